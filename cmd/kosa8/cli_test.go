package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
	"github.com/kosa8/kosa8/sdk"
)

func TestExitCode(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, 0},
		{"the command's status", &exitError{3}, 3},
		{"kosa8's own failure", errors.New("boot failed"), 125},
		{"not found in the guest", &api.CommandError{Code: 127, Msg: "exec: x: command not found"}, 127},
		{"cannot be run", fmt.Errorf("wrapped: %w", &api.CommandError{Code: 126, Msg: "permission denied"}), 126},
		{"a code the guest must not choose", &api.CommandError{Code: 0, Msg: "odd"}, 125},
		{"interrupted while booting", fmt.Errorf("%w: sandbox x removed", errInterrupted), 130},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCode(tc.err); got != tc.want {
				t.Fatalf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

func TestSupervisorErr(t *testing.T) {
	reason := errors.New("pause: not enough disk space")
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"an SDK call's failure: the supervisor's words", &sdk.OpError{Op: "pause dev", Err: reason}, "pause: not enough disk space"},
		{"anything else as it is", fmt.Errorf("%w: dev is stopped", sdk.ErrNotRunning), "sandbox is not running: dev is stopped"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := supervisorErr(tc.err).Error(); got != tc.want {
				t.Fatalf("supervisorErr(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// fakeHome points kosa8 at an empty state directory and returns it.
func fakeHome(t *testing.T) string {
	home := t.TempDir()
	t.Setenv("KOSA8_HOME", home)
	t.Setenv("KOSA8_CONFIG", filepath.Join(home, "config"))
	t.Setenv("KOSA8_CACHE", filepath.Join(home, "cache"))
	return home
}

// fakeSandbox writes a stopped sandbox's directory, with a workspace.
func fakeSandbox(t *testing.T, home, name, ws string, st api.Status) *sandbox.Sandbox {
	t.Helper()
	dir := filepath.Join(home, "sandboxes", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.Config{Name: name, Arch: "amd64", CPUs: 1, MemoryMiB: 512, DiskGiB: 8, User: "kosa8", UID: 1000, GID: 1000}
	if ws != "" {
		cfg.Workspace = &sandbox.WorkspaceConfig{Path: ws}
	}
	writeJSON(t, filepath.Join(dir, "sandbox.json"), cfg)
	writeJSON(t, filepath.Join(dir, "state.json"), st)
	return &sandbox.Sandbox{Dir: dir, Config: cfg}
}

func kosa8(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = execute(newRoot(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestBadArguments: kosa8's own refusals exit 125 before anything is
// created, and name a flag the command has.
func TestBadArguments(t *testing.T) {
	home := fakeHome(t)
	wd := t.TempDir()
	t.Chdir(wd)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--bogus"}, "unknown flag: --bogus ('kosa8 run --help'"},
		{[]string{"run", "--cpus", "0", "--", "true"}, "--cpus 0 is out of range"},
		{[]string{"create", "--cpus", "-2"}, "--cpus -2 is out of range"},
		{[]string{"run", "--memory", "16", "--", "true"}, "did you mean 16G?"},
		{[]string{"create", "--memory", "lots"}, "invalid size"},
		{[]string{"create", "--disk", "1"}, "below the 2G minimum"},
		{[]string{"create", "--checkpoint-every", "1s"}, "use 10s or more"},
		{[]string{"create", "--no-workspace", "--review"}, "--review needs a workspace"},
		{[]string{"exec", "nosuch", "--", "true"}, "no such sandbox"},
		{[]string{"secret", "add", "K", "--host", "*.com"}, "matches a whole public suffix"},
		{[]string{"rewind", "nosuch", "latest"}, "no such sandbox"},
		{[]string{"run", "--arch", "riscv64", "--", "uname", "-m"}, "--arch: architecture \"riscv64\" is not supported: use amd64 (x86_64) or arm64 (aarch64)"},
		{[]string{"create", "--arch", "i386"}, "use amd64 (x86_64) or arm64 (aarch64)"},
		{[]string{"setup", "--arch", "riscv64", "--no-install"}, "use amd64 (x86_64) or arm64 (aarch64)"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, stderr := kosa8(t, tc.args...)
			if code != 125 {
				t.Errorf("exit %d, want 125 (stderr %q)", code, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not say %q", stderr, tc.want)
			}
			if strings.Contains(stderr, "--allow-broad") && tc.args[0] == "secret" {
				t.Errorf("names a flag secret add does not have: %q", stderr)
			}
		})
	}
	if entries, _ := os.ReadDir(filepath.Join(home, "sandboxes")); len(entries) != 0 {
		t.Errorf("refused commands left %d sandboxes", len(entries))
	}
}

// TestArchPrerequisites: a guest of another architecture needs its QEMU
// and its image; without either, run says what to install or build, and
// creates nothing.
func TestArchPrerequisites(t *testing.T) {
	home := fakeHome(t)
	t.Chdir(t.TempDir())
	t.Setenv("KOSA8_QEMU", "")
	other := "arm64"
	if vmspec.HostArch() == vmspec.ARM64 {
		other = "amd64"
	}
	bin := t.TempDir()
	t.Setenv("PATH", bin)
	code, _, stderr := kosa8(t, "run", "--rm", "--arch", other, "--", "uname", "-m")
	pkg := map[string]string{"arm64": "qemu-system-arm", "amd64": "qemu-system-x86"}[other]
	if code != 125 || !strings.Contains(stderr, "not found: run 'kosa8 setup --arch "+other+"' or install "+pkg) {
		t.Errorf("without QEMU: exit %d, stderr %q", code, stderr)
	}
	// A QEMU, no image: KOSA8_ARCH chooses the architecture as --arch does.
	if err := os.WriteFile(filepath.Join(bin, qemu.Binary(vmspec.Arch(other))), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KOSA8_ARCH", other)
	code, _, stderr = kosa8(t, "run", "--rm", "--", "uname", "-m")
	if code != 125 || !strings.Contains(stderr, "guest image not built for "+other+": run 'kosa8 setup --arch "+other+"'") {
		t.Errorf("without the image: exit %d, stderr %q", code, stderr)
	}
	if entries, _ := os.ReadDir(filepath.Join(home, "sandboxes")); len(entries) != 0 {
		t.Errorf("refused runs left %d sandboxes", len(entries))
	}
}

// TestFolderConflict: a folder, its parent or its child already synced by
// another sandbox is refused before anything is created; a stopped
// sandbox on the same folder is no conflict.
func TestFolderConflict(t *testing.T) {
	home := fakeHome(t)
	ws := t.TempDir()
	fakeSandbox(t, home, "holder", ws, api.Status{State: api.Paused, Checkpoint: "x"})
	fakeSandbox(t, home, "idle", filepath.Join(ws, "sub", "deeper"), api.Status{State: api.Stopped})
	for _, dir := range []string{ws, filepath.Join(ws, "sub"), filepath.Dir(ws)} {
		os.MkdirAll(dir, 0o755)
		code, _, stderr := kosa8(t, "create", "--workspace", dir, "--force", "x")
		if code != 125 || !strings.Contains(stderr, "synced by sandbox holder (paused)") {
			t.Errorf("create on %s: exit %d, %q", dir, code, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(home, "sandboxes", "x")); err == nil {
		t.Error("the refused create left its sandbox")
	}
	m, _ := manager()
	if other, err := m.WorkspaceOverlap("y", filepath.Join(ws, "sub", "deeper")); err != nil || other == nil || other.Config.Name != "holder" {
		t.Errorf("overlap with the paused holder: %v, %v", other, err)
	}
	if other, _ := m.WorkspaceOverlap("y", ws+"-sibling"); other != nil {
		t.Errorf("a sibling with a common name prefix overlaps %s", other.Config.Name)
	}
}

func TestResolveCheckpoint(t *testing.T) {
	home := fakeHome(t)
	sb := fakeSandbox(t, home, "cp", "", api.Status{State: api.Stopped})
	ids := []string{"20260101-000000-aaaa", "20260101-000001-aabb", "20260102-000000-cccc"}
	for i, id := range ids {
		tmp, err := sb.Checkpoints().Begin(id)
		if err != nil {
			t.Fatal(err)
		}
		meta := &checkpoint.Meta{ID: id, Kind: "manual", Created: time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC), DisksOnly: i == 2}
		if err := sb.Checkpoints().Commit(tmp, meta); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		ref     string
		machine bool
		want    string // an id, or part of the error
	}{
		{"latest", false, ids[2]},
		{"latest", true, ids[1]},
		{ids[0], false, ids[0]},
		{"20260102", false, ids[2]},
		{"20260101-000001", false, ids[1]},
		{"20260101", false, "ambiguous"},
		{"2025", false, "no checkpoint"},
		{"", false, "no checkpoint"},
	}
	for _, tc := range cases {
		got, err := resolveCheckpoint(sb, tc.ref, tc.machine)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("resolveCheckpoint(%q, %v) = %q, want %q", tc.ref, tc.machine, got, tc.want)
		}
	}
}

func TestCompletion(t *testing.T) {
	home := fakeHome(t)
	sb := fakeSandbox(t, home, "alpha", "", api.Status{State: api.Stopped})
	fakeSandbox(t, home, "beta", "", api.Status{State: api.Stopped})
	tmp, _ := sb.Checkpoints().Begin("20260101-000000-aaaa")
	if err := sb.Checkpoints().Commit(tmp, &checkpoint.Meta{ID: "20260101-000000-aaaa", Kind: "manual"}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"exec", ""}, []string{"alpha", "beta"}, nil},
		{[]string{"stop", "alpha", ""}, []string{"beta"}, []string{"alpha"}},
		{[]string{"rm", "b"}, []string{"beta"}, []string{"alpha"}},
		{[]string{"rewind", "alpha", ""}, []string{"latest", "20260101-000000-aaaa"}, nil},
		{[]string{"start", "alpha", "--from", ""}, []string{"latest", "20260101-000000-aaaa"}, nil},
		{[]string{"run", "--net", ""}, []string{"none", "dev"}, nil},
		{[]string{"diff", ""}, []string{"alpha"}, nil},
	}
	for _, tc := range cases {
		_, out, _ := kosa8(t, append([]string{"__complete"}, tc.args...)...)
		lines := strings.Split(out, "\n")
		has := func(s string) bool {
			for _, l := range lines {
				if strings.SplitN(l, "\t", 2)[0] == s {
					return true
				}
			}
			return false
		}
		for _, w := range tc.want {
			if !has(w) {
				t.Errorf("completing %v does not offer %q: %q", tc.args, w, out)
			}
		}
		for _, n := range tc.not {
			if has(n) {
				t.Errorf("completing %v offers %q: %q", tc.args, n, out)
			}
		}
	}
}

// TestRemoveAsksForPendingChanges: a stopped sandbox that still holds
// changes waiting for review is not removed without -f.
func TestRemoveAsksForPendingChanges(t *testing.T) {
	home := fakeHome(t)
	fakeSandbox(t, home, "work", t.TempDir(), api.Status{State: api.Stopped, Pending: 2})
	code, _, stderr := kosa8(t, "rm", "work")
	if code != 125 || !strings.Contains(stderr, "2 changes not applied") || !strings.Contains(stderr, "kosa8 apply work") {
		t.Fatalf("rm of a sandbox with pending changes: exit %d, %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(home, "sandboxes", "work")); err != nil {
		t.Fatal("removed anyway")
	}
	if code, _, stderr := kosa8(t, "rm", "-f", "work"); code != 0 {
		t.Fatalf("rm -f: exit %d, %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(home, "sandboxes", "work")); err == nil {
		t.Fatal("rm -f kept it")
	}
}

func TestJSONEmptyListsAndLowerCaseKeys(t *testing.T) {
	fakeHome(t)
	for _, args := range [][]string{{"ls", "--json"}, {"image", "ls", "--json"}, {"secret", "ls", "--json"}} {
		code, out, stderr := kosa8(t, args...)
		if code != 0 || strings.TrimSpace(out) != "[]" {
			t.Errorf("kosa8 %v: exit %d, %q %q; want []", args, code, out, stderr)
		}
	}
}

// TestJSONKeysLowerCase: every key of what --json and inspect print is
// lower case (a Go field without a tag would show up capitalised).
func TestJSONKeysLowerCase(t *testing.T) {
	home := fakeHome(t)
	sb := fakeSandbox(t, home, "keys", t.TempDir(), api.Status{State: api.Stopped, Pending: 1})
	sb.Config.Network = sandbox.NetworkConfig{Rules: []string{"example.com"}, Ports: []api.PortForward{{HostPort: 8080, GuestPort: 80}}}
	sb.Config.Secrets = []string{"K"}
	sb.Config.Env = []string{"A=1"}
	l := describe(sb)
	l.Network = &networkView{Rules: []string{"x"}, Secrets: []string{"K"}, Ports: sb.Config.Network.Ports}
	values := []any{
		l,
		syncView{Pending: []changeView{{Path: "a", Kind: "added", Type: "file"}}},
		checkpoint.Meta{ID: "x", Disks: map[string]checkpoint.Disk{"root": {}}},
		sdk.Checkpoint{ID: "x", Disks: map[string]sdk.CheckpointDisk{"root": {}}, Current: true, DiskBytes: 1},
		sdk.RewindResult{Saved: &sdk.Checkpoint{}, Conflicts: []sdk.SyncConflict{{}}},
	}
	upper := regexp.MustCompile(`"([A-Za-z_]*[A-Z][A-Za-z_]*)":`)
	for _, v := range values {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if m := upper.FindAllStringSubmatch(string(b), -1); m != nil {
			t.Errorf("%T has keys that are not lower case: %v", v, m)
		}
	}
}

// setup's last line names the kosa8 the user can call: "kosa8" only when
// that is this binary on the PATH, else its path and how to install it.
func TestKosa8Command(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "bin", "kosa8")
	os.MkdirAll(filepath.Dir(self), 0o755)
	os.WriteFile(self, []byte("x"), 0o755)
	link := filepath.Join(dir, "link")
	os.Symlink(self, link)
	other := filepath.Join(dir, "other")
	os.WriteFile(other, []byte("y"), 0o755)
	found := func(p string) func(string) (string, error) {
		return func(string) (string, error) { return p, nil }
	}
	notFound := func(string) (string, error) { return "", errors.New("not found") }
	cases := []struct {
		name, cwd string
		look      func(string) (string, error)
		want      string
		hint      bool
	}{
		{"this binary on the PATH", dir, found(self), "kosa8", false},
		{"a link to it on the PATH", dir, found(link), "kosa8", false},
		{"not on the PATH, below the folder", dir, notFound, "./bin/kosa8", true},
		{"another kosa8 on the PATH", dir, found(other), "./bin/kosa8", true},
		{"not on the PATH, elsewhere", "/", notFound, "./" + strings.TrimPrefix(self, "/"), true},
		{"not on the PATH, from a sibling folder", filepath.Join(dir, "x"), notFound, self, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name, hint := kosa8Command(self, tc.cwd, tc.look)
			if name != tc.want || (hint != "") != tc.hint {
				t.Fatalf("kosa8Command = %q, %q; want %q, hint %v", name, hint, tc.want, tc.hint)
			}
			if tc.hint && (!strings.Contains(hint, "make install") || !strings.Contains(hint, filepath.Join(dir, "bin")+":$PATH")) {
				t.Fatalf("hint %q: want 'make install' and the PATH line", hint)
			}
		})
	}
}

// kosa8 logs shows the console as a person reads it: no "?" for the
// serial console's carriage returns, and none of the lines a boot
// template's guest wrote before the sandbox existed.
func TestConsoleFilter(t *testing.T) {
	created := time.Date(2026, 12, 3, 10, 25, 0, 0, time.UTC)
	in := "time=2026-12-03T10:21:15.024Z level=INFO msg=\"session ended: the host started over\" who=kosa8-agent\r\n" +
		"time=2026-12-03T10:21:15.057Z level=INFO msg=\"host connected\" who=kosa8-agent\r\n" +
		"time=2026-12-03T10:25:02.337Z level=INFO msg=\"restored: RNG reseeded, clock stepped\" who=kosa8-agent\r\n" +
		"[   18.477387] reboot: Power down\r\n" +
		"time=not-a-time kept\r\n" +
		"a last line without its newline\r"
	want := "time=2026-12-03T10:25:02.337Z level=INFO msg=\"restored: RNG reseeded, clock stepped\" who=kosa8-agent\n" +
		"[   18.477387] reboot: Power down\n" +
		"time=not-a-time kept\n" +
		"a last line without its newline"
	for _, chunk := range []int{1, 7, len(in)} {
		var out bytes.Buffer
		c := &consoleFilter{w: &out, created: created}
		for b := []byte(in); len(b) > 0; {
			n := min(chunk, len(b))
			if _, err := c.Write(b[:n]); err != nil {
				t.Fatal(err)
			}
			b = b[n:]
		}
		c.Flush()
		if out.String() != want {
			t.Fatalf("written %d bytes at a time:\n%q\nwant\n%q", chunk, out.String(), want)
		}
	}
	// A line without end is passed on in bounded pieces.
	var out bytes.Buffer
	c := &consoleFilter{w: &out}
	c.Write(bytes.Repeat([]byte("x"), 3*maxConsoleLine))
	if len(c.buf) >= maxConsoleLine || out.Len() < 2*maxConsoleLine {
		t.Fatalf("an endless line is held: %d buffered, %d written", len(c.buf), out.Len())
	}
}

// The fork command's refusals, before anything is checkpointed or made:
// a missing count, a second sandbox where the command should be, a
// stopped source without --from, a source that is no fork for fork
// logs, and --rm on an apply of a sandbox that is no fork.
func TestForkRefusals(t *testing.T) {
	home := fakeHome(t)
	fakeSandbox(t, home, "base", t.TempDir(), api.Status{State: api.Stopped})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fork", "base"}, "say how many forks with -n N"},
		{[]string{"fork", "base", "other", "-n", "2"}, "then the command after --"},
		{[]string{"fork", "base", "-n", "2"}, "'kosa8 start base' first, or fork one of its checkpoints with --from"},
		{[]string{"fork", "base", "-n", "2", "--from", "latest"}, "base has no checkpoint with a machine in it"},
		{[]string{"fork", "logs", "base"}, "base is not a fork"},
		{[]string{"fork", "ls", "nosuch"}, "no such sandbox"},
	} {
		code, _, stderr := kosa8(t, tc.args...)
		if code != 125 || !strings.Contains(stderr, tc.want) {
			t.Errorf("kosa8 %v: exit %d, stderr %q; want 125 saying %q", tc.args, code, stderr, tc.want)
		}
	}
	code, stdout, _ := kosa8(t, "fork", "ls", "base", "--json")
	if code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("fork ls of a sandbox without forks: exit %d, %q", code, stdout)
	}
}
