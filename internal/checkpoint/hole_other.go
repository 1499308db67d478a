//go:build !linux

package checkpoint

import "errors"

// punchHole is not wired up outside Linux yet (macOS has F_PUNCHHOLE): a
// checkpoint written over a spare keeps its zeros allocated there.
func punchHole(fd int, off, n int64) error {
	return errors.New("punching holes is not supported on this system")
}
