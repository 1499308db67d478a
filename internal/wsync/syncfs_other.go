//go:build !linux

package wsync

import "errors"

// syncFS is Linux's syncfs; elsewhere Root.Sync fsyncs each path.
func syncFS(int) error { return errors.ErrUnsupported }
