//go:build !linux

package checkpoint

import (
	"errors"
	"os"
)

// writeBack does nothing here: macOS has no per-range writeback (and
// checkpoints there clone, with no spares to fill).
func writeBack(*os.File) {}

// preallocate: not here (zeros are written instead).
var preallocate = func(*os.File, int64) error { return errors.ErrUnsupported }
