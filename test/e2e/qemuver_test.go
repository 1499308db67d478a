package e2e

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// twoQEMUs returns an older and a newer QEMU (binary and version line):
// KOSA8_QEMU_OLD (default: qemu-system-x86_64 in PATH, Debian 12's 7.2) and
// KOSA8_QEMU_NEW (default: /opt/qemu10/usr/bin/qemu-system-x86_64, where
// .ci/qemu10.sh unpacks bookworm-backports' 10.x).
func twoQEMUs(t *testing.T) (oldBin, oldLine, newBin, newLine string) {
	t.Helper()
	requireNativeGuest(t, "the two QEMU releases tested are x86-64's")
	oldBin, newBin = os.Getenv("KOSA8_QEMU_OLD"), os.Getenv("KOSA8_QEMU_NEW")
	if oldBin == "" {
		oldBin, _ = exec.LookPath("qemu-system-x86_64")
	}
	if newBin == "" {
		newBin = "/opt/qemu10/usr/bin/qemu-system-x86_64"
	}
	line := func(bin string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, "--version").Output()
		if err != nil {
			return ""
		}
		return strings.SplitN(string(out), "\n", 2)[0]
	}
	oldLine, newLine = line(oldBin), line(newBin)
	if oldLine == "" || newLine == "" || oldLine == newLine {
		t.Skipf("needs two QEMU releases (KOSA8_QEMU_OLD=%q: %q, KOSA8_QEMU_NEW=%q: %q): run .ci/qemu10.sh to add 10.x beside the system's", oldBin, oldLine, newBin, newLine)
	}
	return oldBin, oldLine, newBin, newLine
}

// TestBoot2GiB boots a guest of exactly 2 GiB under the QEMU of this run
// (KOSA8_QEMU): under Debian's QEMU 10 with SeaBIOS's microvm firmware its
// initramfs was overwritten (see internal/vmm/qemu/cmdline.go). The sizes
// around it take the other paths of the firmware's initrd placement.
func TestBoot2GiB(t *testing.T) {
	for _, mem := range []string{"2G", "2040M", "3G"} {
		// The failure this guards against is quick (the agent's handshake
		// breaks); the deadline only bounds a boot on a loaded TCG host.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := kosa8Cmd(ctx, "run", "--rm", "--no-workspace", "--memory", mem, "--", "sh", "-c", "free -m | awk '/Mem:/{print $2}'")
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("a %s guest did not boot: %v\n%s", mem, err, out)
		}
		t.Logf("%s guest: %s", mem, strings.TrimSpace(string(out)))
	}
}

// TestCheckpointAcrossQEMUUpgrade saves checkpoints under one QEMU release
// and starts and rewinds them under another, both ways, with 2 GiB guests
// (the size that once failed to boot under QEMU 10): each either loads the
// machine (same build) or boots from the checkpoint's disks and says so;
// never a hang or a guest with mixed state.
func TestCheckpointAcrossQEMUUpgrade(t *testing.T) {
	oldBin, oldLine, newBin, newLine := twoQEMUs(t)
	t.Logf("old: %s (%s); new: %s (%s)", oldLine, oldBin, newLine, newBin)
	withOld, withNew := []string{"KOSA8_QEMU=" + oldBin}, []string{"KOSA8_QEMU=" + newBin}
	mustWith := func(env []string, args ...string) result {
		t.Helper()
		r := runWith(t, env, args...)
		if r.code != 0 {
			t.Fatalf("kosa8 %v (%s) failed:\n%s", args, env, r)
		}
		return r
	}
	file := func(name string) string {
		t.Helper()
		return must(t, "exec", name, "--", "sh", "-c", "cat ~/f").stdout
	}
	// counting reports whether the counter process runs (its count grows).
	counting := func(name string) bool {
		t.Helper()
		get := func() string {
			return run(t, "", "exec", name, "--", "sh", "-c", "cat /tmp/count 2>/dev/null").stdout
		}
		a := get()
		time.Sleep(1500 * time.Millisecond)
		return get() != a
	}
	startCounter := func(name string) {
		t.Helper()
		must(t, "exec", name, "--", "sh", "-c", counter)
		must(t, "exec", name, "--", "sh", "-c", "for i in $(seq 300); do [ -e /tmp/count ] && exit 0; sleep 0.1; done; exit 1")
	}

	name := "qemuver"
	mustWith(withOld, "create", name, "--no-workspace", "--memory", "2G")
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	mustWith(withOld, "start", name)
	r := must(t, "exec", name, "--", "sh", "-c", "free -m | awk '/Mem:/{print $2}'")
	if mib, err := strconv.Atoi(strings.TrimSpace(r.stdout)); err != nil || mib < 1900 || mib > 2048 {
		t.Fatalf("guest memory %q MiB, want about 2 GiB", r.stdout)
	}
	startCounter(name)
	must(t, "exec", name, "--", "sh", "-c", "echo one > ~/f") // not synced: the checkpoint syncs its disks
	cpOld := checkpointNow(t, name, "under the old QEMU")
	must(t, "exec", name, "--", "sh", "-c", "echo two > ~/f && sync")
	must(t, "stop", name)

	// Upgrade: the old build's machine cannot be loaded, its disks can.
	r = mustWith(withNew, "start", "--from", cpOld.ID, name)
	if !strings.Contains(r.stderr, "booted from its disks") || !strings.Contains(r.stderr, "saved by") {
		t.Fatalf("start --from a checkpoint of another QEMU does not say it booted from disks:\n%s", r)
	}
	if got := file(name); got != "one\n" {
		t.Fatalf("after the cold boot under the new QEMU, ~/f = %q, want the checkpoint's \"one\"", got)
	}
	if counting(name) {
		t.Fatal("a process of the old machine runs after a cold boot: its memory was loaded into another QEMU")
	}

	// Same build: a checkpoint made under the new QEMU loads, processes and all.
	startCounter(name)
	cpNew := checkpointNow(t, name, "under the new QEMU")
	must(t, "exec", name, "--", "sh", "-c", "echo three > ~/f && sync")
	r = must(t, "rewind", name, cpOld.ID)
	if !strings.Contains(r.stderr, "another QEMU build") {
		t.Fatalf("rewind to the old QEMU's checkpoint does not say it booted from disks:\n%s", r)
	}
	if got := file(name); got != "one\n" {
		t.Fatalf("after rewinding to the old checkpoint, ~/f = %q", got)
	}
	r = must(t, "rewind", name, cpNew.ID)
	if strings.Contains(r.stderr, "another QEMU build") {
		t.Fatalf("a checkpoint of the running QEMU was booted cold:\n%s", r)
	}
	// Counting again within 30 s: on a loaded host the restored guest's
	// python may not run within one short window.
	back := false
	for deadline := time.Now().Add(30 * time.Second); !back && time.Now().Before(deadline); {
		back = counting(name)
	}
	if !back {
		t.Fatal("rewind to the new QEMU's own checkpoint did not bring its counter back")
	}
	must(t, "stop", name)

	// Downgrade: the new build's checkpoint under the old QEMU, from its disks.
	r = mustWith(withOld, "start", "--from", cpNew.ID, name)
	if !strings.Contains(r.stderr, "booted from its disks") {
		t.Fatalf("start --from a newer QEMU's checkpoint under the old one:\n%s", r)
	}
	if got := file(name); got != "one\n" {
		t.Fatalf("after the downgrade, ~/f = %q, want \"one\" (the disks of %s)", got, cpNew.ID)
	}
	if counting(name) {
		t.Fatal("the newer QEMU's machine was loaded by the older one")
	}
}
