package checkpoint

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkIncrementalSave2GiB is the pause's RAM work for a 2 GiB guest
// with 1 GiB in use that wrote 64 MiB (random pages) since the last
// checkpoint: the pagemap walk over QEMU-like mapping of the whole file
// and the copy of the dirty pages into a resident copy of the previous
// checkpoint, then freeing the holes. The dirty set comes from the
// writes themselves where the kernel has no soft-dirty bits (the walk is
// timed either way).
//
//	go test -run x -bench IncrementalSave -benchtime 5x ./internal/checkpoint/
func BenchmarkIncrementalSave2GiB(b *testing.B) {
	const size = 2 << 30
	dir, err := os.MkdirTemp("/dev/shm", "kosa8-bench-")
	if err != nil {
		b.Skip(err)
	}
	defer os.RemoveAll(dir)
	f, err := os.Create(filepath.Join(dir, "ram"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	f.Truncate(size)
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(mem)
	rng := rand.New(rand.NewPCG(1, 1))
	for off := 0; off < size/2; off += int(PageSize) {
		mem[off] = byte(rng.Uint32()) | 1
	}
	spare, err := os.Create(filepath.Join(b.TempDir(), "spare"))
	if err != nil {
		b.Fatal(err)
	}
	defer spare.Close()
	if _, err := FillFrom(spare, f, size, nil); err != nil {
		b.Fatal(err)
	}
	var st unix.Stat_t
	unix.Fstat(int(f.Fd()), &st)
	sd := &SoftDirty{pid: os.Getpid(), size: size, major: unix.Major(st.Dev), minor: unix.Minor(st.Dev), ino: st.Ino, notify: -1}
	real := ProbeSoftDirty() == nil
	var walk, cp time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if real {
			clearRefs(os.Getpid())
		}
		written := NewPages(size)
		for k := 0; k < (64<<20)/int(PageSize); k++ {
			p := rng.Int64N(size / 2 / PageSize)
			mem[p*PageSize+8] = byte(rng.Uint32())
			written.Set(p)
		}
		b.StartTimer()
		t0 := time.Now()
		sd.armed = true
		dirty, err := sd.Dirty()
		if err != nil {
			b.Fatal(err)
		}
		if !real {
			for p := int64(0); p < written.Len(); p++ {
				if written.Has(p) {
					dirty.Set(p)
				}
			}
		}
		t1 := time.Now()
		if _, _, err := CopyIncremental(spare, f, size, dirty); err != nil {
			b.Fatal(err)
		}
		walk += t1.Sub(t0)
		cp += time.Since(t1)
	}
	b.ReportMetric(float64(walk.Milliseconds())/float64(b.N), "walk-ms/op")
	b.ReportMetric(float64(cp.Milliseconds())/float64(b.N), "copy-ms/op")
	b.StopTimer()
	if err := Compare(spare, f, size); err != nil {
		b.Fatal(err)
	}
}
