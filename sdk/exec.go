package sdk

import (
	"bytes"
	"context"
	"fmt"
	"io"
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
// exit: see ExecResult.ExitCode).
func (s *Sandbox) Exec(ctx context.Context, cmd Cmd) (*ExecResult, error) {
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	req := &guest.ExecRequest{Argv: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, User: cmd.User}
	if err := req.Validate(); err != nil {
		return nil, err
	}
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
		return nil, fmt.Errorf("exec in %s: %w", s.Name(), err)
	}
	defer conn.Close()

	sigs := make(chan byte, 1)
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
		sigs <- byte(syscall.SIGKILL)
		// A guest that does not answer the kill: give up on the stream.
		select {
		case <-time.After(killGrace):
			conn.Close()
		case <-done:
		}
	}()
	st, err := guest.Pump(conn, guest.StdIO{Stdin: cmd.Stdin, Stdout: cmd.Stdout, Stderr: cmd.Stderr, Signals: sigs})
	res := &ExecResult{Duration: time.Since(start)}
	select {
	case <-timedOut:
		res.TimedOut = true
	default:
	}
	if err != nil {
		if res.TimedOut {
			return nil, fmt.Errorf("exec in %s: the command was killed after its time limit but did not report its end: %w", s.Name(), err)
		}
		return nil, fmt.Errorf("exec in %s: %w", s.Name(), err)
	}
	if st.Error != "" {
		return nil, fmt.Errorf("exec in %s: %s", s.Name(), st.Error)
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
// last ones. over records that more came.
type capBuffer struct {
	buf  bytes.Buffer
	max  int
	tail bool
	over bool
}

func (c *capBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if c.buf.Len()+len(p) > c.max {
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
