package checkpoint

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
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

// ShmToSpare tells whether f's file system, if it is a tmpfs with a size,
// can take need more bytes and still keep keep free and an eighth of its
// size beside: a tmpfs has a size of its own (/dev/shm: half the host's
// memory unless set otherwise), guest RAM files grow in it as guests touch
// their memory, and a guest whose page finds it full dies (SIGBUS in QEMU).
// Memory prepared ahead for speed must never take that room.
func ShmToSpare(f *os.File, need, keep int64) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return err
	}
	if st.Type != unix.TMPFS_MAGIC {
		return nil
	}
	return shmRoomFor(need, int64(st.Blocks)*st.Bsize, int64(st.Bavail)*st.Bsize, keep)
}

// shmRoomFor: size 0 is a tmpfs without one (bounded by memory only).
func shmRoomFor(need, size, free, keep int64) error {
	if size == 0 {
		return nil
	}
	keep += size / 8
	if free-need < keep {
		return fmt.Errorf("%d MiB free in shared memory (a tmpfs of %d MiB), %d MiB would be needed and %d MiB kept free for guest RAM", free>>20, size>>20, need>>20, keep>>20)
	}
	return nil
}

// HostRoom is the host's memory and the shared-memory file system guest
// RAM lives in, for deciding ahead how many machines fit.
func HostRoom() (Room, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return Room{}, err
	}
	defer f.Close()
	r := Room{MemTotal: -1, MemAvailable: -1}
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
			r.MemTotal = n << 10
		case "MemAvailable":
			r.MemAvailable = n << 10
		}
	}
	if r.MemTotal < 0 || r.MemAvailable < 0 {
		return Room{}, fmt.Errorf("/proc/meminfo has no MemTotal or MemAvailable")
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		r.ShmSize, r.ShmFree = int64(st.Blocks)*st.Bsize, int64(st.Bavail)*st.Bsize
	}
	r.Known = true
	return r, nil
}
