package checkpoint

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeTracker knows exactly which pages the test wrote through the mapping
// (what soft-dirty bits report); writes through the descriptor and
// punched holes set changed, as inotify does. lie drops a page from the
// set, to prove the verifier catches a tracker that misses one.
type fakeTracker struct {
	written *Pages
	changed bool
	armed   bool
	lie     bool
}

func (f *fakeTracker) Dirty() (*Pages, error) {
	if !f.armed {
		return nil, errNotArmed
	}
	f.armed = false
	d := NewPages(f.written.Len() * PageSize)
	for i := int64(0); i < d.Len(); i++ {
		if f.written.Has(i) {
			d.Set(i)
		}
	}
	if f.lie {
		for i := int64(0); i < d.Len(); i++ {
			if d.Has(i) {
				d.Clear(i)
				break
			}
		}
	}
	return d, nil
}

func (f *fakeTracker) Reset() (bool, error) {
	c := f.changed
	f.changed, f.armed = false, true
	f.written = NewPages(f.written.Len() * PageSize)
	return c, nil
}

func (f *fakeTracker) Close() error { return nil }

// guest is a RAM file mapped like QEMU's, with the writes the tracker sees.
type guest struct {
	f   *os.File
	mem []byte
	tr  *fakeTracker
	rng *rand.Rand
}

func (g *guest) write(pages int) {
	n := int64(len(g.mem)) / PageSize
	for k := 0; k < pages; k++ {
		p := g.rng.Int64N(n)
		off := p*PageSize + g.rng.Int64N(PageSize-64)
		for i := 0; i < 64; i++ {
			g.mem[off+int64(i)] = byte(g.rng.Uint32())
		}
		g.tr.written.Set(p)
	}
}

// discard punches a hole, as QEMU does for free page reporting, and then
// touches the page for reading: a fresh zero page, not soft-dirty.
func (g *guest) discard() {
	n := int64(len(g.mem)) / PageSize
	p := g.rng.Int64N(n)
	if err := unix.Fallocate(int(g.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, p*PageSize, PageSize); err != nil {
		panic(err)
	}
	_ = g.mem[p*PageSize]
	g.tr.changed = true
}

func waitSpares(t *testing.T, p *Spares, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		done := !p.running && len(p.ready) == p.Slots
		ok := true
		for _, s := range p.ready {
			ok = ok && s.base == want
		}
		p.mu.Unlock()
		if done && ok {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("spares not ready with base %q", want)
}

func newGuest(t *testing.T, size int64) *guest {
	f, mem := shmFile(t, size, size)
	g := &guest{f: f, mem: mem, tr: &fakeTracker{written: NewPages(size)}, rng: rand.New(rand.NewPCG(7, 8))}
	g.write(int(size / PageSize / 2))
	return g
}

// Ten checkpoints in a row, with random writes, discards and writes
// between them: each is byte for byte the guest's RAM; those after the
// first copy only what was written unless a discard made tracking
// uncertain; the spares keep up.
func TestIncrementalCheckpoints(t *testing.T) {
	const size = 8 << 20
	g := newGuest(t, size)
	dir := t.TempDir()
	sp := &Spares{Dir: dir, Size: size, Slots: 2}
	defer sp.Close()
	r := &RAMSaver{Size: size, Spares: sp}
	r.Track(g, func() (Tracker, error) { return g.tr, nil })
	sp.Refill()
	waitSpares(t, sp, "")
	parent := ""
	for i := 0; i < 10; i++ {
		id := NewID() + string(rune('a'+i))
		if i > 0 {
			g.write(40)
		}
		discarded := i == 4
		if discarded {
			g.discard()
		}
		dst := filepath.Join(dir, id)
		base, ok := sp.Take(dst, r.Want())
		if !ok {
			t.Fatalf("checkpoint %d: no spare", i)
		}
		f, err := os.OpenFile(dst, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		written := g.tr.written.Count()
		res, err := r.Save(f, g.f, id, parent, true, base)
		if err != nil {
			t.Fatal(err)
		}
		overZeros := !res.stale // outside the guest's data the spare held zeros
		if err := r.FreeHoles(f, res); err != nil {
			t.Fatal(err)
		}
		if err := Compare(f, g.f, size); err != nil {
			t.Fatalf("checkpoint %d (incremental %v): %v", i, res.Incremental, err)
		}
		wantInc := i > 0 && !discarded
		if res.Incremental != wantInc {
			t.Fatalf("checkpoint %d: incremental=%v (%s), want %v", i, res.Incremental, res.FullReason, wantInc)
		}
		if res.Incremental && res.Copied > written*PageSize {
			t.Fatalf("checkpoint %d: copied %d bytes for %d written pages", i, res.Copied, written)
		}
		// Sparse again: over zeros, gaps under minFreedHole may stay
		// allocated (TestFreeHolesOverZerosSkipsSmallGaps); over older RAM
		// (a full copy over a spare of another checkpoint) every gap is
		// freed.
		kept := int64(0)
		if overZeros {
			kept = smallGaps(res.Extents, minFreedHole)
		}
		var st unix.Stat_t
		unix.Fstat(int(f.Fd()), &st)
		if st.Blocks*512 > res.Stored+kept+64<<10 {
			t.Fatalf("checkpoint %d: %d bytes allocated for %d of data (%d in small gaps over zeros): not sparse", i, st.Blocks*512, res.Stored, kept)
		}
		f.Close()
		r.Committed(id, dst, res)
		waitSpares(t, sp, id)
		parent = id
	}
}

// A tracker that misses a page: the verifier finds the difference and the
// checkpoint is repaired by a full copy.
func TestVerifierCatchesMissedPage(t *testing.T) {
	const size = 4 << 20
	g := newGuest(t, size)
	dir := t.TempDir()
	sp := &Spares{Dir: dir, Size: size, Slots: 1}
	defer sp.Close()
	r := &RAMSaver{Size: size, Spares: sp, Verify: true}
	r.Track(g, func() (Tracker, error) { return g.tr, nil })
	parent := ""
	for i := 0; i < 2; i++ {
		sp.Refill()
		waitSpares(t, sp, parent)
		id := NewID()
		g.write(20)
		g.tr.lie = i == 1
		dst := filepath.Join(dir, id)
		base, _ := sp.Take(dst, r.Want())
		f, _ := os.OpenFile(dst, os.O_RDWR, 0)
		res, err := r.Save(f, g.f, id, parent, true, base)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.FreeHoles(f, res); err != nil {
			t.Fatal(err)
		}
		if i == 0 && res.Verify != "ok" {
			t.Fatalf("full copy: verify %q", res.Verify)
		}
		if i == 1 && (!res.Incremental || !strings.Contains(res.Verify, "differs") || !strings.Contains(res.Verify, "repaired")) {
			t.Fatalf("lying tracker: incremental=%v verify %q", res.Incremental, res.Verify)
		}
		if err := Compare(f, g.f, size); err != nil {
			t.Fatal(err)
		}
		f.Close()
		r.Committed(id, dst, res)
		parent = id
	}
}

// A checkpoint that comes while the spare is still being filled takes it
// as far as it got (a full copy into it) instead of new pages.
func TestTakeSpareBeingFilled(t *testing.T) {
	const size = 64 << 20
	g := newGuest(t, 4<<20)
	dir := t.TempDir()
	sp := &Spares{Dir: dir, Size: size, Slots: 1}
	defer sp.Close()
	sp.Refill()
	fillerAt(sp, 10*time.Second)
	dst := filepath.Join(dir, "cp")
	base, ok := sp.Take(dst, "")
	if !ok {
		t.Skip("the fill finished before it could be interrupted")
	}
	if sp.Ready() == 0 && base != unknownBase && base != "" {
		t.Fatalf("base %q", base)
	}
	f, _ := os.OpenFile(dst, os.O_RDWR, 0)
	defer f.Close()
	r := &RAMSaver{Size: 4 << 20}
	res, err := r.Save(f, g.f, NewID(), "", true, base)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.FreeHoles(f, res); err != nil {
		t.Fatal(err)
	}
	f.Truncate(4 << 20)
	if err := Compare(f, g.f, 4<<20); err != nil {
		t.Fatal(err)
	}
}

func TestSubtract(t *testing.T) {
	got := subtract([]Extent{{0, 100}, {200, 100}}, []Extent{{10, 10}, {50, 200}, {290, 5}})
	want := []Extent{{0, 10}, {20, 30}, {250, 40}, {295, 5}}
	if len(got) != len(want) {
		t.Fatalf("%v", got)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%v, want %v", got, want)
		}
	}
}

// The verifier reads only data, but finds a difference anywhere: in data
// of either file, against a hole of the other.
func TestCompare(t *testing.T) {
	dir := t.TempDir()
	const size = 1 << 20
	a, _ := os.Create(filepath.Join(dir, "a"))
	b, _ := os.Create(filepath.Join(dir, "b"))
	a.Truncate(size)
	b.Truncate(size)
	if err := Compare(a, b, size); err != nil {
		t.Fatal(err)
	}
	a.WriteAt([]byte{1}, 300000)
	if err := Compare(a, b, size); err == nil || !strings.Contains(err.Error(), "page 73 ") {
		t.Fatalf("data against a hole: %v", err)
	}
	if err := Compare(b, a, size); err == nil {
		t.Fatal("hole against data: no difference")
	}
	b.WriteAt([]byte{1}, 300000)
	b.WriteAt([]byte{0}, 900000) // data of zeros against a hole: equal
	if err := Compare(a, b, size); err != nil {
		t.Fatal(err)
	}
	if got := union([]Extent{{0, 10}, {50, 10}}, []Extent{{5, 10}, {70, 1}}); len(got) != 3 || got[0] != (Extent{0, 15}) {
		t.Fatalf("union: %v", got)
	}
}

// A spare of zeros is made without writing: its blocks preallocated and
// its pages read into the page cache, so that it puts nothing in the
// disk's queue. Checked by the bytes this process sent toward storage
// (/proc/self/io), against zeros written the old way as the control.
func TestSpareOfZerosWritesNothing(t *testing.T) {
	const size = 64 << 20
	writes := func() int64 { return writeBytes(t) }
	dir := t.TempDir()
	control, err := os.Create(filepath.Join(dir, "control"))
	if err != nil {
		t.Fatal(err)
	}
	defer control.Close()
	w0 := writes()
	if _, err := fillFrom(control, nil, size, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := writes() - w0; got < size/2 {
		t.Skipf("zeros written to %s counted %d bytes of writes: this filesystem does not account them", dir, got)
	}
	sp := &Spares{Dir: dir, Size: size, Slots: 1}
	defer sp.Close()
	w1 := writes()
	sp.Refill()
	waitSpares(t, sp, "")
	if got := writes() - w1; got > size/16 {
		t.Fatalf("a spare of zeros wrote %d bytes (of %d)", got, int64(size))
	}
	f, err := os.Open(sp.Paths()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fi, _ := f.Stat(); fi.Size() != size || Allocated(f) < size {
		t.Fatalf("spare: size %d, %d bytes allocated, want %d of both", fi.Size(), Allocated(f), int64(size))
	}
	// It reads as zeros.
	if err := Compare(f, control, size); err != nil {
		t.Fatal(err)
	}
}

// Take leaves the refill to its caller, who starts it once the pause is
// over: nothing is filled beside the pause's copy of the guest's RAM.
func TestTakeLeavesTheRefill(t *testing.T) {
	sp := &Spares{Dir: t.TempDir(), Size: 8 << 20, Slots: 1}
	defer sp.Close()
	sp.Refill()
	waitSpares(t, sp, "")
	if _, ok := sp.Take(filepath.Join(t.TempDir(), "cp"), ""); !ok {
		t.Fatal("no spare taken")
	}
	sp.mu.Lock()
	running := sp.running
	sp.mu.Unlock()
	if running || sp.Ready() != 0 {
		t.Fatalf("Take started a refill (running %v, %d ready)", running, sp.Ready())
	}
	sp.Refill()
	waitSpares(t, sp, "")
}

// A spare that finds no room to preallocate writes no zeros instead (they
// would take the last space a checkpoint needs): there is none for now,
// and the next Refill tries again.
func TestSpareWithoutRoomTriesLater(t *testing.T) {
	full := func(*os.File, int64) error { return syscall.ENOSPC }
	real := preallocate
	preallocate = full
	defer func() { preallocate = real }()
	sp := &Spares{Dir: t.TempDir(), Size: 8 << 20, Slots: 1}
	defer sp.Close()
	sp.Refill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sp.mu.Lock()
		running, disabled := sp.running, sp.disabled
		sp.mu.Unlock()
		if !running {
			if disabled != nil {
				t.Fatalf("spares off for good after a full disk: %v", disabled)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fill did not end")
		}
		time.Sleep(time.Millisecond)
	}
	if sp.Ready() != 0 {
		t.Fatal("a spare made without room")
	}
	if left, _ := filepath.Glob(filepath.Join(sp.Dir, SpareName+"*")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
	preallocate = real
	sp.Refill()
	waitSpares(t, sp, "")
}

// Reserved counts the blocks a ready spare holds, not that it is ready: a
// filesystem whose preallocation succeeds without reserving anything
// (OpenZFS) leaves a spare of zeros holding none, so a rewind does not
// count on it for writing the outgoing RAM out later.
func TestReservedCountsOnlyAllocatedBlocks(t *testing.T) {
	const size = 8 << 20
	sp := &Spares{Dir: t.TempDir(), Size: size, Slots: 2}
	defer sp.Close()
	if got := sp.Reserved(); got != 0 {
		t.Fatalf("no spare ready, Reserved %d", got)
	}
	sp.Refill()
	waitSpares(t, sp, "")
	if got := sp.Reserved(); got < size {
		t.Fatalf("preallocated spares reserve %d bytes, want at least %d", got, size)
	}
	// Spares holding a checkpoint's RAM: data blocks, which copy-on-write
	// filesystems do not overwrite in place.
	ram := filepath.Join(t.TempDir(), "ram")
	if err := os.WriteFile(ram, bytes.Repeat([]byte{7}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	sp.Rebase("cp1", ram, nil)
	waitSpares(t, sp, "cp1")
	if got := sp.Reserved(); got != 0 {
		t.Fatalf("spares of a checkpoint's RAM reserve %d bytes, want none counted", got)
	}

	real := preallocate
	// Sets the size, reserves nothing (as OpenZFS does).
	preallocate = func(f *os.File, n int64) error { return f.Truncate(n) }
	defer func() { preallocate = real }()
	cow := &Spares{Dir: t.TempDir(), Size: size, Slots: 2}
	defer cow.Close()
	cow.Refill()
	waitSpares(t, cow, "")
	if got := cow.Reserved(); got != 0 {
		t.Fatalf("spares that hold no blocks reserve %d bytes", got)
	}
}

// A guest that touches every other page cannot make the host punch a
// hole per page at every checkpoint: over a spare of zeros only gaps of
// minFreedHole or more are freed (the zeros stay allocated elsewhere),
// and the file still reads as the guest's RAM. Over older RAM, every gap
// is cleared.
func TestFreeHolesOverZerosSkipsSmallGaps(t *testing.T) {
	const size = 16 << 20
	ram, mem := shmFile(t, size, size)
	for p := int64(0); p < (8<<20)/PageSize; p += 2 { // every other page of the first 8 MiB
		mem[p*PageSize+5] = byte(p) | 1
	}
	mem[12<<20] = 7 // one page after a 4 MiB gap; the tail after it is freed too
	for _, stale := range []bool{false, true} {
		dst, err := os.Create(filepath.Join(t.TempDir(), "cp"))
		if err != nil {
			t.Fatal(err)
		}
		base := ""
		if stale {
			base = "older"
			if _, err := fillFrom(dst, nil, size, nil, nil); err != nil {
				t.Fatal(err)
			}
			junk := bytes.Repeat([]byte{0xAB}, size)
			if _, err := dst.WriteAt(junk, 0); err != nil {
				t.Fatal(err)
			}
		} else if err := preallocate(dst, size); err != nil {
			t.Skip("no fallocate here:", err)
		}
		r := &RAMSaver{Size: size}
		res, err := r.Save(dst, ram, NewID(), "", true, base)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.FreeHoles(dst, res); err != nil {
			t.Fatal(err)
		}
		if err := Compare(dst, ram, size); err != nil {
			t.Fatalf("stale %v: %v", stale, err)
		}
		got := Allocated(dst)
		switch {
		case !stale && (got < 8<<20 || got > 8<<20+PageSize):
			t.Fatalf("over zeros: %d bytes allocated, want the first 8 MiB (small gaps kept) and one page", got)
		case stale && got > 4<<20+PageSize:
			t.Fatalf("over older RAM: %d bytes allocated, want every gap freed (4 MiB of pages and one)", got)
		}
		dst.Close()
	}
}

// smallGaps is the total of the gaps under min between exts.
func smallGaps(exts []Extent, min int64) int64 {
	var n int64
	for i := 1; i < len(exts); i++ {
		if g := exts[i].Off - (exts[i-1].Off + exts[i-1].Len); g > 0 && g < min {
			n += g
		}
	}
	return n
}

// writeBytes is the bytes this process has sent toward storage
// (/proc/self/io's write_bytes); the test skips where there is none.
func writeBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skip("no /proc/self/io (task I/O accounting):", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Skip("no write_bytes in /proc/self/io")
	return 0
}

// fillerAt waits, up to d, for sp's worker to be filling a spare, and
// reports whether it is.
func fillerAt(sp *Spares, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		sp.mu.Lock()
		w := sp.working != nil
		sp.mu.Unlock()
		if w {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
}
