package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// While a build holds the image lock, doctor (and a command needing the
// image) says a build is under way, since when and its log, not "run kosa8
// setup"; without one it says how to build, with no Go slice brackets and
// no tool the default build does not need.
func TestImageCheckDuringBuild(t *testing.T) {
	fakeHome(t)
	t.Setenv(image.MethodEnv, "")
	cache := t.TempDir()
	store := image.Store{Dir: cache}
	arch := vmspec.HostArch()
	c := imageCheck(store, arch)
	if c.OK || c.Waiting || c.Detail != "not built for "+string(arch) || !strings.HasPrefix(c.Fix, "kosa8 setup") || strings.ContainsAny(c.Fix, "[]") || strings.Contains(c.Fix, "needs") {
		t.Fatalf("no image: %+v", c)
	}
	dir := filepath.Join(cache, "images", string(arch))
	os.MkdirAll(dir, 0o755)
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	started := time.Now().Add(-12 * time.Minute).UTC().Format(time.RFC3339)
	lock.WriteString(`{"pid":4242,"started":"` + started + `","log":"/cache/image-build.log"}`)
	// The lock is held by this process's other descriptor: BuildingNow
	// opens its own, as another process would.
	c = imageCheck(store, arch)
	if c.OK || !c.Waiting || !strings.Contains(c.Detail, "being built now") || !strings.Contains(c.Detail, "12m0s ago, process 4242") ||
		!strings.Contains(c.Fix, "tail -f /cache/image-build.log") {
		t.Fatalf("during a build: %+v", c)
	}
	var b strings.Builder
	printCheck(&b, c)
	if !strings.HasPrefix(b.String(), "wait  image ") {
		t.Fatalf("printed %q", b.String())
	}
	if _, err := store.Lookup(image.DefaultRecipe(arch)); err == nil || !strings.Contains(err.Error(), "being built now") || strings.Contains(err.Error(), "run 'kosa8 setup'") {
		t.Fatalf("Lookup during a build: %v", err)
	}
	syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if c := imageCheck(store, arch); c.Waiting {
		t.Fatalf("after the build: %+v", c)
	}
}

// Where the builder VM would run under TCG and the host has mmdebstrap,
// setup's advice names the faster build and its measured time.
func TestSetupFixNamesTheFasterBuilder(t *testing.T) {
	fakeHome(t)
	t.Setenv(image.MethodEnv, "")
	t.Setenv("KOSA8_ACCEL", "tcg")
	bin := t.TempDir()
	for tool := range image.Tools {
		os.WriteFile(filepath.Join(bin, tool), []byte("#!/bin/sh\n"), 0o755)
	}
	t.Setenv("PATH", bin)
	fix := setupFix(vmspec.HostArch())
	if !strings.Contains(fix, "KOSA8_IMAGE_BUILDER=mmdebstrap kosa8 setup") || !strings.Contains(fix, "about 3 minutes") || !strings.Contains(fix, "20-30 minutes") {
		t.Fatalf("with mmdebstrap, under tcg: %q", fix)
	}
	os.Remove(filepath.Join(bin, "mmdebstrap"))
	if fix := setupFix(vmspec.HostArch()); fix != "kosa8 setup" {
		t.Fatalf("without mmdebstrap: %q", fix)
	}
}

// doctor's fix for a TCG host follows the probe first: a host whose KVM
// the probe refuses gets the probe's fix even where a boot failure was
// recorded earlier (that record's "forgotten at the next reboot" is about
// a KVM that passes the probe and then fails a sandbox).
func TestAccelFixFollowsTheProbe(t *testing.T) {
	failed := map[vmm.Accel]qemu.Failure{vmm.KVM: {BootID: "b", Reason: "MSR 0x10a"}}
	cases := []struct {
		name string
		h    qemu.Host
		node bool
		euid int
		want string
	}{
		{"no /dev/kvm", qemu.Host{}, false, 0, "enable virtualization"},
		{"probe refused, record kept", qemu.Host{KVMReason: "API version", Failed: failed}, true, 0, "cannot run a guest"},
		{"not in the group", qemu.Host{KVMReason: "open /dev/kvm: permission denied"}, true, 1000, "add yourself to its group"},
		{"probe passed, sandbox failed", qemu.Host{KVMUsable: true, Failed: failed}, true, 0, "forgotten at the next reboot"},
	}
	for _, c := range cases {
		if got := accelFix(c.h, "linux", c.node, c.euid); !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q in it", c.name, got, c.want)
		}
	}
	if got := accelFix(qemu.Host{}, "darwin", false, 501); !strings.Contains(got, "Apple silicon") {
		t.Errorf("darwin: %q", got)
	}
}
