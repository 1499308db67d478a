package checkpoint

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// RAMSaver copies a running machine's RAM into checkpoints. The first
// checkpoint of a machine copies all of it; later ones, when the kernel
// tracks soft-dirty pages, copy only the pages the guest wrote since the
// previous checkpoint into a spare that already holds that checkpoint's
// RAM. Whenever tracking was reset or is uncertain (a new QEMU after a
// start or rewind, a failed clear, pages discarded through the file, no
// spare holding the previous checkpoint) the copy is full.
//
// With Verify set (KOSA8_CHECKPOINT_VERIFY=1) every checkpoint is compared
// byte for byte with the guest's RAM during the pause; a mismatch is
// logged, reported in the checkpoint's metadata, and repaired by a full
// copy.
type RAMSaver struct {
	Size   int64
	Verify bool
	Log    *slog.Logger
	Spares *Spares

	mu       sync.Mutex
	owner    any // the machine tracked
	tracker  Tracker
	trackErr error  // why there is no tracker
	pending  string // checkpoint the tracker was reset at, until it commits
	armedFor string // committed checkpoint the tracker's window starts at
}

// Track points the saver at the running machine. A machine other than the
// last one starts tracking afresh (newTracker), unarmed: its first
// checkpoint is a full copy.
func (r *RAMSaver) Track(owner any, newTracker func() (Tracker, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if owner == r.owner {
		return
	}
	if r.tracker != nil {
		r.tracker.Close()
	}
	r.owner, r.tracker, r.trackErr, r.pending, r.armedFor = owner, nil, nil, "", ""
	t, err := newTracker()
	if err != nil {
		r.trackErr = err
		if r.Log != nil {
			r.Log.Info("checkpoints copy all of the RAM: no dirty page tracking", "err", err)
		}
		return
	}
	r.tracker = t
}

// Want is the checkpoint a spare should hold for the next checkpoint to be
// incremental ("" when it cannot be).
func (r *RAMSaver) Want() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tracker == nil {
		return ""
	}
	return r.armedFor
}

// SaveResult is what Save did.
type SaveResult struct {
	Extents     []Extent // data extents of the RAM file written
	Stored      int64    // bytes of data in it
	Copied      int64    // bytes copied during the pause
	Incremental bool
	FullReason  string // why the copy was full
	Verify      string // "ok", or what the verifier found; "" when off
	delta       *Delta
	// stale: outside Extents the file may hold older RAM (a full copy
	// over a spare that was not all zeros) until FreeHoles.
	stale bool
}

// Save writes the guest's RAM (src, the machine's RAM file) into dst for
// checkpoint id, whose parent is the checkpoint the machine runs from. The
// machine must be paused. spare tells whether dst is a spare and base what
// it holds (see Spares.Take).
func (r *RAMSaver) Save(dst, src *os.File, id, parent string, spare bool, base string) (*SaveResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &SaveResult{}
	var must *Pages
	switch {
	case r.tracker == nil:
		res.FullReason = "no dirty page tracking"
		if r.trackErr != nil {
			res.FullReason += ": " + r.trackErr.Error()
		}
	case r.armedFor == "" || r.armedFor != parent:
		res.FullReason = "first checkpoint since tracking started"
	case !spare || base != parent:
		res.FullReason = "no spare holding the previous checkpoint"
	default:
		var err error
		if must, err = r.tracker.Dirty(); err != nil {
			res.FullReason = "dirty pages unknown: " + err.Error()
		}
	}
	r.armedFor, r.pending = "", ""
	if r.tracker != nil {
		// A new window starts now, while the machine is paused: whatever
		// the guest writes from here on is in the next checkpoint's set.
		changed, err := r.tracker.Reset()
		switch {
		case err != nil:
			r.tracker.Close()
			r.tracker, r.trackErr = nil, fmt.Errorf("reset: %w", err)
			if must != nil {
				must, res.FullReason = nil, "tracking failed: "+err.Error()
			}
		case changed && must != nil:
			must, res.FullReason = nil, "the RAM file was changed through its descriptor (pages discarded)"
			r.pending = id // the new window is sound
		default:
			r.pending = id
		}
	}
	if err := r.copy(res, dst, src, must, spare); err != nil {
		return nil, err
	}
	res.stale = spare && base != "" && must == nil
	incremental := res.Incremental
	if r.Verify {
		if err := r.FreeHoles(dst, res); err != nil {
			return nil, err
		}
		if err := Compare(dst, src, r.Size); err != nil {
			if !errors.Is(err, ErrMismatch) {
				return nil, fmt.Errorf("verify: %w", err)
			}
			res.Verify = err.Error()
			if r.Log != nil {
				r.Log.Error("checkpoint verifier: RAM differs, copying all of it", "id", id, "incremental", res.Incremental, "err", err)
			}
			// Repaired: the checkpoint must be the guest's RAM. The
			// spares are then refilled in full (no delta), and tracking
			// starts over.
			if err := r.copy(res, dst, src, nil, true); err != nil {
				return nil, err
			}
			if err := PunchHoles(dst, res.Extents, r.Size); err != nil {
				return nil, err
			}
			must, r.pending = nil, ""
			if err := Compare(dst, src, r.Size); err != nil {
				return nil, fmt.Errorf("verify the full copy: %w", err)
			}
			res.Verify += " (repaired by a full copy)"
		} else {
			res.Verify = "ok"
		}
	}
	for _, e := range res.Extents {
		res.Stored += e.Len
	}
	res.delta = &Delta{From: parent, To: id, Exts: res.Extents}
	if must != nil {
		res.delta.Copied = must
	}
	res.Incremental = incremental
	return res, nil
}

// FreeHoles frees what a checkpoint written by Save holds outside the
// guest's data: zeros of the spare (or, after a full copy over a spare,
// older RAM). Freeing a GiB of page cache takes a while: it is done once
// the machine runs again.
// It fails only where the file would otherwise not be the guest's RAM.
func (r *RAMSaver) FreeHoles(dst *os.File, res *SaveResult) error {
	if res == nil {
		return nil
	}
	err := FreeSpareHoles(dst, res.Extents, r.Size, !res.stale) // stale: older RAM must go, every byte
	if err != nil && !res.stale {
		if r.Log != nil {
			r.Log.Warn("punch holes in the checkpoint's RAM (it keeps zeros allocated)", "err", err)
		}
		return nil
	}
	if err == nil {
		res.stale = false
	}
	return err
}

// copy fills dst from src: the pages in must over the previous
// checkpoint's RAM, or (must nil) all the data.
func (r *RAMSaver) copy(res *SaveResult, dst, src *os.File, must *Pages, spare bool) error {
	var err error
	res.Incremental = must != nil
	switch {
	case must != nil:
		res.Extents, res.Copied, err = CopyIncremental(dst, src, r.Size, must)
	case spare:
		// The spare held zeros or an older RAM where the guest has none
		// now: FreeHoles makes the file sparse again, after the pause.
		res.Extents, res.Copied, err = CopyData(dst, src)
	default:
		if res.Copied, err = CopySparse(dst, src); err == nil {
			res.Extents, err = DataExtents(dst, r.Size)
		}
	}
	if err != nil {
		return fmt.Errorf("copy guest RAM: %w", err)
	}
	return nil
}

// Committed is told that checkpoint id (RAM at ramPath, saved as res)
// is on disk: the next checkpoint may build on it, and the spares are
// brought up to it in the background.
func (r *RAMSaver) Committed(id, ramPath string, res *SaveResult) {
	r.mu.Lock()
	target := ""
	if r.tracker != nil && r.pending == id {
		r.armedFor, target = id, id
	}
	r.mu.Unlock()
	if r.Spares == nil {
		return
	}
	if target == "" || res == nil {
		r.Spares.Rebase("", "", nil)
		return
	}
	r.Spares.Rebase(target, ramPath, res.delta)
}
