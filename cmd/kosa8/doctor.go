package main

import (
	"context"
	"fmt"
	"io"
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
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Warn    bool   `json:"warning,omitempty"` // works, but worth knowing
	Waiting bool   `json:"waiting,omitempty"` // not ready yet, being made (OK is false)
	Detail  string `json:"detail"`
	Fix     string `json:"fix,omitempty"`
}

// setupFix says how to build the image of arch here: setup, what it
// installs for the build method chosen, and (where this host has
// mmdebstrap and the builder VM would run under TCG) the faster build.
func setupFix(arch vmspec.Arch) string {
	fix := vmspec.SetupCommand(arch)
	method, err := image.Method(arch)
	if err != nil {
		return err.Error()
	}
	if missing := image.MissingTools(); method == image.MethodHostTools && len(missing) > 0 {
		return fix + " (it installs " + strings.Join(missing, ", ") + " for " + image.MethodEnv + "=" + image.MethodHostTools + ")"
	}
	if hint := builderHint(arch); hint != "" {
		return fix + "; " + hint
	}
	return fix
}

// builderHint is what to know before a portable build under TCG on a host
// that could build with its own mmdebstrap instead; "" otherwise.
// Measured on 2 Dec 2026 on the 2-core development VM, TCG, QEMU 7.2.22
// (bench image): the builder VM 1,130 s, mmdebstrap 190 s.
func builderHint(arch vmspec.Arch) string {
	method, err := image.Method(arch)
	if err != nil || method != image.MethodPortable || image.Foreign(arch) || len(image.MissingTools()) > 0 {
		return ""
	}
	var dir string
	if m, err := manager(); err == nil {
		dir = m.Paths.Home
	}
	accel, err := qemu.ChooseAccel(qemu.DetectHostIn(dir), arch, vmm.Accel(os.Getenv("KOSA8_ACCEL")))
	if err != nil || accel != vmm.TCG {
		return ""
	}
	return "its builder VM runs under TCG here: 20-30 minutes on 2 cores; this host has mmdebstrap, and " +
		image.MethodEnv + "=" + image.MethodHostTools + " kosa8 setup builds with it in about 3 minutes (190 s against 1,130 s, measured on a 2-core TCG host)"
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
	add(imageCheck(image.Store{Dir: m.Paths.Cache}, arch))
	add(foreignCheck(m, arch))
	add(ramCheck())
	return out
}

// imageCheck says whether arch's image is built, being built (by whom,
// since when, its log), or how to build it.
func imageCheck(store image.Store, arch vmspec.Arch) check {
	img, err := store.Lookup(image.DefaultRecipe(arch))
	if err == nil {
		return check{Name: "image", OK: true, Detail: fmt.Sprintf("%s, kernel %s, built %s", filepath.Base(img.Dir), img.Manifest.KernelVersion, ago(img.Manifest.Built))}
	}
	if b, ok := store.BuildingNow(arch); ok {
		return check{Name: "image", Waiting: true, Detail: "not ready: " + b.String(), Fix: b.Wait()}
	}
	return check{Name: "image", Detail: "not built for " + string(arch), Fix: setupFix(arch)}
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
	why := strings.TrimRight(oneLine(h.WhyNot(arch), 2048), ". ")
	c := check{Name: "acceleration", OK: true, Warn: true, Detail: "tcg: " + why + "; " + vmm.IsolationWarning}
	c.Fix = accelFix(h, runtime.GOOS, fileExists("/dev/kvm"), os.Geteuid())
	return c
}

// accelFix is what to do about a host whose sandboxes run under TCG: the
// probe's reason first (a recorded boot failure means something only where
// the probe passed).
func accelFix(h qemu.Host, goos string, kvmNode bool, euid int) string {
	switch {
	case goos == "darwin":
		return "use an Apple silicon Mac with macOS 12 or later"
	case !kvmNode:
		return "enable virtualization: turn it on in the firmware (or the cloud VM's nested virtualization), and load kvm_intel or kvm_amd"
	case !h.KVMUsable && euid != 0 && strings.Contains(h.KVMReason, "permission denied"):
		return "/dev/kvm exists but is not usable by you: add yourself to its group (usually kvm) and log in again"
	case h.KVMUsable && len(h.Failed) > 0:
		return "this host's KVM cannot boot a standard guest (common on nested, paravirtualized cloud VMs): run kosa8 on a host with full nested virtualization or on bare metal; the record is forgotten at the next reboot"
	default:
		return "this host's /dev/kvm cannot run a guest (common on nested, paravirtualized cloud VMs): run kosa8 on a host with full nested virtualization or on bare metal"
	}
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
					printCheck(os.Stdout, c)
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

// doctorWidth is the width doctor's text is wrapped to.
const doctorWidth = 100

// printCheck prints one check: its mark, name and detail, then its fix,
// wrapped under the detail's column (a QEMU message of several lines, or
// a long one, stays inside it).
func printCheck(w io.Writer, c check) {
	mark := "ok  "
	switch {
	case c.Waiting:
		mark = "wait"
	case !c.OK:
		mark = "FAIL"
	case c.Warn:
		mark = "warn"
	}
	indent := strings.Repeat(" ", 20)
	lines := wrapWords(sanitize(c.Detail, false), doctorWidth-len(indent))
	fmt.Fprintf(w, "%s  %-13s %s\n", mark, c.Name, lines[0])
	for _, l := range lines[1:] {
		fmt.Fprintf(w, "%s%s\n", indent, l)
	}
	if c.Fix != "" && (!c.OK || c.Warn) {
		for _, l := range wrapWords("fix: "+sanitize(c.Fix, false), doctorWidth-len(indent)) {
			fmt.Fprintf(w, "%s%s\n", indent, l)
		}
	}
}

// wrapWords breaks s at spaces into lines of at most width (a longer
// word gets a line of its own); newlines in s are spaces.
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return append(lines, line)
}
