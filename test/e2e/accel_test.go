package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeQEMU writes a QEMU wrapper that, when asked for KVM, says so on its
// standard error (which the supervisor log keeps) and fails the way nested,
// paravirtualized hosts do: "die" exits at once with QEMU's own message,
// "hang" never greets. Otherwise it runs the real QEMU. It returns the
// environment that selects it, on a state directory of the test's own (the
// failure record lives there). The wrapper's folder is world-readable: a
// confined QEMU runs as a uid of its own.
func fakeQEMU(t *testing.T, mode string) (env []string, home string) {
	t.Helper()
	requireNativeGuest(t, "the fallback from KVM is tested with the host's own QEMU")
	real, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/tmp", "kosa8-fake-qemu-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/sh
case " $* " in
*" -accel kvm "*)
	echo "fake-qemu: kvm attempt" >&2
	case "` + mode + `" in
	die) echo "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x2000000e1" >&2; exit 1 ;;
	hang) exec sleep 600 ;;
	esac ;;
esac
exec ` + real + ` "$@"
`
	bin := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	home = t.TempDir()
	return []string{
		"KOSA8_QEMU=" + bin,
		"KOSA8_TEST_ASSUME_KVM=1",
		"KOSA8_ACCEL=",
		"KOSA8_HOME=" + home,
		"KOSA8_CONFIG=" + filepath.Join(home, "config"),
	}, home
}

func runEnv(t *testing.T, env []string, timeout time.Duration, args ...string) result {
	t.Helper()
	return invocation{env: env, timeout: timeout}.run(t, args...)
}

// kvmAttempts counts the fake QEMU's KVM attempts in a kept sandbox's
// supervisor log.
func kvmAttempts(t *testing.T, home, name string) int {
	b, err := os.ReadFile(filepath.Join(home, "sandboxes", name, "supervisor.log"))
	if err != nil {
		t.Fatal(err)
	}
	// QEMU's own lines are logged as msg=qemu; errors quoting them are not.
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "msg=qemu ") && strings.Contains(line, "fake-qemu: kvm attempt") {
			n++
		}
	}
	return n
}

// runKept runs a command in a new sandbox that is stopped, not removed, so
// its supervisor log can be read; it is removed at the test's end.
func runKept(t *testing.T, env []string, name string, args ...string) result {
	t.Helper()
	t.Cleanup(func() { runEnv(t, env, time.Minute, "rm", "-f", name) })
	return runEnv(t, env, 4*time.Minute, append([]string{"run", "--name", name, "--no-workspace", "--"}, args...)...)
}

// A KVM that passes the probe but whose QEMU dies: the sandbox boots under
// TCG, says why, doctor reports it, and the next start does not try KVM.
func TestAccelFallbackWhenQEMUDies(t *testing.T) {
	env, home := fakeQEMU(t, "die")
	r := runKept(t, env, "die1", "echo", "booted")
	if r.code != 0 || !strings.Contains(r.stdout, "booted") {
		t.Fatalf("run did not fall back to tcg:\n%s", r)
	}
	if !strings.Contains(r.stderr, "fell back to tcg") || !strings.Contains(r.stderr, "MSR 0x10a") {
		t.Errorf("run does not say why it fell back:\n%s", r.stderr)
	}
	if n := kvmAttempts(t, home, "die1"); n != 1 {
		t.Errorf("%d attempts under kvm, want 1", n)
	}
	d := runEnv(t, env, time.Minute, "doctor")
	if !strings.Contains(d.stdout, "failed to boot a sandbox") || !strings.Contains(d.stdout, "MSR 0x10a") {
		t.Errorf("doctor does not report the failed boot:\n%s", d)
	}
	if !strings.HasSuffix(d.stdout, "\n") {
		t.Errorf("doctor's output does not end with a newline: %q", d.stdout)
	}
	// QEMU's message of several lines stays inside doctor's layout: every
	// line but a check's first is indented, and no sentence ends twice.
	for _, line := range strings.Split(strings.TrimSuffix(d.stdout, "\n"), "\n") {
		if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "ok ") && !strings.HasPrefix(line, "warn ") && !strings.HasPrefix(line, "FAIL ") && !strings.HasPrefix(line, "wait ") {
			t.Errorf("doctor's layout broken by %q", line)
		}
	}
	if strings.Contains(d.stdout, "..") && !strings.Contains(d.stdout, "../") {
		t.Errorf("doctor says %q", d.stdout)
	}
	r = runKept(t, env, "die2", "echo", "again")
	if r.code != 0 || !strings.Contains(r.stdout, "again") {
		t.Fatalf("second run:\n%s", r)
	}
	// Said in full once: now one short line.
	if strings.Contains(r.stderr, "MSR 0x10a") || strings.Count(r.stderr, "kosa8: warning:") != 1 || !strings.Contains(r.stderr, "kvm failed to boot a sandbox here earlier") {
		t.Errorf("the second run's warning is not one short line:\n%s", r.stderr)
	}
	if n := kvmAttempts(t, home, "die2"); n != 0 {
		t.Errorf("the second run tried kvm again (%d attempts)", n)
	}
}

// Forced KVM is never replaced by TCG: the error shows QEMU's message and
// how to go on.
func TestAccelForcedKVMFails(t *testing.T) {
	env, _ := fakeQEMU(t, "die")
	env = append(env, "KOSA8_ACCEL=kvm")
	r := runEnv(t, env, 3*time.Minute, "run", "--rm", "--no-workspace", "--", "true")
	if r.code == 0 {
		t.Fatalf("forced kvm with a failing QEMU succeeded:\n%s", r)
	}
	for _, want := range []string{"MSR 0x10a", "KOSA8_ACCEL=tcg"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the error does not mention %q:\n%s", want, r.stderr)
		}
	}
}

// A KVM under which the guest hangs: the boot is given up after a bounded
// time and the sandbox runs under TCG.
func TestAccelFallbackWhenGuestHangs(t *testing.T) {
	env, home := fakeQEMU(t, "hang")
	start := time.Now()
	r := runKept(t, env, "hang1", "echo", "booted")
	if r.code != 0 || !strings.Contains(r.stdout, "booted") {
		t.Fatalf("run did not fall back to tcg:\n%s", r)
	}
	if !strings.Contains(r.stderr, "fell back to tcg") {
		t.Errorf("run does not say it fell back:\n%s", r.stderr)
	}
	if n := kvmAttempts(t, home, "hang1"); n != 1 {
		t.Errorf("%d attempts under kvm, want 1", n)
	}
	t.Logf("hung kvm, then tcg: %v", time.Since(start))
}
