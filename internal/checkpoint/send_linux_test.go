package checkpoint

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// The in-kernel copy and the buffered one give the same file, between
// tmpfs (guest RAM) and the disk (checkpoints) both ways, over a spare's
// older data, and stop where a truncated source ends.
func TestCopyRangeInKernelAndBuffered(t *testing.T) {
	dirs := map[string]string{"disk": t.TempDir()}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "kosa8-test-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			dirs["tmpfs"] = d
		}
	}
	const size = 8 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	content := make([]byte, size)
	for i := 0; i < 40; i++ { // scattered runs of pages, the rest zeros
		off := rng.IntN(size/4096) * 4096
		n := min((1+rng.IntN(64))*4096, size-off)
		for j := off; j < off+n; j++ {
			content[j] = byte(rng.Uint32())
		}
	}
	old := bytes.Repeat([]byte{0xee}, size) // a spare holding an older RAM
	for sname, sdir := range dirs {
		for dname, ddir := range dirs {
			for _, buffered := range []bool{false, true} {
				name := sname + " to " + dname
				if buffered {
					name += ", buffered"
				}
				t.Run(name, func(t *testing.T) {
					sendfileBroken.Store(buffered)
					t.Cleanup(func() { sendfileBroken.Store(false) })
					src := newFile(t, sdir, "src", content)
					dst := newFile(t, ddir, "dst", old)
					// The whole file through the sparse copy: data where
					// src has it; a spare's old bytes stay in the holes.
					if _, err := CopySparse(dst, src); err != nil {
						t.Fatal(err)
					}
					got, _ := os.ReadFile(dst.Name())
					for i := 0; i < size; i += 4096 {
						want := content[i : i+4096]
						if !bytes.Equal(got[i:i+4096], want) && !bytes.Equal(got[i:i+4096], old[i:i+4096]) {
							t.Fatalf("page %d is neither the source's nor the spare's", i/4096)
						}
						if !allZero(want) && !bytes.Equal(got[i:i+4096], want) {
							t.Fatalf("page %d with data was not copied", i/4096)
						}
					}
					// One range over all of it, then one past a truncated end.
					n, err := copyRange(dst, src, 0, size, make([]byte, 64<<10))
					if err != nil || n != size {
						t.Fatalf("copyRange: %d bytes, %v", n, err)
					}
					if got, _ := os.ReadFile(dst.Name()); !bytes.Equal(got, content) {
						t.Fatal("copy differs")
					}
					if err := src.Truncate(size / 2); err != nil {
						t.Fatal(err)
					}
					n, err = copyRange(dst, src, size/4, size, make([]byte, 64<<10))
					if err != nil || n != size/4 {
						t.Fatalf("copy from a truncated source: %d bytes, %v; want %d", n, err, size/4)
					}
				})
			}
		}
	}
}

func newFile(t *testing.T, dir, name string, b []byte) *os.File {
	t.Helper()
	p := filepath.Join(dir, name)
	os.Remove(p)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(); os.Remove(p) })
	if err := f.Truncate(int64(len(b))); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(b); off += 4096 {
		if !allZero(b[off : off+4096]) {
			if _, err := f.WriteAt(b[off:off+4096], int64(off)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}
