package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// archFlag registers --arch, defaulting to $KOSA8_ARCH; guestArch reads it.
func archFlag(fs *pflag.FlagSet, v *string) {
	fs.StringVar(v, "arch", os.Getenv("KOSA8_ARCH"), "guest architecture: amd64 or arm64 (default: the host's, or $KOSA8_ARCH; another than the host's is emulated)")
}

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
