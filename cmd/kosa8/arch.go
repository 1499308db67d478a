package main

import (
	"fmt"

	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// guestArch reads --arch (default $KOSA8_ARCH, else the host's).
func guestArch(s string) (vmspec.Arch, error) {
	a, err := vmspec.ParseArch(s)
	if err != nil {
		return "", fmt.Errorf("--arch: %w", err)
	}
	return a, nil
}

// checkQEMU fails, before a sandbox is created, when the QEMU for arch's
// guests is missing; the error names the package that holds it.
func checkQEMU(arch vmspec.Arch) error {
	_, err := qemu.FindBinary(arch, "")
	return err
}
