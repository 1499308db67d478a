package checkpoint

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resident is the number of f's pages (of size) in the page cache.
func resident(t *testing.T, f *os.File, size int64) int64 {
	t.Helper()
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	vec := make([]byte, (size+PageSize-1)/PageSize)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n
}

// The point of a spare is that its pages are in the page cache: a spare
// of zeros made by preallocation must have been read through, not only
// reserved (TestSpareOfZerosWritesNothing passes without readThrough).
func TestSpareOfZerosIsResident(t *testing.T) {
	const size = 64 << 20
	sp := &Spares{Dir: t.TempDir(), Size: size, Slots: 1}
	defer sp.Close()
	sp.Refill()
	waitSpares(t, sp, "")
	f, err := os.Open(sp.Paths()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, want := resident(t, f, size), int64(size)/PageSize; got < want*9/10 {
		t.Fatalf("%d of %d pages of the spare resident", got, want)
	}
}

// A spare of zeros taken while being read through is whole (its size and
// zeros everywhere), and the worker does not go on filling another one
// beside the pause: Take leaves the refill to its caller on this path too.
func TestTakeOfTheSpareBeingFilled(t *testing.T) {
	const size = 1 << 30
	dir := t.TempDir()
	if free, err := FreeBytes(dir); err != nil || free < 4*size {
		t.Skip("no room")
	}
	sp := &Spares{Dir: dir, Size: size, Slots: 1}
	defer sp.Close()
	sp.Refill()
	if !fillerAt(sp, 10*time.Second) {
		t.Fatal("worker never started")
	}
	dst := filepath.Join(t.TempDir(), "cp")
	base, ok := sp.Take(dst, "")
	if !ok || base != "" {
		t.Fatalf("Take: %q %v", base, ok)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fi, _ := f.Stat(); fi.Size() != size {
		t.Fatalf("taken spare of %d bytes, want %d", fi.Size(), int64(size))
	}
	if r := resident(t, f, size); r == size/PageSize {
		t.Logf("the spare was whole by the time it was taken (not a test of the partial case)")
	}
	zero, _ := os.Create(filepath.Join(t.TempDir(), "zero"))
	defer zero.Close()
	zero.Truncate(size)
	if err := Compare(f, zero, size); err != nil {
		t.Fatal(err)
	}
	sp.mu.Lock()
	running, working := sp.running, sp.working
	sp.mu.Unlock()
	if running || working != nil {
		t.Fatalf("after Take of the spare being filled the worker goes on filling another, during the pause (running %v, working %v)", running, working != nil)
	}
}

// A spare that copies a checkpoint (incremental mode, the usual case) is
// preallocated too: it writes the checkpoint's data, not the zeros around
// it, and is an exact, resident copy.
func TestSpareOfACheckpointWritesOnlyItsData(t *testing.T) {
	const size = 64 << 20
	writes := func() int64 { return writeBytes(t) }
	dir := t.TempDir()
	cp, err := os.Create(filepath.Join(dir, "cp-ram"))
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	cp.Truncate(size)
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	for _, off := range []int64{0, 9 << 20, 40 << 20, size - 1<<20} {
		cp.WriteAt(data, off)
	}
	cp.Sync()
	w0 := writes()
	sp := &Spares{Dir: dir, Size: size, Slots: 1}
	defer sp.Close()
	sp.Rebase("cp", cp.Name(), nil)
	waitSpares(t, sp, "cp")
	if got := writes() - w0; got > size/4 {
		t.Errorf("a spare copying 4 MiB of data wrote %d bytes (of %d)", got, int64(size))
	}
	f, err := os.Open(sp.Paths()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Compare(f, cp, size); err != nil {
		t.Fatal(err)
	}
	if got, want := resident(t, f, size), int64(size)/PageSize; got < want*9/10 {
		t.Fatalf("%d of %d pages of the spare resident", got, want)
	}
	want, _ := DataExtents(cp, size)
	sp.mu.Lock()
	got := sp.ready[0].exts
	sp.mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("spare's extents %v, want %v", got, want)
	}
}
