package wsync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Side is one end of a sync: the host folder or the guest's workspace.
type Side interface {
	// Scan describes the given paths and, for directories, everything
	// below them; nil paths means the whole tree. Absent paths are left out.
	Scan(ctx context.Context, paths []string) (map[string]*Entry, error)
	Read(ctx context.Context, p string) (io.ReadCloser, error)
	// Write replaces p with r's content, expected to hash to hash; it
	// returns the hash of what it wrote. Content that does not hash to
	// hash is not written: p stays as it was (the engine's manifest still
	// describes it) and the error is errChanged or says so.
	//
	// Write, Symlink and Remove change p only if it still is was, what the
	// engine saw there when it decided (nil: nothing), looked at just
	// before the change lands: else p stays as it was and the error is
	// ErrStale. A user who saves a file while a pass copies the agent's
	// version over it keeps their edit.
	Write(ctx context.Context, p string, mode fs.FileMode, r io.Reader, hash string, was *Entry) (string, error)
	Mkdir(ctx context.Context, p string, mode fs.FileMode) error
	Symlink(ctx context.Context, p, target string, was *Entry) error
	Remove(ctx context.Context, p string, was *Entry) error
}

// Syncer is a Side that can make what it holds durable: Sync returns once
// every change made to the side so far would survive a crash of what holds
// it (QEMU killed, the host losing power). The engine saves a manifest
// that says both sides hold X only after both made X durable, so that a
// start after a crash never takes a state that died with the guest's page
// cache for one the guest deleted.
type Syncer interface {
	Sync(ctx context.Context) error
}

// ErrNoSync: the side cannot make its state durable (a guest agent of an
// older build, restored from its checkpoint). The pass is recorded as
// before; a start after a crash merges (Recover) and so loses nothing.
var ErrNoSync = errors.New("this side cannot sync")

// PutItem is one entry for a BatchSide: a file's content comes from Open.
type PutItem struct {
	Entry *Entry
	Was   *Entry // what the side held at the path when the pass looked (see Side.Write)
	Open  func() (io.ReadCloser, error)
}

// BatchSide is a Side that takes many entries in one go (the guest, where
// each operation costs a round trip).
type BatchSide interface {
	// Put writes the entries in order and returns those that failed.
	Put(ctx context.Context, items []PutItem) (map[string]error, error)
}

// Options tune an Engine.
type Options struct {
	// Review keeps every guest change back until Apply.
	Review bool
	// Exclude are names or path globs that stay on their side.
	Exclude []string
	Hold    HoldRules
	// Now stamps conflict copies (tests fix it).
	Now func() time.Time
	// QuotaBytes and QuotaFiles bound what the sync may write to the host
	// folder for the guest: the bytes and entries of the agent's making
	// that the host holds at once (0: the defaults).
	QuotaBytes int64
	QuotaFiles int
	// Journal, when set, records durably the host deletions a pass is
	// about to make for the guest (nil once they are made), so that a
	// crash halfway through a deleted tree is finished by Recover
	// instead of leaving half the tree.
	Journal func(map[string]*Entry) error
	// SaveGuest, when set, is told the guest versions that wait for
	// review or approval (a deletion is an entry of Type 'x') whenever
	// they change: after a crash Recover knows them from an unknown
	// guest state.
	SaveGuest func(map[string]*Entry)
}

// Default quotas: far above a project's sources, far below a full disk.
const (
	DefaultQuotaBytes = 10 << 30
	DefaultQuotaFiles = 200000
	// maxTombs bounds the deletions kept for rewinds (see setManifest).
	maxTombs = 10000
)

// Change is a guest change not written to the host: held for approval,
// or waiting in review mode.
type Change struct {
	Path  string `json:"path"`
	Kind  string `json:"kind"` // added, modified, deleted
	Why   string `json:"why"`  // held: the reason; review: "review"
	Guest *Entry `json:"guest,omitempty"`
}

// Conflict is a path both sides changed; both versions are kept.
type Conflict struct {
	Path string    `json:"path"`
	Copy string    `json:"copy"` // where the guest's version went
	Time time.Time `json:"time"`
}

// Status is what `kosa8 sync status` shows.
type Status struct {
	Held      []Change   `json:"held"`
	Pending   []Change   `json:"pending"`
	Conflicts []Conflict `json:"conflicts"`
	Skipped   []string   `json:"skipped"` // too large, special files, refused names
	Errors    []string   `json:"errors"`
	LastSync  time.Time  `json:"last_sync"`
	Files     int        `json:"files"`
	Quota     Quota      `json:"quota"`
}

// Quota is what the guest's changes take of the host folder, against the
// sandbox's limits.
type Quota struct {
	Bytes    int64 `json:"bytes"`
	MaxBytes int64 `json:"max_bytes"`
	Files    int   `json:"files"`
	MaxFiles int   `json:"max_files"`
	// Refused counts writes refused because they would pass a limit.
	Refused int `json:"refused,omitempty"`
}

// Engine syncs a host folder and the guest's workspace. Each decision
// compares three states of a path: the manifest (what both sides last
// agreed on), the host's and the guest's. A side that still matches the
// manifest did not change; the other side's change wins. Both changed:
// the host's version stays, the guest's is kept beside it. Nothing is
// deleted unless its side was unchanged since the last sync.
type Engine struct {
	host, guest Side
	opts        Options

	mu        sync.Mutex
	batch     []PutItem      // writes to the guest gathered during a sync
	gitFailed map[string]int // git directory → lowest rank that failed this pass
	manifest  map[string]*Entry
	held      map[string]Change
	pending   map[string]Change
	conflicts []Conflict
	skipped   map[string]string
	tombs     map[string]string // paths the user deleted (see setManifest)
	links     map[string]string // the manifest's links: path → text
	passLinks map[string]string // links the host scan of this pass saw
	linkIdx   *linkIndex        // links and passLinks (links' text winning), for the link rule
	gitMarks  map[string]bool   // .git files, HEADs and commondirs known
	gitDirs   map[string]bool   // folders git uses as git directories, besides .git ones
	gitRuns   gitRunSet         // paths a host git config names (hooksPath, includes, commands), to the config
	used      Quota
	errs      []string
	passErrs  []string       // this pass's failures (the first few)
	passFails int            // how many paths failed this pass
	stale     map[string]int // paths whose change was stale, passes in a row
	lastSync  time.Time
	onChange  func(map[string]*Entry)
	// changed: the manifest differs from the one last saved.
	changed bool
	// savedGuest is the guest versions awaiting review or approval as
	// last saved (Options.SaveGuest).
	savedGuest map[string]*Entry
	// journaled: Options.Journal holds deletions not yet cleared.
	journaled bool
	// noSync is set once the guest said it cannot sync (ErrNoSync).
	noSync bool
}

// deletion is a removal a pass makes after its creations, children
// first: from the host folder (the guest deleted the path; cur is what
// the host held) or from the guest.
type deletion struct {
	path   string
	onHost bool
	cur    *Entry
	run    func()
}

// NewEngine returns an engine starting from manifest (nil: nothing synced
// yet). save, if set, is called with the manifest after each sync.
func NewEngine(host, guest Side, manifest map[string]*Entry, opts Options, save func(map[string]*Entry)) *Engine {
	if manifest == nil {
		manifest = map[string]*Entry{}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.QuotaBytes <= 0 {
		opts.QuotaBytes = DefaultQuotaBytes
	}
	if opts.QuotaFiles <= 0 {
		opts.QuotaFiles = DefaultQuotaFiles
	}
	e := &Engine{host: host, guest: guest, opts: opts, manifest: map[string]*Entry{}, held: map[string]Change{},
		pending: map[string]Change{}, skipped: map[string]string{}, tombs: map[string]string{},
		links: map[string]string{}, linkIdx: newLinkIndex(), gitMarks: map[string]bool{}, onChange: save}
	for p, ent := range manifest {
		if ent.Type == 'x' {
			e.setManifest(p, nil, ent.Origin)
		} else {
			e.setManifest(p, ent, ent.Origin)
		}
	}
	e.changed = false // as saved
	// A journal the last run left may be on disk: Recover finishes it; any
	// other first pass (a continued record, a rewind) clears it once its
	// own deletions are made, so that no later Recover reads one that no
	// longer describes the host.
	e.journaled = opts.Journal != nil
	return e
}

// Excluded reports whether p stays on its side.
// Git's lock files are always: they belong to a git process at work.
func (e *Engine) Excluded(p string) bool {
	return isGitLock(p) || lostFound(p) || matchAny(p, e.opts.Exclude)
}

// lostFound tells whether p is the folder's top-level lost+found or in
// it. The guest's workspace file system has its own (its agent leaves it
// out of scans), so the host's would look deleted by the guest on every
// full pass: it stays on the host, never synced.
func lostFound(p string) bool {
	return p == "lost+found" || strings.HasPrefix(p, "lost+found/")
}

// under reports whether p is one of roots or below one (nil roots: all).
func under(p string, roots []string) bool {
	if roots == nil {
		return true
	}
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// Sync reconciles the given paths (and what is below them); nil syncs the
// whole tree.
func (e *Engine) Sync(ctx context.Context, paths []string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pass(ctx, paths, nil, func(p string, b, h, g *Entry) *deletion {
		return e.decide(ctx, p, b, h, g)
	})
}

// pass is the one shape of every reconciling pass (Sync, Rewind,
// Recover): scan both sides, decide each path (the manifest's under paths
// and extra ones too, parents first), then finishPass. They differ only
// in decide.
func (e *Engine) pass(ctx context.Context, paths, extra []string, decide func(p string, b, h, g *Entry) *deletion) error {
	h, err := e.host.Scan(ctx, paths)
	if err != nil {
		return fmt.Errorf("scan the host folder: %w", err)
	}
	g, err := e.guest.Scan(ctx, paths)
	if err != nil {
		return fmt.Errorf("scan the guest workspace: %w", err)
	}
	var known []string
	for p := range e.manifest {
		if under(p, paths) {
			known = append(known, p)
		}
	}
	for _, p := range extra {
		if under(p, paths) {
			known = append(known, p)
		}
	}
	order := e.order(h, g, known)
	var dels []*deletion
	e.startPass(ctx, h)
	for _, p := range order {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if d := decide(p, e.manifest[p], h[p], g[p]); d != nil {
			dels = append(dels, d)
		}
	}
	e.finishPass(ctx, dels)
	return nil
}

// startPass readies a pass over the host scan h: the links and git
// directories the gate must know of.
func (e *Engine) startPass(ctx context.Context, h map[string]*Entry) {
	e.batch = e.batch[:0]
	e.passErrs, e.passFails = nil, 0
	e.gitFailed = map[string]int{}
	e.passLinks = map[string]string{}
	e.linkIdx = newLinkIndex()
	for p, ent := range h {
		if ent.Type == 'l' {
			e.passLinks[p] = ent.Link
			if text, known := e.links[p]; !known {
				e.linkIdx.set(p, ent.Link, true)
			} else if text != ent.Link {
				e.linkIdx.set(scanKey(p), ent.Link, true) // the host's, newer than the manifest's
			}
		}
		if isGitMark(p) {
			e.gitMarks[p] = true
		}
	}
	for p, text := range e.links {
		e.linkIdx.set(p, text, true)
	}
	e.gitDirs = e.findGitDirs(ctx)
	e.gitRuns = e.findGitRuns(ctx, e.gitDirs)
}

// finishPass ends a pass: the gathered guest writes go out, then the
// deletions, children before their directories; then both sides are made
// durable and the manifest saved (persist).
//
// The guest's deletions reach the host only once they are durable in the
// guest and journaled (Options.Journal): a crash halfway through a deleted
// tree then leaves a journal that Recover finishes, never half the tree,
// and a deletion that died with the guest's page cache never reaches the
// host at all. If the guest cannot sync, they wait for the next pass.
func (e *Engine) finishPass(ctx context.Context, dels []*deletion) {
	e.flushBatch(ctx)
	hostDels := map[string]*Entry{}
	for _, d := range dels {
		if d.onHost {
			hostDels[d.path] = d.cur
		}
	}
	ready := true
	if len(hostDels) > 0 {
		if err := e.syncGuest(ctx); err != nil {
			ready = false
			e.failAll(hostDels, fmt.Errorf("not deleted on the host yet: the guest's deletion is not durable: %w", err))
		} else if e.opts.Journal != nil {
			if err := e.opts.Journal(hostDels); err != nil {
				ready = false
				e.failAll(hostDels, fmt.Errorf("not deleted on the host yet: journal: %w", err))
			} else {
				e.journaled = true
			}
		}
	}
	for i := len(dels) - 1; i >= 0; i-- {
		if dels[i].onHost && !ready {
			continue
		}
		dels[i].run()
	}
	// The deletions are made (or failed, the host's path being other than
	// journaled, or in use): the journal has done its work. Kept until the
	// record is saved, it would outlive them by as long as the guest
	// fails its flushes, and a start after a crash would delete again a
	// file the user put back meanwhile (a git checkout of what the agent
	// deleted), which the guest never held durably. Not when they wait:
	// Recover's journal then stays for the pass that makes them.
	if ready {
		e.clearJournal()
	}
	e.lastSync = time.Now()
	e.persist(ctx)
}

// failAll records err for each of paths.
func (e *Engine) failAll(paths map[string]*Entry, err error) {
	for p := range paths {
		e.fail(p, err)
	}
}

// syncGuest and syncHost make a side durable, if it can sync (Syncer).
func (e *Engine) syncGuest(ctx context.Context) error {
	sy, _ := e.guest.(Syncer)
	return e.syncWith(ctx, sy)
}

func (e *Engine) syncHost(ctx context.Context) error {
	sy, _ := e.host.(Syncer)
	return e.syncWith(ctx, sy)
}

// syncWith runs sy's Sync (none: nothing to do). ErrNoSync counts as
// done: see its doc.
func (e *Engine) syncWith(ctx context.Context, sy Syncer) error {
	if sy == nil {
		return nil
	}
	err := sy.Sync(ctx)
	if errors.Is(err, ErrNoSync) {
		e.noSync = true
		return nil
	}
	return err
}

// persist saves the manifest and the guest versions awaiting review, once
// both sides hold durably what they record: a manifest saying both sides
// hold X is never on disk while X could still die with the guest's page
// cache (or the host's). Nothing is saved if nothing changed, and nothing
// if a side cannot sync now: the saved state stays as it was, older but
// true, and the next pass tries again.
func (e *Engine) persist(ctx context.Context) bool {
	guestKnown := e.guestKnown()
	if !e.changed && maps.EqualFunc(guestKnown, e.savedGuest, sameRecord) {
		return true
	}
	if err := e.syncGuest(ctx); err != nil {
		e.noteErr(fmt.Sprintf("the guest could not make the pass durable (its record is saved on the next pass): %v", err))
		return false
	}
	if err := e.syncHost(ctx); err != nil {
		e.noteErr(fmt.Sprintf("the host folder could not be synced to disk (the record is saved on the next pass): %v", err))
		return false
	}
	e.changed = false
	if e.onChange != nil {
		e.onChange(e.manifestCopy())
	}
	if e.opts.SaveGuest != nil {
		e.opts.SaveGuest(guestKnown)
	}
	e.savedGuest = guestKnown
	return true
}

// clearJournal clears Options.Journal once the deletions it holds are
// made; one that cannot be cleared now is tried again after the next pass.
func (e *Engine) clearJournal() {
	if e.journaled && e.opts.Journal != nil && e.opts.Journal(nil) == nil {
		e.journaled = false
	}
}

// noteErr records an error that is no one path's.
func (e *Engine) noteErr(msg string) {
	e.errs = append(e.errs, msg)
	if len(e.errs) > 100 {
		e.errs = e.errs[len(e.errs)-100:]
	}
}

// guestKnown is the guest's version of each path awaiting review or
// approval (Type 'x': deleted in the guest), of the paths the manifest
// holds: Recover decides a path the manifest does not know alike with or
// without its record, and a guest's own new files (unbounded in review
// mode, or in a new repository, all held) would have the whole record
// rewritten durably at each pass that touches one.
func (e *Engine) guestKnown() map[string]*Entry {
	m := map[string]*Entry{}
	for _, src := range []map[string]Change{e.pending, e.held} {
		for p, c := range src {
			if e.manifest[p] == nil {
				continue
			}
			if c.Guest == nil {
				m[p] = &Entry{Path: p, Type: 'x'}
			} else {
				g := *c.Guest
				m[p] = &g
			}
		}
	}
	return m
}

// sameRecord reports whether two records are alike in every field.
func sameRecord(a, b *Entry) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// order lists the paths of both scans and known, less the excluded ones,
// parents before children and, within that, in git's own order.
func (e *Engine) order(h, g map[string]*Entry, known []string) []string {
	all := map[string]bool{}
	for p := range h {
		all[p] = true
	}
	for p := range g {
		all[p] = true
	}
	for _, p := range known {
		all[p] = true
	}
	// Ranked once per path, not at every comparison.
	type ranked struct {
		rank int
		p    string
	}
	var rs []ranked
	for p := range all {
		if !e.Excluded(p) {
			rs = append(rs, ranked{gitRank(p), p})
		}
	}
	slices.SortFunc(rs, func(a, b ranked) int {
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		return strings.Compare(a.p, b.p)
	})
	order := make([]string, len(rs))
	for i, r := range rs {
		order[i] = r.p
	}
	return order
}

// manifestCopy is the manifest as saved: entries plus tombstones.
func (e *Engine) manifestCopy() map[string]*Entry {
	m := make(map[string]*Entry, len(e.manifest)+len(e.tombs))
	for k, v := range e.manifest {
		c := *v
		m[k] = &c
	}
	for k, o := range e.tombs {
		m[k] = &Entry{Path: k, Type: 'x', Origin: o}
	}
	return m
}

// setManifest records p as in step, last changed from origin; nil records
// a deletion. Only the user's deletions are kept (as tombstones): a rewind
// treats a path it knows nothing of as the agent's anyway, so a tombstone
// saying the agent deleted something tells it nothing, and an agent that
// creates and deletes thousands of files leaves none. The user's are
// capped at maxTombs; one dropped costs at most a file the user deleted
// coming back from a checkpoint, through the gate like any other.
func (e *Engine) setManifest(p string, ent *Entry, origin string) {
	defer e.relink(p)
	delete(e.stale, p)
	before := e.manifest[p]
	defer func() {
		if !sameRecord(before, e.manifest[p]) {
			e.changed = true
		}
	}()
	if old := e.manifest[p]; old != nil {
		e.account(old, -1)
		if old.Type == 'l' {
			delete(e.links, p)
		}
	}
	if ent == nil {
		delete(e.manifest, p)
		if origin == "host" {
			e.tombs[p] = origin
			for k := range e.tombs {
				if len(e.tombs) <= maxTombs {
					break
				}
				delete(e.tombs, k)
			}
		} else {
			delete(e.tombs, p)
		}
		return
	}
	c := *ent
	c.Path = p
	if origin == "" {
		if old := e.manifest[p]; old != nil && old.Same(ent) {
			origin = old.Origin // unchanged: keep who made it so
		} else {
			origin = "host"
		}
	}
	c.Origin = origin
	e.manifest[p] = &c
	e.account(&c, 1)
	if c.Type == 'l' {
		e.links[p] = c.Link
	}
	if isGitMark(p) {
		e.gitMarks[p] = true
	}
	delete(e.tombs, p)
}

// relink brings the link index up to date at p: the manifest's link
// there, else the one the pass's scan saw, else none.
func (e *Engine) relink(p string) {
	e.linkIdx.set(scanKey(p), "", false) // p written: the scan's text is no longer the host's
	if text, ok := e.links[p]; ok {
		e.linkIdx.set(p, text, true)
		return
	}
	text, ok := e.passLinks[p]
	e.linkIdx.set(p, text, ok)
}

// account adds (sign 1) or takes away (-1) an entry of the guest's making
// from the quota's count.
func (e *Engine) account(ent *Entry, sign int) {
	if ent.Origin != "guest" {
		return
	}
	e.used.Files += sign
	if ent.Type == 'f' {
		e.used.Bytes += int64(sign) * ent.Size
	}
}

// staleReport is how many passes in a row a path may be stale before it
// is reported.
const staleReport = 3

// fail records what kept p out of step. A side that changed after the
// pass looked (ErrStale), or while its content was copied (errChanged), is
// no failure: that change brings the next pass, and a routine edit during
// a pass (or a conflict being sorted out) is no error to show the user.
// Unless it is every pass: a file written all the time, or one the scan
// cannot read but is there, is reported from the staleReport-th on.
func (e *Engine) fail(p string, err error) {
	if errors.Is(err, ErrStale) || errors.Is(err, errChanged) {
		if e.stale == nil {
			e.stale = map[string]int{}
		}
		if e.stale[p]++; e.stale[p] < staleReport {
			return
		}
		err = fmt.Errorf("%w, %d passes in a row (a file changed all the time, or one this sync cannot read)", err, e.stale[p])
	}
	msg := p + ": " + err.Error()
	e.passFails++
	if len(e.passErrs) < 5 {
		e.passErrs = append(e.passErrs, msg)
	}
	e.errs = append(e.errs, msg)
	if len(e.errs) > 100 {
		e.errs = e.errs[len(e.errs)-100:]
	}
}

// decide handles one path. Deletions are returned, to run after all
// creations and children-first.
func (e *Engine) decide(ctx context.Context, p string, b, h, g *Entry) *deletion {
	delete(e.skipped, p)
	switch {
	case h.Same(g):
		e.setManifest(p, h, "")
		delete(e.held, p)
		delete(e.pending, p)
		return nil
	case h.Same(b):
		return e.toHost(ctx, p, b, h, g)
	case g.Same(b):
		return e.toGuest(ctx, p, g, h)
	}
	// Both sides changed, differently.
	delete(e.held, p)
	delete(e.pending, p)
	switch {
	case h == nil:
		// The host deleted what the guest changed: keep the guest's.
		return e.toHost(ctx, p, b, h, g)
	case g == nil:
		// The guest deleted what the user changed: keep the user's.
		return e.toGuest(ctx, p, g, h)
	case h.Type == 'd' || g.Type == 'd':
		// A directory on one side, something else on the other: the
		// host's stays; the guest's goes beside it.
		return e.conflict(ctx, p, h, g)
	}
	return e.conflict(ctx, p, h, g)
}

// conflict keeps the host's version at p on both sides and the guest's
// version next to it: in the guest at once, on the host through the gate
// like any other guest change.
func (e *Engine) conflict(ctx context.Context, p string, h, g *Entry) *deletion {
	cp, err := e.conflictName(ctx, p)
	if err != nil {
		e.fail(p, err)
		return nil
	}
	c := *g
	c.Path = cp
	if g.Type != 'd' {
		if err := e.guestCopy(ctx, p, cp, g); err != nil {
			e.fail(p, err)
			return nil
		}
	}
	// The host's version goes in first: should the guest's p change
	// meanwhile (stale), its copy goes again and the next pass starts
	// over, so a file the agent keeps writing never leaves a trail of
	// copies on the host.
	if err := e.putGuest(ctx, p, g, h); err != nil {
		if g.Type != 'd' {
			if rerr := e.guest.Remove(ctx, cp, &c); rerr != nil {
				e.fail(cp, rerr)
			}
		}
		e.fail(p, err)
		return nil
	}
	if g.Type != 'd' {
		// Read from the guest's copy: p holds the host's version now.
		e.gate(ctx, hostWrite{via: viaConflict, path: cp, src: p, from: cp, kind: "added", want: &c})
	}
	e.setManifest(p, h, "host")
	e.conflicts = append(e.conflicts, Conflict{Path: p, Copy: cp, Time: e.opts.Now().UTC()})
	return nil
}

// conflictMark starts the suffix of a conflict copy's name.
const conflictMark = ".sandbox-conflict-"

// conflictName names the copy of the guest's version of p: p, less any
// conflict suffixes (a copy of a copy is named after the file, so names
// never grow), plus one with the time; and, should that name be taken on
// either side or in the manifest (two conflicts in a second), a counter:
// a conflict copy never replaces anything.
func (e *Engine) conflictName(ctx context.Context, p string) (string, error) {
	base := p
	for {
		i := strings.LastIndex(base, conflictMark)
		if i <= strings.LastIndex(base, "/")+1 {
			break
		}
		base = base[:i]
	}
	name := base + conflictMark + e.opts.Now().UTC().Format("20060102-150405")
	for n := 1; n <= 20; n++ {
		cp := name
		if n > 1 {
			cp = fmt.Sprintf("%s-%d", name, n)
		}
		if e.manifest[cp] != nil || e.hostStat(ctx, cp) != nil {
			continue
		}
		g, err := e.guest.Scan(ctx, []string{cp})
		if err != nil {
			return "", fmt.Errorf("name a conflict copy: %w", err)
		}
		if len(g) == 0 {
			return cp, nil
		}
	}
	return "", fmt.Errorf("no free name for a conflict copy beside %s: move some %s files away", p, conflictMark+"*")
}

// toHost offers the guest's state of p to the host (which holds h).
func (e *Engine) toHost(ctx context.Context, p string, b, h, g *Entry) *deletion {
	kind := "modified"
	switch {
	case g == nil:
		kind = "deleted"
	case b == nil:
		kind = "added"
	}
	del, _ := e.gate(ctx, hostWrite{via: viaSync, path: p, src: p, kind: kind, cur: h, want: g})
	return del
}

// via names the way guest data comes to the host folder.
type via int

const (
	viaSync     via = iota // a sync pass
	viaRewind              // the merge after a rewind, a restore or start --from
	viaApply               // kosa8 apply: the user reviewed it
	viaApprove             // kosa8 approve: the user approved this held path
	viaConflict            // the guest's version of a conflict, beside the host's
)

// hostWrite is one change of the host folder made of the guest's data.
type hostWrite struct {
	via  via
	path string // where on the host
	src  string // the guest's path the content is of (a conflict copy's differs)
	from string // where in the guest to read it, if not src (a conflict's copy there)
	kind string // added, modified, deleted: for held and pending records
	cur  *Entry // the host's entry at path now
	want *Entry // the guest's entry; nil deletes path
}

// readFrom is where in the guest w's content is read.
func (w hostWrite) readFrom() string {
	if w.from != "" {
		return w.from
	}
	return w.src
}

// gate is the one way guest data reaches the host folder: sync passes,
// rewinds, restores, start --from, apply, approve and conflict copies all
// come here, and nothing else in this package writes to the host (a test
// reads the package's source to hold that). In order it applies:
//   - the size cap;
//   - the hold rules (held.go: files host tools run or obey, git by
//     allow-list, new repositories), but for a path the user approved;
//   - the link rule (LinkWhy), always;
//   - review mode, but for apply and approve;
//   - the quotas, always.
//
// It returns a deletion to run after the pass's creations, and whether
// the change was made (or, for a deletion, is to be made).
func (e *Engine) gate(ctx context.Context, w hostWrite) (*deletion, bool) {
	p, g := w.path, w.want
	if g != nil && g.Big {
		e.skipped[p] = "larger than the size cap"
		return nil, false
	}
	hold := func(why string) (*deletion, bool) {
		e.held[p] = Change{Path: p, Kind: w.kind, Why: why, Guest: g}
		delete(e.pending, p)
		return nil, false
	}
	var typ byte
	if g != nil {
		typ = g.Type
	}
	var content []byte // a git config, read once: what is checked is what is written
	if w.via != viaApprove {
		why, cfg := e.opts.Hold.holdWhy(p, typ, e.gitDirs, e.hostDir(ctx))
		if why == "" {
			why = e.gitRuns.why(p, typ)
		}
		if why == "" && cfg && g == nil {
			// Its names (hooksPath, includes) would be gone on the next
			// pass, and the guest's files there unheld.
			why = "deletes a git config"
		}
		if why == "" && w.src != p {
			why, cfg2 := e.opts.Hold.holdWhy(w.src, typ, e.gitDirs, e.hostDir(ctx))
			if why != "" {
				return hold(why)
			}
			cfg = cfg || cfg2
		}
		if why == "" && cfg && g != nil {
			if g.Type != 'f' {
				why = "a git config that is not a file"
			} else {
				content, why = e.gitConfigCheck(ctx, w)
			}
		}
		if why != "" {
			return hold(why)
		}
	}
	if g != nil && g.Type == 'l' {
		if why := LinkWhy(engineLinks{ctx, e}, p, g.Link); why != "" {
			return hold(why)
		}
		if controlName(g.Link) {
			return hold("a link whose text has control characters (ls -l would send them to a terminal)")
		}
	}
	if e.opts.Review && w.via != viaApply && w.via != viaApprove {
		e.pending[p] = Change{Path: p, Kind: w.kind, Why: "review", Guest: g}
		delete(e.held, p)
		return nil, false
	}
	if g != nil {
		if why := e.overQuota(p, g); why != "" {
			e.used.Refused++
			e.skipped[p] = why
			e.fail(p, errors.New(why))
			return nil, false
		}
	}
	delete(e.held, p)
	delete(e.pending, p)
	delete(e.skipped, p)
	if g == nil {
		return &deletion{path: p, onHost: true, cur: w.cur, run: func() {
			if err := e.host.Remove(ctx, p, w.cur); err != nil {
				if !isNotEmpty(err) {
					e.fail(p, err)
				}
				// A directory the user put new files in stays; the next
				// sync sees it on both sides again.
				return
			}
			e.setManifest(p, nil, "guest")
		}}, true
	}
	// A repository goes out in git's order: once a step failed (git on the
	// host holds a lock, say), its later steps wait for the next pass, so
	// the host never has a ref to a missing object or an index ahead of
	// its refs.
	gitDir, rank := gitDirOf(p), gitRank(p)
	if failed, ok := e.gitFailed[gitDir]; ok && gitDir != "" && failed < rank {
		return nil, false
	}
	err := func() error {
		was := w.cur
		if cur := w.cur; cur != nil && cur.Type != g.Type {
			if cur.Type == 'd' {
				return fmt.Errorf("a directory stands where a %s should go", typeName(g.Type))
			}
			if err := e.host.Remove(ctx, p, cur); err != nil {
				return err
			}
			was = nil
		}
		switch g.Type {
		case 'd':
			return e.host.Mkdir(ctx, p, g.Mode)
		case 'l':
			return e.host.Symlink(ctx, p, g.Link, was)
		}
		var r io.Reader
		if content != nil {
			if int64(len(content)) != g.Size {
				return errChanged
			}
			r = bytes.NewReader(content)
		} else {
			rc, err := e.guest.Read(ctx, w.readFrom())
			if err != nil {
				return err
			}
			defer rc.Close()
			// No more than the scan saw and the quota counted: a file
			// the guest grows meanwhile is written on a later pass.
			r = &atMost{r: rc, left: g.Size}
		}
		if e.isGitIndex(p) {
			r = newIndexCheck(r, e.indexHashLen(ctx, path.Dir(p)))
		}
		hash, err := e.host.Write(ctx, p, g.Mode, r, g.Hash, was)
		if err != nil {
			return err
		}
		if hash != g.Hash {
			return errChanged
		}
		return nil
	}()
	if err != nil {
		e.fail(p, err)
		if failed, ok := e.gitFailed[gitDir]; gitDir != "" && (!ok || rank < failed) {
			if e.gitFailed == nil {
				e.gitFailed = map[string]int{}
			}
			e.gitFailed[gitDir] = rank
		}
		return nil, false
	}
	e.setManifest(p, g, "guest")
	return nil, true
}

// atMost reads r, failing with errChanged past left bytes.
type atMost struct {
	r    io.Reader
	left int64
}

func (a *atMost) Read(p []byte) (int, error) {
	if a.left < 0 {
		return 0, errChanged
	}
	if a.left < int64(len(p))-1 {
		p = p[:a.left+1]
	}
	n, err := a.r.Read(p)
	if a.left -= int64(n); a.left < 0 {
		return 0, errChanged
	}
	if err == io.EOF && a.left > 0 {
		return n, errChanged // shorter than scanned: not what was checked
	}
	return n, err
}

// gitConfigCheck reads the guest's git config whole and says why its
// change is held, or returns the content to write: exactly the bytes
// checked, never a second read the guest could have changed meanwhile.
func (e *Engine) gitConfigCheck(ctx context.Context, w hostWrite) ([]byte, string) {
	if w.want.Size > MaxGitConfig {
		return nil, "git config larger than 1 MiB: held whole"
	}
	if w.cur == nil || w.cur.Type != 'f' {
		return nil, "a new git config"
	}
	old, err := readAll(ctx, e.host.Read, w.path)
	if err != nil {
		return nil, "git config change (host version unreadable: " + err.Error() + ")"
	}
	new, err := readAll(ctx, e.guest.Read, w.readFrom())
	if err != nil {
		return nil, "git config change (guest version unreadable: " + err.Error() + ")"
	}
	if !GitConfigHarmless(old, new) {
		return nil, "git config change beyond branch tracking"
	}
	return new, ""
}

// readAll reads p whole, up to MaxGitConfig bytes; more is an error.
func readAll(ctx context.Context, read func(context.Context, string) (io.ReadCloser, error), p string) ([]byte, error) {
	r, err := read(ctx, p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, MaxGitConfig+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxGitConfig {
		return nil, fmt.Errorf("larger than %d bytes", MaxGitConfig)
	}
	return b, nil
}

// overQuota says why writing g at p would pass a quota, or "".
func (e *Engine) overQuota(p string, g *Entry) string {
	files, bytes := 1, int64(0)
	if g.Type == 'f' {
		bytes = g.Size
	}
	if old := e.manifest[p]; old != nil && old.Origin == "guest" {
		files--
		if old.Type == 'f' {
			bytes -= old.Size
		}
	}
	q := e.opts
	switch {
	case files > 0 && e.used.Files+files > q.QuotaFiles:
		return fmt.Sprintf("sync quota: the sandbox may keep at most %d files of its own in the host folder (it has %d); delete some inside, or raise quota_files in the sandbox's config", q.QuotaFiles, e.used.Files)
	case bytes > 0 && bytes > q.QuotaBytes-e.used.Bytes: // no overflow, whatever size the guest claims
		return fmt.Sprintf("sync quota: the sandbox may keep at most %d bytes of its own in the host folder (it has %d, this file is %d); delete some inside, or raise quota_bytes in the sandbox's config", q.QuotaBytes, e.used.Bytes, g.Size)
	}
	return ""
}

// statSide is a Side that describes one path without walking below it.
type statSide interface {
	Stat(ctx context.Context, p string) (*Entry, error)
}

// hostStat describes p on the host now (nil: nothing there).
func (e *Engine) hostStat(ctx context.Context, p string) *Entry {
	if s, ok := e.host.(statSide); ok {
		ent, err := s.Stat(ctx, p)
		if err != nil {
			// Unreadable or special: not a folder, not a link.
			return &Entry{Path: p, Type: 'f'}
		}
		return ent
	}
	return e.manifest[p]
}

// hostDir reports whether the host has a real directory at a path now.
func (e *Engine) hostDir(ctx context.Context) func(string) bool {
	return func(p string) bool {
		ent := e.hostStat(ctx, p)
		return ent != nil && ent.Type == 'd'
	}
}

// engineLinks is the host folder as the link rule sees it.
type engineLinks struct {
	ctx context.Context
	e   *Engine
}

func (l engineLinks) Lstat(p string) (byte, string) {
	ent := l.e.hostStat(l.ctx, p)
	if ent == nil {
		return 0, ""
	}
	return ent.Type, ent.Link
}

// ThroughLink implements throughView: the index, not a walk of every link.
func (l engineLinks) ThroughLink(p string) string { return l.e.linkIdx.throughLink(p) }

func (l engineLinks) Links() map[string]string {
	m := make(map[string]string, len(l.e.links)+len(l.e.passLinks))
	for k, v := range l.e.passLinks {
		m[k] = v
	}
	for k, v := range l.e.links {
		m[k] = v
	}
	return m
}

// isGitMark tells whether p may make a folder a git directory: a .git
// file, a commondir, a HEAD.
func isGitMark(p string) bool {
	switch foldName(path.Base(p)) {
	case ".git", "commondir", "head":
		return true
	}
	return false
}

// findGitDirs lists the folders, besides those named .git, that git on
// the host uses as a git directory: where a .git file's "gitdir:" points,
// where a commondir points, and folders with a HEAD of the host's own.
// Pointers are read from the host, bounded; those that leave the folder
// are no concern of the sync's.
func (e *Engine) findGitDirs(ctx context.Context) map[string]bool {
	dirs := map[string]bool{}
	var root string
	if d, ok := e.host.(interface{ Dir() string }); ok {
		root = d.Dir()
	}
	resolve := func(from, target string) string {
		target = strings.TrimSpace(target)
		if strings.HasPrefix(target, "/") {
			if root == "" || !strings.HasPrefix(target, root+"/") {
				return ""
			}
			target = strings.TrimPrefix(target, root+"/")
			from = "."
		}
		j := path.Join(from, target)
		if _, err := CleanRel(j); err != nil {
			return ""
		}
		return j
	}
	read := func(p string) string {
		b, err := readAllMax(ctx, e.host.Read, p, 4096)
		if err != nil {
			return ""
		}
		return string(b)
	}
	// Pass by pass: gitdir: pointers; then folders with a HEAD that are
	// no part of a git directory found so far (inside one, a HEAD is a
	// ref or a reflog); then commondir pointers of all of these.
	inside := func(p string) bool {
		if _, ok := gitDirRest(p); ok {
			return true
		}
		for d := range dirs {
			if strings.HasPrefix(p, d+"/") {
				return true
			}
		}
		return false
	}
	for _, kind := range []string{".git", "head", "commondir"} {
		for p := range e.gitMarks {
			if foldName(path.Base(p)) != kind {
				continue
			}
			ent := e.hostStat(ctx, p)
			if ent == nil {
				delete(e.gitMarks, p)
				continue
			}
			if ent.Type == 'd' {
				continue
			}
			dir := path.Dir(p)
			switch kind {
			case ".git":
				if ent.Type != 'f' {
					continue
				}
				if t, ok := strings.CutPrefix(read(p), "gitdir:"); ok {
					if d := resolve(dir, strings.SplitN(t, "\n", 2)[0]); d != "" {
						dirs[d] = true
					}
				}
			case "head":
				if dir != "." && !inside(dir) {
					dirs[dir] = true
				}
			case "commondir":
				if _, inDotGit := gitDirRest(p); inDotGit || dirs[dir] {
					if d := resolve(dir, strings.SplitN(read(p), "\n", 2)[0]); d != "" {
						dirs[d] = true
					}
				}
			}
		}
	}
	return dirs
}

func readAllMax(ctx context.Context, read func(context.Context, string) (io.ReadCloser, error), p string, max int64) ([]byte, error) {
	r, err := read(ctx, p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, max))
}

// toGuest applies the host's state of p to the guest (which holds cur).
func (e *Engine) toGuest(ctx context.Context, p string, cur, h *Entry) *deletion {
	delete(e.held, p)
	delete(e.pending, p)
	if h != nil && h.Big {
		e.skipped[p] = "larger than the size cap"
		return nil
	}
	if h == nil {
		return &deletion{path: p, run: func() {
			if err := e.guest.Remove(ctx, p, cur); err != nil {
				if !isNotEmpty(err) {
					e.fail(p, err)
				}
				return
			}
			e.setManifest(p, nil, "host")
		}}
	}
	if _, ok := e.guest.(BatchSide); ok && (cur == nil || cur.Type == h.Type && h.Type != 'd') {
		want := h
		e.batch = append(e.batch, PutItem{Entry: want, Was: cur, Open: func() (io.ReadCloser, error) { return e.readScanned(ctx, p, want) }})
		return nil
	}
	if err := e.putGuest(ctx, p, cur, h); err != nil {
		e.fail(p, err)
		return nil
	}
	e.setManifest(p, h, "host")
	return nil
}

// PassFailures reports how many paths the last pass failed to bring in
// step, and the first few reasons. A path that failed is not in the
// manifest, so the next pass tries it again.
func (e *Engine) PassFailures() (int, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.passFails, slices.Clone(e.passErrs)
}

// flushBatch sends the gathered guest writes in one go.
func (e *Engine) flushBatch(ctx context.Context) {
	if len(e.batch) == 0 {
		return
	}
	items := e.batch
	e.batch = nil
	failed, err := e.guest.(BatchSide).Put(ctx, items)
	for _, it := range items {
		p := it.Entry.Path
		switch {
		case err != nil:
			e.fail(p, err)
		case failed[p] != nil:
			if !errors.Is(failed[p], errChanged) { // ErrStale: fail ignores it
				e.fail(p, failed[p])
			}
		default:
			e.setManifest(p, it.Entry, "host")
		}
	}
}

// putGuest makes the guest's p the host's want, the guest holding cur.
func (e *Engine) putGuest(ctx context.Context, p string, cur, want *Entry) error {
	if cur != nil && cur.Type != want.Type {
		if cur.Type == 'd' {
			return fmt.Errorf("a directory stands where a %s should go", typeName(want.Type))
		}
		if err := e.guest.Remove(ctx, p, cur); err != nil {
			return err
		}
		cur = nil
	}
	switch want.Type {
	case 'd':
		return e.guest.Mkdir(ctx, p, want.Mode)
	case 'l':
		return e.guest.Symlink(ctx, p, want.Link, cur)
	}
	r, err := e.readScanned(ctx, p, want)
	if err != nil {
		return err
	}
	defer r.Close()
	return e.guestWrite(ctx, p, want, cur, r)
}

// readScanned opens the host's p for a copy of the version ent describes:
// its first ent.Size bytes. A file its writer appends to meanwhile (a
// log) arrives as scanned rather than failing its hash; the rest follows
// on the next pass. Any other change fails the guest's hash check.
func (e *Engine) readScanned(ctx context.Context, p string, ent *Entry) (io.ReadCloser, error) {
	r, err := e.host.Read(ctx, p)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{&prefix{r: r, left: ent.Size}, r}, nil
}

// prefix reads the first left bytes of r; fewer is errChanged.
type prefix struct {
	r    io.Reader
	left int64
}

func (a *prefix) Read(p []byte) (int, error) {
	if a.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > a.left {
		p = p[:a.left]
	}
	n, err := a.r.Read(p)
	a.left -= int64(n)
	if err == io.EOF && a.left > 0 {
		return n, errChanged
	}
	if a.left == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// guestCopy copies the guest's own p (entry g) to cp, in the guest.
func (e *Engine) guestCopy(ctx context.Context, p, cp string, g *Entry) error {
	if g.Type == 'l' {
		return e.guest.Symlink(ctx, cp, g.Link, nil)
	}
	r, err := e.guest.Read(ctx, p)
	if err != nil {
		return err
	}
	defer r.Close()
	return e.guestWrite(ctx, cp, g, nil, r)
}

// guestWrite writes want's content from r to the guest's p, if p is
// still was.
func (e *Engine) guestWrite(ctx context.Context, p string, want, was *Entry, r io.Reader) error {
	hash, err := e.guest.Write(ctx, p, want.Mode, r, want.Hash, was)
	if err != nil {
		return err
	}
	if hash != want.Hash {
		return errChanged
	}
	return nil
}

func typeName(t byte) string {
	switch t {
	case 'd':
		return "directory"
	case 'l':
		return "link"
	}
	return "file"
}

// errChanged: the source changed while it was copied; the next sync picks
// up the new version.
var errChanged = errors.New("changed while being copied")

// isNotEmpty reports a directory that could not be removed because
// something new is in it.
func isNotEmpty(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) || strings.Contains(err.Error(), "not empty"))
}

// Status reports what is held, pending and conflicting.
func (e *Engine) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := Status{LastSync: e.lastSync, Files: len(e.manifest), Conflicts: slices.Clone(e.conflicts), Errors: slices.Clone(e.errs), Quota: e.used}
	st.Quota.MaxBytes, st.Quota.MaxFiles = e.opts.QuotaBytes, e.opts.QuotaFiles
	for _, c := range e.held {
		st.Held = append(st.Held, c)
	}
	for _, c := range e.pending {
		st.Pending = append(st.Pending, c)
	}
	for p, why := range e.skipped {
		st.Skipped = append(st.Skipped, p+": "+why)
	}
	slices.SortFunc(st.Held, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	slices.SortFunc(st.Pending, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	slices.Sort(st.Skipped)
	return st
}

// Apply writes held or pending guest changes to the host: the paths given,
// or all pending ones when none is given (held files are only ever
// applied by name).
func (e *Engine) Apply(ctx context.Context, paths []string, held bool) ([]string, error) {
	return e.ApplySeen(ctx, paths, held, nil)
}

// ApplySeen is Apply of the versions the user was shown: seen holds, for
// each path, the guest's entry that was shown (nil: a deletion). A path
// whose guest version is now another, or that seen lacks, is refused and
// not written: a guest that watches its diff being read cannot swap in
// another version before the user's answer. nil seen checks nothing (Apply).
func (e *Engine) ApplySeen(ctx context.Context, paths []string, held bool, seen map[string]*Entry) ([]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	src := e.pending
	if held {
		src = e.held
	}
	var todo []string
	if len(paths) == 0 && !held {
		for p := range src {
			todo = append(todo, p)
		}
	}
	for _, p := range paths {
		if _, ok := src[p]; !ok {
			return nil, fmt.Errorf("%s is not %s", p, map[bool]string{true: "held", false: "pending"}[held])
		}
		todo = append(todo, p)
	}
	slices.Sort(todo)
	v := viaApply
	if held {
		v = viaApprove
	}
	// The gate needs to know the host's links and git directories.
	hs, err := e.host.Scan(ctx, nil)
	if err != nil {
		return nil, err
	}
	e.startPass(ctx, hs)
	var dels []*deletion
	var refused []string
	unseen := map[string]bool{}
	for _, p := range todo {
		g, err := e.guest.Scan(ctx, []string{p})
		if err != nil {
			return nil, err
		}
		h, err := e.host.Scan(ctx, []string{p})
		if err != nil {
			return nil, err
		}
		if seen != nil {
			if want, ok := seen[p]; !ok || !g[p].Same(want) {
				refused = append(refused, p+": changed in the sandbox since it was shown (look at it again)")
				unseen[p] = true
				continue
			}
		}
		kind := src[p].Kind
		if del, _ := e.gate(ctx, hostWrite{via: v, path: p, src: p, kind: kind, cur: h[p], want: g[p]}); del != nil {
			dels = append(dels, del)
		}
	}
	e.finishPass(ctx, dels)
	for _, p := range todo {
		if unseen[p] {
			continue
		}
		if c, ok := e.held[p]; ok {
			refused = append(refused, p+": "+c.Why)
		} else if why, ok := e.skipped[p]; ok {
			refused = append(refused, p+": "+why)
		}
	}
	if len(refused) > 0 {
		return todo, fmt.Errorf("not written to the host:\n  %s", strings.Join(refused, "\n  "))
	}
	return todo, nil
}

// Discard puts the host's version back in the guest for pending and held
// paths (all of both when none is given).
func (e *Engine) Discard(ctx context.Context, paths []string) ([]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(paths) == 0 {
		for p := range e.pending {
			paths = append(paths, p)
		}
		// Held changes are the agent's unapplied work too.
		for p := range e.held {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	var dels []*deletion
	for _, p := range paths {
		_, pending := e.pending[p]
		_, held := e.held[p]
		if !pending && !held {
			return nil, fmt.Errorf("%s is neither pending nor held", p)
		}
		h, err := e.host.Scan(ctx, []string{p})
		if err != nil {
			return nil, err
		}
		g, err := e.guest.Scan(ctx, []string{p})
		if err != nil {
			return nil, err
		}
		if del := e.toGuest(ctx, p, g[p], h[p]); del != nil {
			dels = append(dels, del)
		}
	}
	e.finishPass(ctx, dels)
	return paths, nil
}

// Rewind brings the host folder back to the state the guest's workspace
// now holds (it was just restored from a checkpoint). The engine's manifest
// is the one from just before the rewind. For each path: if the host still
// matches the manifest and the last change there came from the guest (an
// edit, or a deletion), the agent made it: the host goes back to the
// guest's version. Otherwise the user changed it (synced or not): the
// user's version stays, goes into the guest, and is reported as a
// conflict when the checkpoint held something else.
func (e *Engine) Rewind(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pass(ctx, nil, slices.Collect(maps.Keys(e.tombs)), func(p string, m, hp, gp *Entry) *deletion {
		agentMade := hp.Same(m) && ((m != nil && m.Origin != "host") || (m == nil && e.tombs[p] != "host"))
		switch {
		case hp.Same(gp):
			e.setManifest(p, gp, "")
			return nil
		case agentMade:
			// Back to the checkpoint on the host, through the gate like
			// any guest data: the checkpoint's version of a path comes from
			// the guest's disk, and it may never have been on the host
			// (held, waiting for review, or unknown to the manifest).
			kind := "modified"
			switch {
			case gp == nil:
				kind = "deleted"
			case hp == nil:
				kind = "added"
			}
			del, _ := e.gate(ctx, hostWrite{via: viaRewind, path: p, src: p, kind: kind, cur: hp, want: gp})
			return del
		}
		if gp != nil && !(gp.Type == 'd' && hp != nil && hp.Type == 'd') {
			e.conflicts = append(e.conflicts, Conflict{Path: p, Copy: "(kept your version over the checkpoint's)", Time: e.opts.Now().UTC()})
		}
		return e.toGuest(ctx, p, gp, hp)
	})
}

// Recover is the first pass of a start whose guest may hold less than the
// manifest says: the last run did not stop cleanly (its supervisor or
// QEMU was killed, the host lost power), or the machine comes from a
// checkpoint or from disks older than the manifest. What the guest lost
// looks, to an ordinary pass, like the agent's deletions and edits, and an
// ordinary pass would carry them to the host: the user's own files
// included. Recover infers no deletion:
//   - a path the guest holds as last recorded (the manifest, or the
//     version that waits for review or approval: guest) is decided as
//     ever: its state is known;
//   - otherwise the guest's state is unknown: a path only the host has goes
//     back into the guest, a path only the guest has goes to the host
//     (through the gate), and one that differs is a conflict, both kept;
//   - but a deletion journaled before the crash (journal: what the host
//     held) is finished where the host still holds just that and the
//     guest nothing: the guest had made it durable before it was
//     journaled. A tree deleted in the guest is then gone from the host,
//     not half of it.
func (e *Engine) Recover(ctx context.Context, guest, journal map[string]*Entry) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var extra []string
	for _, m := range []map[string]*Entry{guest, journal} {
		for p := range m {
			if _, err := CleanRel(p); err == nil {
				extra = append(extra, p)
			}
		}
	}
	if len(journal) > 0 {
		e.journaled = true // cleared once this pass made its deletions
	}
	return e.pass(ctx, nil, extra, func(p string, b, h, g *Entry) *deletion {
		known := b
		if k, ok := guest[p]; ok {
			known = k
			if k != nil && k.Type == 'x' {
				known = nil
			}
		}
		switch {
		case h.Same(g):
			return e.decide(ctx, p, b, h, g)
		case g == nil && h != nil && journal[p] != nil && h.Same(journal[p]):
			del, _ := e.gate(ctx, hostWrite{via: viaSync, path: p, src: p, kind: "deleted", cur: h, want: nil})
			return del
		case g.Same(known):
			return e.decide(ctx, p, b, h, g)
		case g == nil:
			return e.toGuest(ctx, p, g, h)
		case h == nil:
			return e.toHost(ctx, p, b, h, g)
		case h.Type == 'd' && g.Type == 'd':
			e.setManifest(p, h, "")
			return nil
		case g.Same(b):
			// The guest lost what waited for review: the host's version,
			// the user's, goes in.
			return e.toGuest(ctx, p, g, h)
		}
		return e.conflict(ctx, p, h, g)
	})
}

// Saved reports whether the manifest as it is now was saved (the last
// pass's persist succeeded and nothing changed since).
func (e *Engine) Saved() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.changed && maps.EqualFunc(e.guestKnown(), e.savedGuest, sameRecord)
}

// GuestKnown returns the guest versions awaiting review or approval, as
// Options.SaveGuest is told them (a checkpoint keeps them too).
func (e *Engine) GuestKnown() map[string]*Entry {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.guestKnown()
}

// Manifest returns a copy of the manifest.
func (e *Engine) Manifest() map[string]*Entry {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.manifestCopy()
}
