package main

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
)

// TestRawOutputSites proves the choke point: kosa8's real stdout and
// stderr (termOut, termErr) are reached only by the functions that must
// have the raw terminal, and nothing keeps a copy of os.Stdout or
// os.Stderr from before guardOutput replaced them. Everything else any
// command prints goes through os.Stdout/os.Stderr, hence termsafe.
func TestRawOutputSites(t *testing.T) {
	allowed := map[string]bool{
		"main":        true, // hands them to execute
		"execute":     true, // the error line when the guard cannot be set up
		"newProgress": true, // the spinner rewrites its line; steps are cleaned
		"execIn":      true, // a guest process's own output, attached on purpose
	}
	fset := token.NewFileSet()
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			if gd, ok := decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				ast.Inspect(gd, func(n ast.Node) bool {
					if vs, ok := n.(*ast.ValueSpec); ok && !slices.ContainsFunc(vs.Names, func(id *ast.Ident) bool { return id.Name == "termOut" }) {
						for _, v := range vs.Values {
							if s := exprString(v); strings.Contains(s, "os.Stdout") || strings.Contains(s, "os.Stderr") {
								t.Errorf("%s: package variable keeps %s from before the guard", fset.Position(v.Pos()), s)
							}
						}
					}
					return true
				})
				continue
			}
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.CallExpr:
					// Asking whether it is a terminal reads nothing out.
					if id, ok := x.Fun.(*ast.Ident); ok && id.Name == "isTerminal" {
						return false
					}
				case *ast.Ident:
					if (x.Name == "termOut" || x.Name == "termErr") && !allowed[fd.Name.Name] {
						t.Errorf("%s: %s uses %s: print through os.Stdout/os.Stderr so termsafe cleans it", fset.Position(x.Pos()), fd.Name.Name, x.Name)
					}
				}
				return true
			})
		}
	}
}

func exprString(e ast.Expr) string {
	var b strings.Builder
	ast.Inspect(e, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := s.X.(*ast.Ident); ok {
				b.WriteString(id.Name + "." + s.Sel.Name + " ")
			}
		}
		return true
	})
	return b.String()
}

// TestRawStdoutCommands: only commands whose stdout is a guest process's
// own (or binary) skip the cleaning; a new one must be added here on
// purpose.
func TestRawStdoutCommands(t *testing.T) {
	var got []string
	for c := range rawStdout {
		got = append(got, c)
	}
	slices.Sort(got)
	if want := []string{"debug", "exec", "run", "shell", "supervise"}; !slices.Equal(got, want) {
		t.Fatalf("raw stdout commands %v, want %v", got, want)
	}
	root := newRoot()
	for c := range rawStdout {
		if found, _, err := root.Find([]string{c}); err != nil || found.Name() != c {
			t.Errorf("raw command %q is not a command", c)
		}
	}
}

// TestGuestTextCleaned plants escape sequences in what a guest controls
// and a stopped sandbox keeps (checkpoint messages, the recorded error,
// the console log) and runs the commands that print them: nothing of it
// reaches the output raw.
func TestGuestTextCleaned(t *testing.T) {
	home := t.TempDir()
	t.Setenv("KOSA8_HOME", home)
	t.Setenv("KOSA8_CONFIG", filepath.Join(home, "config"))
	t.Setenv("KOSA8_CACHE", filepath.Join(home, "cache"))
	const evil = "\x1b]0;pwned\x07\x1b[2J\u009b31m\u202e"
	name := "esc"
	dir := filepath.Join(home, "sandboxes", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.Config{Name: name, Arch: "amd64", CPUs: 1, MemoryMiB: 512, DiskGiB: 8, User: "kosa8", UID: 1000, GID: 1000}
	writeJSON(t, filepath.Join(dir, "sandbox.json"), cfg)
	writeJSON(t, filepath.Join(dir, "state.json"), api.Status{State: api.Crashed, Error: "guest said " + evil})
	if err := os.WriteFile(filepath.Join(dir, sandbox.ConsoleLog), []byte("boot\n"+evil+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sb := &sandbox.Sandbox{Dir: dir, Config: cfg}
	store := sb.Checkpoints()
	id := checkpoint.NewID()
	tmp, err := store.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(tmp, &checkpoint.Meta{ID: id, Created: time.Now(), Kind: "manual", Message: "msg " + evil}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string // shows that the output was captured, cleaned
	}{
		{[]string{"checkpoints", name}, "msg ?]0;pwned??[2J?31m?"},
		{[]string{"ls"}, "esc"},
		{[]string{"logs", name}, "boot\n?]0;pwned??[2J?31m?"},
		{[]string{"exec", name, "--", "true"}, "guest said ?]0;pwned"}, // fails with the recorded error
		{[]string{"inspect", name}, "guest said"},
	} {
		var out, errb bytes.Buffer
		code := execute(newRoot(), tc.args, &out, &errb)
		all := out.String() + errb.String()
		if strings.ContainsAny(all, "\x1b\x07\u009b\u202e") {
			t.Errorf("kosa8 %v (exit %d) printed guest control characters: %q", tc.args, code, all)
		}
		if !strings.Contains(all, tc.want) {
			t.Errorf("kosa8 %v (exit %d) does not show %q: %q", tc.args, code, tc.want, all)
		}
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer safe for the progress goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Every wait over a few seconds shows what it waits for, a count or phase
// and the time: without a terminal as lines repeated while the step lasts,
// on a terminal as one line with a bar.
func TestProgressShowsCountAndElapsed(t *testing.T) {
	var out, log syncBuffer
	p := startProgress(&out, false, 1*time.Second)
	p.Step("installing 40 packages")
	p.LogTo(&log)
	p.Step("unpacking")
	p.Count(10, 40)
	time.Sleep(2500 * time.Millisecond)
	p.Count(40, 40)
	p.Done()
	got := out.String()
	if !strings.Contains(got, "installing 40 packages\nunpacking\n") {
		t.Fatalf("steps not printed once each:\n%s", got)
	}
	if !regexp.MustCompile(`  \.\.\. unpacking: 10/40 \(25%\), [12]\.\ds\n`).MatchString(got) {
		t.Fatalf("no line with the count and the elapsed time while the step lasted:\n%s", got)
	}
	if l := log.String(); !strings.Contains(l, "kosa8: progress: unpacking\n") || !strings.Contains(l, "kosa8: progress: unpacking: 10/40 (25%)\n") ||
		!strings.Contains(l, "kosa8: progress: unpacking: 40/40 (100%)\n") || strings.Contains(l, "installing") {
		t.Fatalf("log lines:\n%s", l)
	}

	var tty syncBuffer
	p = startProgress(&tty, true, time.Hour)
	p.Step("setting up")
	p.Count(5, 10)
	time.Sleep(300 * time.Millisecond)
	p.Step("next")
	p.Done()
	if got := tty.String(); !strings.Contains(got, "setting up  [##########          ] 5/10 50%  0.") ||
		!strings.Contains(got, "\r\x1b[K  setting up: 5/10 (50%)  0.") {
		t.Fatalf("terminal: no bar, or the finished step lacks its time:\n%q", got)
	}
}

// A wait for another build shows that build's last progress line, read
// from its log, and the log's path; the wait's own text is not logged.
func TestWatchBuildLog(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "image-build.log")
	os.WriteFile(logPath, []byte("apt output\nkosa8: progress: booting the build sandbox\nmore\n"), 0o644)
	var out, log syncBuffer
	p := startProgress(&out, false, time.Hour)
	p.LogTo(&log)
	stop := watchBuildLog(p, "waiting for another build", logPath)
	f, _ := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("kosa8: progress: [2/3] npm install -g x \x1b[2J\n")
	f.Close()
	time.Sleep(1500 * time.Millisecond)
	stop()
	p.Done()
	got := out.String()
	for _, want := range []string{
		"waiting for another build (log: " + logPath + "); it is at: booting the build sandbox\n",
		"waiting for another build (log: " + logPath + "); it is at: [2/3] npm install -g x ?[2J\n",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("want %q in:\n%q", want, got)
		}
	}
	if log.String() != "" {
		t.Fatalf("the wait wrote to this build's log: %q", log.String())
	}
	if got := lastProgressLine(filepath.Join(t.TempDir(), "none")); got != "" {
		t.Fatalf("no log: %q", got)
	}
}

// A wait is announced once it lasts (stop, pause, kill); a short one
// prints nothing.
func TestSlowWait(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	oldErr, oldAfter := termErr, slowWaitAfter
	termErr, slowWaitAfter = f, 100*time.Millisecond
	defer func() { termErr, slowWaitAfter = oldErr, oldAfter }()
	slowWait("quick")()
	done := slowWait("stopping sandbox x")
	time.Sleep(400 * time.Millisecond)
	done()
	b, _ := os.ReadFile(f.Name())
	if strings.Contains(string(b), "quick") || !strings.Contains(string(b), "stopping sandbox x\n") {
		t.Fatalf("written: %q", b)
	}
}

// Where there is no terminal (a script, a log), progress says nothing for
// its first seconds: a command that ends or fails at once prints only its
// result; one that goes on has the steps it went through said then.
func TestProgressQuietAtFirstWithoutTerminal(t *testing.T) {
	var b syncBuffer
	p := startProgress(&b, false, time.Hour)
	p.mu.Lock()
	p.quiet = 1500 * time.Millisecond
	p.mu.Unlock()
	p.Step("opening the image")
	p.Step("booting the VM")
	if got := b.String(); got != "" {
		t.Fatalf("said at once: %q", got)
	}
	time.Sleep(2600 * time.Millisecond)
	p.Step("attaching the workspace")
	p.Done()
	if got, want := b.String(), "opening the image\nbooting the VM\nattaching the workspace\n"; got != want {
		t.Fatalf("said %q, want %q", got, want)
	}
}

// KOSA8_PROGRESS=all: a log that asks for every step gets each at once,
// however short the operation.
func TestProgressAllSaysEveryStepAtOnce(t *testing.T) {
	t.Setenv("KOSA8_PROGRESS", "all")
	if q := progressQuiet(); q != 0 {
		t.Fatalf("quiet %v with KOSA8_PROGRESS=all", q)
	}
	var b syncBuffer
	p := startProgress(&b, false, time.Hour)
	p.mu.Lock()
	p.quiet = progressQuiet()
	p.mu.Unlock()
	p.Step("copying in: 1 files")
	p.Done()
	if got := b.String(); got != "copying in: 1 files\n" {
		t.Fatalf("said %q", got)
	}
	t.Setenv("KOSA8_PROGRESS", "")
	if q := progressQuiet(); q != quietFor {
		t.Fatalf("quiet %v by default, want %v", q, quietFor)
	}
}
