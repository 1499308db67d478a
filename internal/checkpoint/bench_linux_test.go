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

// BenchmarkSpareFillFsync measures what a spare's fill costs the rest of
// the host: the latency of a small file's write and fsync (as QEMU's
// flush of a disk layer in a checkpoint's pause) while a 1 GiB spare is
// made. Three ways: zeros written unpaced (left to the kernel, whose
// flusher is started on it at the end as it would be 30 s later or at the
// dirty limit), zeros written paced (writebackStep at a time, as spares
// holding a checkpoint's RAM are filled), and preallocated and read (as
// spares of zeros are made where the filesystem can: nothing written).
// All run in one process, on the filesystem of the test's temp directory
// (set TMPDIR to the one checkpoints live on).
//
//	go test -run x -bench SpareFillFsync -benchtime 3x ./internal/checkpoint/
func BenchmarkSpareFillFsync(b *testing.B) {
	const size = 1 << 30
	dir := b.TempDir()
	for _, mode := range []string{"unpaced", "paced", "preallocated"} {
		b.Run(mode, func(b *testing.B) {
			unix.Sync() // nothing of the mode before in the queue
			var worst, total time.Duration
			var probes int
			var fill time.Duration
			for i := 0; i < b.N; i++ {
				spare, err := os.Create(filepath.Join(dir, "spare"))
				if err != nil {
					b.Fatal(err)
				}
				var p *pacer
				if mode == "paced" {
					p = pace(spare)
				}
				done := make(chan error, 1)
				t0 := time.Now()
				go func() {
					if mode == "preallocated" {
						err := preallocate(spare, size)
						if err == nil {
							err = readThrough(spare, size, func() bool { return false })
						}
						done <- err
						return
					}
					_, err := fillFrom(spare, nil, size, nil, p)
					if err == nil && p == nil {
						// The kernel's flusher, started on it.
						err = unix.SyncFileRange(int(spare.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
					}
					done <- err
				}()
				w, n, sum, err := fsyncWhile(filepath.Join(dir, "small"), done)
				fill += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				// Whatever is still being written out counts too.
				w2, n2, sum2, err := fsyncFor(filepath.Join(dir, "small"), 300*time.Millisecond)
				if err != nil {
					b.Fatal(err)
				}
				worst = max(worst, w, w2)
				probes += n + n2
				total += sum + sum2
				spare.Close()
				os.Remove(spare.Name())
				unix.Sync()
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "max-fsync-ms")
			b.ReportMetric(float64(total.Microseconds())/1000/float64(max(probes, 1)), "mean-fsync-ms")
			b.ReportMetric(float64(fill.Milliseconds())/float64(b.N), "fill-ms")
		})
	}
}

// fsyncWhile writes and fsyncs a small file in a loop until done yields,
// returning the slowest, the count and the sum of those, and done's error.
func fsyncWhile(path string, done <-chan error) (worst time.Duration, n int, sum time.Duration, err error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		select {
		case err := <-done:
			return worst, n, sum, err
		default:
		}
		t := time.Now()
		if _, err := f.WriteAt(buf, 0); err != nil {
			return worst, n, sum, err
		}
		if err := f.Sync(); err != nil {
			return worst, n, sum, err
		}
		d := time.Since(t)
		worst, n, sum = max(worst, d), n+1, sum+d
		time.Sleep(5 * time.Millisecond)
	}
}

// fsyncFor is fsyncWhile for a fixed time.
func fsyncFor(path string, d time.Duration) (time.Duration, int, time.Duration, error) {
	done := make(chan error, 1)
	time.AfterFunc(d, func() { done <- nil })
	return fsyncWhile(path, done)
}
