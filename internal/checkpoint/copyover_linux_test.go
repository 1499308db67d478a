package checkpoint

import (
	"bytes"
	"math/rand"
	"os"
	"testing"
)

// CopyOver leaves dst equal to src byte for byte whatever dst held: data
// where src has holes, a longer or shorter dst, src's data up to its end;
// on disk and on tmpfs, through sendfile and through the buffer loop.
func TestCopyOverExactWhateverDstHeld(t *testing.T) {
	dirs := []string{t.TempDir()}
	if d, err := os.MkdirTemp("/dev/shm", "k8co-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(d) })
		dirs = append(dirs, d)
	}
	t.Cleanup(func() { sendfileBroken.Store(false) })
	rng := rand.New(rand.NewSource(1))
	for _, dir := range dirs {
		for _, broken := range []bool{false, true} {
			sendfileBroken.Store(broken)
			for i := 0; i < 40; i++ {
				copyOverCase(t, rng, dir)
			}
		}
	}
}

func copyOverCase(t *testing.T, rng *rand.Rand, dir string) {
	t.Helper()
	size := int64(1+rng.Intn(64)) * PageSize
	src, err := os.CreateTemp(dir, "src")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(src.Name())
	defer src.Close()
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	for k := rng.Intn(6); k > 0; k-- {
		off := rng.Int63n(size)
		b := make([]byte, min(int64(1+rng.Intn(3*int(PageSize))), size-off))
		rng.Read(b)
		if _, err := src.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], b)
	}
	dst, err := os.CreateTemp(dir, "dst")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(dst.Name())
	defer dst.Close()
	junk := bytes.Repeat([]byte{0xAA}, int(size+int64(rng.Intn(4)-1)*PageSize))
	if _, err := dst.WriteAt(junk, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := CopyOver(dst, src); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size+1)
	n, _ := dst.ReadAt(got, 0)
	if int64(n) != size || !bytes.Equal(got[:n], want) {
		t.Fatalf("in %s: dst differs from src (%d bytes read of %d)", dir, n, size)
	}
}
