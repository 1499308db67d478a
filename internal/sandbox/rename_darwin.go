package sandbox

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// renameNoReplace renames old to new unless new exists.
func renameNoReplace(old, new string) error {
	err := unix.RenamexNp(old, new, unix.RENAME_EXCL)
	if errors.Is(err, unix.EEXIST) {
		return os.ErrExist
	}
	return err
}
