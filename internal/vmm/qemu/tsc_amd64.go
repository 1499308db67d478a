package qemu

import (
	"path/filepath"
	"strconv"
	"strings"
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
func HostTSCkHz() int { return HostTSCkHzIn("") }

// tscRecordFile, in a driver's RecordDir, keeps the measurement for the
// rest of the host's boot: "BOOT_ID KHZ".
const tscRecordFile = "host-tsc"

// HostTSCkHzIn is HostTSCkHz, taken from dir's record of this boot of the
// host when there is one, and recorded there when measured (the 60 ms
// measurement was on every start's path). An empty dir: no record.
func HostTSCkHzIn(dir string) int {
	tscOnce.Do(func() { tscKHz = recordedTSC(dir, bootID(), measureTSC) })
	return tscKHz
}

// recordedTSC is the rate dir records for boot, or measure's, then
// recorded.
func recordedTSC(dir, boot string, measure func() int) int {
	if dir == "" || boot == "" {
		return measure()
	}
	path := filepath.Join(dir, tscRecordFile)
	if b, err := readRecord(path, 256); err == nil {
		id, khz, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		if n, err := strconv.Atoi(khz); err == nil && id == boot && n > 0 {
			return n
		}
	}
	khz := measure()
	if khz > 0 {
		_ = writeRecord(path, []byte(boot+" "+strconv.Itoa(khz)+"\n")) // measured again next time
	}
	return khz
}

func measureTSC() int {
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
	return int(best)
}
