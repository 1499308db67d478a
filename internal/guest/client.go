package guest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// Client is the host's side of the channel to one guest agent.
type Client struct {
	sess *yamux.Session
	gen  uint64
}

// helloInterval is how often a HELLO is repeated until the agent answers:
// the first ones go out while the guest is still booting, and after a
// rewind the agent's stale session eats one before it notices.
const helloInterval = 200 * time.Millisecond

// Connect runs the handshake on conn (see the package comment) and starts a
// session. It waits, within ctx, for the agent to come up.
func Connect(ctx context.Context, conn net.Conn) (*Client, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	gen := binary.BigEndian.Uint64(b[:])
	br := bufio.NewReaderSize(conn, 64<<10)

	acked := make(chan error, 1)
	go func() {
		for {
			c, err := ReadControl(br)
			if err != nil {
				acked <- err
				return
			}
			if c.Kind == Ack && c.Generation == gen {
				acked <- nil
				return
			}
		}
	}()
	t := time.NewTicker(helloInterval)
	defer t.Stop()
	for {
		if err := WriteControl(conn, Control{Kind: Hello, Generation: gen}); err != nil {
			return nil, fmt.Errorf("agent handshake: %w", err)
		}
		select {
		case err := <-acked:
			if err != nil {
				return nil, fmt.Errorf("agent handshake: %w", err)
			}
		case <-t.C:
			continue
		case <-ctx.Done():
			conn.Close() // ends the reader goroutine
			return nil, fmt.Errorf("agent did not answer: %w", ctx.Err())
		}
		break
	}
	if err := WriteControl(conn, Control{Kind: Start, Generation: gen}); err != nil {
		return nil, err
	}
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false // a paused guest (checkpoint) must not end the session
	cfg.StreamOpenTimeout = 0
	// Bulk transfers (the first workspace sync) stall on the 256 KiB
	// default window; memory per stream only grows while data is in flight.
	cfg.MaxStreamWindowSize = 4 << 20
	cfg.ConnectionWriteTimeout = 60 * time.Second
	cfg.LogOutput = io.Discard
	sess, err := yamux.Client(&ackSkipper{r: br, c: conn, gen: gen}, cfg)
	if err != nil {
		return nil, err
	}
	return &Client{sess: sess, gen: gen}, nil
}

// ackSkipper drops the extra ACKs the agent sent for repeated HELLOs; they
// come before its first yamux frame, which starts with a zero byte.
type ackSkipper struct {
	r    *bufio.Reader
	c    net.Conn
	gen  uint64
	once bool
}

func (a *ackSkipper) Read(p []byte) (int, error) {
	for !a.once {
		b, err := a.r.Peek(1)
		if err != nil {
			return 0, err
		}
		if b[0] != controlMagic[0] {
			a.once = true
			break
		}
		hdr, err := a.r.Peek(controlSize)
		if err != nil {
			return 0, err
		}
		c, ok := parseControl(hdr)
		if !ok || c.Kind != Ack || c.Generation != a.gen {
			return 0, errors.New("agent channel: unexpected bytes after handshake")
		}
		_, _ = a.r.Discard(controlSize)
	}
	return a.r.Read(p)
}

func (a *ackSkipper) Write(p []byte) (int, error) { return a.c.Write(p) }
func (a *ackSkipper) Close() error                { return a.c.Close() }

// Close ends the session (the agent goes back to waiting for a HELLO).
func (c *Client) Close() error { return c.sess.Close() }

// ConnectionLost tells whether err is the guest's channel breaking (a
// stream or the session ending under a call, the socket reset) rather than
// an answer the agent gave: what a guest whose QEMU or kernel died leaves
// a caller with.
func ConnectionLost(err error) bool {
	var ae *AgentError
	if err == nil || errors.As(err, &ae) {
		return false
	}
	for _, lost := range []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, yamux.ErrSessionShutdown,
		yamux.ErrStreamClosed, yamux.ErrConnectionReset, syscall.ECONNRESET, syscall.EPIPE} {
		if errors.Is(err, lost) {
			return true
		}
	}
	return false
}

// Done is closed when the session ends.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Open starts a stream with req and returns it once the agent has answered.
// The caller owns the stream.
func (c *Client) Open(ctx context.Context, req *Request) (net.Conn, *Response, error) {
	s, err := c.sess.OpenStream()
	if err != nil {
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { Abort(s) })
	defer stop()
	if err := WriteJSON(s, FrameRequest, req); err != nil {
		s.Close()
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	resp, err := ReadResponse(s)
	if err != nil {
		s.Close()
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("agent %s: %w", req.Op, ctx.Err())
		}
		return nil, nil, err
	}
	return s, resp, nil
}

// Abort ends a stream now: a yamux stream's Close only half-closes it,
// and a Read blocked on a guest that never answers (a paused machine)
// would wait on; the deadline wakes it.
func Abort(s net.Conn) {
	_ = s.SetDeadline(time.Now())
	_ = s.Close()
}

// ReadResponse reads a Response or FrameError and turns the latter into an error.
func ReadResponse(r io.Reader) (*Response, error) {
	f, err := ReadFrame(r)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	var resp Response
	if err := json.Unmarshal(f.Payload, &resp); err != nil {
		return nil, fmt.Errorf("agent: bad response: %w", err)
	}
	switch f.Kind {
	case FrameError:
		return nil, &AgentError{Msg: resp.Error, Code: resp.ExitCode}
	case FrameResponse:
		return &resp, nil
	}
	return nil, fmt.Errorf("agent: unexpected frame kind %d", f.Kind)
}

// AgentError is an error the agent reported. Code, when set, is the exit
// status a shell would give for it (126, 127).
type AgentError struct {
	Msg  string
	Code int
}

func (e *AgentError) Error() string { return e.Msg }

func (c *Client) call(ctx context.Context, req *Request) (*Response, error) {
	s, resp, err := c.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	s.Close()
	return resp, nil
}

// Ping checks the agent answers.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.call(ctx, &Request{Op: OpPing})
	return err
}

// Info describes the guest.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	resp, err := c.call(ctx, &Request{Op: OpInfo})
	if err != nil {
		return nil, err
	}
	if resp.Info == nil {
		return nil, errors.New("agent: info missing")
	}
	return resp.Info, nil
}

// Identity is what makes a guest one sandbox's: its hostname and its
// machine-id (from which its filesystems' UUIDs are made). Empty fields
// leave the guest's as they are. NewBootID, after a restore, gives it a
// boot id of its own: it was restored as another machine than the one
// saved (a fork, a start from a boot template).
type Identity struct {
	Hostname  string
	MachineID string
	NewBootID bool
}

// SetTime steps the guest's clock to t and gives it the identity id (a
// cold boot's first call).
func (c *Client) SetTime(ctx context.Context, t time.Time, id Identity) error {
	_, err := c.call(ctx, &Request{Op: OpSetTime, Time: t, Hostname: id.Hostname, MachineID: id.MachineID})
	return err
}

// Docker starts the guest's container engine and returns once it answers
// (at once when it runs already).
func (c *Client) Docker(ctx context.Context, req DockerRequest) error {
	_, err := c.call(ctx, &Request{Op: OpDocker, Docker: &req})
	return err
}

// Poweroff asks the agent to end all processes and power off.
func (c *Client) Poweroff(ctx context.Context) error {
	_, err := c.call(ctx, &Request{Op: OpPoweroff})
	return err
}

// Stat describes a guest path.
func (c *Client) Stat(ctx context.Context, path string) (*FileInfo, error) {
	resp, err := c.call(ctx, &Request{Op: OpStat, Path: path})
	if err != nil {
		return nil, err
	}
	return resp.Stat, nil
}

// List lists a guest directory.
func (c *Client) List(ctx context.Context, path string) ([]FileInfo, error) {
	resp, err := c.call(ctx, &Request{Op: OpList, Path: path})
	if err != nil {
		return nil, err
	}
	return resp.List, nil
}

// ReadFile copies a guest file to w.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (*FileInfo, error) {
	s, resp, err := c.Open(ctx, &Request{Op: OpReadFile, Path: path})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { Abort(s) })
	defer stop()
	for {
		f, err := ReadFrame(s)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		switch f.Kind {
		case FrameData:
			if _, err := w.Write(f.Payload); err != nil {
				return nil, err
			}
		case FrameEOF:
			return resp.Stat, nil
		case FrameError:
			var r Response
			_ = json.Unmarshal(f.Payload, &r)
			return nil, &AgentError{Msg: r.Error}
		default:
			return nil, fmt.Errorf("read %s: unexpected frame kind %d", path, f.Kind)
		}
	}
}

// WriteFile writes r to a guest file, atomically, owned by user ("" for the
// default user).
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, user string, r io.Reader) error {
	req := &Request{Op: OpWrite, Path: path, User: user}
	req.Mode = fileMode(mode)
	return c.Write(ctx, req, r)
}

// Write sends an OpWrite request with r as the file's content.
func (c *Client) Write(ctx context.Context, req *Request, r io.Reader) error {
	s, err := c.sess.OpenStream()
	if err != nil {
		return err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { Abort(s) })
	defer stop()
	req.Op = OpWrite
	if err := WriteJSON(s, FrameRequest, req); err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := WriteFrame(s, FrameData, buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if err := WriteFrame(s, FrameEOF, nil); err != nil {
		return err
	}
	_, err = ReadResponse(s)
	return err
}

// Exec starts a process; the returned stream carries its frames.
func (c *Client) Exec(ctx context.Context, req *ExecRequest) (net.Conn, *Response, error) {
	if err := req.Validate(); err != nil {
		return nil, nil, err
	}
	return c.Open(ctx, &Request{Op: OpExec, Exec: req})
}

// Attach connects to a process started earlier by id.
func (c *Client) Attach(ctx context.Context, id string) (net.Conn, *Response, error) {
	return c.Open(ctx, &Request{Op: OpAttach, ID: id})
}

// StdIO is what a process's frames are connected to on the host.
type StdIO struct {
	Stdin          io.Reader // nil: stdin is closed at once
	Stdout, Stderr io.Writer
	Resize         <-chan WindowSize
	Signals        <-chan byte
}

// Pump connects an exec stream to io until the exit frame arrives, and
// returns the exit status.
func Pump(s io.ReadWriter, sio StdIO) (*ExitStatus, error) {
	var wmu sync.Mutex
	send := func(kind FrameKind, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return WriteFrame(s, kind, p)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		if sio.Stdin == nil {
			_ = send(FrameStdinEOF, nil)
			return
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := sio.Stdin.Read(buf)
			if n > 0 {
				if send(FrameStdin, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				_ = send(FrameStdinEOF, nil)
				return
			}
		}
	}()
	go func() {
		for {
			select {
			case ws, ok := <-sio.Resize:
				if !ok {
					sio.Resize = nil
					continue
				}
				_ = send(FrameResize, marshal(ws))
			case sig, ok := <-sio.Signals:
				if !ok {
					sio.Signals = nil
					continue
				}
				_ = send(FrameSignal, []byte{sig})
			case <-done:
				return
			}
		}
	}()
	for {
		f, err := ReadFrame(s)
		if err != nil {
			return nil, fmt.Errorf("exec stream: %w", err)
		}
		switch f.Kind {
		case FrameStdout:
			if sio.Stdout != nil {
				_, _ = sio.Stdout.Write(f.Payload)
			}
		case FrameStderr:
			if sio.Stderr != nil {
				_, _ = sio.Stderr.Write(f.Payload)
			}
		case FrameExit:
			var st ExitStatus
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return nil, fmt.Errorf("exec stream: bad exit frame: %w", err)
			}
			return &st, nil
		case FrameError:
			var r Response
			_ = json.Unmarshal(f.Payload, &r)
			return nil, &AgentError{Msg: r.Error}
		}
	}
}

// Freeze stops every workload process in the guest (before a checkpoint).
func (c *Client) Freeze(ctx context.Context) error {
	_, err := c.call(ctx, &Request{Op: OpFreeze})
	return err
}

// Thaw lets them run again.
func (c *Client) Thaw(ctx context.Context) error {
	_, err := c.call(ctx, &Request{Op: OpThaw})
	return err
}

// Restored tells a restored guest to reseed its RNG with entropy, step its
// clock to now, take the identity id (a new boot id with NewBootID) and
// thaw its workloads.
func (c *Client) Restored(ctx context.Context, entropy []byte, now time.Time, id Identity) error {
	_, err := c.call(ctx, &Request{Op: OpRestored, Entropy: entropy, Time: now, Hostname: id.Hostname, MachineID: id.MachineID, NewBootID: id.NewBootID})
	return err
}
