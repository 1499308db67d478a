// Package audit keeps a sandbox's audit log: one JSON object per line, in
// the sandbox's state directory on the host, out of the guest's reach and
// never rewound. It is bounded: past its size it rotates into one older
// file (audit.log.1), so a noisy guest costs at most twice the limit.
package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"sync"
	"time"
)

// Event is one decision or happening.
type Event struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"` // dns, tcp, udp, icmp, ipv6, policy, checkpoint, …
	Name     string    `json:"name,omitempty"`
	Dest     string    `json:"dest,omitempty"` // ip:port as the guest addressed it
	Upstream string    `json:"upstream,omitempty"`
	QType    string    `json:"qtype,omitempty"`
	Decision string    `json:"decision,omitempty"` // allow, deny
	Rule     string    `json:"rule,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	BytesOut int64     `json:"bytes_out,omitempty"` // guest → world
	BytesIn  int64     `json:"bytes_in,omitempty"`
	Answer   string    `json:"answer,omitempty"`
}

// DefaultMaxBytes bounds one audit file.
const DefaultMaxBytes = 16 << 20

// Log appends events to a file.
type Log struct {
	path string
	max  int64

	mu   sync.Mutex
	f    *os.File
	size int64
	subs map[chan Event]struct{}
}

// Open opens (or creates) the log at path.
func Open(path string, max int64) (*Log, error) {
	if max <= 0 {
		max = DefaultMaxBytes
	}
	l := &Log{path: path, max: max, subs: map[chan Event]struct{}{}}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Add records e (its time is set when zero).
func (l *Log) Add(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	if l.size+int64(len(b)) > l.max {
		l.rotate()
	}
	if n, err := l.f.Write(b); err == nil {
		l.size += int64(n)
	}
	for ch := range l.subs {
		select {
		case ch <- e:
		default: // a slow follower misses events rather than stalling the network
		}
	}
}

func (l *Log) rotate() {
	l.f.Close()
	_ = os.Rename(l.path, l.path+".1")
	if err := l.open(); err != nil {
		l.f = nil
	}
}

// Subscribe delivers events as they are added until cancel is called.
func (l *Log) Subscribe() (events <-chan Event, cancel func()) {
	ch := make(chan Event, 256)
	l.mu.Lock()
	l.subs[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs, ch)
		l.mu.Unlock()
	}
}

// Close closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// maxLine bounds a line when reading a log back.
const maxLine = 64 << 10

// Read returns the events in the log at path (the rotated file first).
// Lines that do not parse are skipped.
func Read(path string) ([]Event, error) {
	var out []Event
	for _, p := range []string{path + ".1", path} {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		evs, err := decode(f)
		f.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
	}
	return out, nil
}

func decode(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLine)
	for sc.Scan() {
		var e Event
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return out, err
	}
	return out, nil
}
