package supervisor

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/wsync"
)

// countingGuest is the guest side of the sync with the files it writes
// counted, during the first pass only: the engine sees the same GuestSide,
// Put included.
type countingGuest struct {
	*wsync.GuestSide
	mu    sync.Mutex
	total launch.CopyProgress
	last  time.Time
	tell  func(launch.CopyProgress) // at most every interval; nil: nobody listens
}

const progressInterval = time.Second

func (c *countingGuest) Put(ctx context.Context, items []wsync.PutItem) (map[string]error, error) {
	c.mu.Lock()
	active := c.tell != nil
	c.mu.Unlock()
	if !active {
		return c.GuestSide.Put(ctx, items)
	}
	// One Put carries a whole pass: count each file as it is opened to be
	// streamed, so a large first copy reports as it goes.
	counted := make([]wsync.PutItem, len(items))
	for i, it := range items {
		counted[i] = it
		if it.Open == nil || it.Entry == nil {
			continue
		}
		open, size := it.Open, it.Entry.Size
		counted[i].Open = func() (io.ReadCloser, error) {
			c.count(size)
			return open()
		}
	}
	return c.GuestSide.Put(ctx, counted)
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
// and stops telling: later passes are the live sync, not the copy.
func (c *countingGuest) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tell != nil && c.total.Files > 0 && !c.last.IsZero() {
		c.tell(c.total)
	}
	c.tell = nil
}
