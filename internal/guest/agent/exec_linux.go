package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/guest"
)

const (
	// pendingCap bounds the output a process may produce while no stream is
	// attached; past it the agent stops reading and the process blocks on
	// its own writes, so nothing is dropped.
	pendingCap = 4 << 20
	// drainAfterExit is how long output is still read once the process has
	// exited, for background children that keep the pipes open.
	drainAfterExit = 300 * time.Millisecond
	// keepUnclaimed is how long an exit status waits for a stream to take it.
	keepUnclaimed = 10 * time.Minute
)

// proc is a process started by exec. Its output goes to the attached
// stream, or is held (bounded) until a stream attaches again.
type proc struct {
	id     string
	pid    int
	tty    *os.File      // PTY master, nil without a terminal
	stdin  chan []byte   // nil chunk: EOF
	exited chan struct{} // closed once the process has exited

	mu       sync.Mutex
	cond     *sync.Cond
	w        io.Writer // attached stream, nil while detached
	pending  [][]byte  // encoded frames waiting for a stream
	pendingN int
	done     bool // the exit frame was delivered
}

func newProc(id string) *proc {
	p := &proc{id: id, stdin: make(chan []byte, 64), exited: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func encodeFrame(kind guest.FrameKind, payload []byte) []byte {
	b := make([]byte, 5+len(payload))
	b[0] = byte(kind)
	b[1], b[2], b[3], b[4] = byte(len(payload)>>24), byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	copy(b[5:], payload)
	return b
}

// emit sends a frame to the attached stream or holds it. It blocks while
// the held output is over its cap and no stream is attached.
func (p *proc) emit(kind guest.FrameKind, payload []byte) {
	f := encodeFrame(kind, payload)
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.w == nil && p.pendingN > pendingCap {
		p.cond.Wait()
	}
	if p.w != nil && len(p.pending) == 0 {
		if _, err := p.w.Write(f); err == nil {
			if kind == guest.FrameExit {
				p.done = true
			}
			return
		}
		p.w = nil
	}
	p.pending = append(p.pending, f)
	p.pendingN += len(f)
}

// attach makes w the stream for p's output, first sending what was held.
func (p *proc) attach(w io.Writer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.pending) > 0 {
		f := p.pending[0]
		if _, err := w.Write(f); err != nil {
			return
		}
		if guest.FrameKind(f[0]) == guest.FrameExit {
			p.done = true
		}
		p.pending = p.pending[1:]
		p.pendingN -= len(f)
	}
	p.w = w
	p.cond.Broadcast()
}

func (p *proc) detach(w io.Writer) {
	p.mu.Lock()
	if p.w == w {
		p.w = nil
	}
	p.mu.Unlock()
}

func (p *proc) delivered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// handleExec starts a process and serves its stream.
func (a *Agent) handleExec(ctx context.Context, s net.Conn, req *guest.ExecRequest) {
	if req == nil {
		a.respondError(s, errors.New("exec: missing request"))
		return
	}
	if err := req.Validate(); err != nil {
		a.respondError(s, err)
		return
	}
	a.waitRootGrown(rootGrowWait, "the command starts anyway")
	if req.ID == "" {
		req.ID = newID()
	}
	a.mu.Lock()
	if _, dup := a.procs[req.ID]; dup {
		a.mu.Unlock()
		a.respondError(s, fmt.Errorf("exec: id %q is in use", req.ID))
		return
	}
	p := newProc(req.ID)
	a.procs[req.ID] = p
	a.mu.Unlock()

	if err := a.startProc(p, req); err != nil {
		a.mu.Lock()
		delete(a.procs, req.ID)
		a.mu.Unlock()
		a.respondError(s, err)
		return
	}
	a.log.Info("exec", "id", p.id, "pid", p.pid, "argv0", req.Argv[0], "tty", req.TTY)
	if err := guest.WriteJSON(s, guest.FrameResponse, guest.Response{Pid: p.pid, ID: p.id}); err != nil {
		return // the process runs on; a later attach can take its output
	}
	a.serveProc(s, p)
}

// handleAttach connects a new stream to a running (or finished) process.
func (a *Agent) handleAttach(s net.Conn, id string) {
	a.mu.Lock()
	p := a.procs[id]
	a.mu.Unlock()
	// A process whose exit was delivered is gone, though the goroutine
	// that delivered it may not have forgotten it yet (the host, which
	// read the exit, can attach first). done is set under p.mu in the
	// same hold as the write of the exit frame, so this sees it.
	if p != nil && p.delivered() {
		a.forget(p)
		p = nil
	}
	if p == nil {
		a.respondError(s, fmt.Errorf("attach: no process %q", id))
		return
	}
	if err := guest.WriteJSON(s, guest.FrameResponse, guest.Response{Pid: p.pid, ID: p.id}); err != nil {
		return
	}
	a.serveProc(s, p)
}

// serveProc attaches s to p and handles stdin, resize and signal frames
// until the stream closes or the process's exit has been delivered.
func (a *Agent) serveProc(s net.Conn, p *proc) {
	p.attach(s)
	defer p.detach(s)
	for {
		f, err := guest.ReadFrame(s)
		if err != nil {
			if p.delivered() {
				a.forget(p)
			}
			return
		}
		switch f.Kind {
		case guest.FrameStdin, guest.FrameStdinEOF:
			chunk := f.Payload
			if f.Kind == guest.FrameStdinEOF {
				chunk = nil
			} else if chunk == nil {
				chunk = []byte{}
			}
			// Blocks while the process does not read its input; that holds
			// the stream's window and so slows the host, losing nothing.
			select {
			case p.stdin <- chunk:
			case <-p.exited:
			}
		case guest.FrameResize:
			var ws guest.WindowSize
			if json.Unmarshal(f.Payload, &ws) == nil && p.tty != nil {
				_ = setWinsize(p.tty, ws)
			}
		case guest.FrameSignal:
			if len(f.Payload) == 1 {
				a.signal(p, syscall.Signal(f.Payload[0]))
			}
		}
	}
}

func (a *Agent) forget(p *proc) {
	a.mu.Lock()
	if a.procs[p.id] == p {
		delete(a.procs, p.id)
	}
	a.mu.Unlock()
}

// signal delivers sig to the process group in the foreground: the
// terminal's for a PTY, else the group the process leads.
func (a *Agent) signal(p *proc, sig syscall.Signal) {
	pgid := p.pid
	if p.tty != nil {
		withFd(p.tty, func(fd int) {
			if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil && fg > 0 {
				pgid = fg
			}
		})
	}
	if err := unix.Kill(-pgid, sig); err != nil {
		_ = unix.Kill(p.pid, sig)
	}
}

// startError is a command that could not be started, with the status a
// shell gives for it: 127 when it does not exist, 126 when it cannot be run.
type startError struct {
	code int
	err  error
}

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

// notRunnable classifies an exec failure as a shell does.
func notRunnable(argv0 string, err error) error {
	code := 126
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		code = 127
	}
	return &startError{code, fmt.Errorf("exec %s: %w", argv0, err)}
}

// startProc starts the process described by req as p.
func (a *Agent) startProc(p *proc, req *guest.ExecRequest) error {
	u, err := a.users.lookup(req.User, a.defaultUser)
	if err != nil {
		return err
	}
	env := baseEnv(u, req.TTY)
	env = mergeEnv(env, a.extraEnv)
	env = mergeEnv(env, req.Env)
	dir := req.Dir
	if dir == "" {
		dir = u.home
	}
	argv0, err := lookPath(req.Argv[0], envValue(env, "PATH"))
	if err != nil {
		return &startError{127, err}
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return &startError{126, fmt.Errorf("exec: working directory %s does not exist", dir)}
	}
	attr := &os.ProcAttr{Dir: dir, Env: env, Sys: &syscall.SysProcAttr{}}
	if a.cgroupFD > 0 {
		// Born in the workload cgroup (clone3 CLONE_INTO_CGROUP): no window
		// in which a new process escapes a freeze.
		attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = true, a.cgroupFD
	}
	if os.Getuid() == 0 {
		attr.Sys.Credential = &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid), Groups: u.groups}
	} else if u.uid != os.Getuid() {
		return fmt.Errorf("exec: cannot run as %s: the agent is not root", u.name)
	}

	var closeAfter []*os.File
	var outputs []*os.File
	var stdinW *os.File
	if req.TTY {
		master, slave, err := openPTY()
		if err != nil {
			return fmt.Errorf("exec: open pty: %w", err)
		}
		if req.Rows > 0 && req.Cols > 0 {
			_ = setWinsize(master, guest.WindowSize{Rows: req.Rows, Cols: req.Cols})
		}
		attr.Files = []*os.File{slave, slave, slave}
		attr.Sys.Setsid = true
		attr.Sys.Setctty = true
		attr.Sys.Ctty = 0
		closeAfter = append(closeAfter, slave)
		p.tty = master
		stdinW = master
		outputs = []*os.File{master}
	} else {
		inR, inW, err := os.Pipe()
		if err != nil {
			return err
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			return err
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			return err
		}
		attr.Files = []*os.File{inR, outW, errW}
		attr.Sys.Setpgid = true
		closeAfter = append(closeAfter, inR, outW, errW)
		stdinW = inW
		outputs = []*os.File{outR, errR}
	}

	proc, exited, err := a.reaper.start(func() (*os.Process, error) {
		// The agent runs with umask 0; its children get the usual 022.
		old := unix.Umask(0o022)
		defer unix.Umask(old)
		return os.StartProcess(argv0, req.Argv, attr)
	})
	for _, f := range closeAfter {
		f.Close()
	}
	if err != nil {
		for _, f := range outputs {
			f.Close()
		}
		if stdinW != p.tty {
			stdinW.Close()
		}
		return notRunnable(req.Argv[0], err)
	}
	p.pid = proc.Pid
	_ = proc.Release()

	go feedStdin(p, stdinW, req.TTY)

	var wg sync.WaitGroup
	kinds := []guest.FrameKind{guest.FrameStdout, guest.FrameStderr}
	for i, f := range outputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pump(f, kinds[i], p)
		}()
	}
	go func() {
		ws := <-exited
		close(p.exited)
		// Output still in the pipes belongs before the exit frame; children
		// left behind may hold the pipes open, so stop reading after a while.
		deadline := time.Now().Add(drainAfterExit)
		for _, f := range outputs {
			_ = f.SetReadDeadline(deadline)
		}
		wg.Wait()
		for _, f := range outputs {
			f.Close()
		}
		st := exitStatus(ws)
		a.log.Info("exit", "id", p.id, "pid", p.pid, "code", st.Code, "signal", st.Signal)
		p.emit(guest.FrameExit, mustJSON(st))
		if p.delivered() {
			a.forget(p)
			return
		}
		time.AfterFunc(keepUnclaimed, func() { a.forget(p) })
	}()
	return nil
}

// pump copies one output of p into frames until EOF, an error or the drain
// deadline.
func pump(f *os.File, kind guest.FrameKind, p *proc) {
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.emit(kind, append([]byte(nil), buf[:n]...))
		}
		if err != nil {
			return
		}
	}
}

// feedStdin writes what the streams send for stdin, in order. A nil chunk
// is EOF. For a PTY, EOF is ignored: the terminal stays.
func feedStdin(p *proc, w *os.File, tty bool) {
	if !tty {
		defer w.Close()
	}
	for {
		var chunk []byte
		select {
		case chunk = <-p.stdin:
		case <-p.exited:
			return
		}
		if chunk == nil {
			if !tty {
				return
			}
			continue
		}
		// An error means the process closed its input; later chunks are
		// dropped the same way a pipe would drop them.
		_, _ = w.Write(chunk)
	}
}

func exitStatus(ws unix.WaitStatus) guest.ExitStatus {
	switch {
	case ws.Exited():
		return guest.ExitStatus{Code: ws.ExitStatus()}
	case ws.Signaled():
		return guest.ExitStatus{Code: 128 + int(ws.Signal()), Signal: unix.SignalName(ws.Signal())}
	}
	return guest.ExitStatus{Code: 255, Error: "unknown wait status " + strconv.Itoa(int(ws))}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func baseEnv(u *user, tty bool) []string {
	term := "dumb"
	if tty {
		term = "xterm-256color"
	}
	return []string{
		"PATH=" + defaultPath,
		"HOME=" + u.home,
		"USER=" + u.name,
		"LOGNAME=" + u.name,
		"SHELL=" + u.shell,
		"LANG=C.UTF-8",
		"TERM=" + term,
	}
}

// mergeEnv returns base with each KEY=VALUE of add set, later entries winning.
func mergeEnv(base, add []string) []string {
	out := append([]string(nil), base...)
	for _, kv := range add {
		k, _, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		replaced := false
		for i, e := range out {
			if strings.HasPrefix(e, k+"=") {
				out[i] = kv
				replaced = true
				break
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds name in path the way a shell would, for the environment
// the process will have rather than the agent's own.
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %s: command not found", name)
}

// waitRootGrown waits, up to max, for the root filesystem to finish
// growing to its disk (Config.RootGrown); what says so if it had not.
func (a *Agent) waitRootGrown(max time.Duration, what string) {
	if a.rootGrown == nil {
		return
	}
	select {
	case <-a.rootGrown:
	case <-time.After(max):
		a.log.Warn("the root filesystem is still growing: " + what)
	}
}
