package checkpoint

import (
	"os"

	"golang.org/x/sys/unix"
)

// cloneOpen: FICLONE onto a new file. The kernel answers EOPNOTSUPP where
// the file system has no remap (tmpfs, ext4, XFS made without reflink),
// EXDEV across file systems and EINVAL for files it will not share
// (not regular, DAX, a swap file).
func cloneOpen(dst string, src *os.File) error {
	fd, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = unix.IoctlFileClone(fd, int(src.Fd()))
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		_ = unix.Unlink(dst)
		return err
	}
	return nil
}
