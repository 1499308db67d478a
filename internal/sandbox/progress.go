package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/kosa8/kosa8/internal/wsync"
)

// CopyProgress is how far copying the host folder into the guest has come:
// sent on the ready pipe while a sandbox boots, so the user sees a large
// folder move (files and bytes) instead of a silent wait.
type CopyProgress struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// countingGuest is the guest side of the sync with every batch it writes
// counted: the engine sees the same GuestSide, Put included.
type countingGuest struct {
	*wsync.GuestSide
	mu    sync.Mutex
	total CopyProgress
	last  time.Time
	tell  func(CopyProgress) // at most every interval; nil: nobody listens
}

const progressInterval = time.Second

func (c *countingGuest) Put(ctx context.Context, items []wsync.PutItem) (map[string]error, error) {
	failed, err := c.GuestSide.Put(ctx, items)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, it := range items {
		if it.Entry == nil || failed[it.Entry.Path] != nil {
			continue
		}
		c.total.Files++
		c.total.Bytes += it.Entry.Size
	}
	if c.tell != nil && time.Since(c.last) >= progressInterval {
		c.last = time.Now()
		c.tell(c.total)
	}
	return failed, err
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
