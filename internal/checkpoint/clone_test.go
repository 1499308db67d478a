package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCloneUnsupportedErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no remap (tmpfs, ext4)", unix.EOPNOTSUPP, true},
		{"another file system", unix.EXDEV, true},
		{"files it will not share", unix.EINVAL, true},
		{"no such ioctl", unix.ENOTTY, true},
		{"wrapped", fmt.Errorf("ioctl: %w", unix.EOPNOTSUPP), true},
		{"disk full", unix.ENOSPC, false},
		{"permission", unix.EPERM, false},
		{"destination exists", fs.ErrExist, false},
		{"other", errors.New("boom"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cloneUnsupported(tc.err); got != tc.want {
				t.Errorf("cloneUnsupported(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
