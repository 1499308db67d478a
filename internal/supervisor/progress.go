package supervisor

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/wsync"
)

// countingGuest is the guest side of the sync with the files it writes
// counted, during the first pass only: the engine sees the same GuestSide,
// Put included. During that pass every call that the guest answers, batch
// of a scan, file opened and chunk read also touches the pass's stall
// guard: the first copy is bounded by its progress. After done the live
// sync goes straight through.
type countingGuest struct {
	*wsync.GuestSide
	mu    sync.Mutex
	total launch.CopyProgress
	last  time.Time
	tell  func(launch.CopyProgress) // at most every interval; nil: nobody listens
	moved atomic.Pointer[stallGuard]
}

// newCountingGuest counts g's first pass for tell and tells moved of its
// progress, scan batches included (g.Progress).
func newCountingGuest(g *wsync.GuestSide, tell func(launch.CopyProgress), moved *stallGuard) *countingGuest {
	c := &countingGuest{GuestSide: g, tell: tell}
	c.moved.Store(moved)
	g.Progress = c.touch
	return c
}

const progressInterval = time.Second

// touch is progress of the first pass (nothing after done).
func (c *countingGuest) touch() { c.moved.Load().touch() }

// moving is r, telling the first pass's guard of each chunk read (r
// itself after done).
func (c *countingGuest) moving(r io.ReadCloser) io.ReadCloser {
	if g := c.moved.Load(); g != nil {
		return movingReader{r, g}
	}
	return r
}

func (c *countingGuest) Put(ctx context.Context, items []wsync.PutItem) (map[string]error, error) {
	if c.moved.Load() == nil {
		return c.GuestSide.Put(ctx, items)
	}
	defer c.touch()
	// One Put carries a whole pass: count each file as it is opened to be
	// streamed, so a large first copy reports as it goes, and each chunk
	// read of it as progress (one file of gigabytes is one open).
	counted := make([]wsync.PutItem, len(items))
	for i, it := range items {
		counted[i] = it
		if it.Open == nil || it.Entry == nil {
			continue
		}
		open, size := it.Open, it.Entry.Size
		counted[i].Open = func() (io.ReadCloser, error) {
			c.count(size)
			c.touch()
			r, err := open()
			if err != nil {
				return nil, err
			}
			return c.moving(r), nil
		}
	}
	return c.GuestSide.Put(ctx, counted)
}

func (c *countingGuest) Scan(ctx context.Context, paths []string) (map[string]*wsync.Entry, error) {
	defer c.touch()
	return c.GuestSide.Scan(ctx, paths)
}

func (c *countingGuest) Read(ctx context.Context, p string) (io.ReadCloser, error) {
	defer c.touch()
	r, err := c.GuestSide.Read(ctx, p)
	if err != nil {
		return nil, err
	}
	return c.moving(r), nil
}

func (c *countingGuest) Write(ctx context.Context, p string, mode fs.FileMode, r io.Reader, hash string, was *wsync.Entry) (string, error) {
	defer c.touch()
	if r != nil {
		r = c.moving(io.NopCloser(r))
	}
	return c.GuestSide.Write(ctx, p, mode, r, hash, was)
}

func (c *countingGuest) Mkdir(ctx context.Context, p string, mode fs.FileMode) error {
	defer c.touch()
	return c.GuestSide.Mkdir(ctx, p, mode)
}

func (c *countingGuest) Symlink(ctx context.Context, p, target string, was *wsync.Entry) error {
	defer c.touch()
	return c.GuestSide.Symlink(ctx, p, target, was)
}

func (c *countingGuest) Remove(ctx context.Context, p string, was *wsync.Entry) error {
	defer c.touch()
	return c.GuestSide.Remove(ctx, p, was)
}

func (c *countingGuest) Sync(ctx context.Context) error {
	defer c.touch()
	return c.GuestSide.Sync(ctx)
}

// movingReader tells g of each read: a stream that moves is progress.
type movingReader struct {
	io.ReadCloser
	g *stallGuard
}

func (r movingReader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	if n > 0 {
		r.g.touch()
	}
	return n, err
}

// firstCopyStall is how long the workspace's first pass may go without
// progress (a guest call answered, a file opened, a chunk of one read)
// before the start gives up on it: the boot's time limit does not bound
// the first copy, whose length follows the folder's size.
var firstCopyStall = 2 * time.Minute

// firstCopyMax bounds the first pass whatever its progress: a guest that
// answers just often enough cannot hold a start (and its folder's lock)
// for ever. 10,000 files took 31 s under TCG; an hour is about a million.
var firstCopyMax = time.Hour

// errStalled is the cause of a first pass that stopped moving, or that
// passed its ceiling.
type errStalled struct {
	what  string
	limit time.Duration
	total bool   // the ceiling, not a stall
	hint  string // what to do, for the user
}

func (e errStalled) Error() string {
	if e.total {
		return fmt.Sprintf("%s took longer than %v: exclude what the sandbox does not need (kosa8.toml's [workspace] exclude), or use a smaller folder", e.what, e.limit)
	}
	return fmt.Sprintf("%s made no progress for %v (the guest stopped answering, or the host is overloaded): %s", e.what, e.limit, e.hint)
}

// stallGuard ends a context once nothing has moved for its limit. A nil
// guard is never touched and ends nothing.
type stallGuard struct {
	moved atomic.Int64 // unix nanoseconds of the last progress
}

func (g *stallGuard) touch() {
	if g != nil {
		g.moved.Store(time.Now().UnixNano())
	}
}

func (g *stallGuard) idle() time.Duration {
	return time.Since(time.Unix(0, g.moved.Load()))
}

// watchStall returns ctx, ended with errStalled once g has not been
// touched for limit or ceiling has passed, and the stop that ends the
// watch.
func watchStall(ctx context.Context, what, hint string, limit, ceiling time.Duration) (context.Context, *stallGuard, func()) {
	g := &stallGuard{}
	g.touch()
	ctx, endAll := context.WithTimeoutCause(ctx, ceiling, errStalled{what: what, limit: ceiling, total: true})
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(max(limit/20, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if g.idle() >= limit {
					cancel(errStalled{what: what, limit: limit, hint: hint})
					return
				}
			}
		}
	}()
	return ctx, g, func() { cancel(nil); endAll() }
}

func (c *countingGuest) count(size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total.Files++
	c.total.Bytes += size
	if c.tell != nil && time.Since(c.last) >= progressInterval {
		c.last = time.Now()
		c.tell(c.total)
	}
}

// done tells the final count of the first pass (when it copied anything)
// and stops telling and touching: later passes are the live sync, not the
// copy.
func (c *countingGuest) done() {
	c.moved.Store(nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tell != nil && c.total.Files > 0 && !c.last.IsZero() {
		c.tell(c.total)
	}
	c.tell = nil
}
