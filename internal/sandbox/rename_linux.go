package sandbox

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// renameNoReplace renames old to new unless new exists (even as an empty
// directory, which a plain rename would replace).
func renameNoReplace(old, new string) error {
	err := unix.Renameat2(unix.AT_FDCWD, old, unix.AT_FDCWD, new, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) {
		return os.ErrExist
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// Filesystems without RENAME_NOREPLACE: a directory rename fails on
		// a non-empty target, and Create leaves no empty ones.
		if _, err := os.Lstat(new); err == nil {
			return os.ErrExist
		}
		return os.Rename(old, new)
	}
	return err
}
