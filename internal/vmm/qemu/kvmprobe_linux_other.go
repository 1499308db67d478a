//go:build linux && !amd64 && !arm64

package qemu

import "errors"

func probeGuest(int) error {
	return errors.New("kosa8 has no KVM test guest for this architecture")
}
