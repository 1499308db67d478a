package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// QMP is a client of QEMU's machine protocol over a connected socket.
// Commands may be issued from many goroutines; events are delivered on a
// channel that drops the oldest when nobody reads.
type QMP struct {
	conn *net.UnixConn

	wmu sync.Mutex // one command on the wire at a time, with its fds

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan qmpReply
	err     error // set when the reader ends
	closed  chan struct{}

	events chan Event
}

// Event is an asynchronous QMP event.
type Event struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data"`
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *QMPError       `json:"error"`
	ID     *uint64         `json:"id"`
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
}

// QMPError is an error QEMU returned for a command.
type QMPError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *QMPError) Error() string { return "qemu: " + e.Desc }

// maxQMPLine bounds one QMP message. QEMU's replies are small except for
// query-* lists; 16 MiB leaves room for those and stops a runaway.
const maxQMPLine = 16 << 20

// NewQMP reads the greeting on conn and negotiates capabilities.
func NewQMP(ctx context.Context, conn *net.UnixConn) (*QMP, error) {
	q := &QMP{conn: conn, pending: map[uint64]chan qmpReply{}, closed: make(chan struct{}), events: make(chan Event, 64)}
	r := bufio.NewReaderSize(conn, 64<<10)
	greeting := make(chan error, 1)
	go func() {
		line, err := readLine(r)
		if err == nil {
			var g struct {
				QMP json.RawMessage `json:"QMP"`
			}
			if err = json.Unmarshal(line, &g); err == nil && g.QMP == nil {
				err = errors.New("no QMP greeting")
			}
		}
		greeting <- err
	}()
	select {
	case err := <-greeting:
		if err != nil {
			return nil, fmt.Errorf("qmp greeting: %w", err)
		}
	case <-ctx.Done():
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: %w", ctx.Err())
	}
	go q.readLoop(r)
	if err := q.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		return nil, err
	}
	return q, nil
}

func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, chunk...)
		if len(line) > maxQMPLine {
			return nil, errors.New("qmp message too long")
		}
		if !isPrefix {
			return line, nil
		}
	}
}

func (q *QMP) readLoop(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = readLine(r)
		if err != nil {
			break
		}
		var rep qmpReply
		if json.Unmarshal(line, &rep) != nil {
			continue
		}
		if rep.Event != "" {
			ev := Event{Name: rep.Event, Data: rep.Data}
			select {
			case q.events <- ev:
			default:
				select {
				case <-q.events:
				default:
				}
				select {
				case q.events <- ev:
				default:
				}
			}
			continue
		}
		if rep.ID == nil {
			continue
		}
		q.mu.Lock()
		ch := q.pending[*rep.ID]
		delete(q.pending, *rep.ID)
		q.mu.Unlock()
		if ch != nil {
			ch <- rep
		}
	}
	q.mu.Lock()
	q.err = fmt.Errorf("qmp connection closed: %w", err)
	for id, ch := range q.pending {
		close(ch)
		delete(q.pending, id)
	}
	q.mu.Unlock()
	close(q.closed)
}

// Events delivers asynchronous events (STOP, RESUME, SHUTDOWN, …).
func (q *QMP) Events() <-chan Event { return q.events }

// Execute runs cmd with args and decodes its return value into out.
func (q *QMP) Execute(ctx context.Context, cmd string, args, out any) error {
	return q.execute(ctx, cmd, args, out, nil)
}

// ExecuteWithFile runs cmd passing f along (SCM_RIGHTS), as getfd and
// add-fd expect.
func (q *QMP) ExecuteWithFile(ctx context.Context, cmd string, args any, f *os.File) error {
	return q.execute(ctx, cmd, args, nil, f)
}

// CommandTimeout bounds a command whose caller set no deadline: a QEMU
// that stopped answering (wedged on a host disk, or stopped) must never
// hang the supervisor that waits on it.
var CommandTimeout = 30 * time.Second

func (q *QMP) execute(ctx context.Context, cmd string, args, out any, f *os.File) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, CommandTimeout)
		defer cancel()
	}
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return q.err
	}
	q.nextID++
	id := q.nextID
	ch := make(chan qmpReply, 1)
	q.pending[id] = ch
	q.mu.Unlock()

	msg := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	q.wmu.Lock()
	// A QEMU that reads no more commands fills the socket: the write too
	// ends with the command's deadline.
	dl, _ := ctx.Deadline()
	_ = q.conn.SetWriteDeadline(dl)
	if f != nil {
		rights := syscall.UnixRights(int(f.Fd()))
		_, _, err = q.conn.WriteMsgUnix(b, rights, nil)
	} else {
		_, err = q.conn.Write(b)
	}
	q.wmu.Unlock()
	if err != nil {
		q.mu.Lock()
		delete(q.pending, id)
		q.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case rep, ok := <-ch:
		if !ok {
			return fmt.Errorf("qmp %s: %w", cmd, q.closedErr())
		}
		if rep.Error != nil {
			return fmt.Errorf("qmp %s: %w", cmd, rep.Error)
		}
		if out != nil && rep.Return != nil {
			return json.Unmarshal(rep.Return, out)
		}
		return nil
	case <-ctx.Done():
		q.mu.Lock()
		delete(q.pending, id)
		q.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

func (q *QMP) closedErr() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Done is closed when the connection ends.
func (q *QMP) Done() <-chan struct{} { return q.closed }

// Close ends the connection.
func (q *QMP) Close() error { return q.conn.Close() }
