package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestRunShowsGuestKernelAndExitStatus(t *testing.T) {
	host, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, "", "run", "--rm", "--", "uname", "-r")
	if r.code != 0 {
		t.Fatalf("run failed:\n%s", r)
	}
	guest := strings.TrimSpace(r.stdout)
	if guest == "" || guest == strings.TrimSpace(string(host)) {
		t.Fatalf("guest kernel %q vs host %q: the command did not run in the VM", guest, host)
	}
	if !strings.Contains(guest, "cloud") {
		t.Errorf("guest kernel %q is not Debian's cloud kernel", guest)
	}
	if _, err := os.Stat("/dev/kvm"); err != nil && !strings.Contains(r.stderr, "not a security boundary") {
		t.Errorf("running under TCG without saying so; stderr: %q", r.stderr)
	}

	r = run(t, "", "run", "--rm", "--", "sh", "-c", "exit 42")
	if r.code != 42 {
		t.Fatalf("exit status not propagated:\n%s", r)
	}

	// The first command finds the root filesystem grown to the disk asked
	// for (it grows in the background during the boot; a command waits).
	r = run(t, "", "run", "--rm", "--disk", "6G", "--", "stat", "-f", "-c", "%b %S", "/")
	var blocks, bsize int64
	if _, err := fmt.Sscan(r.stdout, &blocks, &bsize); err != nil || r.code != 0 {
		t.Fatalf("stat -f /: %v\n%s", err, r)
	}
	if got := blocks * bsize; got < 5<<30 || got > 6<<30 {
		t.Errorf("the root filesystem is %d MiB on a 6 GiB disk", got>>20)
	}
	if n := len(ls(t)); n != 0 {
		t.Fatalf("--rm left %d sandboxes behind", n)
	}
}

func TestExec(t *testing.T) {
	name := sandbox(t, "exec")

	t.Run("streams", func(t *testing.T) {
		r := run(t, "", "exec", name, "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 3")
		if r.code != 3 || r.stdout != "to-out\n" || !strings.HasSuffix(r.stderr, "to-err\n") {
			t.Fatalf("stdout/stderr/exit not separate:\n%s", r)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		input := strings.Repeat("line of input\n", 2000)
		r := run(t, input, "exec", "-i", name, "--", "sha256sum")
		want, _ := exec.Command("sh", "-c", "printf '%s' \"$0\" | sha256sum", input).Output()
		if r.code != 0 || r.stdout != string(want) {
			t.Fatalf("stdin did not arrive whole: got %q want %q\n%s", r.stdout, want, r)
		}
	})
	t.Run("env and cwd", func(t *testing.T) {
		r := must(t, "exec", "-e", "FOO=bar baz", "-w", "/tmp", name, "--", "sh", "-c", `echo "$FOO|$(pwd)|$HOME" && test "$HOME" = "/home/$USER"`)
		if r.stdout != "bar baz|/tmp|/home/"+guestUser()+"\n" {
			t.Fatalf("env/cwd: %q", r.stdout)
		}
	})
	t.Run("user", func(t *testing.T) {
		r := must(t, "exec", name, "--", "id", "-un")
		if strings.TrimSpace(r.stdout) != guestUser() {
			t.Fatalf("default user %q, want %q", r.stdout, guestUser())
		}
		r = must(t, "exec", name, "--", "id", "-u")
		want := os.Getuid()
		if want == 0 {
			want = 1000 // root on the host gets an unprivileged user inside
		}
		if strings.TrimSpace(r.stdout) != fmt.Sprint(want) {
			t.Fatalf("default user uid %q, want %d", r.stdout, want)
		}
		r = must(t, "exec", name, "--", "sudo", "-n", "id", "-u")
		if strings.TrimSpace(r.stdout) != "0" {
			t.Fatalf("passwordless sudo: %q", r.stdout)
		}
		r = must(t, "exec", "-u", "root", name, "--", "id", "-u")
		if strings.TrimSpace(r.stdout) != "0" {
			t.Fatalf("--user root: %q", r.stdout)
		}
	})
	t.Run("missing command", func(t *testing.T) {
		r := run(t, "", "exec", name, "--", "no-such-command")
		if r.code == 0 || !strings.Contains(r.stderr, "command not found") {
			t.Fatalf("missing command:\n%s", r)
		}
	})
	t.Run("signal", func(t *testing.T) {
		cmd := kosa8Cmd(t.Context(), "exec", name, "--", "sh", "-c", "echo started; exec sleep 60")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 8)
		if _, err := out.Read(buf); err != nil || !strings.HasPrefix(string(buf), "started") {
			t.Fatalf("no output before signal: %q %v", buf, err)
		}
		start := time.Now()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		err = cmd.Wait()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 143 {
			t.Fatalf("SIGTERM did not reach the guest process: %v", err)
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("signal took %s", time.Since(start))
		}
	})
	t.Run("tty", func(t *testing.T) {
		r := must(t, "exec", "-t", name, "--", "sh", "-c", "tty; test -t 1 && echo interactive")
		if !strings.Contains(r.stdout, "/dev/pts/") || !strings.Contains(r.stdout, "interactive") {
			t.Fatalf("no terminal: %q", r.stdout)
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		const n = 8
		var wg sync.WaitGroup
		results := make([]result, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = run(t, "", "exec", name, "--", "sh", "-c", fmt.Sprintf("sleep 0.$((RANDOM %% 5)); echo %d", i))
			}()
		}
		wg.Wait()
		for i, r := range results {
			if r.code != 0 || strings.TrimSpace(r.stdout) != fmt.Sprint(i) {
				t.Errorf("exec %d: %s", i, r)
			}
		}
	})
}

func TestStopStartKeepsRootDisk(t *testing.T) {
	name := sandbox(t, "persist")
	must(t, "exec", name, "--", "sh", "-c", "echo kept > ~/marker && sudo sh -c 'echo system > /etc/kosa8-marker'")
	must(t, "stop", name)
	if st := ls(t)[name].State; st != "stopped" {
		t.Fatalf("after stop: state %q", st)
	}
	r := run(t, "", "exec", name, "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "kosa8 start") {
		t.Fatalf("exec in a stopped sandbox:\n%s", r)
	}
	must(t, "start", name)
	r = must(t, "exec", name, "--", "sh", "-c", "cat ~/marker /etc/kosa8-marker")
	if r.stdout != "kept\nsystem\n" {
		t.Fatalf("root disk lost files across stop/start: %q", r.stdout)
	}
}

func TestTwoSandboxesAtOnce(t *testing.T) {
	names := []string{"twin-a", "twin-b"}
	for _, n := range names {
		must(t, "create", n)
		t.Cleanup(func() { run(t, "", "rm", "-f", n) })
	}
	var wg sync.WaitGroup
	errs := make([]result, 2)
	for i, n := range names {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = run(t, "", "start", n) }()
	}
	wg.Wait()
	for i, r := range errs {
		if r.code != 0 {
			t.Fatalf("start %s:\n%s", names[i], r)
		}
	}
	must(t, "exec", names[0], "--", "sh", "-c", "echo only-in-a > /tmp/x")
	for _, n := range names {
		r := must(t, "exec", n, "--", "hostname")
		if strings.TrimSpace(r.stdout) != n {
			t.Errorf("hostname in %s: %q", n, r.stdout)
		}
	}
	if r := run(t, "", "exec", names[1], "--", "cat", "/tmp/x"); r.code == 0 {
		t.Fatalf("a file written in %s is visible in %s", names[0], names[1])
	}
}

func TestRmRemovesEverything(t *testing.T) {
	must(t, "create", "gone")
	must(t, "start", "gone")
	dir := ls(t)["gone"].Dir
	r := run(t, "", "rm", "gone")
	if r.code == 0 || !strings.Contains(r.stderr, "rm -f") {
		t.Fatalf("rm of a running sandbox without -f:\n%s", r)
	}
	must(t, "rm", "-f", "gone")
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("state directory %s still there: %v", dir, err)
	}
	if _, ok := ls(t)["gone"]; ok {
		t.Fatal("ls still lists the removed sandbox")
	}
	// Its own staging and trash folders: another test's kill -9 may leave
	// one of another sandbox's, swept after ten minutes.
	leftovers, _ := filepath.Glob(filepath.Join(home, "sandboxes", ".*-gone-*"))
	if len(leftovers) != 0 {
		t.Fatalf("leftovers in the sandboxes directory: %v", leftovers)
	}
}

func TestSupervisorKillLeavesNoOrphan(t *testing.T) {
	supervisorKillLeavesNoOrphan(t, "crashy", nil)
}

// The same with the parent-death signal switched off: QEMU's watchdog,
// the mechanism macOS relies on, must do it.
func TestSupervisorKillLeavesNoOrphanWatchdog(t *testing.T) {
	supervisorKillLeavesNoOrphan(t, "crashy-dog", []string{"KOSA8_TEST_NO_PDEATHSIG=1"})
}

func supervisorKillLeavesNoOrphan(t *testing.T, name string, env []string) {
	if r := runWith(t, env, "create", name); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	if r := runWith(t, env, "start", name); r.code != 0 {
		t.Fatalf("start: %s", r)
	}
	must(t, "exec", name, "--", "sh", "-c", "echo before-crash > ~/f && sync")
	e := ls(t)[name]
	if e.Status.QEMUPID == 0 || !processRunning(e.Status.QEMUPID) {
		t.Fatalf("QEMU pid %d not running before the kill", e.Status.QEMUPID)
	}
	if err := syscall.Kill(e.Status.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// QEMU's parent-death signal fires when the supervisor thread that
	// started it exits, which can be before the last of the supervisor's
	// threads lets go of its files (and its lock): wait for both.
	deadline := time.Now().Add(10 * time.Second)
	for processRunning(e.Status.QEMUPID) || processRunning(e.Status.SupervisorPID) {
		if time.Now().After(deadline) {
			t.Fatalf("QEMU (pid %d, running %v) or its supervisor (pid %d, running %v) still up 10 s after the kill",
				e.Status.QEMUPID, processRunning(e.Status.QEMUPID), e.Status.SupervisorPID, processRunning(e.Status.SupervisorPID))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The leader thread shows as a zombie while the supervisor's other
	// threads still close its files, the lock among them: give that a
	// moment before the state must say crashed.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st := ls(t)[name].State
		if st == "crashed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after kill -9 of the supervisor: state %q 10 s on, want crashed", st)
		}
	}
	must(t, "start", name)
	if r := must(t, "exec", name, "--", "sh", "-c", "cat ~/f"); r.stdout != "before-crash\n" {
		t.Fatalf("disk after crash and restart: %q", r.stdout)
	}
}

func TestBadInput(t *testing.T) {
	must(t, "create", "taken")
	t.Cleanup(func() { run(t, "", "rm", "-f", "taken") })
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"name taken", nil, []string{"create", "taken"}, "already exists"},
		{"invalid name", nil, []string{"create", "../escape"}, "invalid sandbox name"},
		{"not found", nil, []string{"exec", "nosuch", "--", "true"}, "no such sandbox"},
		{"bad memory", nil, []string{"create", "--memory", "lots", "x1"}, "invalid size"},
		{"too little memory", nil, []string{"create", "--memory", "64M", "x2"}, "out of range"},
		{"bad env", nil, []string{"create", "--env", "NOT_SET_ON_HOST_KOSA8", "x3"}, "not set on the host"},
		{"qemu missing", []string{"KOSA8_QEMU=/nonexistent/qemu"}, []string{"run", "--rm", "--", "true"}, "run '" + setupAdvice() + "'"},
		{"image missing", []string{"KOSA8_CACHE=" + t.TempDir()}, []string{"create", "x4"}, "guest image not built"},
		{"state dir unwritable", []string{"KOSA8_HOME=/proc/kosa8"}, []string{"create", "x5"}, "KOSA8_HOME"},
		{"not enough memory", nil, []string{"run", "--rm", "--memory", "200G", "--", "true"}, "not enough memory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := kosa8Cmd(t.Context(), tc.args...)
			cmd.Env = append(cmd.Env, tc.env...)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("succeeded: %s", out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("error %q does not say %q", out, tc.want)
			}
			if lines := strings.Count(strings.TrimSpace(string(out)), "\n"); lines > 3 {
				t.Errorf("error is %d lines long: %s", lines+1, out)
			}
		})
	}
	// Nothing half-created by the failures above.
	for n := range ls(t) {
		if n != "taken" {
			t.Errorf("a failed command left sandbox %q behind", n)
		}
	}
}
