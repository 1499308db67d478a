package qemu

import (
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// Host describes what acceleration this machine offers.
type Host struct {
	GOOS      string
	Arch      vmspec.Arch
	KVMUsable bool // /dev/kvm opens read-write and speaks API version 12
	HVFUsable bool // kern.hv_support is 1
}

// ChooseAccel picks the acceleration for a guest of arch on h. A guest of
// another architecture is always emulated. want, when not empty, is the
// user's choice (KOSA8_ACCEL or --accel) and wins where it is possible.
func ChooseAccel(h Host, arch vmspec.Arch, want vmm.Accel) (vmm.Accel, error) {
	native := arch == h.Arch
	possible := map[vmm.Accel]bool{vmm.TCG: true}
	if native && h.GOOS == "linux" && h.KVMUsable {
		possible[vmm.KVM] = true
	}
	if native && h.GOOS == "darwin" && h.HVFUsable {
		possible[vmm.HVF] = true
	}
	if want != "" {
		if !possible[want] {
			return "", &AccelError{Want: want, Host: h, Arch: arch}
		}
		return want, nil
	}
	for _, a := range []vmm.Accel{vmm.KVM, vmm.HVF} {
		if possible[a] {
			return a, nil
		}
	}
	return vmm.TCG, nil
}

// AccelError says why an asked-for acceleration cannot be used.
type AccelError struct {
	Want vmm.Accel
	Host Host
	Arch vmspec.Arch
}

func (e *AccelError) Error() string {
	switch {
	case e.Arch != e.Host.Arch:
		return "acceleration " + string(e.Want) + " cannot run a " + string(e.Arch) + " guest on a " + string(e.Host.Arch) + " host: use tcg"
	case e.Want == vmm.KVM && e.Host.GOOS == "linux":
		return "kvm is not usable: /dev/kvm is missing or not read-write for this user (load kvm_intel or kvm_amd, or add yourself to the kvm group)"
	case e.Want == vmm.HVF && e.Host.GOOS == "darwin":
		return "hvf is not usable: this Mac reports no Hypervisor.framework support"
	default:
		return "acceleration " + string(e.Want) + " is not available on " + e.Host.GOOS
	}
}
