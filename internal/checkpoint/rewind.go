package checkpoint

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// RewindRAM keeps guest RAM ready for the likeliest rewind: a RAM file
// holding an exact copy of one checkpoint's RAM (the last one taken, or
// the one just rewound to), filled in the background. A rewind to that
// checkpoint hands the file to the new VMM instead of copying the RAM
// while the user waits, which is most of a rewind (1 GiB of data: about
// 0.5 s here); a rewind to any other checkpoint copies as before.
//
// It costs host memory: the checkpoint's RAM in use, a second time, while
// the sandbox runs. A fill stops, and frees its file, when the host has
// too little memory to spare (Room) or the tmpfs too little room beside
// the guests' RAM (ShmToSpare).
type RewindRAM struct {
	// New makes an empty RAM file of Size for the VMM (the driver's,
	// vmm.RAMFileMaker): on tmpfs, unlinked.
	New  func() (*os.File, error)
	Size int64
	// Room tells whether the host can spare need more bytes of memory; nil
	// uses MemoryToSpare.
	Room func(need int64) error
	// Verify compares the file with the checkpoint before it is handed
	// over (KOSA8_CHECKPOINT_VERIFY).
	Verify bool
	Log    *slog.Logger

	mu     sync.Mutex
	f      *os.File // the file, when not being filled
	holds  string   // the checkpoint f holds, whole ("" none)
	fill   *fillJob // the fill running, if any
	closed bool
}

type fillJob struct {
	id   string
	stop atomic.Bool // stop: another fill comes, or the file is dropped
	drop atomic.Bool // and free the file (else the next fill writes over it)
	done chan struct{}
}

// Prepare makes the file hold checkpoint id's RAM (at ramPath), in the
// background, replacing what it held: from now on only id is handed out.
// A fill already running stops first and hands its file on.
func (r *RewindRAM) Prepare(id, ramPath string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.New == nil || (r.holds == id && r.f != nil) {
		return
	}
	prev := r.fill
	if prev != nil && prev.id == id && !prev.stop.Load() {
		return
	}
	job := &fillJob{id: id, done: make(chan struct{})}
	r.fill = job
	// The file belongs to the fill now, whatever it held.
	f := r.f
	r.f, r.holds = nil, ""
	if prev != nil {
		prev.stop.Store(true)
	}
	go func() {
		defer close(job.done)
		if prev != nil {
			<-prev.done // its file, if it kept one, is r.f now
			r.mu.Lock()
			if r.f != nil {
				// One file is enough: f, if any, was left by a fill that
				// ended while prev had yet to take it over.
				if f != nil {
					f.Close()
				}
				f = r.f
			}
			r.f, r.holds = nil, ""
			r.mu.Unlock()
		}
		var err error
		if job.drop.Load() {
			err = errStopped
		} else {
			f, err = r.fillFrom(f, ramPath, job)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.fill == job {
			r.fill = nil
		}
		switch {
		case f == nil:
		case r.closed || job.drop.Load() || (err != nil && !errors.Is(err, errStopped)):
			f.Close()
		case err != nil:
			// Stopped halfway for another fill, which writes over it.
			r.f, r.holds = f, ""
		default:
			// Stopped after the copy or not: the file is whole.
			r.f, r.holds = f, id
		}
		if errors.Is(err, errors.ErrUnsupported) {
			// Not on this system (New says so): off for good, said once.
			r.closed = true
		}
		if err != nil && !errors.Is(err, errStopped) && r.Log != nil {
			r.Log.Info("no RAM prepared for a rewind: a rewind copies the checkpoint's RAM", "checkpoint", id, "why", err)
		}
	}()
}

// fillFrom copies the checkpoint's RAM at ramPath into f (a RAM file
// holding something else, resident: written over, its other pages freed)
// or, f nil, into a new one.
func (r *RewindRAM) fillFrom(f *os.File, ramPath string, job *fillJob) (*os.File, error) {
	if job.stop.Load() {
		return f, errStopped
	}
	src, err := os.Open(ramPath)
	if err != nil {
		return f, err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return f, err
	}
	if st.Size() != r.Size {
		return f, fmt.Errorf("the checkpoint's RAM is %d bytes, the guest's %d", st.Size(), r.Size)
	}
	exts, err := DataExtents(src, r.Size)
	if err != nil {
		return f, err
	}
	var data int64
	for _, e := range exts {
		data += e.Len
	}
	room := r.Room
	if room == nil {
		room = MemoryToSpare
	}
	// Room for need more bytes in memory and in the tmpfs f is on: looked
	// at before the fill and again as it goes (need 0), as other
	// sandboxes' fills and growing guests take memory meanwhile.
	roomFor := func(f *os.File, need int64) error {
		if err := room(need); err != nil {
			return err
		}
		return ShmToSpare(f, need, r.Size)
	}
	if f == nil {
		if err := room(data); err != nil {
			return nil, err
		}
		if f, err = r.New(); err != nil {
			return nil, err
		}
		if err := ShmToSpare(f, data, r.Size); err != nil {
			return f, err
		}
	} else if grow := data - Allocated(f); grow > 0 {
		// Written over: only what this checkpoint holds beyond the last.
		if err := roomFor(f, grow); err != nil {
			return f, err
		}
	}
	var checked int64 // bytes copied when the room was last looked at
	_, err = copyOver(f, src, exts, r.Size, func(copied int64) error {
		if job.stop.Load() {
			return errStopped
		}
		if copied-checked >= copyChunk {
			checked = copied
			return roomFor(f, 0)
		}
		return nil
	})
	return f, err
}

// Take gives up the RAM file for a rewind to checkpoint id: the caller
// owns it. exact tells whether it holds id's RAM (a fill of id still
// running is waited for: it is no slower than a new copy); if not, it
// holds some other RAM and the caller copies id's over it (CopyOver),
// which beats filling new pages and never keeps two spare copies of the
// guest's RAM. nil: there is none. ramPath, with Verify, is id's RAM to
// compare with before calling it exact.
func (r *RewindRAM) Take(id, ramPath string) (f *os.File, exact bool) {
	r.mu.Lock()
	job := r.fill
	if job != nil && job.id != id {
		job.stop.Store(true) // it ends within a chunk, handing its file back
	}
	r.mu.Unlock()
	if job != nil {
		<-job.done
	}
	r.mu.Lock()
	f, exact = r.f, r.holds == id
	r.f, r.holds = nil, ""
	r.mu.Unlock()
	if f == nil {
		return nil, false
	}
	if exact && r.Verify {
		if err := compareWith(f, ramPath, r.Size); err != nil {
			if r.Log != nil {
				r.Log.Error("RAM prepared for the rewind differs from the checkpoint: copying it over", "checkpoint", id, "err", err)
			}
			return f, false
		}
	}
	return f, exact
}

func compareWith(f *os.File, path string, size int64) error {
	g, err := os.Open(path)
	if err != nil {
		return err
	}
	defer g.Close()
	return Compare(f, g, size)
}

// Holds tells which checkpoint's RAM is ready ("" none).
func (r *RewindRAM) Holds() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return ""
	}
	return r.holds
}

// Drop frees the file if it holds (or is being filled with) checkpoint id,
// or any with id "".
func (r *RewindRAM) Drop(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if job := r.fill; job != nil && (id == "" || job.id == id) {
		job.drop.Store(true) // the fill closes its file
		job.stop.Store(true)
	}
	if r.f != nil && (id == "" || r.holds == id) {
		r.f.Close()
		r.f, r.holds = nil, ""
	}
}

// Close frees the file and stops any fill for good.
func (r *RewindRAM) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.Drop("")
}

// Bytes is the memory the file holds now.
func (r *RewindRAM) Bytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return 0
	}
	return Allocated(r.f)
}

// Allocated is the memory or disk space f takes.
func Allocated(f *os.File) int64 {
	fi, err := f.Stat()
	if err != nil {
		return 0
	}
	if n, ok := blocksOf(fi); ok {
		return n
	}
	return fi.Size()
}

// blocksOf is the space fi's file takes on its filesystem, where the
// system says (ok).
func blocksOf(fi os.FileInfo) (int64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Blocks * 512, true
}
