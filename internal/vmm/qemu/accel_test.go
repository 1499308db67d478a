package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

func TestChooseAccel(t *testing.T) {
	linux := func(kvm bool) Host {
		h := Host{GOOS: "linux", Arch: vmspec.AMD64, KVMUsable: kvm}
		if !kvm {
			h.KVMReason = "the test guest stopped with failed VM entry instead of writing to an I/O port"
		}
		return h
	}
	mac := func(hvf bool) Host { return Host{GOOS: "darwin", Arch: vmspec.ARM64, HVFUsable: hvf} }
	kvmFailed := linux(true)
	kvmFailed.Failed = map[vmm.Accel]Failure{vmm.KVM: {Reason: "qemu exited: failed to set MSR 0x10a"}}
	hvfFailed := mac(true)
	hvfFailed.Failed = map[vmm.Accel]Failure{vmm.HVF: {Reason: "timeout"}}
	cases := []struct {
		name string
		host Host
		arch vmspec.Arch
		ask  vmm.Accel
		want vmm.Accel
		err  string
	}{
		{"linux with kvm", linux(true), vmspec.AMD64, "", vmm.KVM, ""},
		{"linux whose kvm runs no guest", linux(false), vmspec.AMD64, "", vmm.TCG, ""},
		{"linux foreign arch", linux(true), vmspec.ARM64, "", vmm.TCG, ""},
		{"kvm failed a boot earlier", kvmFailed, vmspec.AMD64, "", vmm.TCG, ""},
		{"kvm failed a boot earlier but asked for", kvmFailed, vmspec.AMD64, vmm.KVM, vmm.KVM, ""},
		{"mac with hvf", mac(true), vmspec.ARM64, "", vmm.HVF, ""},
		{"mac without hvf", mac(false), vmspec.ARM64, "", vmm.TCG, ""},
		{"hvf failed a boot earlier", hvfFailed, vmspec.ARM64, "", vmm.TCG, ""},
		{"asked tcg on kvm host", linux(true), vmspec.AMD64, vmm.TCG, vmm.TCG, ""},
		{"asked kvm without it", linux(false), vmspec.AMD64, vmm.KVM, "", "failed VM entry"},
		{"asked kvm without it says how to go on", linux(false), vmspec.AMD64, vmm.KVM, "", "KOSA8_ACCEL=tcg"},
		{"asked hvf on linux", linux(true), vmspec.AMD64, vmm.HVF, "", "not available"},
		{"asked kvm foreign arch", linux(true), vmspec.ARM64, vmm.KVM, "", "cannot run"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseAccel(tc.host, tc.arch, tc.ask)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ChooseAccel = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestWhyNot(t *testing.T) {
	h := Host{GOOS: "linux", Arch: vmspec.AMD64, KVMReason: "/dev/kvm does not exist"}
	if got := h.WhyNot(vmspec.AMD64); !strings.Contains(got, "/dev/kvm does not exist") {
		t.Errorf("WhyNot = %q", got)
	}
	h = Host{GOOS: "linux", Arch: vmspec.AMD64, KVMUsable: true}
	if got := h.WhyNot(vmspec.AMD64); got != "" {
		t.Errorf("WhyNot with kvm = %q", got)
	}
	h.Failed = map[vmm.Accel]Failure{vmm.KVM: {Reason: "MSR 0x10a"}}
	if got := h.WhyNot(vmspec.AMD64); !strings.Contains(got, "MSR 0x10a") || !strings.Contains(got, "failed to boot") {
		t.Errorf("WhyNot after a failed boot = %q", got)
	}
}

func TestFailureRecord(t *testing.T) {
	if bootID() == "" {
		t.Skip("this host names no boot id: failures are never remembered")
	}
	dir := t.TempDir()
	if f := readFailures(dir); len(f) != 0 {
		t.Fatalf("failures in an empty dir: %v", f)
	}
	long := strings.Repeat("x", 3*maxReason)
	if err := RecordFailure(dir, vmm.KVM, long); err != nil {
		t.Fatal(err)
	}
	f, ok := readFailures(dir)[vmm.KVM]
	if !ok || len(f.Reason) != maxReason {
		t.Fatalf("recorded failure: %v %d", ok, len(f.Reason))
	}
	if _, ok := readFailures(dir)[vmm.HVF]; ok {
		t.Fatal("a kvm failure counted for hvf")
	}
	// Read only from a file at its name, never through a link.
	elsewhere := filepath.Join(t.TempDir(), "failure.json")
	if err := os.Rename(failureFile(dir, vmm.KVM), elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, failureFile(dir, vmm.KVM)); err != nil {
		t.Fatal(err)
	}
	if _, ok := readFailures(dir)[vmm.KVM]; ok {
		t.Fatal("a failure read through a link")
	}
	if err := os.Rename(elsewhere, failureFile(dir, vmm.KVM)); err != nil { // the link replaced by the file again
		t.Fatal(err)
	}
	if _, ok := readFailures(dir)[vmm.KVM]; !ok {
		t.Fatal("the recorded failure, back at its name, is not read")
	}
	// A failure from another boot of the host is forgotten.
	if err := os.WriteFile(failureFile(dir, vmm.KVM), []byte(`{"boot_id":"another boot","reason":"old"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := readFailures(dir)[vmm.KVM]; ok {
		t.Fatal("a failure of an earlier boot is still in force")
	}
	if err := RecordFailure(dir, vmm.KVM, "again"); err != nil {
		t.Fatal(err)
	}
	if err := ClearFailure(dir, vmm.KVM); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(failureFile(dir, vmm.KVM)); !os.IsNotExist(err) {
		t.Fatalf("cleared failure still on disk: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".accel-*")); len(m) != 0 {
		t.Fatalf("temporary files left: %v", m)
	}
}
