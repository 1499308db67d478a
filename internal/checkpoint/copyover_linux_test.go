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

// A source shorter than it said (a file cut while it is read: sysfs files
// stand in, sized 4096 and reading a line) must not leave what dst held
// after the data read: CopyOver fails rather than hand over RAM that is
// part another checkpoint's.
func TestCopyOverShortSource(t *testing.T) {
	t.Cleanup(func() { sendfileBroken.Store(false) })
	for _, path := range []string{"/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/profiling"} {
		src, err := os.Open(path)
		if err != nil {
			continue
		}
		defer src.Close()
		fi, err := src.Stat()
		content, rerr := os.ReadFile(path)
		if err != nil || rerr != nil || fi.Size() <= int64(len(content)) {
			continue
		}
		for _, broken := range []bool{false, true} {
			sendfileBroken.Store(broken)
			dst, err := os.CreateTemp(t.TempDir(), "dst")
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			if _, err := dst.Write(bytes.Repeat([]byte{0xAA}, int(fi.Size()))); err != nil {
				t.Fatal(err)
			}
			if _, err := CopyOver(dst, src); err != nil {
				continue // refused: right
			}
			got, _ := os.ReadFile(dst.Name())
			if bytes.IndexByte(got, 0xAA) >= 0 {
				t.Fatalf("sendfile off %v: a short read of %s left dst's old bytes after the %d read, and CopyOver said nothing", broken, path, len(content))
			}
		}
		return
	}
	t.Skip("no sysfs file sized beyond what it reads")
}

// The same for the RAM kept ready: a fill over a file that held other RAM
// from a checkpoint file that reads short must not end up handed out as
// the checkpoint's own (exact: nothing copied at the rewind).
func TestRewindRAMFillFromShortSource(t *testing.T) {
	t.Cleanup(func() { sendfileBroken.Store(false) })
	path := "/sys/kernel/mm/transparent_hugepage/enabled"
	content, err := os.ReadFile(path)
	fi, serr := os.Stat(path)
	if err != nil || serr != nil || fi.Size() <= int64(len(content)) {
		t.Skip("no sysfs file sized beyond what it reads")
	}
	for _, broken := range []bool{false, true} {
		sendfileBroken.Store(broken)
		old, err := os.CreateTemp(t.TempDir(), "ram")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := old.Write(bytes.Repeat([]byte{0xAA}, int(fi.Size()))); err != nil {
			t.Fatal(err)
		}
		r := &RewindRAM{Size: fi.Size(), Room: func(int64) error { return nil },
			New: func() (*os.File, error) { return os.CreateTemp(t.TempDir(), "ram") }}
		r.f = old // another checkpoint's RAM, to be written over
		r.Prepare("A", path)
		f, exact := r.Take("A", path)
		r.Close()
		if f == nil {
			continue // the fill failed and freed its file: a rewind copies
		}
		got := make([]byte, fi.Size())
		f.ReadAt(got, 0)
		f.Close()
		if exact && bytes.IndexByte(got, 0xAA) >= 0 {
			t.Fatalf("sendfile off %v: the ready RAM was handed out as A's, exact, with the old RAM after the %d bytes read", broken, len(content))
		}
	}
}
