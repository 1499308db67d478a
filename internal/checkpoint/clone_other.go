//go:build !linux && !darwin

package checkpoint

import (
	"os"

	"golang.org/x/sys/unix"
)

func cloneOpen(dst string, src *os.File) error { return unix.ENOTSUP }
