package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// wsUnder makes a workspace folder whose parent is mode 0700: under /root
// when the tests run as root (the folder exists in the guest image too,
// closed to the guest user), else in a private temporary folder.
func wsUnder0700(t *testing.T) string {
	t.Helper()
	base := ""
	if os.Getuid() == 0 {
		base = "/root"
	}
	parent, err := os.MkdirTemp(base, "kosa8-e2e-closed-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(parent, "project")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	return ws
}

// TestRunFromClosedFolder: the quick start from a clone under a 0700
// folder (/root/project as root): the guest user can enter the workspace,
// and the workspace shows the project only (no lost+found).
func TestRunFromClosedFolder(t *testing.T) {
	ws := wsUnder0700(t)
	os.WriteFile(filepath.Join(ws, "README"), []byte("hi\n"), 0o644)
	r := run(t, "", "run", "--rm", "--workspace", ws, "--", "sh", "-c", "uname -s; pwd; ls -A; cat README")
	if r.code != 0 {
		t.Fatalf("run from a workspace under a 0700 folder:\n%s", r)
	}
	if want := "Linux\n" + ws + "\nREADME\nhi\n"; r.stdout != want {
		t.Fatalf("stdout %q, want %q (lost+found must not show)", r.stdout, want)
	}
}

// TestRunAsUnprivilegedUser: the same quick start as a host user that is
// not root, with a state directory of its own.
func TestRunAsUnprivilegedUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to switch to another user (the tests already run unprivileged)")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	uid, gid := 65534, 65534 // nobody
	// The user needs kosa8, the agent and the image where it can read them.
	dir, err := os.MkdirTemp("", "kosa8-e2e-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	for _, b := range []string{"kosa8", "kosa8-agent"} {
		data, err := os.ReadFile(filepath.Join(binDir, b))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, b), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cache := filepath.Join(dir, "cache")
	if out, err := exec.Command("cp", "-a", "--reflink=auto", "--sparse=always", imageCache(t), cache).CombinedOutput(); err != nil {
		t.Fatalf("copy the image cache: %v: %s", err, out)
	}
	userHome := filepath.Join(dir, "home")
	ws := filepath.Join(userHome, "project")
	os.MkdirAll(ws, 0o700)
	os.Chmod(userHome, 0o700)
	if out, err := exec.Command("chown", "-R", "65534:65534", userHome, cache).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--",
		filepath.Join(dir, "kosa8"), "run", "--rm", "--", "sh", "-c", "id -u; pwd; ls -A")
	cmd.Dir = ws
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + userHome, "KOSA8_HOME=" + filepath.Join(userHome, "k8"),
		"KOSA8_CACHE=" + cache, "KOSA8_CONFIG=" + filepath.Join(userHome, "cfg"), "KOSA8_ACCEL=" + os.Getenv("KOSA8_ACCEL")}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run as uid %d: %v\n%s", uid, err, out)
	}
	if !strings.Contains(string(out), "65534\n"+ws+"\n") {
		t.Fatalf("the guest user is not the host user, or not in the workspace:\n%s", out)
	}
	_ = gid
}

// imageCache is the image cache the tests use.
func imageCache(t *testing.T) string {
	if c := os.Getenv("KOSA8_CACHE"); c != "" {
		return c
	}
	if c := os.Getenv("XDG_CACHE_HOME"); c != "" {
		return filepath.Join(c, "kosa8")
	}
	h, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(h, ".cache", "kosa8")
}

func TestExitCodes(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "--rm", "--", "no-such-command"}, 127, "command not found"},
		{[]string{"run", "--rm", "--", "/etc/passwd"}, 126, "permission denied"},
		{[]string{"run", "--rm", "--", "sh", "-c", "exit 3"}, 3, ""},
		{[]string{"run", "--no-such-flag"}, 125, "unknown flag"},
		{[]string{"run", "--cpus", "0", "--", "true"}, 125, "--cpus 0"},
		{[]string{"exec", "no-such-sandbox", "--", "true"}, 125, "no such sandbox"},
	}
	for _, tc := range cases {
		r := run(t, "", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("kosa8 %v: want exit %d and %q, got\n%s", tc.args, tc.code, tc.want, r)
		}
	}
	if n := len(ls(t)); n != 0 {
		t.Errorf("%d sandboxes left behind", n)
	}
}

// TestRunLeavesStdinAlone: a loop reading a list runs kosa8 once per line
// and sees every line: run does not swallow the loop's stdin.
func TestRunLeavesStdinAlone(t *testing.T) {
	list := filepath.Join(t.TempDir(), "list")
	os.WriteFile(list, []byte("one\ntwo\nthree\n"), 0o644)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := kosa8Cmd(ctx)
	cmd.Path, cmd.Args = "/bin/sh", []string{"sh", "-c", `while read f; do "$KOSA8" run --rm -- echo "got $f" 2>/dev/null; done < "$1"`, "sh", list}
	cmd.Env = append(cmd.Env, "KOSA8="+filepath.Join(binDir, "kosa8"))
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "got one\ngot two\ngot three\n" {
		t.Fatalf("loop: %v\n%q", err, out)
	}
	// -i passes it on.
	if r := run(t, "piped in\n", "run", "--rm", "-i", "--", "cat"); r.stdout != "piped in\n" {
		t.Fatalf("run -i:\n%s", r)
	}
}

// TestClosedPipeEndsCommand: 'kosa8 run --rm -- seq … | head -2' ends: the
// guest process gets SIGPIPE and the sandbox is removed. The same for exec.
func TestClosedPipeEndsCommand(t *testing.T) {
	pipe := func(args ...string) (string, time.Duration) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		cmd := kosa8Cmd(ctx)
		cmd.Path, cmd.Args = "/bin/sh", []string{"sh", "-c", `"$KOSA8" "$@" 2>/dev/null | head -2; echo "status ${?}"`, "sh"}
		cmd.Args = append(cmd.Args, args...)
		cmd.Env = append(cmd.Env, "KOSA8="+filepath.Join(binDir, "kosa8"))
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out), time.Since(start)
	}
	out, took := pipe("run", "--rm", "--name", "pipe", "--", "seq", "1", "100000000")
	if !strings.HasPrefix(out, "1\n2\n") {
		t.Fatalf("run | head: %q", out)
	}
	if _, ok := ls(t)["pipe"]; ok {
		t.Fatal("the sandbox is still there after its reader went away")
	}
	t.Logf("run --rm | head -2 ended in %v", took)

	name := sandbox(t, "pipex")
	out, took = pipe("exec", name, "--", "seq", "1", "100000000")
	if !strings.HasPrefix(out, "1\n2\n") {
		t.Fatalf("exec | head: %q", out)
	}
	if r := must(t, "exec", name, "--", "sh", "-c", "pgrep -x seq || echo none"); strings.TrimSpace(r.stdout) != "none" {
		t.Fatalf("seq still runs in the guest: %s", r.stdout)
	}
	t.Logf("exec | head -2 ended in %v", took)
}

// TestReviewSurvivesRmAndStop: 'run --rm --review' keeps the agent's work:
// the sandbox stays, stopped, and says so; diff, discard and apply work on
// it while stopped; held files can be read and discarded; rm asks. The
// review boots it once: after the first command it is paused, and the
// next ones resume it. --rm takes effect once every change is applied or
// discarded: the last of them removes it.
func TestReviewSurvivesRmAndStop(t *testing.T) {
	ws, err := os.MkdirTemp(home, "keep-")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ws, "app.py"), []byte("print(1)\n"), 0o644)
	name := "keep"
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	r := run(t, "", "run", "--rm", "--review", "--name", name, "--workspace", ws, "--", "sh", "-c",
		"echo 'print(2)' > app.py; echo new > added.txt; echo 'export AGENT=1' > .envrc; echo junk > junk.txt; "+
			"echo '# approved' > kosa8.toml")
	if r.code != 0 {
		t.Fatalf("run:\n%s", r)
	}
	if !strings.Contains(r.stderr, "5 changes pending in keep: 'kosa8 diff keep'") {
		t.Fatalf("run did not say what is pending:\n%s", r)
	}
	if e, ok := ls(t)[name]; !ok || e.State != "stopped" {
		t.Fatalf("the --rm --review sandbox with pending changes is gone or not stopped: %+v", e)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "app.py")); string(b) != "print(1)\n" {
		t.Fatal("review mode wrote to the host")
	}
	// rm asks (no terminal here: it refuses and says what to do).
	if r := run(t, "", "rm", name); r.code != 125 || !strings.Contains(r.stderr, "not applied") {
		t.Fatalf("rm of a sandbox with pending changes:\n%s", r)
	}
	// Each review command: how it reached the sandbox, and how long it took.
	boots := 0
	review := func(args ...string) result {
		t.Helper()
		start := time.Now()
		r := must(t, args...)
		t.Logf("kosa8 %s: %s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond))
		if strings.Contains(r.stderr, "kosa8: starting "+name+" to reach its workspace") {
			boots++
		} else if !strings.Contains(r.stderr, "kosa8: resuming "+name+" to reach its workspace") {
			t.Fatalf("kosa8 %v neither booted nor resumed %s:\n%s", args, name, r)
		}
		return r
	}
	// A held file can be read before it is approved.
	d := review("diff", name, ".envrc").stdout
	if !strings.Contains(d, "A .envrc  (held:") || !strings.Contains(d, "+export AGENT=1") {
		t.Fatalf("diff of a held file:\n%s", d)
	}
	if e := ls(t)[name]; e.State != "paused" {
		t.Fatalf("after a review command with changes left the sandbox is %s, want paused", e.State)
	}
	d = review("diff", name).stdout
	for _, want := range []string{"M app.py", "+print(2)", "A added.txt", "A junk.txt"} {
		if !strings.Contains(d, want) {
			t.Fatalf("diff of the stopped sandbox lacks %q:\n%s", want, d)
		}
	}
	// approve shows what it writes before writing it.
	a := review("approve", name, "kosa8.toml")
	if !strings.Contains(a.stdout, "+# approved") || !strings.HasSuffix(a.stdout, "\nkosa8.toml\n") {
		t.Fatalf("approve did not show the diff first:\n%s", a)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "kosa8.toml")); !strings.Contains(string(b), "approved") {
		t.Fatal("approve did not write the held file")
	}
	review("discard", name, ".envrc", "junk.txt")
	if e := ls(t)[name]; e.State != "paused" {
		t.Fatalf("with changes left the sandbox is %s, want paused", e.State)
	}
	last := review("apply", name, "app.py", "added.txt")
	if b, _ := os.ReadFile(filepath.Join(ws, "app.py")); string(b) != "print(2)\n" {
		t.Fatal("apply on a stopped sandbox did not write")
	}
	if boots != 1 {
		t.Fatalf("the review booted the sandbox %d times, want once", boots)
	}
	for _, p := range []string{".envrc", "junk.txt"} {
		if _, err := os.Stat(filepath.Join(ws, p)); err == nil {
			t.Fatalf("discarded %s reached the host", p)
		}
	}
	// Nothing left to review: --rm takes effect, the applied work stays on
	// the host.
	if !strings.Contains(last.stderr, "nothing left to review in "+name+": removed (--rm)") {
		t.Fatalf("the last apply did not say the sandbox was removed:\n%s", last)
	}
	if e, ok := ls(t)[name]; ok {
		t.Fatalf("with every change applied or discarded the --rm sandbox is still there: %+v", e)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "added.txt")); string(b) != "new\n" {
		t.Fatal("applied file lost")
	}
}

// TestFolderConflictBeforeBoot: a folder, its child or its parent that a
// running sandbox syncs is refused at once, naming that sandbox, and no
// sandbox is left behind.
func TestFolderConflictBeforeBoot(t *testing.T) {
	ws, err := os.MkdirTemp(home, "shared-")
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(ws, "sub"), 0o755)
	must(t, "create", "owner", "--workspace", ws)
	t.Cleanup(func() { run(t, "", "rm", "-f", "owner") })
	// A second sandbox on the folder is fine while the first is stopped.
	must(t, "create", "second", "--workspace", ws)
	t.Cleanup(func() { run(t, "", "rm", "-f", "second") })
	must(t, "start", "owner")
	for _, args := range [][]string{
		{"run", "--rm", "--workspace", ws, "--", "true"},
		{"run", "--workspace", filepath.Join(ws, "sub"), "--", "true"},
		{"create", "--workspace", filepath.Dir(ws), "--force", "parent"},
		{"create", "--workspace", ws, "third"},
		{"start", "second"},
	} {
		start := time.Now()
		r := run(t, "", args...)
		if r.code != 125 || !strings.Contains(r.stderr, "synced by sandbox owner") {
			t.Errorf("kosa8 %v:\n%s", args, r)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("kosa8 %v took %v: it booted before refusing", args, d)
		}
	}
	for n, e := range ls(t) {
		if n != "owner" && n != "second" {
			t.Errorf("a refused command left sandbox %s (%s)", n, e.State)
		}
		if n == "second" && e.State != "created" {
			t.Errorf("the refused start left second %s", e.State)
		}
	}
}

// TestBootFailureKeepsLogs: an --rm sandbox that fails to boot is removed,
// but its console and supervisor logs are kept, and the error names them.
func TestBootFailureKeepsLogs(t *testing.T) {
	cmd := kosa8Cmd(t.Context(), "run", "--rm", "--name", "doomed", "--", "true")
	// Not an agent: the guest's /init fails and the kernel panics. For a
	// guest of another arch, a program built for it that only exits (the
	// host's /bin/true is refused before the boot, for its arch).
	notAgent := "/bin/true"
	if guestArch() != runtime.GOARCH {
		notAgent = buildForGuest(t, "package main\n\nfunc main() {}\n")
	}
	cmd.Env = append(cmd.Env, "KOSA8_AGENT="+notAgent)
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 125 {
		t.Fatalf("boot failure: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`logs are kept in (\S+)\)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("the error does not name the kept logs:\n%s", out)
	}
	for _, f := range []string{"console.log", "supervisor.log"} {
		if b, err := os.ReadFile(filepath.Join(string(m[1]), f)); err != nil || len(b) == 0 {
			t.Errorf("%s not kept: %v", f, err)
		}
	}
	if _, ok := ls(t)["doomed"]; ok {
		t.Error("the failed --rm sandbox is still there")
	}
}

// TestInterruptDuringBoot: ^C on the terminal while a sandbox boots exits
// 130 and leaves no sandbox behind (run) or a stopped one (start), never a
// crashed one.
func TestInterruptDuringBoot(t *testing.T) {
	interrupt := func(args ...string) int {
		cmd := kosa8Cmd(t.Context(), args...)
		ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 100})
		if err != nil {
			t.Fatal(err)
		}
		defer ptmx.Close()
		var scr screen
		go io.Copy(&scr, ptmx)
		scr.waitFor(t, 0, "booting sandbox")
		time.Sleep(500 * time.Millisecond)
		if _, err := ptmx.Write([]byte{3}); err != nil { // ^C
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if ee, ok := err.(*exec.ExitError); ok {
				return ee.ExitCode()
			}
			t.Fatalf("kosa8 %v after ^C: %v\n%s", args, err, scr.String())
		case <-time.After(60 * time.Second):
			cmd.Process.Signal(syscall.SIGKILL)
			t.Fatalf("kosa8 %v did not end after ^C:\n%s", args, scr.String())
		}
		return 0
	}
	if code := interrupt("run", "--name", "cut", "--", "true"); code != 130 {
		t.Fatalf("run ^C exit %d, want 130", code)
	}
	if e, ok := ls(t)["cut"]; ok {
		t.Fatalf("run ^C left the sandbox (%s)", e.State)
	}
	must(t, "create", "cut2")
	t.Cleanup(func() { run(t, "", "rm", "-f", "cut2") })
	if code := interrupt("start", "cut2"); code != 130 {
		t.Fatalf("start ^C exit %d, want 130", code)
	}
	if e := ls(t)["cut2"]; e.State != "created" {
		t.Fatalf("start ^C left the sandbox %s", e.State)
	}
}

// TestGuestEscapesNeverPrinted: escape sequences a hostile guest plants in
// file names, link targets and what it makes the user print (checkpoint
// messages) reach no output of kosa8 raw.
func TestGuestEscapesNeverPrinted(t *testing.T) {
	ws, err := os.MkdirTemp(home, "esc-")
	if err != nil {
		t.Fatal(err)
	}
	name := "esc"
	must(t, "create", name, "--workspace", ws, "--review")
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	const plant = `e=$(printf '\033]0;pwned\007\033[2J\302\233'); ` +
		`echo x > "file$e"; mkdir -p .vscode; ln -s "target$e" .envrc; ln -s "t$e" "link$e"; echo y > ".vscode/$e.json"`
	must(t, "exec", name, "--", "sh", "-c", plant)
	must(t, "sync", "now", name)
	must(t, "checkpoint", name, "-m", "msg \x1b]0;pwned\x07")
	for _, args := range [][]string{
		{"held", name}, {"held", name, "--json"}, {"diff", name}, {"sync", "status", name}, {"sync", "status", name, "--json"},
		{"checkpoints", name}, {"ls"}, {"inspect", name}, {"logs", name},
		{"diff", name, "file\x1b]0;pwned\x07"}, // an error carrying the text
	} {
		r := run(t, "", args...)
		if all := r.stdout + r.stderr; strings.ContainsAny(all, "\x1b\x07\u009b") {
			t.Errorf("kosa8 %v printed control characters: %q", args, all)
		}
		if args[0] == "held" && len(args) == 2 && !strings.Contains(r.stdout, ".envrc -> target?]0;pwned??[2J?") {
			t.Errorf("held does not show the link target cleaned:\n%s", r)
		}
	}
}

// TestCopyProgress: copying a folder in shows files and bytes, without a
// terminal too.
func TestCopyProgress(t *testing.T) {
	ws, err := os.MkdirTemp(home, "big-")
	if err != nil {
		t.Fatal(err)
	}
	const files = 800
	chunk := strings.Repeat("x", 8<<10)
	for i := range files {
		d := filepath.Join(ws, fmt.Sprintf("d%02d", i%20))
		os.MkdirAll(d, 0o755)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d", i)), []byte(chunk), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	cmd := kosa8Cmd(ctx, "run", "--rm", "--workspace", ws, "--", "sh", "-c", "find . -type f | wc -l")
	// A start from a boot template copies the 800 files in within the 2 s
	// a short operation stays quiet without a terminal; this asks for each
	// step however short.
	cmd.Env = append(cmd.Env, "KOSA8_PROGRESS=all")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || strings.TrimSpace(stdout.String()) != fmt.Sprint(files) {
		t.Fatalf("run: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	m := regexp.MustCompile(`copying \S+ in: (\d+) files, ([0-9.]+ [KMG]iB)`).FindAllStringSubmatch(stderr.String(), -1)
	if len(m) == 0 {
		t.Fatalf("no copy progress on stderr:\n%s", stderr.String())
	}
	if last := m[len(m)-1]; last[1] != fmt.Sprint(files) {
		t.Errorf("last progress %q: want all %d files", last[0], files)
	}
	t.Logf("progress lines: %d, last %q", len(m), m[len(m)-1][0])
}

// TestDiffOfAnEndlessGuestCopy: a root guest that replaces the guest's cat
// with an endless one (the diff reads the sandbox's copy of a changed file
// with it) gets a diff that gives up at 1 MiB, not a kosa8 on the host that
// reads for ever into its memory.
func TestDiffOfAnEndlessGuestCopy(t *testing.T) {
	ws, err := os.MkdirTemp(home, "endless-")
	if err != nil {
		t.Fatal(err)
	}
	name := "endless"
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	r := run(t, "", "run", "--rm", "--review", "--name", name, "--workspace", ws, "--", "sh", "-c",
		`echo small > note.txt && sudo sh -c 'printf "#!/bin/sh\nexec yes 0123456789abcdef0123456789abcdef\n" > /usr/bin/cat.new && chmod 755 /usr/bin/cat.new && mv /usr/bin/cat.new /usr/bin/cat'`)
	if r.code != 0 {
		t.Fatalf("run:\n%s", r)
	}
	start := time.Now()
	d := run(t, "", "diff", name, "note.txt")
	if !strings.Contains(d.stdout+d.stderr, "larger than 1.0 MiB") {
		t.Fatalf("diff of a file the guest's cat streams without end (%v):\n%s", time.Since(start), d)
	}
	if strings.Count(d.stdout, "0123456789abcdef") > 0 {
		t.Fatalf("diff printed the endless stream:\n%.2000s", d.stdout)
	}
	t.Logf("diff gave up after %v", time.Since(start))
}
