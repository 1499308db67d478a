package checkpoint

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrCloneUnsupported: the file system cannot clone these files (tmpfs,
// ext4, or source and destination on different file systems). Copy
// instead.
var ErrCloneUnsupported = errors.New("the file system cannot clone files")

// CloneFile makes dst, a new file, a copy-on-write clone of the file src:
// both share their blocks until either is written, so cloning costs
// metadata, not a copy of the data. It uses FICLONE on Linux (XFS with
// reflink, btrfs) and clonefile(2) on macOS (APFS). dst must not exist; it
// is left absent when the clone fails. Where the file system cannot clone,
// the error wraps ErrCloneUnsupported.
func CloneFile(dst, src string) error {
	f, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer f.Close()
	return CloneOpen(dst, f)
}

// CloneOpen is CloneFile from an open file (it need not have a name: on
// Linux guest RAM is an unlinked file). On Linux FICLONE first writes back
// src's dirty pages, so the call takes as long as that writeback; the
// clone is then made of what is on disk, which includes every write
// through a shared mapping of src made before the call. dst is created
// with mode 0600 on Linux and src's mode on macOS.
func CloneOpen(dst string, src *os.File) error {
	if err := cloneOpen(dst, src); err != nil {
		if cloneUnsupported(err) {
			return fmt.Errorf("clone %s to %s: %w (%w)", src.Name(), dst, ErrCloneUnsupported, err)
		}
		return fmt.Errorf("clone %s to %s: %w", src.Name(), dst, err)
	}
	return nil
}

// cloneUnsupported tells the errors by which a file system says it cannot
// clone (these files) from the errors of a clone it could make but did not
// (no space, no permission, dst exists), which copying would not cure.
func cloneUnsupported(err error) bool {
	for _, e := range []error{unix.EOPNOTSUPP, unix.ENOTSUP, unix.EXDEV, unix.EINVAL, unix.ENOTTY, unix.ENOSYS} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
