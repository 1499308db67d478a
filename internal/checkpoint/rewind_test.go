package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rewindRig is a RewindRAM over files in a test directory, counting the
// RAM files it makes.
type rewindRig struct {
	t    *testing.T
	dir  string
	r    *RewindRAM
	made atomic.Int32

	mu    sync.Mutex
	files []*os.File // every file made, to check none is left open
}

const rewindSize = 16 << 20

func newRewindRig(t *testing.T) *rewindRig {
	dir := t.TempDir()
	return newRewindRigIn(t, dir, dir)
}

// newRewindRigIn makes the checkpoints' files in dir and the RAM files in
// ramDir.
func newRewindRigIn(t *testing.T, dir, ramDir string) *rewindRig {
	g := &rewindRig{t: t, dir: dir}
	g.r = &RewindRAM{Size: rewindSize, Room: func(int64) error { return nil }}
	g.r.New = func() (*os.File, error) {
		g.made.Add(1)
		f, err := os.CreateTemp(ramDir, "ram-*")
		if err != nil {
			return nil, err
		}
		os.Remove(f.Name())
		g.mu.Lock()
		g.files = append(g.files, f)
		g.mu.Unlock()
		return f, f.Truncate(rewindSize)
	}
	// Once closed and its fills ended, the RewindRAM holds no file open:
	// each is closed by it or by the test, which took it.
	t.Cleanup(func() {
		g.r.Close()
		g.wait()
		g.mu.Lock()
		defer g.mu.Unlock()
		for i, f := range g.files {
			if f.Fd() != ^uintptr(0) {
				t.Errorf("RAM file %d of %d is still open: nobody owns it", i+1, len(g.files))
			}
		}
	})
	return g
}

// checkpointRAM writes a checkpoint RAM file with pages of b at offs.
func (g *rewindRig) checkpointRAM(name string, b byte, offs ...int64) string {
	p := filepath.Join(g.dir, name)
	f, err := os.Create(p)
	if err != nil {
		g.t.Fatal(err)
	}
	defer f.Close()
	f.Truncate(rewindSize)
	for _, off := range offs {
		f.WriteAt(bytes.Repeat([]byte{b}, int(PageSize)), off)
	}
	return p
}

func (g *rewindRig) equal(f *os.File, path string) {
	g.t.Helper()
	if f == nil {
		g.t.Fatal("no prepared RAM")
	}
	if err := compareWith(f, path, rewindSize); err != nil {
		g.t.Fatal(err)
	}
}

// wait lets the background fill end.
func (g *rewindRig) wait() {
	g.r.mu.Lock()
	job := g.r.fill
	g.r.mu.Unlock()
	if job != nil {
		<-job.done
	}
}

// takeExact is Take as a rewind to id sees it when it finds id's RAM
// ready; a file holding something else goes back, as a rewind that copies
// over it would leave things for the next fill.
func (g *rewindRig) takeExact(id, path string) *os.File {
	f, exact := g.r.Take(id, path)
	if f != nil && !exact {
		g.r.mu.Lock()
		if g.r.f == nil {
			g.r.f, g.r.holds = f, ""
		} else {
			f.Close()
		}
		g.r.mu.Unlock()
		return nil
	}
	return f
}

// A rewind to another checkpoint gets the file all the same, to copy
// that checkpoint's RAM over (CopyOver): no second file, none of the
// older RAM left in it.
func TestRewindRAMTakenForAnotherCheckpoint(t *testing.T) {
	g := newRewindRig(t)
	a := g.checkpointRAM("a", 'a', 0, 5*PageSize, 600*PageSize)
	b := g.checkpointRAM("b", 'b', 5*PageSize)
	g.r.Prepare("A", a)
	g.wait()
	f, exact := g.r.Take("B", b)
	if f == nil || exact {
		t.Fatalf("take for B: file %v, exact %v; want A's file, not exact", f != nil, exact)
	}
	src, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := CopyOver(f, src); err != nil {
		t.Fatal(err)
	}
	g.equal(f, b)
	if n := Allocated(f); n > PageSize+64<<10 {
		t.Errorf("%d bytes allocated for one page of data: A's pages were not freed", n)
	}
	f.Close()
	if g.r.Holds() != "" || g.made.Load() != 1 {
		t.Errorf("after the take: holds %q, %d files made", g.r.Holds(), g.made.Load())
	}
	// Taken while a fill writes over the file (A's, made anew, then B's
	// over it): the fill stops and its file comes along.
	g.r.Prepare("A", a)
	g.wait()
	g.r.Prepare("B", b)
	if f, exact := g.r.Take("C", a); f == nil || exact {
		t.Fatalf("take for C during B's fill: file %v, exact %v", f != nil, exact)
	} else {
		f.Close()
	}
	if n := g.made.Load(); n != 2 {
		t.Errorf("%d files made, want 2", n)
	}
}

func TestRewindRAMPreparedAndTaken(t *testing.T) {
	g := newRewindRig(t)
	a := g.checkpointRAM("a", 'a', 0, 5*PageSize, rewindSize-PageSize)
	g.r.Prepare("A", a)
	// Take waits for a fill of the same checkpoint still running.
	f := g.takeExact("A", a)
	g.equal(f, a)
	f.Close()
	if g.takeExact("A", a) != nil {
		t.Fatal("the same file was handed out twice")
	}
	if g.r.Holds() != "" || g.r.Bytes() != 0 {
		t.Fatalf("after the take it still holds %q, %d bytes", g.r.Holds(), g.r.Bytes())
	}
}

// A fill for a newer checkpoint writes over the older one's file (no
// second file, no second helping of memory) and leaves none of the older
// data behind.
func TestRewindRAMRefilledInPlace(t *testing.T) {
	g := newRewindRig(t)
	a := g.checkpointRAM("a", 'a', 0, 5*PageSize, 9*PageSize)
	b := g.checkpointRAM("b", 'b', 5*PageSize, 700*PageSize)
	g.r.Prepare("A", a)
	g.wait()
	if g.r.Holds() != "A" || g.r.Bytes() < 3*PageSize {
		t.Fatalf("holds %q, %d bytes", g.r.Holds(), g.r.Bytes())
	}
	g.r.Prepare("B", b)
	if f := g.takeExact("A", a); f != nil {
		t.Fatal("handed out A's RAM while B's replaces it")
	}
	g.r.Prepare("B", b) // again: the take stopped the fill
	g.wait()
	if g.r.Holds() != "B" {
		t.Fatalf("holds %q, want B", g.r.Holds())
	}
	if n := g.r.Bytes(); n > 2*PageSize+64<<10 {
		t.Errorf("%d bytes allocated for two pages of data: A's pages were not freed", n)
	}
	f := g.takeExact("B", b)
	g.equal(f, b)
	f.Close()
	if n := g.made.Load(); n != 1 {
		t.Errorf("%d RAM files made, want 1 (refilled in place)", n)
	}
}

// A take for another checkpoint stops the fill and gets nothing: the
// rewind copies.
func TestRewindRAMOtherCheckpoint(t *testing.T) {
	g := newRewindRig(t)
	a := g.checkpointRAM("a", 'a', 0)
	b := g.checkpointRAM("b", 'b', 0)
	g.r.Prepare("A", a)
	if f := g.takeExact("B", b); f != nil {
		t.Fatal("handed out A's RAM for B")
	}
	g.wait()
	if h := g.r.Holds(); h != "" && h != "A" {
		t.Fatalf("holds %q", h)
	}
}

// A system whose VMM cannot have its RAM file made ahead says so once:
// no file, no more fills.
func TestRewindRAMUnsupported(t *testing.T) {
	g := newRewindRig(t)
	g.r.New = func() (*os.File, error) {
		g.made.Add(1)
		return nil, fmt.Errorf("RAM files made ahead: %w", errors.ErrUnsupported)
	}
	a := g.checkpointRAM("a", 'a', 0)
	g.r.Prepare("A", a)
	g.wait()
	g.r.Prepare("B", a)
	g.wait()
	if f, _ := g.r.Take("B", a); f != nil || g.made.Load() != 1 {
		t.Fatalf("file %v, %d tries to make one; want none after the first", f != nil, g.made.Load())
	}
}

func TestRewindRAMNoRoom(t *testing.T) {
	g := newRewindRig(t)
	g.r.Room = func(need int64) error { return errors.New("no room") }
	a := g.checkpointRAM("a", 'a', 0)
	g.r.Prepare("A", a)
	if f := g.takeExact("A", a); f != nil {
		t.Fatal("prepared RAM without room for it")
	}
	if g.made.Load() != 0 {
		t.Fatal("made a RAM file without room for it")
	}
}

func TestRewindRAMDrop(t *testing.T) {
	g := newRewindRig(t)
	a := g.checkpointRAM("a", 'a', 0)
	g.r.Prepare("A", a)
	g.wait()
	g.r.Drop("B")
	if g.r.Holds() != "A" {
		t.Fatal("dropping another checkpoint's RAM dropped A's")
	}
	g.r.Drop("A")
	if g.r.Holds() != "" || g.takeExact("A", a) != nil {
		t.Fatal("A's RAM is still there after its drop")
	}
	// Dropped while being filled: nothing left either.
	g.r.Prepare("A", a)
	g.r.Drop("A")
	g.wait()
	if g.r.Holds() != "" {
		t.Fatal("a fill dropped halfway kept its file")
	}
}

// With Verify, a prepared file that is not the checkpoint's RAM is not
// handed out.
func TestRewindRAMVerified(t *testing.T) {
	g := newRewindRig(t)
	g.r.Verify = true
	a := g.checkpointRAM("a", 'a', 0, 3*PageSize)
	g.r.Prepare("A", a)
	g.wait()
	g.r.f.WriteAt([]byte("changed behind its back"), 3*PageSize+100)
	if f := g.takeExact("A", a); f != nil {
		t.Fatal("a prepared RAM that differs from the checkpoint was handed out")
	}
}

// A fill asked for while the file of an ended fill waits for the next
// one to take it over (the fill that ended put it back; the next, asked
// for meanwhile, has not run yet) writes over that file: it is neither
// lost, open for nobody until the garbage collector, nor doubled by a new
// one.
func TestRewindRAMPrepareKeepsAWaitingFile(t *testing.T) {
	g := newRewindRig(t)
	a := g.checkpointRAM("a", 'a', 0, 7*PageSize)
	b := g.checkpointRAM("b", 'b', 3*PageSize)
	g.r.Prepare("A", a)
	g.wait()
	// A's file is back in r.f; a fill of X, asked for after A's, has not
	// taken it over yet (it waits here until the test lets it end, with
	// no file of its own).
	g.r.mu.Lock()
	waiting := &fillJob{id: "X", done: make(chan struct{})}
	g.r.fill = waiting
	g.r.mu.Unlock()
	g.r.Prepare("B", b)
	close(waiting.done)
	g.wait()
	f := g.takeExact("B", b)
	g.equal(f, b)
	f.Close()
	if n := g.made.Load(); n != 1 {
		t.Errorf("%d RAM files made, want 1: the waiting one was dropped for a new one", n)
	}
}

// Prepare, Take and Drop in any order, one at a time as the supervisor
// calls them (under its checkpoint lock), while fills run, stop halfway
// and hand their files on: whatever Take hands out is exactly the
// checkpoint's RAM, and at the end no file is left open.
func TestRewindRAMStress(t *testing.T) {
	g := newRewindRig(t)
	rng := rand.New(rand.NewPCG(3, 4))
	g.r.Room = func(int64) error {
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		return nil
	}
	ids := []string{"A", "B", "C"}
	paths := map[string]string{}
	for i, id := range ids {
		// Scattered pages, a run of extents each: a fill looks whether to
		// stop between them.
		var offs []int64
		for p := int64(i); p < rewindSize/PageSize; p += 5 + int64(i) {
			offs = append(offs, p*PageSize)
		}
		paths[id] = g.checkpointRAM(id, byte('a'+i), offs...)
	}
	handed := 0
	for range 400 {
		id := ids[rng.IntN(len(ids))]
		switch rng.IntN(4) {
		case 0, 1:
			g.r.Prepare(id, paths[id])
		case 2:
			if f := g.takeExact(id, paths[id]); f != nil {
				g.equal(f, paths[id])
				f.Close()
				handed++
			}
		case 3:
			g.r.Drop(id)
		}
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
	}
	if handed == 0 {
		t.Error("no prepared RAM was ever handed out")
	}
	t.Logf("%d handed out, %d files made", handed, g.made.Load())
}

// Memory the host runs short of while a fill runs (another sandbox's
// fill, a guest growing) stops the fill and frees its file: the room is
// looked at as it goes (every 32 MiB), not only before.
func TestRewindRAMRoomRunsOutDuringTheFill(t *testing.T) {
	const size = 64 << 20
	dir := t.TempDir()
	var made *os.File
	var calls atomic.Int32
	r := &RewindRAM{Size: size,
		Room: func(int64) error {
			if calls.Add(1) > 1 {
				return errors.New("no room now")
			}
			return nil
		},
		New: func() (*os.File, error) {
			f, err := os.CreateTemp(dir, "ram-*")
			if err != nil {
				return nil, err
			}
			os.Remove(f.Name())
			made = f
			return f, f.Truncate(size)
		},
	}
	t.Cleanup(r.Close)
	a := filepath.Join(dir, "a")
	if err := os.WriteFile(a, bytes.Repeat([]byte{'a'}, 40<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(a, size); err != nil {
		t.Fatal(err)
	}
	r.Prepare("A", a)
	if f, _ := r.Take("A", a); f != nil {
		f.Close()
		t.Fatal("the fill went on without room for it")
	}
	if made == nil || made.Fd() != ^uintptr(0) {
		t.Errorf("the fill's file is not closed (made: %v)", made != nil)
	}
}
