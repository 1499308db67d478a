package qemu

import (
	"sync"
	"time"
)

func rdtsc() uint64

var (
	tscOnce sync.Once
	tscKHz  int
)

// HostTSCkHz measures this machine's TSC rate. Under TCG the guest reads
// the host's TSC, and the guest kernel's own calibration against the
// emulated PIT fails in some boots (it then hangs): telling it the rate
// (tsc_early_khz=) skips that calibration.
func HostTSCkHz() int {
	tscOnce.Do(func() {
		best := 0.0
		// The shortest of a few samples is the least disturbed by scheduling.
		for i := 0; i < 3; i++ {
			t0, c0 := time.Now(), rdtsc()
			time.Sleep(20 * time.Millisecond)
			t1, c1 := time.Now(), rdtsc()
			khz := float64(c1-c0) / float64(t1.Sub(t0).Nanoseconds()) * 1e6
			if best == 0 || khz < best {
				best = khz
			}
		}
		tscKHz = int(best)
	})
	return tscKHz
}
