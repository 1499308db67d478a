package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// ramCheck reports the shared memory guest RAM lives in.
func ramCheck() check {
	var sf unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &sf); err != nil {
		return check{Name: "guest RAM", Detail: "/dev/shm: " + err.Error(), Fix: "mount a tmpfs on /dev/shm"}
	}
	if sf.Type != 0x01021994 {
		return check{Name: "guest RAM", Detail: "/dev/shm is not tmpfs", Fix: "mount a tmpfs on /dev/shm"}
	}
	free := int64(sf.Bavail) * sf.Bsize >> 20
	return check{Name: "guest RAM", OK: free >= 512, Detail: fmt.Sprintf("/dev/shm (tmpfs), %d MiB free", free), Fix: "free memory or enlarge /dev/shm"}
}
