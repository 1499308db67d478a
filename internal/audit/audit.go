// Package audit keeps a sandbox's audit trail: JSON objects, one a line, in
// the sandbox's state directory on the host, out of the guest's reach and
// never rewound. There are two files:
//
//   - audit.log, every decision and happening (DNS answers, connections
//     with their byte counts, …): high volume, bounded by rotating into
//     one older file (audit.log.1), so a noisy guest costs at most twice
//     its limit;
//   - security.log beside it, the evidence: denials, exfiltration
//     attempts, held writes, checkpoints, rewinds and policy changes. It
//     keeps SecurityGenerations files of its limit each (64 MiB in all by
//     default) before the oldest goes.
//
// A guest must not be able to erase the evidence by making noise. So every
// kind of record has its own budget in each file (a token bucket: a burst,
// then a steady rate); records over the budget are not written but
// counted, and a summary record ("N more dns records …") says how many
// went unwritten and what the last one was. A flood of one kind cannot
// crowd out another kind, and at the security file's rate the guest needs
// hours of flooding to rotate away its first generation; the records it
// floods with are the evidence of the flood.
package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	Decision string    `json:"decision,omitempty"` // allow, deny, summary, …
	Rule     string    `json:"rule,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	BytesOut int64     `json:"bytes_out,omitempty"` // guest → world
	BytesIn  int64     `json:"bytes_in,omitempty"`
	Answer   string    `json:"answer,omitempty"`
	// Refused is the address(es) an allowed name resolved to and was
	// refused at: private, documentation, shared or the host's own, which
	// a name reaches only when pinned ("pin:NAME").
	Refused string `json:"refused,omitempty"`
	// Count is set on a summary: how many records it stands for.
	Count int `json:"count,omitempty"`
}

// maxField bounds each text field of a record: names and reasons come from
// the guest (a Host header of a megabyte), and records of that size would
// rotate the security log away in seconds, whatever the per-kind budgets.
const maxField = 512

// bounded is e with every text field cut to maxField bytes (a cut field
// ends in "…(N bytes)", so the record still says it was longer).
func (e Event) bounded() Event {
	for _, f := range []*string{&e.Kind, &e.Name, &e.Dest, &e.Upstream, &e.QType, &e.Decision, &e.Rule, &e.Reason, &e.Answer, &e.Refused} {
		if len(*f) > maxField {
			*f = strings.ToValidUTF8((*f)[:maxField], "") + "…(" + strconv.Itoa(len(*f)) + " bytes)"
		}
	}
	return e
}

// Kinds of security records written by callers outside the network.
const (
	KindExfiltration = "exfiltration" // a secret's placeholder where it may not go
	KindHeld         = "held"         // a guest write held back from the host folder
	KindCheckpoint   = "checkpoint"
	KindRewind       = "rewind"
	KindPolicy       = "policy" // a change of the allow-list
	KindSecurity     = "security"
)

// DecisionSummary marks a record standing for others not written.
const DecisionSummary = "summary"

// securityKinds are always evidence, whatever their decision.
var securityKinds = map[string]bool{
	KindExfiltration: true, KindHeld: true, KindCheckpoint: true, KindRewind: true,
	KindPolicy: true, KindSecurity: true, "read-only": true, "approve": true,
}

// IsSecurity reports whether e belongs in the security log: a denial of
// any kind, or a kind that is evidence by itself.
func IsSecurity(e Event) bool {
	return e.Decision == "deny" || securityKinds[e.Kind]
}

// Limits.
const (
	// DefaultMaxBytes bounds one audit file.
	DefaultMaxBytes = 16 << 20
	// SecurityGenerations is how many security files of the limit each are
	// kept (security.log, .1, .2, .3).
	SecurityGenerations = 4
	// SecurityFile is the security log's name, beside the audit log.
	SecurityFile = "security.log"
)

// budget is a kind's allowance in one file: a burst, then a rate per
// second.
type budget struct {
	burst, rate float64
}

var (
	// The audit log takes bursts of thousands (a build opening many
	// connections) and 50 records a second of one kind after that.
	mainBudget = budget{burst: 2000, rate: 50}
	// The security log takes a burst of 500 of a kind, then 2 a second:
	// at about 300 bytes a record, a guest flooding every kind at once
	// needs hours to fill a 16 MiB generation.
	securityBudget = budget{burst: 500, rate: 2}
)

// summaryEvery is how often held-back counts are written out as
// summaries.
const summaryEvery = 10 * time.Second

// Log appends events to the audit log and, for security records, to the
// security log.
type Log struct {
	main *file
	sec  *file

	mu   sync.Mutex
	subs map[chan Event]struct{}
	stop chan struct{}
	done chan struct{}
}

// Logger is the name callers outside the network know the log by.
type Logger = Log

// Open opens (or creates) the audit log at path, with at most max bytes a
// file (0: DefaultMaxBytes), and the security log beside it.
func Open(path string, max int64) (*Log, error) {
	if max <= 0 {
		max = DefaultMaxBytes
	}
	main, err := openFile(path, max, 2, mainBudget)
	if err != nil {
		return nil, err
	}
	sec, err := openFile(SecurityPath(path), max, SecurityGenerations, securityBudget)
	if err != nil {
		main.close()
		return nil, err
	}
	l := &Log{main: main, sec: sec, subs: map[chan Event]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
	go l.summarize()
	return l, nil
}

// SecurityPath is where the security log of the audit log at path lives.
func SecurityPath(auditPath string) string {
	return filepath.Join(filepath.Dir(auditPath), SecurityFile)
}

// Add records e (its time is set when zero) in the audit log, and in the
// security log too when it is a security record.
func (l *Log) Add(e Event) {
	l.add(e, IsSecurity(e))
}

// Security records e as evidence: in the security log, whatever its kind
// (and in the audit log, so that 'net log' shows it in order). Callers
// outside the network use it for held writes, rewinds and checkpoints:
//
//	log.Security(audit.Event{Kind: audit.KindHeld, Name: ".envrc", Reason: "held for approval"})
func (l *Log) Security(e Event) {
	l.add(e, true)
}

func (l *Log) add(e Event, security bool) {
	if l == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	e = e.bounded()
	l.main.add(e)
	if security {
		l.sec.add(e)
	}
	l.mu.Lock()
	for ch := range l.subs {
		select {
		case ch <- e:
		default: // a slow follower misses events rather than stalling the network
		}
	}
	l.mu.Unlock()
}

// summarize writes held-back counts out now and then, so that a flood that
// stops is still summed up.
func (l *Log) summarize() {
	defer close(l.done)
	t := time.NewTicker(summaryEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case now := <-t.C:
			l.main.flushSummaries(now, false)
			l.sec.flushSummaries(now, false)
		}
	}
}

// Subscribe delivers events as they are added (before any budget: a
// follower sees every one it keeps up with) until cancel is called.
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

// Close writes what summaries are pending and closes the files.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	select {
	case <-l.stop:
		return nil
	default:
	}
	close(l.stop)
	<-l.done
	now := time.Now()
	l.main.flushSummaries(now, true)
	l.sec.flushSummaries(now, true)
	return errors.Join(l.main.close(), l.sec.close())
}

// file is one log with its rotation and the budgets of its kinds.
type file struct {
	path   string
	max    int64
	gens   int // files kept, this one included
	budget budget

	mu      sync.Mutex
	f       *os.File
	size    int64
	buckets map[string]*bucket
}

// bucket is a kind's budget in a file, and what it held back.
type bucket struct {
	tokens     float64
	last       time.Time
	suppressed int
	since      time.Time // the first record held back
	lastHeld   Event     // the last record held back
}

// maxBuckets bounds the kinds tracked; kinds are set by kosa8's code, not
// the guest, so this is a guard only.
const maxBuckets = 256

func openFile(path string, max int64, gens int, b budget) (*file, error) {
	f := &file{path: path, max: max, gens: gens, budget: b, buckets: map[string]*bucket{}}
	if err := f.open(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *file) open() error {
	fd, err := os.OpenFile(f.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", f.path, err)
	}
	st, err := fd.Stat()
	if err != nil {
		fd.Close()
		return err
	}
	f.f, f.size = fd, st.Size()
	// A record cut short (the host lost power mid-write) would run into
	// the next one and spoil both: the next starts on a line of its own.
	if f.size > 0 {
		last := make([]byte, 1)
		if r, err := os.Open(f.path); err == nil {
			if _, err := r.ReadAt(last, f.size-1); err == nil && last[0] != '\n' {
				if n, err := fd.Write([]byte{'\n'}); err == nil {
					f.size += int64(n)
				}
			}
			r.Close()
		}
	}
	return nil
}

func (f *file) add(e Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return
	}
	b := f.buckets[e.Kind]
	if b == nil {
		if len(f.buckets) >= maxBuckets {
			f.flushLocked(e.Time, true)
			f.buckets = map[string]*bucket{}
		}
		b = &bucket{tokens: f.budget.burst, last: e.Time}
		f.buckets[e.Kind] = b
	}
	if dt := e.Time.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(f.budget.burst, b.tokens+dt*f.budget.rate)
		b.last = e.Time
	}
	if b.tokens < 1 {
		if b.suppressed == 0 {
			b.since = e.Time
		}
		b.suppressed++
		b.lastHeld = e
		return
	}
	b.tokens--
	if b.suppressed > 0 {
		f.writeLocked(summary(e.Kind, b, e.Time))
		b.suppressed = 0
	}
	f.writeLocked(e)
}

// flushSummaries writes a summary for every kind that held records back
// at least summaryEvery ago (all of them with force).
func (f *file) flushSummaries(now time.Time, force bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flushLocked(now, force)
}

func (f *file) flushLocked(now time.Time, force bool) {
	if f.f == nil {
		return
	}
	for kind, b := range f.buckets {
		if b.suppressed > 0 && (force || now.Sub(b.since) >= summaryEvery) {
			f.writeLocked(summary(kind, b, now))
			b.suppressed = 0
		}
	}
}

func summary(kind string, b *bucket, now time.Time) Event {
	last := b.lastHeld
	what := last.Name
	if what == "" {
		what = last.Dest
	}
	reason := fmt.Sprintf("%d more %s records not written since %s (over the log's rate for one kind); the last: %s %s",
		b.suppressed, kind, b.since.UTC().Format(time.RFC3339), last.Decision, what)
	if last.Reason != "" {
		reason += ": " + last.Reason
	}
	return Event{Time: now.UTC(), Kind: kind, Decision: DecisionSummary, Name: last.Name, Dest: last.Dest, Reason: truncate(reason, 1024), Count: b.suppressed}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (f *file) writeLocked(e Event) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	b = append(b, '\n')
	if f.size+int64(len(b)) > f.max {
		f.rotate()
		if f.f == nil {
			return
		}
	}
	if n, err := f.f.Write(b); err == nil {
		f.size += int64(n)
	}
}

// rotate shifts path.N-1 … path.1, path one generation down; the oldest
// goes.
func (f *file) rotate() {
	f.f.Close()
	f.f = nil
	for i := f.gens - 1; i >= 1; i-- {
		_ = os.Rename(genPath(f.path, i-1), genPath(f.path, i))
	}
	if err := f.open(); err != nil {
		f.f = nil
	}
}

func genPath(path string, i int) string {
	if i == 0 {
		return path
	}
	return path + "." + strconv.Itoa(i)
}

func (f *file) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return nil
	}
	err := f.f.Close()
	f.f = nil
	return err
}

// maxLine bounds a line when reading a log back.
const maxLine = 64 << 10

// Read returns the events in the audit log at path (the rotated file
// first). Lines that do not parse are skipped.
func Read(path string) ([]Event, error) {
	return readGens(path, 2)
}

// ReadSecurity returns the events in the security log beside the audit
// log at auditPath, oldest first.
func ReadSecurity(auditPath string) ([]Event, error) {
	return readGens(SecurityPath(auditPath), SecurityGenerations)
}

func readGens(path string, gens int) ([]Event, error) {
	var out []Event
	for i := gens - 1; i >= 0; i-- {
		p := genPath(path, i)
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
			return nil, fmt.Errorf("read %s: %w", p, err)
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
