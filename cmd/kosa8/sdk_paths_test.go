package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// fakeRunning makes a sandbox in a fresh home that looks running: its
// supervisor lock held, mux serving its API socket; ws is its workspace
// folder ("" for none). The home is short: a unix socket's path is at most
// 107 bytes.
func fakeRunning(t *testing.T, name, ws string, mux http.Handler) *sandbox.Sandbox {
	t.Helper()
	home, err := os.MkdirTemp("", "k8c-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	t.Setenv("KOSA8_HOME", home)
	t.Setenv("KOSA8_CONFIG", filepath.Join(home, "config"))
	t.Setenv("KOSA8_CACHE", filepath.Join(home, "cache"))
	sb := fakeSandbox(t, home, name, ws, api.Status{State: api.Running})
	lock, err := os.OpenFile(sb.Path("supervisor.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sb.Path(sandbox.APISocket))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close(); lock.Close() })
	if !sb.Alive() {
		t.Fatal("the fake sandbox does not look running")
	}
	return sb
}

// rawTerminal points kosa8's own stdout and stderr (a guest process's
// output, the progress line) at a file for the test.
func rawTerminal(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "terminal"))
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := termOut, termErr
	termOut, termErr = f, f
	t.Cleanup(func() { termOut, termErr = oldOut, oldErr; f.Close() })
	return f
}

// fullMeta is a checkpoint's metadata with every field set.
func fullMeta(id string) *checkpoint.Meta {
	return &checkpoint.Meta{
		Version: 1, ID: id, Parent: "cp0", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Message: "before", Kind: "manual",
		QEMU: "QEMU emulator version 9.2.0", Firmware: "qboot.rom", Arch: "amd64", MemoryMiB: 1024,
		Disks:    map[string]checkpoint.Disk{"root": {Path: "checkpoints/" + id + "/root.qcow2", Format: "qcow2"}},
		RAMBytes: 300 << 20, DeviceBytes: 4096, PauseMillis: 41.5, TotalMillis: 120.25,
		Incremental: true, RAMCopiedBytes: 12 << 20, FullCopyReason: "parent's spare was busy", Verify: "ok",
	}
}

func decodeMap(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("not JSON: %v: %q", err, s)
	}
	return m
}

func jsonOf(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return decodeMap(t, string(b))
}

// `kosa8 checkpoint` and `kosa8 rewind` print what the supervisor said:
// --json every key of its answer (scripts and the bench read pause_ms,
// incremental, ram_copied_bytes, verify, saved.total_ms...), and its
// refusal in its own words.
func TestCheckpointAndRewindOutput(t *testing.T) {
	id := checkpoint.NewID()
	meta := fullMeta(id)
	rw := api.RewindResult{
		To: id, Saved: fullMeta("cp2"), Millis: 450, SavedMillis: 900, Warning: "the workspace was not merged", ColdBoot: true,
		Conflicts: []wsync.Conflict{{Path: "a.txt", Copy: "a.txt.sandbox-conflict-1", Time: time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)}},
	}
	refuse := false
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		if refuse {
			w.WriteHeader(http.StatusInternalServerError)
			json.NewEncoder(w).Encode(api.ErrorResponse{Error: "checkpoint: not enough disk space"})
			return
		}
		json.NewEncoder(w).Encode(meta)
	})
	mux.HandleFunc("POST /v1/rewind", func(w http.ResponseWriter, r *http.Request) {
		if refuse {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorResponse{Error: "rewind: no such checkpoint " + id})
			return
		}
		json.NewEncoder(w).Encode(rw)
	})
	sb := fakeRunning(t, "cp", "", mux)
	rawTerminal(t) // the progress line
	store := sb.Checkpoints()
	tmp, err := store.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(tmp, &checkpoint.Meta{ID: id, Created: time.Now(), Kind: "manual"}); err != nil {
		t.Fatal(err)
	}

	code, out, stderr := kosa8(t, "checkpoint", "cp", "-m", "before", "--json")
	if code != 0 {
		t.Fatalf("checkpoint --json: exit %d %q", code, stderr)
	}
	got, want := decodeMap(t, out), jsonOf(t, meta)
	// Added by the SDK: it is the one the machine descends from.
	if got["current"] != true {
		t.Errorf("checkpoint --json: current %v", got["current"])
	}
	delete(got, "current")
	delete(got, "disk_bytes")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("checkpoint --json:\n got  %v\n want %v", got, want)
	}
	code, out, _ = kosa8(t, "checkpoint", "cp")
	if code != 0 || !strings.HasPrefix(out, id+"  paused 42 ms, total 120 ms, 300.0 MiB RAM, ") {
		t.Errorf("checkpoint: exit %d %q", code, out)
	}

	code, out, stderr = kosa8(t, "rewind", "cp", "latest", "--json")
	if code != 0 {
		t.Fatalf("rewind --json: exit %d %q", code, stderr)
	}
	if got, want := decodeMap(t, out), jsonOf(t, rw); !reflect.DeepEqual(got, want) {
		t.Errorf("rewind --json:\n got  %v\n want %v", got, want)
	}
	code, out, stderr = kosa8(t, "rewind", "cp", id)
	if code != 0 || out != "rewound to "+id+" in 450 ms; the state before is checkpoint cp2\n  kept your version: a.txt\n" ||
		!strings.Contains(stderr, "kosa8: warning: the workspace was not merged\n") || !strings.Contains(stderr, "booted from its disks") {
		t.Errorf("rewind: exit %d %q %q", code, out, stderr)
	}
	rw.Saved = nil
	code, out, _ = kosa8(t, "rewind", "cp", id, "--json")
	if got := decodeMap(t, out); code != 0 || got["saved"] != nil || len(got) != len(jsonOf(t, rw)) {
		t.Errorf("rewind --json without a saved state: exit %d %q", code, out)
	}

	refuse = true
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"checkpoint", "cp"}, "kosa8: checkpoint: not enough disk space\n"},
		{[]string{"rewind", "cp", id}, "kosa8: rewind: no such checkpoint " + id + "\n"},
	} {
		code, out, stderr := kosa8(t, tc.args...)
		if code != exitKosa8 || out != "" || !strings.HasSuffix(stderr, tc.want) {
			t.Errorf("kosa8 %v refused: exit %d %q %q, want %q", tc.args, code, out, stderr, tc.want)
		}
	}
}

// fakeExec answers an exec upgrade as the supervisor does, then plays a
// guest: argv[0] picks the ending.
func fakeExec(t *testing.T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req guest.ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.Header.Get("Upgrade") != api.ExecUpgrade {
			http.Error(w, "bad exec", http.StatusBadRequest)
			return
		}
		if req.Argv[0] == "nope" {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(api.ExecErrorResponse{Error: "exec nope: not found", ExitCode: exitNotFound})
			return
		}
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", api.ExecUpgrade)
		brw.Flush()
		frames := make(chan guest.Frame, 16)
		go func(rd *bufio.Reader) {
			defer close(frames)
			for {
				f, err := guest.ReadFrame(rd)
				if err != nil {
					return
				}
				frames <- f
			}
		}(brw.Reader)
		exit := func(st guest.ExitStatus) { guest.WriteJSON(conn, guest.FrameExit, st) }
		switch req.Argv[0] {
		case "echo":
			guest.WriteFrame(conn, guest.FrameStdout, []byte(strings.Join(req.Argv[1:], " ")+"\n"))
			guest.WriteFrame(conn, guest.FrameStderr, []byte("to stderr\n"))
			exit(guest.ExitStatus{Code: 3})
		case "agentfail":
			guest.WriteJSON(conn, guest.FrameError, guest.Response{Error: "exec agentfail: no such user"})
		case "waitfail":
			exit(guest.ExitStatus{Error: "wait: no child processes"})
		case "hangup":
			// The stream ends without an exit.
		case "env":
			guest.WriteFrame(conn, guest.FrameStdout, fmt.Appendf(nil, "tty=%v %s dir=%s\n", req.TTY, strings.Join(req.Env, ","), req.Dir))
			exit(guest.ExitStatus{})
		case "sigwait":
			// Exits with the first signal it is sent, as a shell would.
			guest.WriteFrame(conn, guest.FrameStdout, []byte("waiting\n"))
			for f := range frames {
				if f.Kind == guest.FrameSignal {
					exit(guest.ExitStatus{Code: 128 + int(f.Payload[0])})
					return
				}
			}
		}
	}
}

// `kosa8 exec` passes the command's exit status on, its output raw; its
// own failures (the stream, the agent) exit 125, a command not found 127,
// each with the reason as it was given.
func TestExecExitCodesAndErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/exec", fakeExec(t))
	fakeRunning(t, "ex", "", mux)
	outFile := rawTerminal(t)
	for _, tc := range []struct {
		argv   []string
		code   int
		stderr string // kosa8's own, the end of it
	}{
		{[]string{"echo", "hi"}, 3, ""},
		{[]string{"nope"}, exitNotFound, "kosa8: exec nope: not found\n"},
		{[]string{"agentfail"}, exitKosa8, "kosa8: exec agentfail: no such user\n"},
		{[]string{"waitfail"}, exitKosa8, "kosa8: wait: no child processes\n"},
		{[]string{"hangup"}, exitKosa8, "kosa8: exec stream: EOF\n"},
	} {
		code, _, stderr := kosa8(t, append([]string{"exec", "ex", "--"}, tc.argv...)...)
		if code != tc.code || !strings.HasSuffix(stderr, tc.stderr) || (tc.stderr == "" && stderr != "") {
			t.Errorf("exec %v: exit %d %q, want %d %q", tc.argv, code, stderr, tc.code, tc.stderr)
		}
	}
	if b, _ := os.ReadFile(outFile.Name()); string(b) != "hi\nto stderr\n" {
		t.Errorf("the guest's output: %q", b)
	}

	// Without a terminal, a signal to kosa8 goes to the command, as the
	// guest's number for it. The test keeps SIGUSR1 from ending itself.
	keep := make(chan os.Signal, 1)
	signal.Notify(keep, syscall.SIGUSR1)
	defer signal.Stop(keep)
	go func() {
		for {
			if b, _ := os.ReadFile(outFile.Name()); strings.HasSuffix(string(b), "waiting\n") {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	}()
	if code, _, stderr := kosa8(t, "exec", "ex", "--", "sigwait"); code != 128+10 { // SIGUSR1 is 10 on Linux
		t.Errorf("exec sigwait: exit %d %q, want %d", code, stderr, 128+10)
	}

	// -t asks for a terminal and passes TERM on.
	t.Setenv("TERM", "vt220")
	outFile.Truncate(0)
	outFile.Seek(0, 0)
	if code, _, stderr := kosa8(t, "exec", "-t", "-e", "A=1", "ex", "--", "env"); code != 0 {
		t.Errorf("exec -t: exit %d %q", code, stderr)
	}
	if b, _ := os.ReadFile(outFile.Name()); string(b) != "tty=true TERM=vt220,A=1 dir=\n" {
		t.Errorf("exec -t: %q", b)
	}
}

// The image build's steps and the agent-home copies run without the
// terminal: the output to writers, root's in /root, and a ^C (ctx) ends
// the command and the wait, as kosa8's failure.
func TestExecWith(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/exec", fakeExec(t))
	sb := fakeRunning(t, "bx", "", mux)
	var out strings.Builder
	code, err := execCapture(t.Context(), sb, []string{"env"}, "root", &out, &out)
	if code != 0 || err != nil || out.String() != "tty=false  dir=/root\n" {
		t.Fatalf("execCapture as root: %d %v %q", code, err, out.String())
	}
	code, err = execCapture(t.Context(), sb, []string{"waitfail"}, "kosa8", &out, &out)
	if code != exitKosa8 || err == nil || err.Error() != "wait: no child processes" {
		t.Fatalf("execCapture of a failed wait: %d %v", code, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := writerFunc(func(b []byte) (int, error) {
		if strings.Contains(string(b), "waiting") {
			cancel()
		}
		return len(b), nil
	})
	code, err = execCapture(ctx, sb, []string{"sigwait"}, "root", w, w)
	if code != exitKosa8 || err == nil || err.Error() != "exec stream: context canceled" {
		t.Fatalf("execCapture interrupted: %d %v", code, err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// pipeWriter: once the reader is gone, the process gets SIGPIPE, then
// SIGTERM and SIGKILL a few seconds apart if it keeps writing; its output
// is dropped without an error.
func TestPipeWriterEscalates(t *testing.T) {
	sigs := make(chan os.Signal, 8)
	var gone bool
	p := &pipeWriter{w: writerFunc(func(b []byte) (int, error) {
		if gone {
			return 0, syscall.EPIPE
		}
		return len(b), nil
	}), sigs: sigs}
	if n, err := p.Write([]byte("x")); n != 1 || err != nil || len(sigs) != 0 {
		t.Fatalf("a write: %d %v, %d signals", n, err, len(sigs))
	}
	gone = true
	for range 3 {
		if n, err := p.Write([]byte("xy")); n != 2 || err != nil {
			t.Fatalf("a write to a broken pipe: %d %v", n, err)
		}
	}
	if len(sigs) != 1 || <-sigs != syscall.SIGPIPE {
		t.Fatalf("after the pipe broke: %d signals", len(sigs))
	}
	for _, want := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		p.broken = p.broken.Add(-3 * time.Second)
		p.Write([]byte("x"))
		if len(sigs) != 1 || <-sigs != want {
			t.Fatalf("%v not sent", want)
		}
	}
	p.broken = p.broken.Add(-time.Minute)
	p.Write([]byte("x"))
	if len(sigs) != 0 {
		t.Fatalf("more than SIGKILL: %v", <-sigs)
	}
}
