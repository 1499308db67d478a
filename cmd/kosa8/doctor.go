package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// check is one line of doctor's report.
type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Warn   bool   `json:"warning,omitempty"` // works, but worth knowing
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

func doctorChecks(ctx context.Context) []check {
	var out []check
	add := func(c check) { out = append(out, c) }
	arch := vmspec.HostArch()
	add(check{Name: "platform", OK: runtime.GOOS == "linux" || runtime.GOOS == "darwin", Detail: runtime.GOOS + "/" + string(arch)})

	add(accelCheck(arch))

	if bin, err := qemu.FindBinary(arch, ""); err != nil {
		add(check{Name: "qemu", Detail: err.Error(), Fix: "kosa8 setup"})
	} else {
		vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		inst, err := qemu.Probe(vctx, bin, arch)
		cancel()
		add(qemuCheck(inst, err, arch))
	}
	if lookTool("qemu-img") {
		add(check{Name: "qemu-img", OK: true, Detail: "found"})
	} else {
		add(check{Name: "qemu-img", Detail: "not found", Fix: "kosa8 setup (installs qemu-utils)"})
	}
	if a, err := agentPath(vmspec.HostArch()); err != nil {
		add(check{Name: "agent", Detail: err.Error(), Fix: "make build"})
	} else {
		add(check{Name: "agent", OK: true, Detail: a})
	}

	m, err := manager()
	if err != nil {
		add(check{Name: "directories", Detail: err.Error()})
		return out
	}
	if err := sandbox.EnsureWritable(m.Paths.SandboxesDir()); err != nil {
		add(check{Name: "state dir", Detail: err.Error(), Fix: "set KOSA8_HOME to a writable directory"})
	} else {
		add(check{Name: "state dir", OK: true, Detail: m.Paths.SandboxesDir()})
	}
	if img, err := (image.Store{Dir: m.Paths.Cache}).Lookup(image.DefaultRecipe(arch)); err != nil {
		fix := "kosa8 setup"
		if missing := image.MissingTools(); len(missing) > 0 {
			fix += " (needs " + fmt.Sprint(missing) + ")"
		}
		add(check{Name: "image", Detail: err.Error(), Fix: fix})
	} else {
		add(check{Name: "image", OK: true, Detail: fmt.Sprintf("%s, kernel %s, built %s", filepath.Base(img.Dir), img.Manifest.KernelVersion, ago(img.Manifest.Built))})
	}
	add(foreignCheck(m, arch))
	add(ramCheck())
	return out
}

// foreignCheck says whether guests of the other architecture (emulated,
// --arch) can run here: optional, so never a failure.
func foreignCheck(m *sandbox.Manager, host vmspec.Arch) check {
	other := vmspec.ARM64
	if host == vmspec.ARM64 {
		other = vmspec.AMD64
	}
	c := check{Name: string(other) + " guests", OK: true}
	var missing []string
	if _, err := qemu.FindBinary(other, ""); err != nil {
		missing = append(missing, qemu.Binary(other))
	}
	if _, err := agentPath(other); err != nil {
		missing = append(missing, "kosa8-agent-linux-"+string(other))
	}
	if _, err := (image.Store{Dir: m.Paths.Cache}).Lookup(image.DefaultRecipe(other)); err != nil {
		missing = append(missing, "its image")
	}
	if len(missing) == 0 {
		c.Detail = "ready (--arch " + string(other) + ", emulated: tcg)"
		return c
	}
	c.Detail = "optional, not set up: no " + strings.Join(missing, ", ")
	c.Fix = vmspec.SetupCommand(other)
	return c
}

// accelCheck says which acceleration a sandbox gets and, when it is not
// hardware, why and what to do.
func accelCheck(arch vmspec.Arch) check {
	var dir string
	if m, err := manager(); err == nil {
		dir = m.Paths.Home
	}
	h := qemu.DetectHostIn(dir)
	forced := vmm.Accel(os.Getenv("KOSA8_ACCEL"))
	accel, err := qemu.ChooseAccel(h, arch, forced)
	switch {
	case err != nil:
		return check{Name: "acceleration", Detail: err.Error(), Fix: "unset KOSA8_ACCEL, or set it to tcg"}
	case accel != vmm.TCG:
		return check{Name: "acceleration", OK: true, Detail: string(accel) + " (a test guest ran under it)"}
	case forced == vmm.TCG:
		return check{Name: "acceleration", OK: true, Warn: true, Detail: "tcg, as KOSA8_ACCEL asks — " + vmm.IsolationWarning}
	}
	why := h.WhyNot(arch)
	c := check{Name: "acceleration", OK: true, Warn: true, Detail: "tcg — " + why + ". " + vmm.IsolationWarning}
	switch {
	case runtime.GOOS == "darwin":
		c.Fix = "use an Apple silicon Mac with macOS 12 or later"
	case len(h.Failed) > 0:
		c.Fix = "this host's KVM cannot boot a standard guest (common on nested, paravirtualized cloud VMs): run kosa8 on a host with full nested virtualization or on bare metal; the record is forgotten at the next reboot"
	case !fileExists("/dev/kvm"):
		c.Fix = "enable virtualization: turn it on in the firmware (or the cloud VM's nested virtualization), and load kvm_intel or kvm_amd"
	case !h.KVMUsable && os.Geteuid() != 0 && strings.Contains(h.KVMReason, "permission denied"):
		c.Fix = "/dev/kvm exists but is not usable by you: add yourself to its group (usually kvm) and log in again"
	default:
		c.Fix = "this host's /dev/kvm cannot run a guest (common on nested, paravirtualized cloud VMs): run kosa8 on a host with full nested virtualization or on bare metal"
	}
	return c
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func doctorCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check what kosa8 needs and say how to fix what is missing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			checks := doctorChecks(cmd.Context())
			failed := 0
			for _, c := range checks {
				if !c.OK {
					failed++
				}
			}
			if asJSON {
				if err := printJSON(checks); err != nil {
					return err
				}
			} else {
				for _, c := range checks {
					mark := "ok  "
					switch {
					case !c.OK:
						mark = "FAIL"
					case c.Warn:
						mark = "warn"
					}
					fmt.Printf("%s  %-13s %s\n", mark, c.Name, c.Detail)
					if c.Fix != "" && (!c.OK || c.Warn) {
						fmt.Printf("      %-13s fix: %s\n", "", c.Fix)
					}
				}
			}
			if failed > 0 {
				return &exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// qemuCheck says whether the installed QEMU is inside the supported range
// and, if not, what to do.
func qemuCheck(inst qemu.Install, err error, arch vmspec.Arch) check {
	if err != nil {
		return check{Name: "qemu", Detail: err.Error(), Fix: "reinstall QEMU, or point KOSA8_QEMU at a qemu-system binary"}
	}
	detail := inst.VersionLine + " at " + inst.Binary + " (supported: " + qemu.SupportedRange() + ")"
	upgrade := "install QEMU " + qemu.SupportedRange() + ": Debian 12's qemu-system-x86 is 7.2, bookworm-backports has 10.x; on a Mac, brew install qemu; or point KOSA8_QEMU at one"
	switch {
	case inst.Supported() != nil:
		return check{Name: "qemu", Detail: detail + ": too old", Fix: upgrade}
	case !inst.Version.Tested():
		return check{Name: "qemu", OK: true, Warn: true, Detail: detail + ": newer than kosa8 is tested with",
			Fix: "it may work; if sandboxes fail to start or checkpoints fail to load, use QEMU " + qemu.SupportedRange() + " (KOSA8_QEMU selects the binary)"}
	case arch == vmspec.AMD64 && inst.Firmware == "":
		// Without qboot, microvm boots SeaBIOS's firmware, which loses the
		// initramfs of a guest of exactly 2 GiB (see internal/vmm/qemu/cmdline.go).
		return check{Name: "qemu", OK: true, Warn: true, Detail: detail + ": no qboot.rom in its data folders",
			Fix: "install the QEMU's data package (Debian: qemu-system-data), or set KOSA8_QEMU_DATADIR to the folder holding qboot.rom; until then a sandbox of exactly 2 GiB may not boot"}
	}
	if len(inst.DataDirs) > 0 {
		detail += ", data in " + strings.Join(inst.DataDirs, ", ")
	}
	return check{Name: "qemu", OK: true, Detail: detail}
}
