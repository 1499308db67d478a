package wsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The machine a sandbox's sync runs on, as a crash sees it (issue 27):
// the guest's writes live in its page cache until its filesystem is
// synced, and die with QEMU; the host's survive a killed supervisor; what
// the sync saved (manifest, guest versions awaiting review, the journal)
// is what the next start finds. A crash is a panic after a given number of
// operations, anywhere in a pass.

// crashed is the panic of a simulated kill -9.
type crashed struct{}

// machine counts operations towards a crash and holds what was saved.
type machine struct {
	left     int // operations until the crash; <0: none
	manifest map[string]*Entry
	guest    map[string]*Entry
	journal  map[string]*Entry
}

func (m *machine) step() {
	if m.left == 0 {
		panic(crashed{})
	}
	if m.left > 0 {
		m.left--
	}
}

// volatileGuest is the guest's workspace: dir as its processes see it,
// durable what its disk holds (copied from dir at each Sync).
type volatileGuest struct {
	*countedHost // its changes are steps, as the host's are
	dir          string
	durable      string
	syncErr      error // a disk that fails its flush
	syncs        int   // Syncs asked for so far
	// onSync, if set, is asked at the n-th Sync (from 1): it may crash
	// (panic) or fail it.
	onSync func(n int) error
}

func (g *volatileGuest) Sync(context.Context) error {
	g.m.step()
	g.syncs++
	if g.onSync != nil {
		if err := g.onSync(g.syncs); err != nil {
			return err
		}
	}
	if g.syncErr != nil {
		return g.syncErr
	}
	cloneTree(g.dir, g.durable)
	return nil
}

// lose puts the guest's workspace back to what its disk holds: QEMU died.
func (g *volatileGuest) lose() { cloneTree(g.durable, g.dir) }

// countedHost is the host folder; its writes survive a killed supervisor.
type countedHost struct {
	*HostSide
	m *machine
}

func (h *countedHost) Write(ctx context.Context, p string, mode fs.FileMode, r io.Reader, hash string, was *Entry) (string, error) {
	h.m.step()
	return h.HostSide.Write(ctx, p, mode, r, hash, was)
}

func (h *countedHost) Mkdir(ctx context.Context, p string, mode fs.FileMode) error {
	h.m.step()
	return h.HostSide.Mkdir(ctx, p, mode)
}

func (h *countedHost) Symlink(ctx context.Context, p, target string, was *Entry) error {
	h.m.step()
	return h.HostSide.Symlink(ctx, p, target, was)
}

func (h *countedHost) Remove(ctx context.Context, p string, was *Entry) error {
	h.m.step()
	return h.HostSide.Remove(ctx, p, was)
}

func cloneTree(from, to string) {
	if err := os.RemoveAll(to); err != nil {
		panic(err)
	}
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(dst, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, dst)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, info.Mode().Perm())
	})
	if err != nil {
		panic(fmt.Sprintf("copy %s to %s: %v", from, to, err))
	}
}

// world is a sandbox's workspace across runs of its supervisor.
type world struct {
	t          *testing.T
	host, gdir string
	gdur       string
	m          *machine
	g          *volatileGuest
	e          *Engine
	review     bool
	clean      bool // the last run stopped cleanly
}

func newWorld(t *testing.T, review bool) *world {
	base := memDir(t)
	w := &world{t: t, host: filepath.Join(base, "host"), gdir: filepath.Join(base, "guest"), gdur: filepath.Join(base, "disk"), m: &machine{left: -1}, review: review}
	os.Mkdir(w.host, 0o755)
	os.Mkdir(w.gdir, 0o755)
	os.Mkdir(w.gdur, 0o755)
	w.open()
	return w
}

// memDir is a temporary directory in memory where there is one: the
// simulation copies the guest's tree at every sync, and file creation on a
// disk (of a VM, here) made the test ten times slower.
func memDir(t *testing.T) string {
	d, err := os.MkdirTemp("/dev/shm", "kosa8-crash-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// open starts a run: a new engine from what was saved.
func (w *world) open() {
	hr, err := OpenRoot(w.host)
	if err != nil {
		w.t.Fatal(err)
	}
	gr, err := OpenRoot(w.gdir)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { hr.Close(); gr.Close() })
	w.g = &volatileGuest{countedHost: &countedHost{HostSide: &HostSide{Root: gr}, m: w.m}, dir: w.gdir, durable: w.gdur}
	opts := Options{Review: w.review, Now: func() time.Time { return time.Date(2026, 12, 3, 4, 5, 6, 0, time.UTC) },
		Journal: func(j map[string]*Entry) error {
			w.m.step()
			w.m.journal = maps.Clone(j)
			return nil
		},
		SaveGuest: func(g map[string]*Entry) { w.m.guest = maps.Clone(g) },
	}
	w.e = NewEngine(&countedHost{HostSide: &HostSide{Root: hr}, m: w.m}, w.g, w.m.manifest, opts, func(m map[string]*Entry) {
		w.m.step()
		w.m.manifest = m
	})
}

// run runs f, which may crash; it reports whether it did.
func (w *world) run(f func() error) (crash bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			crash = true
		}
	}()
	if err := f(); err != nil {
		w.t.Fatal(err)
	}
	return false
}

// restart is a kill -9 of the supervisor (QEMU dying with it), then a
// start: the guest keeps only what its disk held, and the first pass is
// Recover, unless the run stopped cleanly.
func (w *world) restart() {
	w.g.lose()
	w.m.left = -1
	w.open()
	ctx := context.Background()
	if err := w.e.Recover(ctx, w.m.guest, w.m.journal); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) sync() bool {
	return w.run(func() error { return w.e.Sync(context.Background(), nil) })
}

func writeFile(t *testing.T, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The reproduction: the agent's new file and the user's new file
// are synced, the supervisor is killed, the sandbox started again: both
// files must still be on the host. On the build before, the first pass of
// the new run read their absence in the guest (its writes died with QEMU)
// as the agent's deletions and deleted them from the host.
func TestCrashAfterSyncKeepsBothSidesFiles(t *testing.T) {
	for _, mode := range []string{"recover", "plain sync after the crash"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, false)
			writeFile(t, w.host, "user-1", "user one")
			w.sync()
			writeFile(t, w.gdir, "agent-2", "agent")
			writeFile(t, w.host, "user-2", "user")
			w.sync()
			if read(w.host, "agent-2") != "agent" || read(w.gdir, "user-2") != "user" {
				t.Fatal("the files did not sync")
			}
			if mode == "recover" {
				w.restart()
			} else {
				// Even a start that wrongly continues must find a manifest
				// that claims nothing the guest's disk does not hold.
				w.g.lose()
				w.open()
			}
			w.sync()
			for f, want := range map[string]string{"user-1": "user one", "user-2": "user", "agent-2": "agent"} {
				if got := read(w.host, f); got != want {
					t.Errorf("host %s after the crash: %q, want %q", f, got, want)
				}
				if got := read(w.gdir, f); got != want {
					t.Errorf("guest %s after the crash: %q, want %q", f, got, want)
				}
			}
		})
	}
}

// A manifest whose guest side is ahead of the guest's disk (a start from
// an older checkpoint's disks, or a manifest saved by a build that did not
// sync first): Recover deletes nothing on the host, keeps both versions of
// a file that differs, and puts the host's files back into the guest.
func TestRecoverInfersNoDeletion(t *testing.T) {
	w := newWorld(t, false)
	writeFile(t, w.host, "user", "mine")
	writeFile(t, w.host, "shared", "v1")
	w.sync()
	// The guest's disk is older than what the manifest records.
	old := t.TempDir() + "/old"
	cloneTree(w.gdur, old)
	writeFile(t, w.gdir, "agent", "made inside")
	writeFile(t, w.gdir, "shared", "v2 inside")
	w.sync()
	cloneTree(old, w.gdur)
	writeFile(t, w.gdur, "shared", "v0 on the old disk")
	os.Remove(filepath.Join(w.gdur, "user"))
	w.restart()
	if got := read(w.host, "user"); got != "mine" {
		t.Fatalf("the user's file on the host: %q", got)
	}
	if got := read(w.gdir, "user"); got != "mine" {
		t.Fatalf("the user's file did not go back into the guest: %q", got)
	}
	if got := read(w.host, "agent"); got != "made inside" {
		t.Fatalf("the agent's synced file was deleted from the host: %q", got)
	}
	if got := read(w.host, "shared"); got != "v2 inside" {
		t.Fatalf("the host's version of a file that differs: %q", got)
	}
	copies, _ := filepath.Glob(filepath.Join(w.host, "shared"+conflictMark+"*"))
	if len(copies) != 1 || read(w.host, filepath.Base(copies[0])) != "v0 on the old disk" {
		t.Fatalf("the guest's version was not kept beside the host's: %v", copies)
	}
}

// Kill points, everywhere in a pass and between passes, in a random
// workload of the user's and the agent's, with and without review mode:
// after every crash and restart, every file the user wrote is on the host
// as they wrote it, every tree the agent deleted is on the host whole or
// not at all, and the two sides end in step.
func TestKillAnywhereLosesNoUserFile(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 8
	}
	for seed := range seeds {
		for _, review := range []bool{false, true} {
			name := fmt.Sprintf("seed%d", seed)
			if review {
				name += "-review"
			}
			t.Run(name, func(t *testing.T) { killAnywhere(t, uint64(seed), review) })
		}
	}
}

func killAnywhere(t *testing.T, seed uint64, review bool) {
	rng := rand.New(rand.NewPCG(seed, 27))
	w := newWorld(t, review)
	user := map[string]string{} // the user's files as they last wrote them
	trees := map[string]int{}   // the agent's trees and their size, while the agent has them
	deleted := map[string]int{} // trees the agent deleted
	n := 0
	for step := 0; step < 25; step++ {
		switch a := rng.IntN(10); {
		case a < 3:
			n++
			p := fmt.Sprintf("u/%d.txt", rng.IntN(8))
			c := fmt.Sprintf("user %d %d", step, n)
			writeFile(t, w.host, p, c)
			user[p] = c
		case a < 5:
			n++
			tree := fmt.Sprintf("a%d", n)
			size := 1 + rng.IntN(12)
			for i := range size {
				writeFile(t, w.gdir, fmt.Sprintf("%s/f%d", tree, i), fmt.Sprintf("agent %s %d", tree, i))
			}
			trees[tree] = size
		case a < 6 && len(trees) > 0:
			// A tree whole on the host and on the guest's disk: its
			// deletion must reach the host whole or not at all. (One whose
			// creation a crash cut short is legitimately partial.)
			keys := slices.Sorted(maps.Keys(trees))
			tree := keys[rng.IntN(len(keys))]
			whole := true
			for i := range trees[tree] {
				f := fmt.Sprintf("%s/f%d", tree, i)
				whole = whole && exists(w.host, f) && exists(w.gdur, f)
			}
			if !whole {
				continue
			}
			os.RemoveAll(filepath.Join(w.gdir, tree))
			deleted[tree] = trees[tree]
			delete(trees, tree)
		case a < 8:
			w.m.left = rng.IntN(40)
			if w.sync() {
				w.restart()
			}
			w.m.left = -1
		default:
			if !w.sync() {
				w.restart() // QEMU killed between passes
			}
		}
	}
	w.m.left = -1
	w.sync()
	w.sync()
	for p, c := range user {
		if got := read(w.host, p); got != c {
			t.Errorf("the user's %s on the host: %q, want %q", p, got, c)
		}
	}
	for tree, size := range deleted {
		if review {
			break // nothing of the agent's reached the host without apply
		}
		var have int
		for i := range size {
			if exists(w.host, fmt.Sprintf("%s/f%d", tree, i)) {
				have++
			}
		}
		if have != 0 && have != size {
			t.Errorf("the agent's deleted tree %s: %d of %d files on the host", tree, have, size)
		}
	}
	// In step: what the guest has of the user's is the user's.
	for p, c := range user {
		if got := read(w.gdir, p); got != c {
			t.Errorf("the user's %s in the guest: %q, want %q", p, got, c)
		}
	}
	if errs := w.e.Status().Errors; len(errs) > 0 {
		t.Logf("sync errors: %v", errs)
	}
}

// The journal finishes a tree the guest deleted, killed halfway through
// its deletion on the host.
func TestJournalFinishesADeletedTree(t *testing.T) {
	w := newWorld(t, false)
	for i := range 10 {
		writeFile(t, w.gdir, fmt.Sprintf("tree/f%d", i), "x")
	}
	w.sync()
	os.RemoveAll(filepath.Join(w.gdir, "tree"))
	// Each removal on the host is an operation; past the guest's sync and
	// the journal (2), four files go, then the crash.
	w.m.left = 2 + 4
	if !w.sync() {
		t.Fatal("no crash")
	}
	left, _ := filepath.Glob(filepath.Join(w.host, "tree", "*"))
	if len(left) == 0 || len(left) == 10 {
		t.Fatalf("the crash was not halfway: %d files left", len(left))
	}
	if len(w.m.journal) != 11 {
		t.Fatalf("journal: %d entries, want the tree's 11", len(w.m.journal))
	}
	w.restart()
	if exists(w.host, "tree") {
		left, _ := filepath.Glob(filepath.Join(w.host, "tree", "*"))
		t.Fatalf("half a tree on the host after the restart: %v", left)
	}
	if w.m.journal != nil {
		t.Fatalf("the journal was not cleared: %v", slices.Sorted(maps.Keys(w.m.journal)))
	}
}

// A deletion that died with the guest's page cache never reaches the host:
// the guest must make it durable before the host deletes anything.
func TestUndurableDeletionNeverReachesTheHost(t *testing.T) {
	w := newWorld(t, false)
	writeFile(t, w.host, "keep", "mine")
	w.sync()
	os.Remove(filepath.Join(w.gdir, "keep"))
	w.g.syncErr = errors.New("disk gone")
	w.sync()
	if got := read(w.host, "keep"); got != "mine" {
		t.Fatalf("deleted on the host before the guest's deletion was durable: %q", got)
	}
	if errs := w.e.Status().Errors; len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), "not durable") {
		t.Fatalf("errors: %v", errs)
	}
}

// A journal outlives the deletions it covers only while they run: once
// the host made them, a crash before the pass's record is saved must not
// leave the next start a journal that deletes the file again where the
// user put it back (a git checkout of what the agent deleted) meanwhile.
func TestJournalEndsWithTheDeletionsItCovers(t *testing.T) {
	for _, c := range []struct {
		name   string
		onSync func(n int) error // the deletion pass's guest syncs: 1 before the journal, 2 in persist
	}{
		// The supervisor is killed after the host's deletion, before the
		// record is durable; the user puts the file back while it is down.
		{"killed after the deletion", func(n int) error {
			if n == 2 {
				panic(crashed{})
			}
			return nil
		}},
		// A guest that makes its deletion durable, then fails every later
		// flush (a full disk, or on purpose): the record is never saved and
		// the journal stays, while the user puts the file back and the sync
		// copies it into the guest, where it never becomes durable; then
		// the guest crashes itself.
		{"guest fails its later flushes", func(n int) error {
			if n >= 2 {
				return errors.New("syncfs: no space left on device")
			}
			return nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, false)
			writeFile(t, w.host, "doc", "the user's")
			w.sync()
			os.Remove(filepath.Join(w.gdir, "doc"))
			w.g.syncs, w.g.onSync = 0, c.onSync
			crash := w.sync()
			if exists(w.host, "doc") {
				t.Fatal("the guest's deletion did not reach the host")
			}
			writeFile(t, w.host, "doc", "the user's") // put back, byte for byte
			if !crash {
				w.sync() // into the guest, never durable there
				if read(w.gdir, "doc") != "the user's" {
					t.Fatal("the file put back did not reach the guest")
				}
			}
			w.restart()
			w.sync()
			if got := read(w.host, "doc"); got != "the user's" {
				t.Fatalf("the file the user put back on the host: %q (journal %v)", got, slices.Sorted(maps.Keys(w.m.journal)))
			}
		})
	}
}

// Recover's journal stays until its deletions are made: a restart whose
// guest cannot flush (so the host deletes nothing yet), killed in turn,
// still finishes the tree on the next start, never leaving half of it.
func TestJournalOutlivesARecoverThatCouldNotDelete(t *testing.T) {
	w := newWorld(t, false)
	for i := range 10 {
		writeFile(t, w.gdir, fmt.Sprintf("tree/f%d", i), "x")
	}
	w.sync()
	os.RemoveAll(filepath.Join(w.gdir, "tree"))
	w.m.left = 2 + 4 // the guest's sync, the journal, four removals
	if !w.sync() {
		t.Fatal("no crash")
	}
	w.g.lose()
	w.m.left = -1
	w.open()
	w.g.syncErr = errors.New("syncfs: input/output error")
	if err := w.e.Recover(context.Background(), w.m.guest, w.m.journal); err != nil {
		t.Fatal(err)
	}
	if len(w.m.journal) == 0 {
		t.Fatal("the journal was cleared by a pass that made none of its deletions")
	}
	w.restart()
	if exists(w.host, "tree") {
		left, _ := filepath.Glob(filepath.Join(w.host, "tree", "*"))
		t.Fatalf("half a tree on the host: %v", left)
	}
}

// A journal a crash left is Recover's to finish; a start that does not
// recover (start --from a checkpoint, whose Rewind is not given it) must
// not leave it for a later crash's Recover: by then it no longer describes
// what the host holds, and deletes a file the user put back.
func TestAJournalOutlivesNoStartThatIgnoresIt(t *testing.T) {
	w := newWorld(t, false)
	for i := range 10 {
		writeFile(t, w.gdir, fmt.Sprintf("tree/f%d", i), fmt.Sprintf("agent %d", i))
	}
	w.sync()
	checkpoint := t.TempDir() + "/cp"
	cloneTree(w.gdur, checkpoint) // a checkpoint's disks, the tree whole
	os.RemoveAll(filepath.Join(w.gdir, "tree"))
	w.m.left = 2 + 4 // killed halfway through the tree's deletion on the host
	if !w.sync() {
		t.Fatal("no crash")
	}
	gone := ""
	for i := range 10 {
		if p := fmt.Sprintf("tree/f%d", i); !exists(w.host, p) {
			gone = p
		}
	}
	if gone == "" || len(w.m.journal) == 0 {
		t.Fatalf("the crash was not halfway (journal %d entries)", len(w.m.journal))
	}
	// start --from the checkpoint: its disks, and the rewind's merge.
	cloneTree(checkpoint, w.gdur)
	w.g.lose()
	w.m.left = -1
	w.open()
	if err := w.e.Rewind(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w.m.journal != nil {
		t.Errorf("the last run's journal outlived the start --from: %v", slices.Sorted(maps.Keys(w.m.journal)))
	}
	// Killed again; the user puts back, byte for byte, the file the agent
	// had deleted; the next start recovers.
	content := "agent " + strings.TrimPrefix(gone, "tree/f")
	writeFile(t, w.host, gone, content)
	w.restart()
	w.sync()
	if got := read(w.host, gone); got != content {
		t.Fatalf("the file the user put back: %q", got)
	}
}

// The record of the guest versions awaiting review is written durably at
// every pass that changes it; a guest must not make it grow with files of
// its own making (which Recover needs no record of: one the manifest does
// not know is decided alike with or without it). Else a guest in review
// mode (or making a new repository, all held) with a million files has
// the host rewrite and fsync a record of a million entries at each pass
// it touches one of them.
func TestGuestRecordHoldsOnlyWhatRecoverNeeds(t *testing.T) {
	w := newWorld(t, true)
	writeFile(t, w.host, "user.txt", "the user's")
	w.sync()
	var saved []int
	save := w.e.opts.SaveGuest
	w.e.opts.SaveGuest = func(m map[string]*Entry) {
		saved = append(saved, len(m))
		save(m)
	}
	for i := range 2000 {
		writeFile(t, w.gdir, fmt.Sprintf("spam/%d", i), "x")
	}
	writeFile(t, w.gdir, "user.txt", "the agent's edit")
	w.sync()
	for i := range 5 {
		writeFile(t, w.gdir, "spam/0", fmt.Sprint("touched ", i))
		w.sync()
	}
	total := 0
	for _, n := range saved {
		total += n
	}
	if len(w.e.Status().Pending) < 2001 {
		t.Fatalf("pending: %d, want the 2,001 changes", len(w.e.Status().Pending))
	}
	t.Logf("%d entries written over %d saves", total, len(saved))
	if total > 20 {
		t.Errorf("%d entries written over %d saves (%v): the guest's own new files are recorded", total, len(saved), saved)
	}
	if g := w.m.guest["user.txt"]; g == nil || g.Hash == "" {
		t.Errorf("the agent's edit of a file the manifest knows is not recorded: %v", g)
	}
	// A crash: nothing of the agent's reaches the host, the edit and the
	// new files still wait for review.
	w.restart()
	w.sync()
	if got := read(w.host, "user.txt"); got != "the user's" {
		t.Errorf("host user.txt after the crash: %q", got)
	}
	if exists(w.host, "spam") {
		t.Error("the agent's files reached the host without a review")
	}
	st := w.e.Status()
	if len(st.Pending) < 2001 || len(st.Conflicts) > 0 {
		t.Errorf("after the crash: %d pending, conflicts %v", len(st.Pending), st.Conflicts)
	}
}
