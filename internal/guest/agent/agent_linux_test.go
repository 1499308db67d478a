package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/wsync"
)

// The agent is tested in this process, not as PID 1: the channel, exec,
// PTYs, signals and files behave the same; boot steps are covered by the
// VM tests.

var testAgent *Agent

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kosa8-agent-test")
	if err != nil {
		panic(err)
	}
	if err := writeEtc(dir); err != nil {
		panic(err)
	}
	testAgent = New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), DefaultUser: "tester", Etc: dir})
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func writeEtc(dir string) error {
	uid, gid := os.Getuid(), os.Getgid()
	passwd := fmt.Sprintf("tester:x:%d:%d::%s:/bin/sh\n", uid, gid, dir)
	if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "group"), []byte(fmt.Sprintf("tester:x:%d:\n", gid)), 0o644)
}

// pair starts an agent serving one end of a pipe and connects a client.
func pair(t *testing.T) (*guest.Client, net.Conn) {
	t.Helper()
	hostEnd, guestEnd := net.Pipe()
	go func() { _ = ServeChannel(context.Background(), guestEnd, testAgent.Handle, testAgent.log) }()
	t.Cleanup(func() { hostEnd.Close(); guestEnd.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := guest.Connect(ctx, hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	return c, hostEnd
}

type result struct {
	stdout, stderr string
	status         *guest.ExitStatus
}

func run(t *testing.T, c *guest.Client, req *guest.ExecRequest, stdin io.Reader) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, _, err := c.Exec(ctx, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	defer s.Close()
	var out, errb bytes.Buffer
	st, err := guest.Pump(s, guest.StdIO{Stdin: stdin, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return result{out.String(), errb.String(), st}
}

func TestExecSeparatesStreamsAndExitCode(t *testing.T) {
	c, _ := pair(t)
	r := run(t, c, &guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}}, nil)
	if r.stdout != "out\n" || r.stderr != "err\n" || r.status.Code != 3 {
		t.Fatalf("got stdout %q stderr %q status %+v", r.stdout, r.stderr, r.status)
	}
}

func TestExecStdinEnvDir(t *testing.T) {
	c, _ := pair(t)
	r := run(t, c, &guest.ExecRequest{Argv: []string{"cat"}}, strings.NewReader("hello through stdin"))
	if r.stdout != "hello through stdin" || r.status.Code != 0 {
		t.Fatalf("cat: %+v", r)
	}
	dir := t.TempDir()
	r = run(t, c, &guest.ExecRequest{Argv: []string{"sh", "-c", "echo $FOO:$USER:$(pwd)"}, Env: []string{"FOO=bar"}, Dir: dir}, nil)
	if want := "bar:tester:" + dir + "\n"; r.stdout != want {
		t.Fatalf("env/cwd: got %q want %q", r.stdout, want)
	}
}

func TestExecErrors(t *testing.T) {
	c, _ := pair(t)
	ctx := context.Background()
	if _, _, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"no-such-command-kosa8"}}); err == nil || !strings.Contains(err.Error(), "command not found") {
		t.Errorf("missing command: err = %v", err)
	}
	if _, _, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"true"}, Dir: "/no/such/dir"}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing dir: err = %v", err)
	}
	if _, _, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"true"}, User: "nobody-here"}); err == nil || !strings.Contains(err.Error(), "no user") {
		t.Errorf("missing user: err = %v", err)
	}
	if _, _, err := c.Exec(ctx, &guest.ExecRequest{}); err == nil {
		t.Error("empty argv accepted")
	}
}

func TestExecSignal(t *testing.T) {
	c, _ := pair(t)
	s, _, err := c.Exec(context.Background(), &guest.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	sigs := make(chan byte, 1)
	sigs <- byte(syscall.SIGTERM)
	st, err := guest.Pump(s, guest.StdIO{Stdin: nil, Signals: sigs})
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 128+int(syscall.SIGTERM) || st.Signal != "SIGTERM" {
		t.Fatalf("status = %+v, want killed by SIGTERM", st)
	}
}

func TestExecTTY(t *testing.T) {
	c, _ := pair(t)
	r := run(t, c, &guest.ExecRequest{Argv: []string{"sh", "-c", "tty; stty size; echo $TERM"}, TTY: true, Rows: 33, Cols: 101}, nil)
	if !strings.Contains(r.stdout, "/dev/pts/") || !strings.Contains(r.stdout, "33 101") || !strings.Contains(r.stdout, "xterm-256color") {
		t.Fatalf("tty output %q", r.stdout)
	}
	if r.stderr != "" {
		t.Fatalf("a PTY has no separate stderr, got %q", r.stderr)
	}
}

func TestExecResize(t *testing.T) {
	c, _ := pair(t)
	s, _, err := c.Exec(context.Background(), &guest.ExecRequest{Argv: []string{"sh", "-c", "read x; stty size"}, TTY: true, Rows: 10, Cols: 20})
	if err != nil {
		t.Fatal(err)
	}
	resize := make(chan guest.WindowSize, 1)
	resize <- guest.WindowSize{Rows: 50, Cols: 60}
	pr, pw := io.Pipe()
	go func() {
		time.Sleep(200 * time.Millisecond) // after the resize frame
		pw.Write([]byte("go\n"))
	}()
	var out bytes.Buffer
	st, err := guest.Pump(s, guest.StdIO{Stdin: pr, Stdout: &out, Resize: resize})
	if err != nil || st.Code != 0 {
		t.Fatalf("status %+v err %v", st, err)
	}
	if !strings.Contains(out.String(), "50 60") {
		t.Fatalf("after resize: %q", out.String())
	}
}

func TestAttachAfterStreamLoss(t *testing.T) {
	c, _ := pair(t)
	s, resp, err := c.Exec(context.Background(), &guest.ExecRequest{Argv: []string{"sh", "-c", "echo first; read x; echo second $x"}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := guest.ReadFrame(s)
	if err != nil || f.Kind != guest.FrameStdout || string(f.Payload) != "first\n" {
		t.Fatalf("first frame %v %q %v", f.Kind, f.Payload, err)
	}
	s.Close() // the stream breaks; the process keeps running

	s2, _, err := c.Attach(context.Background(), resp.ID)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := guest.Pump(s2, guest.StdIO{Stdin: strings.NewReader("again\n"), Stdout: &out})
	if err != nil || st.Code != 0 || out.String() != "second again\n" {
		t.Fatalf("after attach: %q %+v %v", out.String(), st, err)
	}
	if _, _, err := c.Attach(context.Background(), resp.ID); err == nil {
		t.Fatal("attach to a finished, delivered process succeeded")
	}
}

// handover lets successive host sessions share one byte stream to the
// agent, as a restored guest does: each new session's reads come from the
// stream from then on, and the old session sees EOF.
type handover struct {
	net.Conn
	mu  sync.Mutex
	cur *io.PipeReader
	pw  *io.PipeWriter
}

func newHandover(c net.Conn) *handover {
	h := &handover{Conn: c}
	h.take()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			h.mu.Lock()
			pw := h.pw
			h.mu.Unlock()
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			pw.Write(buf[:n]) // errors when the session was replaced: bytes dropped, like a dead host's
		}
	}()
	return h
}

// take hands the stream to a new session and returns its end.
func (h *handover) take() net.Conn {
	r, w := io.Pipe()
	h.mu.Lock()
	old := h.pw
	h.cur, h.pw = r, w
	h.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return &sessionEnd{Conn: h.Conn, r: r}
}

type sessionEnd struct {
	net.Conn
	r *io.PipeReader
}

func (s *sessionEnd) Read(b []byte) (int, error) { return s.r.Read(b) }
func (s *sessionEnd) Close() error               { return s.r.Close() }

// servedPipe serves the channel on a pipe whose host end a handover
// shares out.
func servedPipe(t *testing.T) (*handover, net.Conn) {
	hostEnd, guestEnd := net.Pipe()
	t.Cleanup(func() { hostEnd.Close() })
	go func() { _ = ServeChannel(context.Background(), guestEnd, testAgent.Handle, testAgent.log) }()
	return newHandover(hostEnd), hostEnd
}

func TestNewGenerationOnSameStream(t *testing.T) {
	h, hostEnd := servedPipe(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := h.take()
	c1, err := guest.Connect(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	// A process running across the change of session.
	s, resp, err := c1.Exec(ctx, &guest.ExecRequest{Argv: []string{"sh", "-c", "read x; echo got $x"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = s
	// Garbage, then a new session: the agent must drop the old one.
	if _, err := hostEnd.Write([]byte("\x00\x01stale KSA8 bytes")); err != nil {
		t.Fatal(err)
	}
	second := h.take()
	c2, err := guest.Connect(ctx, second)
	if err != nil {
		t.Fatalf("second session: %v", err)
	}
	if err := c2.Ping(ctx); err != nil {
		t.Fatalf("ping on second session: %v", err)
	}
	s2, _, err := c2.Attach(ctx, resp.ID)
	if err != nil {
		t.Fatalf("re-attach: %v", err)
	}
	var out bytes.Buffer
	// A deadline: a lost frame fails here, not at go test's timeout.
	_ = s2.SetDeadline(time.Now().Add(20 * time.Second))
	st, err := guest.Pump(s2, guest.StdIO{Stdin: strings.NewReader("later\n"), Stdout: &out})
	if err != nil || st.Code != 0 || out.String() != "got later\n" {
		t.Fatalf("re-attached process: %q %+v %v", out.String(), st, err)
	}
	select {
	case <-c1.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the old session did not end")
	}
}

func TestFiles(t *testing.T) {
	c, _ := pair(t)
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "f.txt")
	if err := c.WriteFile(ctx, p, 0o640, "", strings.NewReader("content")); err != nil {
		t.Fatal(err)
	}
	fi, err := c.Stat(ctx, p)
	if err != nil || fi.Size != 7 || fi.Mode.Perm() != 0o640 {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	var buf bytes.Buffer
	if _, err := c.ReadFile(ctx, p, &buf); err != nil || buf.String() != "content" {
		t.Fatalf("read: %q %v", buf.String(), err)
	}
	if err := os.Symlink("f.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	list, err := c.List(ctx, dir)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v %v", list, err)
	}
	for _, e := range list {
		if e.Name == "link" && e.Link != "f.txt" {
			t.Errorf("link target %q", e.Link)
		}
	}
	if _, err := c.Stat(ctx, "relative/path"); err == nil {
		t.Error("relative path accepted")
	}
	if _, err := c.ReadFile(ctx, filepath.Join(dir, "missing"), io.Discard); err == nil {
		t.Error("missing file read")
	}
}

// After a restore the guest's old session still reads the port when the
// new host's HELLO arrives: the first HELLO must be answered, not eaten by
// the old session (which would cost the host a retry interval).
func TestFirstHelloEndsOldSession(t *testing.T) {
	h, _ := servedPipe(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c1, err := guest.Connect(ctx, h.take())
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	second := h.take()
	if err := guest.WriteControl(second, guest.Control{Kind: guest.Hello, Generation: 42}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		br := bufio.NewReader(second)
		for {
			c, err := guest.ReadControl(br)
			if err != nil || (c.Kind == guest.Ack && c.Generation == 42) {
				got <- err
				return
			}
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("one HELLO after a live session got no ACK: the old session swallowed it")
	}
}

func TestFrameCursor(t *testing.T) {
	hdr := func(typ byte, length uint32) []byte {
		return []byte{0, typ, 0, 0, 0, 0, 0, 1, byte(length >> 24), byte(length >> 16), byte(length >> 8), byte(length)}
	}
	var stream []byte
	stream = append(stream, hdr(0, 5)...)
	stream = append(stream, "KSA8!"...) // payload may hold anything
	stream = append(stream, hdr(1, 1<<20)...)
	stream = append(stream, hdr(2, 7)...) // ping: no payload
	end := len(stream)
	stream = append(stream, "KSA8 hello"...)
	// Whole, and cut at every point: the same boundary is found.
	for cut := 0; cut <= len(stream); cut++ {
		var c frameCursor
		got := c.feed(stream[:cut])
		if got < 0 {
			if i := c.feed(stream[cut:]); i >= 0 {
				got = cut + i
			}
		}
		if got != end {
			t.Fatalf("cut at %d: boundary at %d, want %d", cut, got, end)
		}
	}
}

// The agent finds its disks by the serial numbers the host set, whatever
// names the kernel gave them (on arm64's virt the workspace disk, last on
// QEMU's command line, became vda), and by name only for disks without one.
func TestFindDisk(t *testing.T) {
	sys := func(disks map[string]string) string {
		dir := t.TempDir()
		for name, serial := range disks {
			os.MkdirAll(filepath.Join(dir, name), 0o755)
			if serial != "-" {
				os.WriteFile(filepath.Join(dir, name, "serial"), []byte(serial+"\n"), 0o444)
			}
		}
		os.MkdirAll(filepath.Join(dir, "loop0"), 0o755)
		return dir
	}
	cases := []struct {
		name         string
		disks        map[string]string
		serial, want string
	}{
		{"arm64 order", map[string]string{"vda": "ws", "vdb": "root"}, RootSerial, "/dev/vdb"},
		{"arm64 order, workspace", map[string]string{"vda": "ws", "vdb": "root"}, WorkspaceSerial, "/dev/vda"},
		{"x86 order", map[string]string{"vda": "root", "vdb": "ws"}, RootSerial, "/dev/vda"},
		{"no serial numbers", map[string]string{"vda": "", "vdb": "-"}, RootSerial, "/dev/vda"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findDisk(sys(tc.disks), tc.serial, "vda", time.Second)
			if err != nil || got != tc.want {
				t.Fatalf("findDisk = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// Serial numbers, none of them this one: not the fallback, an error.
	if got, err := findDisk(sys(map[string]string{"vda": "ws"}), RootSerial, "vda", 20*time.Millisecond); err == nil {
		t.Fatalf("found %q for a disk that is not there", got)
	}
}

// A workspace change from the host lands only over what the host saw
// there: an agent that saved the file meanwhile keeps its version, for
// single writes, batches (ws_put), links and removals alike.
func TestWorkspaceChangesCheckWhatWasThere(t *testing.T) {
	c, _ := pair(t)
	ctx := context.Background()
	dir := t.TempDir()
	g := &wsync.GuestSide{C: c, Root: dir}
	put := func(p, content string, was *wsync.Entry) error {
		sum := sha256.Sum256([]byte(content))
		hash, err := g.Write(ctx, p, 0o644, strings.NewReader(content), hex.EncodeToString(sum[:]), was)
		if err == nil && hash != hex.EncodeToString(sum[:]) {
			t.Fatalf("hash %s", hash)
		}
		return err
	}
	if err := put("f", "v1", nil); err != nil {
		t.Fatal(err)
	}
	if err := put("f", "v1 again", nil); !errors.Is(err, wsync.ErrStale) {
		t.Fatalf("a write expecting nothing replaced a file: %v", err)
	}
	v1, err := g.Scan(ctx, []string{"f"})
	if err != nil || v1["f"] == nil {
		t.Fatalf("scan: %v %v", v1, err)
	}
	was := v1["f"]
	os.WriteFile(filepath.Join(dir, "f"), []byte("the agent's save"), 0o644)
	kept := func(what string) {
		t.Helper()
		if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "the agent's save" {
			t.Fatalf("%s replaced the agent's save: %q", what, b)
		}
	}
	if err := put("f", "the user's", was); !errors.Is(err, wsync.ErrStale) {
		t.Fatalf("write: %v", err)
	}
	kept("a write")
	failed, err := g.Put(ctx, []wsync.PutItem{{
		Entry: &wsync.Entry{Path: "f", Type: 'f', Mode: 0o644, Size: 3, Hash: hex.EncodeToString(func() []byte { s := sha256.Sum256([]byte("new")); return s[:] }())},
		Was:   was,
		Open:  func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("new")), nil },
	}})
	if err != nil || !errors.Is(failed["f"], wsync.ErrStale) {
		t.Fatalf("ws_put: %v %v", failed, err)
	}
	kept("ws_put")
	if err := g.Symlink(ctx, "f", "elsewhere", was); !errors.Is(err, wsync.ErrStale) {
		t.Fatalf("symlink: %v", err)
	}
	kept("a link")
	if err := g.Remove(ctx, "f", was); !errors.Is(err, wsync.ErrStale) {
		t.Fatalf("remove: %v", err)
	}
	kept("a removal")
	// Over what is there, each goes through.
	now, _ := g.Scan(ctx, []string{"f"})
	if err := put("f", "the user's", now["f"]); err != nil {
		t.Fatal(err)
	}
	now, _ = g.Scan(ctx, []string{"f"})
	if err := g.Remove(ctx, "f", now["f"]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "f")); !os.IsNotExist(err) {
		t.Fatalf("not removed: %v", err)
	}
}

// A command waits for the root filesystem to finish growing, which it
// does in the background while the boot goes on.
func TestExecWaitsForTheRootToGrow(t *testing.T) {
	waitsForTheRootToGrow(t, "the command", func(ctx context.Context, c *guest.Client) error {
		s, _, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"true"}})
		if err == nil {
			_, err = guest.Pump(s, guest.StdIO{})
			s.Close()
		}
		return err
	})
}

// A checkpoint's freeze waits for the root filesystem to finish growing
// too: its disks must not catch the filesystem mid-resize.
func TestFreezeWaitsForTheRootToGrow(t *testing.T) {
	waitsForTheRootToGrow(t, "the freeze", func(ctx context.Context, c *guest.Client) error { return c.Freeze(ctx) })
}

// waitsForTheRootToGrow checks that call (what) ends only once the root
// filesystem has grown, and then does.
func waitsForTheRootToGrow(t *testing.T, what string, call func(context.Context, *guest.Client) error) {
	t.Helper()
	grown := make(chan struct{})
	testAgent.rootGrown = grown
	t.Cleanup(func() { testAgent.rootGrown = nil })
	c, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- call(ctx, c)
	}()
	select {
	case err := <-done:
		t.Fatalf("%s ended before the root filesystem had grown (%v)", what, err)
	case <-time.After(300 * time.Millisecond):
	}
	close(grown)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not end once the root filesystem had grown", what)
	}
}
