package checkpoint

import (
	"os"

	"golang.org/x/sys/unix"
)

// cloneOpen: fclonefileat(2), which creates dst itself (EEXIST if it
// exists) and copies nothing when it fails. APFS answers ENOTSUP on a
// volume that cannot clone (HFS+, FAT, SMB) and EXDEV across volumes.
func cloneOpen(dst string, src *os.File) error {
	return unix.Fclonefileat(int(src.Fd()), unix.AT_FDCWD, dst, 0)
}
