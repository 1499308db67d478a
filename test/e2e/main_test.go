// Package e2e boots real sandboxes and checks what a user sees. It needs
// QEMU and a built guest image; it runs only when KOSA8_E2E=1 (make test-vm,
// .ci/run), and then a missing piece is a failure, not a skip.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/termsafe"
)

var (
	binDir string // holds kosa8 and kosa8-agent
	home   string // KOSA8_HOME for this run: sandboxes never mix with the user's
)

func TestMain(m *testing.M) {
	if os.Getenv("KOSA8_E2E") != "1" {
		fmt.Println("skipping VM tests: set KOSA8_E2E=1 (needs QEMU and 'kosa8 setup'; see README)")
		os.Exit(0)
	}
	var err error
	binDir = os.Getenv("KOSA8_BIN")
	if binDir == "" {
		if binDir, err = buildBinaries(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	home, err = os.MkdirTemp("", "kosa8-e2e-home-")
	if err != nil {
		panic(err)
	}
	// go test's own timeout panics without running the cleanup below:
	// reap this run's sandboxes shortly before it, so none outlives it.
	flag.Parse()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > time.Minute {
			time.AfterFunc(d-30*time.Second, func() {
				fmt.Fprintln(os.Stderr, "e2e: the test timeout is near: removing this run's sandboxes")
				reap()
			})
		}
	}
	code := m.Run()
	if code != 0 {
		// Boots that failed keep their logs there; print them, as the
		// run's state directory is removed below.
		dirs, _ := filepath.Glob(filepath.Join(home, "failed", "*"))
		for _, d := range dirs {
			printLogs(d)
		}
		// So do sandboxes a failed program left crashed (an SDK example
		// ends at its first error, its deferred removal never run):
		// reap is about to remove them.
		for _, d := range crashedSandboxes() {
			printLogs(d)
		}
	}
	reap()
	os.RemoveAll(home)
	os.Exit(code)
}

// crashedSandboxes are the folders of this run's sandboxes whose state is
// crashed.
func crashedSandboxes() []string {
	states, _ := filepath.Glob(filepath.Join(home, "sandboxes", "*", "state.json"))
	var out []string
	for _, p := range states {
		var st struct {
			State string `json:"state"`
		}
		b, _ := os.ReadFile(p)
		if json.Unmarshal(b, &st) == nil && st.State == "crashed" {
			out = append(out, filepath.Dir(p))
		}
	}
	return out
}

// dumpSupervisors sends SIGQUIT to the supervisor of every sandbox of
// this run: each writes its goroutines' stacks to its log and exits.
func dumpSupervisors() {
	states, _ := filepath.Glob(filepath.Join(home, "sandboxes", "*", "state.json"))
	for _, p := range states {
		var st struct {
			PID int `json:"supervisor_pid"`
		}
		b, _ := os.ReadFile(p)
		if json.Unmarshal(b, &st) == nil && st.PID > 0 && processRunning(st.PID) {
			_ = syscall.Kill(st.PID, syscall.SIGQUIT)
		}
	}
	time.Sleep(time.Second)
}

// printLogs prints the last lines of a sandbox's logs to stderr.
func printLogs(dir string) {
	for _, f := range []string{"supervisor.log", "console.log"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		text, stacks, _ := strings.Cut(string(b), "SIGQUIT: quit")
		if stacks != "" {
			// Only the goroutines in kosa8's own code, the rest is noise.
			var keep []string
			for _, g := range strings.Split(stacks, "\n\n") {
				if strings.Contains(g, "github.com/kosa8/") {
					keep = append(keep, g)
				}
			}
			stacks = strings.Join(keep, "\n\n")
		}
		lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
		if first := oopsStart(lines); first >= 0 && first < len(lines)-60 {
			// A kernel oops is longer than the tail: its first lines
			// (which function, which address) come first.
			head := lines[first:min(first+40, len(lines)-60)]
			fmt.Fprintf(os.Stderr, "---- %s (the guest kernel's first oops, %d lines)\n%s\n",
				filepath.Join(dir, f), len(head), termsafe.Clean(strings.Join(head, "\n"), true))
		}
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		fmt.Fprintf(os.Stderr, "---- %s (last %d lines)\n%s\n---- end of %s\n",
			filepath.Join(dir, f), len(lines), termsafe.Clean(strings.Join(lines, "\n"), true), f)
		if stacks != "" {
			fmt.Fprintf(os.Stderr, "---- its goroutines at SIGQUIT\n%s\n----\n", stacks)
		}
	}
}

// oopsStart returns the index of the first line of a guest kernel's oops
// or panic report in a console log, or -1.
func oopsStart(lines []string) int {
	for i, l := range lines {
		for _, m := range []string{"BUG:", "Oops:", "general protection fault", "Kernel panic", "WARNING: CPU:"} {
			if strings.Contains(l, m) {
				return i
			}
		}
	}
	return -1
}

// reap removes every sandbox of this run: a failed test may leave one
// running.
func reap() {
	cmd := kosa8Cmd(context.Background(), "ls", "--json")
	out, _ := cmd.Output()
	var list []struct{ Name string }
	_ = json.Unmarshal(out, &list)
	for _, l := range list {
		_ = kosa8Cmd(context.Background(), "rm", "-f", l.Name).Run()
	}
}

func buildBinaries() (string, error) {
	dir, err := os.MkdirTemp("", "kosa8-e2e-bin-")
	if err != nil {
		return "", err
	}
	for _, b := range []struct{ out, pkg string }{{"kosa8", "./cmd/kosa8"}, {"kosa8-agent", "./cmd/kosa8-agent"}} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return dir, nil
}

// kosa8Cmd prepares a kosa8 command with this run's state directory. It
// runs in a fresh empty folder: that folder becomes the workspace of a
// sandbox created without --workspace.
func kosa8Cmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kosa8"), args...)
	if dir, err := os.MkdirTemp(home, "cwd-"); err == nil {
		cmd.Dir = dir
	}
	cmd.Env = append(os.Environ(), "KOSA8_HOME="+home, "KOSA8_CONFIG="+filepath.Join(home, "config"))
	// Once ctx ends and the command is killed, its output pipes close
	// within this even if a child of it still holds them (a shell loop's
	// kosa8 run waiting on a guest whose kernel oopsed): the test fails
	// then, instead of waiting for the suite's timeout.
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

type result struct {
	stdout, stderr string
	code           int
	maxRSS         int64 // bytes: the kosa8 process's own peak resident memory (its VmHWM, polled)
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout: %q\nstderr: %q", r.code, r.stdout, r.stderr)
}

// invocation says how to run kosa8, beyond its arguments.
type invocation struct {
	dir     string        // working folder; "" for a fresh empty one
	env     []string      // added to the environment (later entries win)
	stdin   string        // "" for none
	timeout time.Duration // 0 for two minutes
}

// run runs kosa8 with args as in says.
func (in invocation) run(t *testing.T, args ...string) result {
	t.Helper()
	if in.timeout == 0 {
		in.timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), in.timeout)
	defer cancel()
	cmd := kosa8Cmd(ctx, args...)
	if in.dir != "" {
		cmd.Dir = in.dir
	}
	cmd.Env = append(cmd.Env, in.env...)
	if len(args) > 0 && args[0] == "rm" && t.Failed() {
		// The test failed: what the sandbox logged is the only account
		// of why on a CI machine, and rm is about to delete it.
		for _, a := range args[1:] {
			if !strings.HasPrefix(a, "-") {
				printLogs(filepath.Join(home, "sandboxes", a))
			}
		}
	}
	if in.stdin != "" {
		cmd.Stdin = strings.NewReader(in.stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	// The process's own peak memory, read while it runs: its rusage at
	// exit counts the supervisors and QEMUs it reaped, guest RAM included.
	var peak atomic.Int64
	polled := make(chan struct{})
	stopPoll := make(chan struct{})
	err := cmd.Start()
	if err == nil {
		go func() {
			defer close(polled)
			for {
				if v := vmHWM(cmd.Process.Pid); v > peak.Load() {
					peak.Store(v)
				}
				select {
				case <-stopPoll:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		err = cmd.Wait()
		close(stopPoll)
		<-polled
	}
	if ctx.Err() != nil {
		// kosa8 hung: ask every supervisor of this run where it is
		// (Go prints its goroutines into the sandbox's log on SIGQUIT,
		// and exits), for the logs printed when the test removes it.
		t.Errorf("kosa8 %v did not end within %v: the supervisors' stacks are in their logs", args, in.timeout)
		dumpSupervisors()
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kosa8 %v: %v", args, err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code, maxRSS: peak.Load()}
}

// vmHWM is a process's peak resident memory so far, in bytes (0 when it
// cannot be read).
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}

// run runs kosa8 with args and stdin, within two minutes.
func run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return invocation{stdin: stdin}.run(t, args...)
}

// must runs kosa8 and fails the test unless it exits 0.
func must(t *testing.T, args ...string) result {
	t.Helper()
	r := run(t, "", args...)
	if r.code != 0 {
		t.Fatalf("kosa8 %v failed:\n%s", args, r)
	}
	return r
}

// sandbox creates and starts a sandbox for the test, removed at its end.
func sandbox(t *testing.T, name string, extra ...string) string {
	t.Helper()
	must(t, append([]string{"create", name}, extra...)...)
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	return name
}

type lsEntry struct {
	Name   string `json:"name"`
	State  string `json:"state"`
	Dir    string `json:"dir"`
	Status struct {
		SupervisorPID int    `json:"supervisor_pid"`
		QEMUPID       int    `json:"qemu_pid"`
		Accel         string `json:"accel"`
		Template      string `json:"template"`
	} `json:"status"`
}

func ls(t *testing.T) map[string]lsEntry {
	t.Helper()
	var list []lsEntry
	if err := json.Unmarshal([]byte(must(t, "ls", "--json").stdout), &list); err != nil {
		t.Fatal(err)
	}
	m := map[string]lsEntry{}
	for _, e := range list {
		m[e.Name] = e
	}
	return m
}

// guestUser is the default user's name in the guest: the host user's, or
// kosa8 for root.
func guestUser() string {
	u, err := user.Current()
	if err != nil || u.Uid == "0" {
		return "kosa8"
	}
	return u.Username
}

// processRunning reports whether pid is a live (not zombie) process.
func processRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}
