package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
)

// Cmd is a command to run in a sandbox.
type Cmd struct {
	// Args is the command and its arguments; Args[0] is looked up in the
	// guest's PATH. Nothing is parsed by a shell unless you run one
	// (Args: []string{"bash", "-lc", "make && make test"}).
	Args []string
	// Env entries (KEY=VALUE) are added to the guest's environment.
	Env []string
	// Dir is the working directory in the guest (default: the workspace
	// folder, else the user's home).
	Dir string
	// User is a user in the guest, or "root" (default: the sandbox's user).
	User string
	// Stdin feeds the command's standard input (nil: closed at once).
	Stdin io.Reader
	// Stdout and Stderr receive the command's output as it comes (nil:
	// discarded). They are written from one goroutine, in order.
	Stdout, Stderr io.Writer
	// Timeout ends the command (SIGKILL to its process group) when it runs
	// longer; zero for no limit. Ending ctx does the same.
	Timeout time.Duration

	// TTY runs the command on a terminal in the guest (a pseudo-terminal,
	// as `ssh -t` or `kosa8 exec -t` gives), so that a shell, an editor or
	// an agent's own CLI behaves as it does when typed at. Its output and
	// errors are then one stream, the terminal's, written to Stdout (lines
	// end in \r\n); Stderr gets nothing. Stdin is what is typed and is
	// passed as is: ^C is the byte 0x03, which the guest's terminal turns
	// into SIGINT, so put your own terminal in raw mode
	// (golang.org/x/term.MakeRaw) to pass keys through. TERM is
	// xterm-256color unless Env sets it.
	TTY bool
	// Size is the terminal's size at the start; zero leaves it unset, which
	// full-screen programs handle badly. Resize carries later sizes as the
	// window changes (SIGWINCH): each is applied at once. Both are used
	// with TTY only; Resize may be nil, and once closed it is not read.
	Size   WindowSize
	Resize <-chan WindowSize
	// Signals are delivered to the command while it runs: to the
	// terminal's foreground process group with TTY, else to the process
	// group the command leads. The channel given to signal.Notify can be
	// passed as is, to forward what this program receives. Each signal is
	// sent as the guest's (Linux) number for it, whatever the host; one
	// Linux does not have is dropped. Signals may be nil, and once closed it
	// is not read.
	Signals <-chan os.Signal
	// Started, if set, is called once the command runs in the guest,
	// before any of its output is passed on; pid is its process id there.
	// What should wait until then goes here: a program on a terminal puts
	// it in raw mode, or starts forwarding signals, from here, so that a ^C
	// while the command is being started still interrupts the program.
	Started func(pid int)
}

// WindowSize is a terminal's size in character cells.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// linuxSignals are the guest's numbers for the host's signals: the agent
// takes Linux's, and a Mac numbers some differently (SIGUSR1 is 30 there
// and 10 in the guest).
var linuxSignals = map[syscall.Signal]byte{
	syscall.SIGHUP: 1, syscall.SIGINT: 2, syscall.SIGQUIT: 3, syscall.SIGILL: 4, syscall.SIGTRAP: 5,
	syscall.SIGABRT: 6, syscall.SIGBUS: 7, syscall.SIGFPE: 8, syscall.SIGKILL: 9, syscall.SIGUSR1: 10,
	syscall.SIGSEGV: 11, syscall.SIGUSR2: 12, syscall.SIGPIPE: 13, syscall.SIGALRM: 14, syscall.SIGTERM: 15,
	syscall.SIGCHLD: 17, syscall.SIGCONT: 18, syscall.SIGSTOP: 19, syscall.SIGTSTP: 20, syscall.SIGTTIN: 21,
	syscall.SIGTTOU: 22, syscall.SIGURG: 23, syscall.SIGXCPU: 24, syscall.SIGXFSZ: 25, syscall.SIGVTALRM: 26,
	syscall.SIGPROF: 27, syscall.SIGWINCH: 28, syscall.SIGIO: 29, syscall.SIGSYS: 31,
}

// guestSignal is sig's number in the guest, if it has one.
func guestSignal(sig os.Signal) (byte, bool) {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return 0, false
	}
	n, ok := linuxSignals[s]
	return n, ok
}

// forward passes the caller's signals and window sizes on to the exec
// stream's channels until done.
func forward(done <-chan struct{}, in <-chan os.Signal, sizes <-chan WindowSize, sigs chan<- byte, resize chan<- guest.WindowSize) {
	for in != nil || sizes != nil {
		select {
		case sig, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			if n, ok := guestSignal(sig); ok {
				select {
				case sigs <- n:
				case <-done:
					return
				}
			}
		case ws, ok := <-sizes:
			if !ok {
				sizes = nil
				continue
			}
			select {
			case resize <- guest.WindowSize{Rows: ws.Rows, Cols: ws.Cols}:
			case <-done:
				return
			}
		case <-done:
			return
		}
	}
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`        // the exit code, or 128+signal
	Signal   string `json:"signal,omitempty"` // set when a signal ended it
	TimedOut bool   `json:"timed_out,omitempty"`
	Duration time.Duration
}

// killGrace bounds the wait for a killed command's exit status.
const killGrace = 10 * time.Second

// Exec runs a command in the running sandbox and returns how it ended. An
// error means the command could not be run or followed (not a non-zero
// exit: see ExecResult.ExitCode). Once the sandbox has been asked, it is
// an *OpError whose Err is the reason as the supervisor, the guest or the
// broken stream gave it.
func (s *Sandbox) Exec(ctx context.Context, cmd Cmd) (*ExecResult, error) {
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	req := &guest.ExecRequest{Argv: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, User: cmd.User, TTY: cmd.TTY}
	if cmd.TTY {
		req.Rows, req.Cols = cmd.Size.Rows, cmd.Size.Cols
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	op := "exec in " + s.Name()
	start := time.Now()
	// The exec connection lives on its own context: the caller's ending
	// must reach the guest as a kill, not as a dropped connection (which
	// only hangs the command up).
	connCtx, connCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer connCancel()
	opened := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			connCancel()
		case <-opened:
		}
	}()
	conn, err := client.Exec(connCtx, req)
	close(opened)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &OpError{Op: op, Err: err}
	}
	defer conn.Close()
	if cmd.Started != nil {
		pid, _ := strconv.Atoi(conn.Pid)
		cmd.Started(pid)
	}

	sigs := make(chan byte, 8)
	var resize chan guest.WindowSize
	if cmd.TTY && cmd.Resize != nil {
		resize = make(chan guest.WindowSize, 1)
	}
	timedOut := make(chan struct{})
	var limit <-chan time.Time
	if cmd.Timeout > 0 {
		t := time.NewTimer(cmd.Timeout)
		defer t.Stop()
		limit = t.C
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-limit:
		case <-ctx.Done():
		case <-done:
			return
		}
		close(timedOut)
		// A guest that does not answer the kill (or a stream that takes no
		// more frames): give up on the stream.
		grace := time.NewTimer(killGrace)
		defer grace.Stop()
		select {
		case sigs <- linuxSignals[syscall.SIGKILL]:
		case <-grace.C:
			conn.Close()
			return
		case <-done:
			return
		}
		select {
		case <-grace.C:
			conn.Close()
		case <-done:
		}
	}()
	var sizes <-chan WindowSize
	if resize != nil {
		sizes = cmd.Resize
	}
	go forward(done, cmd.Signals, sizes, sigs, resize)
	st, err := guest.Pump(conn, guest.StdIO{Stdin: cmd.Stdin, Stdout: cmd.Stdout, Stderr: cmd.Stderr, Signals: sigs, Resize: resize})
	res := &ExecResult{Duration: time.Since(start)}
	select {
	case <-timedOut:
		res.TimedOut = true
	default:
	}
	if err != nil {
		if res.TimedOut {
			err = fmt.Errorf("the command was killed after its time limit but did not report its end: %w", err)
		}
		return nil, &OpError{Op: op, Err: err}
	}
	if st.Error != "" {
		return nil, &OpError{Op: op, Err: errors.New(st.Error)}
	}
	res.ExitCode, res.Signal = st.Code, st.Signal
	return res, nil
}

// ExitError is a command's non-zero exit, from Output.
type ExitError struct {
	ExecResult
	Stderr []byte // the end of its standard error
}

func (e *ExitError) Error() string {
	msg := fmt.Sprintf("exit status %d", e.ExitCode)
	if e.TimedOut {
		msg = "killed after its time limit"
	}
	if s := strings.TrimSpace(string(e.Stderr)); s != "" {
		msg += ": " + s
	}
	return msg
}

// maxOutput bounds what Output and the file calls keep in memory.
const maxOutput = 64 << 20

// Output runs args in the sandbox and returns its standard output. A
// non-zero exit is an *ExitError carrying the end of standard error.
func (s *Sandbox) Output(ctx context.Context, args ...string) ([]byte, error) {
	stdout := &capBuffer{max: maxOutput}
	stderr := &capBuffer{max: 8 << 10, tail: true}
	res, err := s.Exec(ctx, Cmd{Args: args, Stdout: stdout, Stderr: stderr})
	if err != nil {
		return nil, err
	}
	if stdout.over {
		return nil, fmt.Errorf("%s: output larger than %d MiB: use Exec with a Stdout writer", args[0], maxOutput>>20)
	}
	if res.ExitCode != 0 {
		return stdout.Bytes(), &ExitError{ExecResult: *res, Stderr: stderr.Bytes()}
	}
	return stdout.Bytes(), nil
}

// capBuffer keeps at most max bytes: the first ones, or with tail the
// last ones. over records that more came; stop, if set, is called then
// (to end a command whose output is of no use past max).
type capBuffer struct {
	buf  bytes.Buffer
	max  int
	tail bool
	over bool
	stop func()
}

func (c *capBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if c.buf.Len()+len(p) > c.max {
		if !c.over && c.stop != nil {
			c.stop()
		}
		c.over = true
		if !c.tail {
			p = p[:max(0, c.max-c.buf.Len())]
		} else {
			keep := append(bytes.Clone(c.buf.Bytes()), p...)
			keep = keep[len(keep)-c.max:]
			c.buf.Reset()
			c.buf.Write(keep)
			return n, nil
		}
	}
	c.buf.Write(p)
	return n, nil
}

func (c *capBuffer) Bytes() []byte { return c.buf.Bytes() }
