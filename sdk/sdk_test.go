package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/kosa8/kosa8/internal/config"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// TestMain keeps `go test ./sdk` free of VM boots: the runnable examples
// start real sandboxes, so they run only with KOSA8_E2E=1 (as
// test/e2e/sdk_test.go runs them), unless -run names them.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("KOSA8_E2E") != "1" && flag.Lookup("test.run").Value.String() == "" {
		_ = flag.Set("test.run", "^(Test|Fuzz)")
	}
	os.Exit(m.Run())
}

// fakeSupervisor serves a sandbox's API socket the way the supervisor
// does, with a guest made of a map of files.
type fakeSupervisor struct {
	t     *testing.T
	mu    sync.Mutex
	files map[string][]byte
	argvs [][]string
	sigs  []byte
	dirs  []string
	// sleeping is told when the client follows a sleep command.
	sleeping chan struct{}
}

// newRunning makes a sandbox directory in a fresh home, holds its
// supervisor lock as a live supervisor does, and serves its API.
func newRunning(t *testing.T, name string) (*Client, *Sandbox, *fakeSupervisor) {
	t.Helper()
	c, sb := newStopped(t, name)
	lock, err := os.OpenFile(sb.sb.Path("supervisor.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	f := &fakeSupervisor{t: t, files: map[string][]byte{}, sleeping: make(chan struct{}, 4)}
	l, err := net.Listen("unix", sb.sb.Path(sandbox.APISocket))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f.routes()}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close(); lock.Close() })
	writeFile(t, sb.sb.Path("state.json"), `{"state":"running"}`)
	return c, sb, f
}

// newStopped makes a stopped sandbox's directory in a fresh home. The
// socket path must stay short: unix socket names are at most 107 bytes.
func newStopped(t *testing.T, name string) (*Client, *Sandbox) {
	t.Helper()
	home, err := os.MkdirTemp("", "k8sdk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	c, err := New(WithHome(home))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(home, "sandboxes", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.Config{Name: name, CPUs: 2, MemoryMiB: 1024, DiskGiB: 16, Network: sandbox.NetworkConfig{Rules: []string{"pypi.org"}}}
	b, _ := json.Marshal(cfg)
	writeFile(t, filepath.Join(dir, "sandbox.json"), string(b))
	writeFile(t, filepath.Join(dir, "state.json"), `{"state":"stopped"}`)
	sb, err := c.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	return c, sb
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeSupervisor) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/exec", f.exec)
	mux.HandleFunc("POST /v1/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		var req api.CheckpointRequest
		json.NewDecoder(r.Body).Decode(&req)
		json.NewEncoder(w).Encode(checkpoint.Meta{ID: "cp1", Message: req.Message, Kind: "manual", PauseMillis: 12, RAMBytes: 4096})
	})
	mux.HandleFunc("POST /v1/rewind", func(w http.ResponseWriter, r *http.Request) {
		var req api.CheckpointRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.ID != "cp1" {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"error": "rewind: no such checkpoint " + req.ID})
			return
		}
		json.NewEncoder(w).Encode(api.RewindResult{To: "cp1", Saved: &checkpoint.Meta{ID: "cp2", Kind: "pre-rewind"}, Millis: 450})
	})
	mux.HandleFunc("POST /v1/pause", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		json.NewEncoder(w).Encode(map[string]string{"error": "pause: not enough disk space"})
	})
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(guest.Info{Kernel: "6.6.1", Machine: "x86_64", Hostname: "x", User: "user", UID: 1000, GID: 1000, Uptime: 3.5})
	})
	mux.HandleFunc("GET /v1/debug/memory", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("RAM\x00\x01"))
	})
	mux.HandleFunc("GET /v1/net/refused", func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		for _, h := range []string{"evil.test", "pypi.example"} {
			enc.Encode(api.Blocked{Host: h, Port: 443, Rule: h, Count: 1, Last: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)})
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	syncStatus := func(w http.ResponseWriter, r *http.Request) {
		st := api.SyncStatus{Path: "/home/me/p", Status: wsync.Status{
			Files: 3,
			Pending: []wsync.Change{
				{Path: "app.py", Kind: "modified", Why: "review", Guest: &wsync.Entry{Path: "app.py", Type: 'f', Size: 12}},
				{Path: "old.txt", Kind: "deleted", Why: "review"},
			},
			Held:      []wsync.Change{{Path: ".envrc", Kind: "added", Why: "host tools run it", Guest: &wsync.Entry{Path: ".envrc", Type: 'l', Link: "target"}}},
			Conflicts: []wsync.Conflict{{Path: "a.txt", Copy: "a.txt.sandbox", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
			Quota:     wsync.Quota{Bytes: 10, MaxBytes: 100, Files: 1, MaxFiles: 50, Refused: 2},
		}}
		if r.Method == "POST" {
			st.Files = 4 // a full pass found one more
		}
		json.NewEncoder(w).Encode(st)
	}
	mux.HandleFunc("GET /v1/sync", syncStatus)
	mux.HandleFunc("POST /v1/sync/now", syncStatus)
	mux.HandleFunc("POST /v1/sync/{what}", func(w http.ResponseWriter, r *http.Request) {
		var req api.SyncRequest
		json.NewDecoder(r.Body).Decode(&req)
		if r.PathValue("what") == "approve" && len(req.Paths) == 0 {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"error": "approve needs the paths to approve, one by one"})
			return
		}
		json.NewEncoder(w).Encode(api.SyncResponse{Done: append([]string{r.PathValue("what")}, req.Paths...)})
	})
	mux.HandleFunc("POST /v1/net/allow", func(w http.ResponseWriter, r *http.Request) {
		var req api.NetRequest
		json.NewDecoder(r.Body).Decode(&req)
		json.NewEncoder(w).Encode(api.NetResponse{Rules: append([]string{"pypi.org"}, req.Rules...)})
	})
	return mux
}

// exec answers an exec upgrade like the supervisor, then plays a guest
// that knows echo, cat, the WriteFile script, find and sleep.
func (f *fakeSupervisor) exec(w http.ResponseWriter, r *http.Request) {
	var req guest.ExecRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.Header.Get("Upgrade") != "kosa8-exec" {
		http.Error(w, "bad exec", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.argvs = append(f.argvs, req.Argv)
	f.dirs = append(f.dirs, req.Dir)
	f.mu.Unlock()
	conn, brw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: kosa8-exec\r\nConnection: Upgrade\r\nKosa8-Exec-Id: e1\r\nKosa8-Exec-Pid: 7\r\n\r\n")
	brw.Flush()
	// Collect stdin up to EOF and signals, as the agent would.
	var stdin bytes.Buffer
	eof := make(chan struct{})
	sig := make(chan byte, 4)
	resized := make(chan guest.WindowSize, 4)
	go func() {
		defer close(eof)
		for {
			fr, err := guest.ReadFrame(brw.Reader)
			if err != nil {
				return
			}
			switch fr.Kind {
			case guest.FrameStdin:
				stdin.Write(fr.Payload)
			case guest.FrameSignal:
				f.mu.Lock()
				f.sigs = append(f.sigs, fr.Payload[0])
				f.mu.Unlock()
				sig <- fr.Payload[0]
			case guest.FrameResize:
				var ws guest.WindowSize
				json.Unmarshal(fr.Payload, &ws)
				resized <- ws
			case guest.FrameStdinEOF:
				switch req.Argv[0] {
				case "sleep":
					// The client pumps (so it follows the command) from here.
					f.sleeping <- struct{}{}
				case "tty":
				case "cat":
					if req.Argv[2] != "/dev/zero" { // that one is followed until a signal
						return
					}
				default:
					return
				}
			}
		}
	}()
	exit := func(code int, signal string) {
		guest.WriteJSON(conn, guest.FrameExit, guest.ExitStatus{Code: code, Signal: signal})
	}
	switch req.Argv[0] {
	case "echo":
		guest.WriteFrame(conn, guest.FrameStdout, []byte(strings.Join(req.Argv[1:], " ")+"\n"))
		guest.WriteFrame(conn, guest.FrameStderr, []byte("to stderr\n"))
		exit(3, "")
	case "cat":
		if req.Argv[2] == "/dev/zero" {
			// An endless file: streamed until the client signals.
			chunk := make([]byte, 64<<10)
			for sent := 0; sent < 1<<30; sent += len(chunk) {
				select {
				case s := <-sig:
					exit(128+int(s), "SIGKILL")
					return
				default:
				}
				if err := guest.WriteFrame(conn, guest.FrameStdout, chunk); err != nil {
					return
				}
			}
			exit(0, "")
			return
		}
		f.mu.Lock()
		b, ok := f.files[req.Argv[2]]
		f.mu.Unlock()
		if !ok {
			guest.WriteFrame(conn, guest.FrameStderr, []byte("cat: "+req.Argv[2]+": No such file or directory\n"))
			exit(1, "")
			return
		}
		guest.WriteFrame(conn, guest.FrameStdout, b)
		exit(0, "")
	case "sh":
		<-eof
		f.mu.Lock()
		f.files[req.Argv[4]] = append([]byte(req.Argv[5]+":"), stdin.Bytes()...)
		f.mu.Unlock()
		exit(0, "")
	case "tty":
		// Says what terminal it got, waits for a new size and a signal, and
		// ends with the signal.
		guest.WriteFrame(conn, guest.FrameStdout, fmt.Appendf(nil, "tty %v %dx%d\n", req.TTY, req.Rows, req.Cols))
		select {
		case ws := <-resized:
			guest.WriteFrame(conn, guest.FrameStdout, fmt.Appendf(nil, "resized %dx%d\n", ws.Rows, ws.Cols))
		case <-time.After(10 * time.Second):
		}
		select {
		case s := <-sig:
			exit(128+int(s), "")
		case <-time.After(10 * time.Second):
			exit(0, "")
		}
	case "sleep":
		select {
		case s := <-sig:
			exit(128+int(s), "SIGKILL")
		case <-time.After(10 * time.Second):
			exit(0, "")
		}
	default:
		guest.WriteJSON(conn, guest.FrameError, guest.Response{Error: "exec " + req.Argv[0] + ": not found"})
	}
}

func TestExecStreamsOutputAndExitCode(t *testing.T) {
	_, sb, f := newRunning(t, "x")
	var out, errb bytes.Buffer
	res, err := sb.Exec(context.Background(), Cmd{Args: []string{"echo", "hi", "there"}, Dir: "/tmp", Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.TimedOut || out.String() != "hi there\n" || errb.String() != "to stderr\n" {
		t.Fatalf("got %+v stdout %q stderr %q", res, out.String(), errb.String())
	}
	if f.dirs[0] != "/tmp" {
		t.Fatalf("dir %q", f.dirs[0])
	}
	// Output turns the non-zero exit into an ExitError with stderr.
	_, err = sb.Output(context.Background(), "echo", "x")
	var ee *ExitError
	if !errors.As(err, &ee) || ee.ExitCode != 3 || !strings.Contains(ee.Error(), "to stderr") {
		t.Fatalf("Output: %v", err)
	}
	// An agent error is an error, not an exit code: the guest's reason,
	// apart from what was asked of which sandbox.
	_, err = sb.Exec(context.Background(), Cmd{Args: []string{"nope"}})
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "exec in x" || oe.Err.Error() != "exec nope: not found" || err.Error() != "exec in x: exec nope: not found" {
		t.Fatalf("unknown command: %#v", err)
	}
	if _, err := sb.Exec(context.Background(), Cmd{}); err == nil {
		t.Fatal("empty command accepted")
	}
}

func TestExecTimeoutKillsTheCommand(t *testing.T) {
	_, sb, f := newRunning(t, "x")
	start := time.Now()
	res, err := sb.Exec(context.Background(), Cmd{Args: []string{"sleep", "600"}, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.ExitCode != 137 || res.Signal != "SIGKILL" {
		t.Fatalf("got %+v", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
	f.mu.Lock()
	sigs := string(f.sigs)
	f.mu.Unlock()
	if sigs != string([]byte{byte(syscall.SIGKILL)}) {
		t.Fatalf("signals sent: %v", []byte(sigs))
	}
	// A context that ends once the command runs does the same.
	<-f.sleeping
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-f.sleeping; cancel() }()
	res, err = sb.Exec(ctx, Cmd{Args: []string{"sleep", "600"}})
	if err != nil || !res.TimedOut {
		t.Fatalf("ctx end: %+v %v", res, err)
	}
}

// notASignal is an os.Signal the guest has no number for.
type notASignal struct{}

func (notASignal) String() string { return "not a signal" }
func (notASignal) Signal()        {}

// A command on a terminal gets its size at the start and later, and the
// signals sent it, as the guest's numbers; Started hears of it first.
func TestExecTerminal(t *testing.T) {
	_, sb, f := newRunning(t, "x")
	resize := make(chan WindowSize, 1)
	sigs := make(chan os.Signal, 2)
	resize <- WindowSize{Rows: 50, Cols: 132}
	sigs <- notASignal{} // dropped
	sigs <- syscall.SIGUSR1
	var out bytes.Buffer
	pid, before := 0, -1
	res, err := sb.Exec(context.Background(), Cmd{Args: []string{"tty"}, TTY: true, Size: WindowSize{Rows: 24, Cols: 80}, Resize: resize, Signals: sigs, Stdout: &out,
		Started: func(p int) { pid, before = p, out.Len() }})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "tty true 24x80\nresized 50x132\n" || res.ExitCode != 128+10 {
		t.Fatalf("exit %d, output %q", res.ExitCode, out.String())
	}
	if pid != 7 || before != 0 {
		t.Fatalf("started: pid %d with %d bytes of output passed on", pid, before)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if string(f.sigs) != "\x0a" {
		t.Fatalf("signals sent %v", []byte(f.sigs))
	}
}

// The guest numbers signals as Linux does, whatever the host.
func TestGuestSignal(t *testing.T) {
	for _, tc := range []struct {
		sig  os.Signal
		want byte
	}{
		{syscall.SIGINT, 2}, {syscall.SIGKILL, 9}, {syscall.SIGUSR1, 10}, {syscall.SIGUSR2, 12}, {syscall.SIGPIPE, 13},
		{syscall.SIGTERM, 15}, {syscall.SIGCHLD, 17}, {syscall.SIGCONT, 18}, {syscall.SIGSTOP, 19}, {syscall.SIGTSTP, 20}, {syscall.SIGWINCH, 28},
	} {
		if got, ok := guestSignal(tc.sig); !ok || got != tc.want {
			t.Errorf("%v: %d %v, want %d", tc.sig, got, ok, tc.want)
		}
	}
	if _, ok := guestSignal(notASignal{}); ok {
		t.Error("a signal with no number was sent")
	}
	if runtime.GOOS == "linux" {
		for s, n := range linuxSignals {
			if byte(s) != n {
				t.Errorf("%v is %d on Linux, mapped to %d", s, int(s), n)
			}
		}
	}
}

func TestFilesRoundTrip(t *testing.T) {
	_, sb, f := newRunning(t, "x")
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "notes/a.txt", []byte("data\x00bin"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The relative path stays relative (never an option), the mode is octal.
	if got := string(f.files["./notes/a.txt"]); got != "600:data\x00bin" {
		t.Fatalf("written %q (files %v)", got, f.files)
	}
	f.files["/etc/x"] = []byte("content")
	b, err := sb.ReadFile(ctx, "/etc/x")
	if err != nil || string(b) != "content" {
		t.Fatalf("read %q %v", b, err)
	}
	if _, err := sb.ReadFile(ctx, "/missing"); err == nil || !strings.Contains(err.Error(), "No such file") {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := sb.ReadFile(ctx, ""); err == nil {
		t.Fatal("empty path accepted")
	}
	if f.argvs[1][1] != "--" {
		t.Fatalf("cat without --: %v", f.argvs[1])
	}
}

// A hostile guest answers a read with an endless stream (a link to
// /dev/zero, a FIFO it keeps writing): ReadFile (MCP's read_file) must stop
// the command once past its bound, not read on for as long as the guest
// sends.
func TestReadFileStopsAnEndlessFile(t *testing.T) {
	_, sb, f := newRunning(t, "x")
	done := make(chan error, 1)
	go func() {
		_, err := sb.ReadFile(context.Background(), "/dev/zero")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("ReadFile of an endless file: %v, want too large", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("ReadFile of an endless file did not end")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sigs) == 0 {
		t.Fatal("the endless cat was not signalled")
	}
}

func TestParseList(t *testing.T) {
	in := "f\x0012\x00644\x001700000000.5\x00b\nname\x00\x00" +
		"d\x004096\x00755\x001700000000.0\x00a dir\x00\x00" +
		"l\x005\x00777\x001700000000.0\x00link\x00../x\x00"
	got, err := parseList([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Name != "a dir" || got[0].Type != "dir" || got[1].Name != "b\nname" || got[1].Size != 12 ||
		got[1].Mode != 0o644 || got[2].Link != "../x" || got[2].Type != "link" || got[1].ModTime.UnixMilli() != 1700000000500 {
		t.Fatalf("got %+v", got)
	}
	for _, bad := range []string{"f\x001\x00", "f\x00x\x00644\x001\x00n\x00\x00", "f\x001\x00644\x001\x00a/b\x00\x00", "f\x001\x00644\x001\x00\x00\x00"} {
		if _, err := parseList([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if got, err := parseList(nil); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v %v", got, err)
	}
}

func FuzzParseList(f *testing.F) {
	f.Add([]byte("f\x0012\x00644\x001700000000.5\x00b\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		list, err := parseList(b)
		if err != nil {
			return
		}
		for _, e := range list {
			if e.Name == "" || strings.ContainsRune(e.Name, '/') {
				t.Fatalf("bad name accepted: %q", e.Name)
			}
		}
	})
}

func TestCheckpointAndRewind(t *testing.T) {
	_, sb, _ := newRunning(t, "x")
	ctx := context.Background()
	cp, err := sb.Checkpoint(ctx, "before")
	if err != nil || cp.ID != "cp1" || cp.Message != "before" || cp.PauseMillis != 12 || !cp.Current {
		t.Fatalf("checkpoint %+v %v", cp, err)
	}
	res, err := sb.Rewind(ctx, "cp1")
	if err != nil || res.To != "cp1" || res.Saved == nil || res.Saved.ID != "cp2" {
		t.Fatalf("rewind %+v %v", res, err)
	}
	_, err = sb.Rewind(ctx, "nope")
	if err == nil || err.Error() != "rewind x to nope: rewind: no such checkpoint nope" {
		t.Fatalf("rewind to nothing: %v", err)
	}
	// The supervisor's own reason, apart from what was asked of which sandbox.
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "rewind x to nope" || oe.Err.Error() != "rewind: no such checkpoint nope" {
		t.Fatalf("rewind error %#v", err)
	}
	err = sb.Pause(ctx)
	if !errors.As(err, &oe) || oe.Op != "pause x" || err.Error() != "pause x: pause: not enough disk space" {
		t.Fatalf("failed pause: %#v", err)
	}
}

func TestStoppedSandbox(t *testing.T) {
	_, sb := newStopped(t, "s")
	ctx := context.Background()
	if _, err := sb.Exec(ctx, Cmd{Args: []string{"true"}}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("exec in a stopped sandbox: %v", err)
	}
	if _, err := sb.Checkpoint(ctx, ""); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("checkpoint of a stopped sandbox: %v", err)
	}
	if err := sb.Stop(ctx); err != nil {
		t.Fatalf("stop of a stopped sandbox: %v", err)
	}
	// Network rules of a stopped sandbox are edited in its state.
	rules, err := sb.Allow(ctx, "example.com:22", "*.npmjs.org")
	if err != nil || strings.Join(rules, " ") != "pypi.org example.com:22 *.npmjs.org" {
		t.Fatalf("allow: %v %v", rules, err)
	}
	if _, err := sb.Allow(ctx, "*.com"); err == nil {
		t.Fatal("a broad rule was accepted without AllowBroad")
	}
	rules, err = sb.Remove(ctx, "pypi.org")
	if err != nil || strings.Join(rules, " ") != "example.com:22 *.npmjs.org" {
		t.Fatalf("remove: %v %v", rules, err)
	}
	if _, err := sb.Remove(ctx, "pypi.org"); err == nil {
		t.Fatal("removing a rule that is not there succeeded")
	}
	rules, err = sb.Deny(ctx, "evil.npmjs.org")
	if err != nil || strings.Join(rules, " ") != "example.com:22 *.npmjs.org deny:evil.npmjs.org" {
		t.Fatalf("deny: %v %v", rules, err)
	}
	if got, _ := sb.Rules(ctx); len(got) != 3 {
		t.Fatalf("rules after: %v", got)
	}
	if err := sb.AddPort(ctx, Port{HostPort: 3000}); err != nil {
		t.Fatal(err)
	}
	if err := sb.AddPort(ctx, Port{HostPort: 3000}); err == nil {
		t.Fatal("a host port forwarded twice")
	}
	if ports, _ := sb.Ports(ctx); len(ports) != 1 || ports[0].GuestPort != 3000 {
		t.Fatalf("ports: %v", ports)
	}
	if err := sb.RemovePort(ctx, 3000); err != nil {
		t.Fatal(err)
	}
	if ports, _ := sb.Ports(ctx); len(ports) != 0 {
		t.Fatalf("ports after rm: %v", ports)
	}
	// A blocked lookup shows with the rule that allows it, until allowed.
	writeFile(t, sb.sb.Path(sandbox.AuditLog), `{"time":"2026-01-01T00:00:00Z","kind":"dns","name":"evil.example","decision":"deny"}`+"\n")
	bl, err := sb.Blocked(ctx)
	if err != nil || len(bl) != 1 || bl[0].Rule != "evil.example" {
		t.Fatalf("blocked: %+v %v", bl, err)
	}
	sb.Allow(ctx, "evil.example")
	if bl, _ := sb.Blocked(ctx); len(bl) != 0 {
		t.Fatalf("still blocked after allow: %+v", bl)
	}
	// The rule change of a stopped sandbox is in its log, as a running
	// one's is.
	if log, _ := sb.NetLog(ctx); len(log) != 2 || log[0].Decision != "deny" || log[1].Kind != "policy" || log[1].Decision != "allow" || log[1].Rule != "evil.example" {
		t.Fatalf("net log: %+v", log)
	}
}

func TestRunningSandboxNetwork(t *testing.T) {
	_, sb, _ := newRunning(t, "x")
	rules, err := sb.Allow(context.Background(), "example.com")
	if err != nil || strings.Join(rules, " ") != "pypi.org example.com" {
		t.Fatalf("allow through the API: %v %v", rules, err)
	}
	if sb.Info().State != Running {
		t.Fatalf("state %s", sb.Info().State)
	}
}

func TestCreateConfig(t *testing.T) {
	home, _ := os.MkdirTemp("", "k8sdk-")
	defer os.RemoveAll(home)
	ws := filepath.Join(home, "my project")
	os.Mkdir(ws, 0o755)
	c, _ := New(WithHome(home))
	cfg, err := c.config(CreateOptions{Workspace: ws, CPUs: 3, Memory: "2G", Allow: []string{"github.com:22"}, Ports: []string{"8080:80"}, Env: []string{"A=b"}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CPUs != 3 || cfg.MemoryMiB != 2048 || cfg.Workspace == nil || cfg.Network.Rules[0] != "github.com:22" ||
		cfg.Network.Ports[0].GuestPort != 80 || cfg.Env[0] != "A=b" || !strings.HasPrefix(cfg.Name, "my-project-") {
		t.Fatalf("config %+v", cfg)
	}
	for name, o := range map[string]CreateOptions{
		"broad rule":     {Allow: []string{"*"}},
		"bad memory":     {Memory: "lots"},
		"bad name":       {Name: "../x"},
		"bad accel":      {Accel: "fast"},
		"missing folder": {Workspace: filepath.Join(home, "nope")},
		"unknown secret": {Secrets: []string{"NOPE"}},
		"bad env":        {Env: []string{"NOEQUALS"}},
	} {
		if _, err := c.config(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestBinary(t *testing.T) {
	c, _ := New(WithBinary("/nonexistent/kosa8"))
	if _, err := c.Binary(); err == nil {
		t.Fatal("a missing binary was accepted")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "kosa8"), []byte("#!/bin/sh\n"), 0o755)
	t.Setenv("PATH", dir)
	c, _ = New()
	if p, err := c.Binary(); err != nil || p != filepath.Join(dir, "kosa8") {
		t.Fatalf("from PATH: %q %v", p, err)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := c.Binary(); err == nil || !strings.Contains(err.Error(), "WithBinary") {
		t.Fatalf("none: %v", err)
	}
}

func TestForFolder(t *testing.T) {
	c, sb := newStopped(t, "a")
	ws := t.TempDir()
	real, _ := filepath.EvalSymlinks(ws)
	sb.sb.Config.Workspace = &sandbox.WorkspaceConfig{Path: real}
	b, _ := json.Marshal(sb.sb.Config)
	writeFile(t, sb.sb.Path("sandbox.json"), string(b))
	got, err := c.ForFolder(context.Background(), ws)
	if err != nil || len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("for folder: %+v %v", got, err)
	}
	if got, _ := c.ForFolder(context.Background(), t.TempDir()); len(got) != 0 {
		t.Fatalf("other folder: %+v", got)
	}
}

func TestCapBuffer(t *testing.T) {
	b := &capBuffer{max: 4}
	io.WriteString(b, "abc")
	io.WriteString(b, "def")
	if string(b.Bytes()) != "abcd" || !b.over {
		t.Fatalf("head: %q", b.Bytes())
	}
	tail := &capBuffer{max: 4, tail: true}
	io.WriteString(tail, "abc")
	io.WriteString(tail, "def")
	if string(tail.Bytes()) != "cdef" || !tail.over {
		t.Fatalf("tail: %q", tail.Bytes())
	}
}

func TestGuestInfoAndMemory(t *testing.T) {
	_, sb, _ := newRunning(t, "x")
	ctx := context.Background()
	i, err := sb.GuestInfo(ctx)
	if err != nil || i.Kernel != "6.6.1" || i.User != "user" || i.UID != 1000 || i.Uptime != 3.5 {
		t.Fatalf("guest info %+v %v", i, err)
	}
	// The same JSON as the API's, which `kosa8 inspect` prints.
	want, _ := json.Marshal(guest.Info{Kernel: "6.6.1", Machine: "x86_64", Hostname: "x", User: "user", UID: 1000, GID: 1000, Uptime: 3.5})
	if got, _ := json.Marshal(i); string(got) != string(want) {
		t.Fatalf("guest info JSON %s, want %s", got, want)
	}
	var ram bytes.Buffer
	if err := sb.DumpMemory(ctx, &ram); err != nil || ram.String() != "RAM\x00\x01" {
		t.Fatalf("memory %q %v", ram.String(), err)
	}

	_, stopped := newStopped(t, "s")
	if _, err := stopped.GuestInfo(ctx); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("guest info of a stopped sandbox: %v", err)
	}
	if err := stopped.DumpMemory(ctx, io.Discard); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("memory of a stopped sandbox: %v", err)
	}
}

func TestWatchRefused(t *testing.T) {
	_, sb, _ := newRunning(t, "x")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []Blocked
	enough := errors.New("enough")
	err := sb.WatchRefused(ctx, func(b Blocked) error {
		got = append(got, b)
		if len(got) == 2 {
			return enough
		}
		return nil
	})
	if !errors.Is(err, enough) || len(got) != 2 || got[0].Host != "evil.test" || got[1].Rule != "pypi.example" || got[0].Port != 443 {
		t.Fatalf("watch: %v %+v", err, got)
	}
	// The same JSON as the API's, which 'kosa8 net approve --json' prints.
	want, _ := json.Marshal(api.Blocked{Host: "evil.test", Port: 443, Rule: "evil.test", Count: 1, Last: got[0].Last})
	if b, _ := json.Marshal(got[0]); string(b) != string(want) {
		t.Fatalf("JSON %s, want %s", b, want)
	}

	// Ending ctx ends the watch without an error.
	ctx2, cancel2 := context.WithCancel(context.Background())
	n := 0
	err = sb.WatchRefused(ctx2, func(Blocked) error {
		if n++; n == 2 {
			cancel2()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("watch until ctx ends: %v", err)
	}

	_, stopped := newStopped(t, "s")
	if err := stopped.WatchRefused(context.Background(), func(Blocked) error { return nil }); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("watch a stopped sandbox: %v", err)
	}
}

func TestSyncStatusAndChanges(t *testing.T) {
	_, sb, _ := newRunning(t, "x")
	ctx := context.Background()
	st, err := sb.SyncStatus(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.Path != "/home/me/p" || st.Files != 3 || len(st.Pending) != 2 || len(st.Held) != 1 || len(st.Conflicts) != 1 {
		t.Fatalf("status %+v", st)
	}
	if c := st.Pending[0]; c.Type != "file" || c.Size != 12 || c.Why != "review" {
		t.Fatalf("pending file %+v", c)
	}
	if c := st.Pending[1]; c.Type != "" || c.Size != 0 {
		t.Fatalf("deleted: no sandbox side %+v", c)
	}
	if c := st.Held[0]; c.Type != "link" || c.Link != "target" || c.Why != "host tools run it" {
		t.Fatalf("held link %+v", c)
	}
	if q := st.Quota; q != (SyncQuota{Bytes: 10, MaxBytes: 100, Files: 1, MaxFiles: 50, Refused: 2}) {
		t.Fatalf("quota %+v", q)
	}
	// The quota and conflicts as the API writes them ('kosa8 sync status
	// --json' prints these).
	for _, pair := range [][2]any{
		{st.Quota, wsync.Quota{Bytes: 10, MaxBytes: 100, Files: 1, MaxFiles: 50, Refused: 2}},
		{st.Conflicts[0], wsync.Conflict{Path: "a.txt", Copy: "a.txt.sandbox", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
	} {
		got, _ := json.Marshal(pair[0])
		want, _ := json.Marshal(pair[1])
		if string(got) != string(want) {
			t.Fatalf("JSON %s, want %s", got, want)
		}
	}
	if st, err := sb.SyncStatus(ctx, true); err != nil || st.Files != 4 {
		t.Fatalf("status after a full pass: %+v %v", st, err)
	}

	for _, tc := range []struct {
		name  string
		call  func(context.Context, ...string) ([]string, error)
		paths []string
		want  string
	}{
		{"apply all", sb.ApplyChanges, nil, "apply"},
		{"apply some", sb.ApplyChanges, []string{"app.py"}, "apply app.py"},
		{"approve", sb.ApproveChanges, []string{".envrc"}, "approve .envrc"},
		{"discard all", sb.DiscardChanges, nil, "discard"},
	} {
		done, err := tc.call(ctx, tc.paths...)
		if err != nil || strings.Join(done, " ") != tc.want {
			t.Errorf("%s: %v %v", tc.name, done, err)
		}
	}
	if _, err := sb.ApproveChanges(ctx); err == nil || !strings.Contains(err.Error(), "approve needs the paths") {
		t.Fatalf("approve nothing: %v", err)
	}

	_, stopped := newStopped(t, "s")
	if _, err := stopped.ApplyChanges(ctx); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("apply in a stopped sandbox: %v", err)
	}
}

// TestCreateRefusesDockerWithoutItsImage: a trusted kosa8.toml that asks
// for a container engine is refused at Create, saying how to make such a
// sandbox, rather than failing at its start (the SDK makes sandboxes of
// the base image only).
func TestCreateRefusesDockerWithoutItsImage(t *testing.T) {
	home := t.TempDir()
	ws := filepath.Join(home, "proj")
	os.Mkdir(ws, 0o755)
	writeFile(t, filepath.Join(ws, config.FileName), "[sandbox]\ndocker = true\n")
	c, _ := New(WithHome(home))
	data := []byte("[sandbox]\ndocker = true\n")
	real, _ := filepath.EvalSymlinks(filepath.Join(ws, config.FileName))
	if err := config.NewTrustStore(c.paths.Config).Trust(real, data); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.config(CreateOptions{Workspace: ws})
	if err != nil || cfg.Docker == nil {
		t.Fatalf("the trusted file's docker = true: %+v %v", cfg.Docker, err)
	}
	if _, err := c.Create(context.Background(), CreateOptions{Workspace: ws}); err == nil || !strings.Contains(err.Error(), "kosa8 create --docker") {
		t.Fatalf("Create: %v", err)
	}
}
