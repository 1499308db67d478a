package checkpoint

import "fmt"

// Room is what the host has for more machines: its memory, and the
// shared-memory file system (/dev/shm) their RAM files live in (a size of
// 0: none, or one bounded by memory only). Known is false where it was
// not measured (then nothing is refused for want of it).
type Room struct {
	Known                  bool
	MemTotal, MemAvailable int64
	ShmSize, ShmFree       int64
}

// Need is what one more machine takes: Mem of the host's memory, Shm of
// the shared-memory file system (its RAM file), Disk of the disk.
type Need struct {
	Mem, Shm, Disk int64
}

// Fit says how many machines of need fit in r and diskFree (bytes free on
// the disk they write to) beside fixed (taken once, whatever the count:
// the checkpoint they start from), keeping what the host must keep: an
// eighth of its memory (at least 1 GiB) available, an eighth of the
// shared-memory file system free, and keepDisk of the disk. why says what
// bounds the count.
func Fit(r Room, fixed, each Need, diskFree, keepDisk int64) (n int, why string) {
	n = 1 << 20
	bound := func(free, fixed, each int64, what string) {
		if each <= 0 {
			if free-fixed < 0 && n > 0 {
				n, why = 0, what
			}
			return
		}
		k := (free - fixed) / each
		if k < 0 {
			k = 0
		}
		if k < int64(n) {
			n, why = int(k), what
		}
	}
	if r.Known {
		keep := max(r.MemTotal/8, 1<<30)
		bound(r.MemAvailable-keep, fixed.Mem, each.Mem,
			fmt.Sprintf("memory: %d MiB available, %d MiB kept free, each takes about %d MiB", r.MemAvailable>>20, keep>>20, each.Mem>>20))
		if r.ShmSize > 0 {
			bound(r.ShmFree-r.ShmSize/8, fixed.Shm, each.Shm,
				fmt.Sprintf("shared memory (/dev/shm): %d MiB free of %d MiB, an eighth kept free, each takes about %d MiB", r.ShmFree>>20, r.ShmSize>>20, each.Shm>>20))
		}
	}
	bound(diskFree-keepDisk, fixed.Disk, each.Disk,
		fmt.Sprintf("disk: %d MiB free, %d MiB kept free, each takes about %d MiB", diskFree>>20, keepDisk>>20, each.Disk>>20))
	return n, why
}
