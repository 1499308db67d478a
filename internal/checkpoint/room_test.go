package checkpoint

import (
	"strings"
	"testing"
)

func TestFit(t *testing.T) {
	const mib = 1 << 20
	room := Room{Known: true, MemTotal: 16 << 30, MemAvailable: 10 << 30, ShmSize: 8 << 30, ShmFree: 8 << 30}
	each := Need{Mem: 1 << 30, Shm: 512 * mib, Disk: 256 * mib}
	for _, c := range []struct {
		name     string
		room     Room
		fixed    Need
		diskFree int64
		want     int
		why      string
	}{
		// 10 GiB available less 2 GiB kept: 8 machines of 1 GiB.
		{"memory bounds", room, Need{}, 100 << 30, 8, "memory"},
		{"the checkpoint first", room, Need{Disk: 1 << 30}, 3 << 30, 4, "disk"},
		// 8 GiB of shm less an eighth: 7 GiB, 14 of 512 MiB; memory allows 8.
		{"shared memory", Room{Known: true, MemTotal: 64 << 30, MemAvailable: 64 << 30, ShmSize: 8 << 30, ShmFree: 8 << 30}, Need{}, 100 << 30, 14, "shared memory"},
		{"nothing fits", Room{Known: true, MemTotal: 8 << 30, MemAvailable: 1 << 30}, Need{}, 100 << 30, 0, "memory"},
		{"memory unknown", Room{}, Need{}, 10 << 30, 36, "disk"},
	} {
		n, why := Fit(c.room, c.fixed, each, c.diskFree, 1<<30)
		if n != c.want || !strings.HasPrefix(why, c.why) {
			t.Errorf("%s: %d (%s), want %d bounded by %s", c.name, n, why, c.want, c.why)
		}
	}
}
