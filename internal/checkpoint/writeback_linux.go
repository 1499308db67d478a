package checkpoint

import (
	"os"

	"golang.org/x/sys/unix"
)

// writeBack writes f's dirty pages to its disk and waits for them. It is
// advice: an error changes nothing (a checkpoint's own data is made
// durable by the fsync of its commit).
func writeBack(f *os.File) {
	_ = unix.SyncFileRange(int(f.Fd()), 0, 0,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
}

// preallocate reserves f's blocks up to size without writing them: they
// read as zeros. A variable for tests.
var preallocate = func(f *os.File, size int64) error {
	return unix.Fallocate(int(f.Fd()), 0, 0, size)
}
