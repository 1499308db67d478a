package qemu

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// Host describes what acceleration this machine offers.
type Host struct {
	GOOS      string
	Arch      vmspec.Arch
	KVMUsable bool   // a test guest ran under KVM (ProbeKVM)
	KVMReason string // why KVM is not usable, when it is not
	HVFUsable bool   // kern.hv_support is 1
	// Failed holds, per accelerator, a failure to boot a real sandbox
	// recorded earlier in this boot of the host (see RecordFailure): the
	// probe's guest ran, but a sandbox did not. It rules the accelerator
	// out unless the user asks for it.
	Failed map[vmm.Accel]Failure
}

// Failure is an accelerator that passed the probe but failed to boot a
// sandbox, kept until the host reboots.
type Failure struct {
	BootID string    `json:"boot_id"`
	Reason string    `json:"reason"`
	When   time.Time `json:"when"`
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
		if _, failed := h.Failed[a]; possible[a] && !failed {
			return a, nil
		}
	}
	return vmm.TCG, nil
}

// WhyNot says why the best accelerator of this host is not used for a guest
// of arch when nothing is forced; "" when it is used.
func (h Host) WhyNot(arch vmspec.Arch) string {
	if arch != h.Arch {
		return "a " + string(arch) + " guest on a " + string(h.Arch) + " host is emulated"
	}
	switch h.GOOS {
	case "linux":
		if !h.KVMUsable {
			return "kvm is not usable: " + h.KVMReason
		}
		if f, ok := h.Failed[vmm.KVM]; ok {
			return "kvm ran the test guest but failed to boot a sandbox at " + f.When.Local().Format("15:04:05") + ": " + f.Reason
		}
	case "darwin":
		if !h.HVFUsable {
			return "hvf is not usable: this Mac reports no Hypervisor.framework support"
		}
		if f, ok := h.Failed[vmm.HVF]; ok {
			return "hvf failed to boot a sandbox at " + f.When.Local().Format("15:04:05") + ": " + f.Reason
		}
	default:
		return "no hardware acceleration on " + h.GOOS
	}
	return ""
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
		return "kvm is not usable: " + e.Host.KVMReason + ": set KOSA8_ACCEL=tcg (or --accel tcg) to run under emulation"
	case e.Want == vmm.HVF && e.Host.GOOS == "darwin":
		return "hvf is not usable: this Mac reports no Hypervisor.framework support"
	default:
		return "acceleration " + string(e.Want) + " is not available on " + e.Host.GOOS
	}
}

// BootID names this boot of the host ("" where it cannot be told): what
// is kept "until the host reboots" is kept with it.
func BootID() string { return bootID() }

// failureFile is where a boot failure under a is recorded in dir.
func failureFile(dir string, a vmm.Accel) string {
	return filepath.Join(dir, "accel-"+string(a)+"-failed.json")
}

// maxReason bounds a recorded reason: it carries QEMU's and the console's
// last lines, which the guest partly controls.
const maxReason = 2048

// RecordFailure notes in dir that a sandbox failed to boot under a, so that
// later starts in this boot of the host go straight to the fallback instead
// of failing again first. A reboot (a new boot id) forgets it, and so does
// ClearFailure.
func RecordFailure(dir string, a vmm.Accel, reason string) error {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	b, err := json.Marshal(Failure{BootID: bootID(), Reason: reason, When: time.Now().UTC()})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return writeRecord(failureFile(dir, a), b)
}

// ClearFailure forgets a recorded failure under a.
func ClearFailure(dir string, a vmm.Accel) error {
	err := os.Remove(failureFile(dir, a))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// readFailures loads the failures recorded in dir during this boot.
func readFailures(dir string) map[vmm.Accel]Failure {
	if dir == "" {
		return nil
	}
	id := bootID()
	out := map[vmm.Accel]Failure{}
	for _, a := range []vmm.Accel{vmm.KVM, vmm.HVF} {
		b, err := readRecord(failureFile(dir, a), 2*maxReason+256)
		if err != nil {
			continue
		}
		var f Failure
		if json.Unmarshal(b, &f) == nil && f.BootID != "" && f.BootID == id {
			out[a] = f
		}
	}
	return out
}

// DetectHostIn is DetectHost with the failures recorded in dir.
func DetectHostIn(dir string) Host {
	h := DetectHost()
	h.Failed = readFailures(dir)
	return h
}
