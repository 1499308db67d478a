package checkpoint

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
)

// Spares keeps spare RAM files ready for checkpoints, in Dir: files the
// size of guest RAM whose every page is in the page cache. A checkpoint
// takes one over and overwrites only what it must; writing into resident
// pages is many times faster than filling new ones, and that copy is
// nearly all of the pause.
//
// A spare holds zeros, or (when checkpoints are incremental) an exact copy
// of the last checkpoint's RAM, so that the next checkpoint copies only
// the pages the guest wrote since. Several are kept (Slots) and a single
// worker refills them in the background, so that checkpoints in quick
// succession each find one; a checkpoint that finds none ready takes the
// one being filled, as far as it got, rather than wait or start from new
// pages.
type Spares struct {
	Dir   string
	Size  int64
	Slots int
	Log   *slog.Logger

	mu       sync.Mutex
	ready    []*spare
	target   string // the checkpoint spares should copy ("" = zeros)
	targetAt string // its RAM file
	delta    *Delta // how target differs from the checkpoint before it
	working  *spare // the spare the worker fills or updates now
	running  bool
	stop     atomic.Bool
	stopped  chan *spare // the worker hands working over on stop
	seq      int
	disabled error // a fill failed (a full disk): no more spares
}

// The base of a spare whose content is not known (taken while being
// filled): good only for a full copy.
const unknownBase = "?"

type spare struct {
	path string
	base string   // checkpoint whose RAM it holds; "" zeros; unknownBase
	exts []Extent // base's data extents (zeros elsewhere)
}

// Delta is what an incremental checkpoint changed: the pages copied into
// it (within its data extents) over From's RAM. Copied nil: a full copy.
type Delta struct {
	From, To string
	Copied   *Pages
	Exts     []Extent
}

// SpareName is the prefix of the spare files in Dir.
const SpareName = ".spare-ram"

// Ready is the number of spares ready now.
func (p *Spares) Ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// Reserved is the disk space every ready spare holds allocated (the
// smallest of them; 0 when none is ready): what a checkpoint that takes
// one can write into without the disk having room. Where preallocation
// reserves nothing (OpenZFS, where fallocate only checks the space), a
// spare of zeros holds none. A spare holding a checkpoint's RAM counts as
// none: its blocks hold data, which a copy-on-write filesystem (btrfs,
// ZFS) does not overwrite in place.
func (p *Spares) Reserved() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var least int64 = -1
	for _, s := range p.ready {
		n := int64(0)
		if s.base == "" {
			if fi, err := os.Lstat(s.path); err == nil && fi.Mode().IsRegular() {
				n, _ = blocksOf(fi)
			}
		}
		if least < 0 || n < least {
			least = n
		}
	}
	return max(least, 0)
}

// Paths lists the spare files (ready or being filled).
func (p *Spares) Paths() []string {
	m, _ := filepath.Glob(filepath.Join(p.Dir, SpareName+"*"))
	return m
}

// Take moves a spare to dst and tells what it holds (base: the checkpoint
// id whose RAM it is an exact copy of, "" zeros, or "?" unknown). It
// prefers a spare holding want. ok is false when there is none at all.
//
// It does not start the refill of what it took: a checkpoint takes its
// spare as it pauses, and a refill then would run beside the pause's copy
// of the guest's RAM, on the same CPUs and memory bandwidth. The caller
// calls Refill once the guest runs again.
func (p *Spares) Take(dst, want string) (base string, ok bool) {
	p.mu.Lock()
	if len(p.ready) > 0 {
		i := len(p.ready) - 1
		for j, s := range p.ready {
			if s.base == want {
				i = j
			}
		}
		s := p.ready[i]
		p.ready = append(p.ready[:i], p.ready[i+1:]...)
		p.mu.Unlock()
		if os.Rename(s.path, dst) != nil {
			os.Remove(s.path)
			return "", false
		}
		return s.base, true
	}
	if p.working == nil {
		p.mu.Unlock()
		return "", false
	}
	// One is being filled: stop the worker and take it as it is. The
	// worker checks between chunks of a few MiB, so this is quick.
	ch := make(chan *spare, 1)
	p.stopped = ch
	p.stop.Store(true)
	p.mu.Unlock()
	s := <-ch
	if s == nil || os.Rename(s.path, dst) != nil {
		return "", false
	}
	if p.Log != nil {
		p.Log.Info("a checkpoint took the spare RAM file being filled: its copy goes partly into new pages", "spare_base", s.base)
	}
	return s.base, true // "" if it was being filled with zeros
}

// Rebase makes spares copies of checkpoint id's RAM (at ramPath) from now
// on; delta says how it differs from the one before, so that spares of
// that one are brought up to date by copying only what changed. id ""
// goes back to zeros.
func (p *Spares) Rebase(id, ramPath string, delta *Delta) {
	p.mu.Lock()
	p.target, p.targetAt, p.delta = id, ramPath, delta
	p.mu.Unlock()
	p.Refill()
}

// Refill starts the worker if spares are missing or stale.
func (p *Spares) Refill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running || p.disabled != nil {
		return
	}
	p.running = true
	go p.work()
}

// Close removes the ready spares (the worker's current one is removed
// when it ends).
func (p *Spares) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.disabled = fmt.Errorf("closed")
	for _, s := range p.ready {
		os.Remove(s.path)
	}
	p.ready = nil
}

func (p *Spares) work() {
	for {
		p.mu.Lock()
		var s *spare
		stale := false
		for i, r := range p.ready {
			if r.base != p.target {
				s, stale = r, true
				p.ready = append(p.ready[:i], p.ready[i+1:]...)
				break
			}
		}
		if s == nil && len(p.ready) < max(p.Slots, 1) && p.disabled == nil {
			p.seq++
			s = &spare{path: filepath.Join(p.Dir, fmt.Sprintf("%s-%d", SpareName, p.seq)), base: unknownBase}
		}
		if s == nil || p.disabled != nil {
			p.running = false
			p.mu.Unlock()
			return
		}
		p.working = s
		target, targetAt, delta := p.target, p.targetAt, p.delta
		p.mu.Unlock()

		got, err := p.fill(s, stale, target, targetAt, delta)

		p.mu.Lock()
		p.working = nil
		if p.stop.Load() {
			// Taken by a checkpoint as it is. The worker ends: its caller
			// calls Refill once the guest runs again (see Take), not beside
			// the pause's copy.
			p.stop.Store(false)
			p.stopped <- s
			p.running = false
			p.mu.Unlock()
			return
		}
		if errors.Is(err, errNoRoom) && p.disabled == nil {
			// Not for good: the next checkpoint's Refill looks again,
			// when the user may have freed space.
			os.Remove(s.path)
			if p.Log != nil {
				p.Log.Info("no spare RAM file for now: checkpoints copy into new pages", "err", err)
			}
			p.running = false
			p.mu.Unlock()
			return
		}
		if err != nil || p.disabled != nil {
			os.Remove(s.path)
			if err != nil && p.disabled == nil {
				p.disabled = err
				if p.Log != nil {
					p.Log.Info("no spare RAM file: checkpoints copy into new pages", "err", err)
				}
			}
			p.running = false
			p.mu.Unlock()
			return
		}
		s.base = got
		p.ready = append(p.ready, s)
		p.mu.Unlock()
	}
}

// fill makes s hold target's RAM (zeros if target is ""): by applying
// delta when s holds the checkpoint delta starts from, else by writing it
// all. It returns what s holds: target, or "" when target's RAM is gone
// (deleted meanwhile).
// spareHeadroom is the disk space a new spare must leave free.
const spareHeadroom = 512 << 20

var errNoRoom = errors.New("no room for a spare RAM file")

// FreeBytes is the space free to this user in dir's filesystem.
func FreeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

func (p *Spares) fill(s *spare, stale bool, target, targetAt string, delta *Delta) (string, error) {
	if err := mkdirIn(p.Dir); err != nil {
		return "", err
	}
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var base *os.File
	if target != "" {
		if base, err = os.Open(targetAt); err != nil {
			target = "" // zeros then: good for a full copy
		} else {
			defer base.Close()
		}
	}
	stopped := func() bool { return p.stop.Load() }
	if stale && delta != nil && delta.Copied != nil && target != "" && s.base == delta.From && delta.To == target {
		s.base = unknownBase // while being changed
		if err := applyDelta(f, base, s.exts, delta, stopped); err != nil {
			return "", err
		}
		s.exts = delta.Exts
		return target, nil
	}
	s.base = unknownBase
	if !stale {
		if err := f.Truncate(0); err != nil {
			return "", err
		}
		// A new spare takes the guest's whole RAM size on disk: never at
		// the cost of the space a checkpoint itself needs. Without room,
		// checkpoints copy into new pages (slower, but they fit).
		if free, err := FreeBytes(p.Dir); err == nil && free < p.Size+spareHeadroom {
			return "", fmt.Errorf("%d MiB free in %s, a spare needs %d MiB and leaves %d MiB: %w", free>>20, p.Dir, p.Size>>20, spareHeadroom>>20, errNoRoom)
		}
		if base == nil {
			s.base = "" // all zeros however far it gets
		}
		// Zeros without writing any: the blocks are reserved (read as
		// zeros, never written) and read once, which brings their pages
		// into the page cache clean. A spare then costs the disk only
		// what it holds of a checkpoint's data: no writeback of gigabytes
		// of zeros (that a checkpoint overwrites anyway) in the queue
		// ahead of other fsyncs. Where the filesystem cannot, zeros are
		// written.
		perr := preallocate(f, p.Size)
		if errors.Is(perr, syscall.ENOSPC) || errors.Is(perr, syscall.EDQUOT) {
			// Writing zeros instead would fail the same way, after taking
			// the last space (or quota) a checkpoint needs: none for now,
			// looked at again at the next checkpoint.
			f.Truncate(0)
			return "", fmt.Errorf("preallocate a spare in %s: %w: %w", p.Dir, perr, errNoRoom)
		}
		if perr == nil {
			if err := readThrough(f, p.Size, stopped); err != nil {
				if err == errStopped {
					return "", nil
				}
				return "", err
			}
			if base == nil {
				return "", nil
			}
			// A copy of target: its data over the zeros, paced.
			exts, err := DataExtents(base, p.Size)
			if err != nil {
				return "", err
			}
			if err := copyExtents(f, base, exts, stopped); err != nil {
				if err == errStopped {
					return "", nil
				}
				return "", err
			}
			s.exts = exts
			return target, nil
		}
	}
	exts, err := FillFrom(f, base, p.Size, stopped)
	if err == errStopped {
		return "", nil
	}
	s.exts = exts
	return target, err
}

// readThrough reads f up to size, polling stop between chunks, so that
// its pages are in the page cache.
func readThrough(f *os.File, size int64, stop func() bool) error {
	buf := make([]byte, 8<<20)
	for pos := int64(0); pos < size; {
		if stop() {
			return errStopped
		}
		n, err := f.ReadAt(buf[:min(int64(len(buf)), size-pos)], pos)
		if n == 0 && err != nil {
			return err
		}
		pos += int64(n)
	}
	return nil
}

// copyExtents copies exts of base into f at the same offsets, written out
// a step at a time, polling stop between chunks.
func copyExtents(f, base *os.File, exts []Extent, stop func() bool) error {
	buf := make([]byte, 8<<20)
	pc := pace(f)
	defer pc.done()
	for _, e := range exts {
		for pos, end := e.Off, e.Off+e.Len; pos < end; {
			if stop() {
				return errStopped
			}
			n := min(int64(len(buf)), end-pos)
			k, err := copyRange(f, base, pos, pos+n, buf)
			if err != nil {
				return err
			}
			if k != n {
				return fmt.Errorf("copy %s into a spare: it ended early at %d", base.Name(), pos+k)
			}
			pc.wrote(k)
			pos += n
		}
	}
	return nil
}

// applyDelta turns f, a resident copy of delta.From's RAM (data extents
// old), into a copy of delta.To's (in base): the pages the delta copied
// come from base, and what was data and is now a hole is zeroed.
func applyDelta(f, base *os.File, old []Extent, delta *Delta, stopped func() bool) error {
	buf := make([]byte, 1<<20)
	p := pace(f)
	defer p.done()
	for _, e := range delta.Exts {
		end := e.Off + e.Len
		for pos := e.Off; pos < end; {
			if !delta.Copied.Has(pos / PageSize) {
				pos = min((pos/PageSize+1)*PageSize, end)
				continue
			}
			runEnd := pos
			for runEnd < end && delta.Copied.Has(runEnd/PageSize) && runEnd-pos < int64(len(buf)) {
				runEnd = min((runEnd/PageSize+1)*PageSize, end)
			}
			n, err := copyRange(f, base, pos, runEnd, buf)
			if err != nil {
				return err
			}
			p.wrote(n)
			pos = runEnd
			if stopped() {
				return nil
			}
		}
	}
	// Zeros where old had data and the new one has none.
	zeros := make([]byte, 1<<20)
	for _, h := range subtract(old, delta.Exts) {
		for pos := h.Off; pos < h.Off+h.Len; {
			n := min(int64(len(zeros)), h.Off+h.Len-pos)
			if _, err := f.WriteAt(zeros[:n], pos); err != nil {
				return err
			}
			p.wrote(n)
			pos += n
		}
	}
	return nil
}

// subtract returns the parts of a (sorted extents) not covered by b.
func subtract(a, b []Extent) []Extent {
	var out []Extent
	j := 0
	for _, e := range a {
		pos, end := e.Off, e.Off+e.Len
		for j < len(b) && b[j].Off+b[j].Len <= pos {
			j++
		}
		for k := j; k < len(b) && b[k].Off < end && pos < end; k++ {
			if b[k].Off > pos {
				out = append(out, Extent{pos, b[k].Off - pos})
			}
			pos = max(pos, b[k].Off+b[k].Len)
		}
		if pos < end {
			out = append(out, Extent{pos, end - pos})
		}
	}
	return out
}
