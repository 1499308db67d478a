package checkpoint

import (
	"errors"
	"math/rand/v2"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// shmFile is a file on tmpfs, as guest RAM is, mapped shared into this
// process like QEMU maps it.
func shmFile(t *testing.T, size int64, mapLen int64) (*os.File, []byte) {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "kosa8-sd-test-")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f, err := os.Create(dir + "/ram")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(mapLen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return f, mem
}

// The pagemap walk without soft-dirty bits: pages the process maps are
// vouched for, pages of the file no mapping covers are always to copy.
// This runs on any Linux; the soft-dirty test below needs the kernel's
// tracking.
func TestDirtyCoversUnmappedPages(t *testing.T) {
	const pages = 256
	size := pages * PageSize
	f, mem := shmFile(t, size, size/2) // only the first half mapped
	for i := int64(0); i < pages/2; i++ {
		mem[i*PageSize] = 1
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	sd := &SoftDirty{pid: os.Getpid(), size: size, major: unix.Major(st.Dev), minor: unix.Minor(st.Dev), ino: st.Ino, notify: -1, armed: true}
	dirty, err := sd.Dirty()
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(pages / 2); i < pages; i++ {
		if !dirty.Has(i) {
			t.Fatalf("page %d is mapped by no one but not reported", i)
		}
	}
	if _, err := sd.Dirty(); !errors.Is(err, errNotArmed) {
		t.Fatalf("a second look in one window: %v, want errNotArmed", err)
	}
	if ProbeSoftDirty() == nil {
		// With tracking, the mapped pages were all written after the
		// process started: no claim about them here.
		return
	}
	for i := int64(0); i < pages/2; i++ {
		if dirty.Has(i) {
			t.Fatalf("page %d: reported dirty without soft-dirty bits", i)
		}
	}
}

// Soft-dirty tracking on this process's own mapping of a tmpfs file:
// exactly the pages written after a Reset are reported; a write through
// the descriptor and a punched hole make Reset report a change.
func TestSoftDirtyOwnMemory(t *testing.T) {
	if err := ProbeSoftDirty(); err != nil {
		t.Skip("this kernel has no soft-dirty tracking:", err)
	}
	const pages = 1024
	size := pages * PageSize
	f, mem := shmFile(t, size, size)
	for i := int64(0); i < pages; i++ {
		mem[i*PageSize] = 1
	}
	sd, err := NewSoftDirty(os.Getpid(), f, size)
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	if _, err := sd.Dirty(); err == nil {
		t.Fatal("Dirty before the first Reset must fail")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 5; round++ {
		if changed, err := sd.Reset(); err != nil || (round > 0 && changed) {
			t.Fatalf("round %d: reset: changed=%v err=%v", round, changed, err)
		}
		want := map[int64]bool{}
		for k := 0; k < 50; k++ {
			p := rng.Int64N(pages)
			want[p] = true
			mem[p*PageSize+rng.Int64N(PageSize)] = byte(rng.Uint32())
		}
		dirty, err := sd.Dirty()
		if err != nil {
			t.Fatal(err)
		}
		for i := int64(0); i < pages; i++ {
			if dirty.Has(i) != want[i] {
				t.Fatalf("round %d: page %d dirty=%v, written=%v", round, i, dirty.Has(i), want[i])
			}
		}
	}
	if _, err := sd.Reset(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{9}, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	if changed, _ := sd.Reset(); !changed {
		t.Fatal("a write through the descriptor was not noticed")
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, PageSize); err != nil {
		t.Fatal(err)
	}
	if changed, _ := sd.Reset(); !changed {
		t.Fatal("a punched hole was not noticed")
	}
}

func FuzzParseMaps(f *testing.F) {
	f.Add([]byte("7f0000000000-7f0080000000 rw-s 00000000 00:1a 12345                      /dev/shm/x.ram (deleted)\n"))
	f.Add([]byte("00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon\n7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n"))
	f.Add([]byte("bad"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := parseMaps(b)
		if err != nil {
			return
		}
		for _, m := range ms {
			if m.end < m.start {
				t.Fatalf("%+v", m)
			}
		}
	})
}

func TestParseMaps(t *testing.T) {
	ms, err := parseMaps([]byte("7f0000000000-7f0080000000 rw-s 00001000 00:1a 12345                      /dev/shm/x.ram (deleted)\n00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/x\n"))
	if err != nil || len(ms) != 2 {
		t.Fatal(ms, err)
	}
	m := ms[0]
	if m.start != 0x7f0000000000 || m.end != 0x7f0080000000 || m.off != 0x1000 || m.major != 0 || m.minor != 0x1a || m.ino != 12345 || !m.shared || ms[1].shared {
		t.Fatalf("%+v", ms)
	}
	if _, err := parseMaps([]byte("zz-00 rw-s 0 0:0 1\n")); err == nil {
		t.Fatal("bad address accepted")
	}
}

// The whole incremental path on real soft-dirty bits: this process maps a
// tmpfs file as QEMU maps guest RAM and writes random pages through the
// mapping (and punches a hole, as a discard does) between checkpoints;
// each checkpoint is compared byte for byte with the file.
func TestIncrementalWithSoftDirty(t *testing.T) {
	if err := ProbeSoftDirty(); err != nil {
		t.Skip("this kernel has no soft-dirty tracking:", err)
	}
	const size = 8 << 20
	f, mem := shmFile(t, size, size)
	rng := rand.New(rand.NewPCG(3, 4))
	write := func(n int) {
		for k := 0; k < n; k++ {
			off := rng.Int64N(size - 64)
			for i := int64(0); i < 64; i++ {
				mem[off+i] = byte(rng.Uint32())
			}
		}
	}
	write(1000)
	sd, err := NewSoftDirty(os.Getpid(), f, size)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sp := &Spares{Dir: dir, Size: size, Slots: 2}
	defer sp.Close()
	r := &RAMSaver{Size: size, Spares: sp}
	r.Track(f, func() (Tracker, error) { return sd, nil })
	sp.Refill()
	parent := ""
	for i := 0; i < 6; i++ {
		write(50)
		if i == 3 {
			if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 5*PageSize, PageSize); err != nil {
				t.Fatal(err)
			}
			_ = mem[5*PageSize] // read back: a clean zero page
		}
		waitSpares(t, sp, parent)
		id := NewID()
		dst := dir + "/" + id
		base, _ := sp.Take(dst, r.Want())
		out, err := os.OpenFile(dst, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Save(out, f, id, parent, true, base)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.FreeHoles(out, res); err != nil {
			t.Fatal(err)
		}
		if err := Compare(out, f, size); err != nil {
			t.Fatalf("checkpoint %d (incremental %v): %v", i, res.Incremental, err)
		}
		if want := i > 0 && i != 3; res.Incremental != want {
			t.Fatalf("checkpoint %d: incremental %v (%s), want %v", i, res.Incremental, res.FullReason, want)
		}
		t.Logf("checkpoint %d: incremental %v, copied %d KiB of %d", i, res.Incremental, res.Copied>>10, res.Stored>>10)
		out.Close()
		r.Committed(id, dst, res)
		parent = id
	}
}
