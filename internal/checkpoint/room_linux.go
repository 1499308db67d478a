package checkpoint

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// MemoryToSpare tells whether the host can hold need more bytes in memory
// and still keep an eighth of it (at least 1 GiB) available: memory
// prepared ahead for speed must never be what pushes the host into
// reclaim or the OOM killer.
func MemoryToSpare(need int64) error {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var total, avail int64 = -1, -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemTotal":
			total = n << 10
		case "MemAvailable":
			avail = n << 10
		}
	}
	if total < 0 || avail < 0 {
		return fmt.Errorf("/proc/meminfo has no MemTotal or MemAvailable")
	}
	return roomFor(need, total, avail)
}

func roomFor(need, total, avail int64) error {
	keep := max(total/8, 1<<30)
	if avail-need < keep {
		return fmt.Errorf("%d MiB of memory available, %d MiB would be needed and %d MiB kept free", avail>>20, need>>20, keep>>20)
	}
	return nil
}
