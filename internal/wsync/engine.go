package wsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	// returns the hash of what it wrote.
	Write(ctx context.Context, p string, mode fs.FileMode, r io.Reader, hash string) (string, error)
	Mkdir(ctx context.Context, p string, mode fs.FileMode) error
	Symlink(ctx context.Context, p, target string) error
	Remove(ctx context.Context, p string) error
}

// PutItem is one entry for a BatchSide: a file's content comes from Open.
type PutItem struct {
	Entry *Entry
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
}

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
	tombs     map[string]string // deleted paths and who deleted them
	errs      []string
	lastSync  time.Time
	onChange  func(map[string]*Entry)
}

// NewEngine returns an engine starting from manifest (nil: nothing synced
// yet). save, if set, is called with the manifest after each sync.
func NewEngine(host, guest Side, manifest map[string]*Entry, opts Options, save func(map[string]*Entry)) *Engine {
	if manifest == nil {
		manifest = map[string]*Entry{}
	}
	tombs := map[string]string{}
	for p, e := range manifest {
		if e.Type == 'x' {
			tombs[p] = e.Origin
			delete(manifest, p)
		}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Engine{host: host, guest: guest, opts: opts, manifest: manifest, held: map[string]Change{},
		pending: map[string]Change{}, skipped: map[string]string{}, tombs: tombs, onChange: save}
}

// Excluded reports whether p stays on its side.
// Git's lock files are always: they belong to a git process at work.
func (e *Engine) Excluded(p string) bool { return isGitLock(p) || matchAny(p, e.opts.Exclude) }

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
	order := e.order(h, g, known)
	var deletes []func()
	e.batch = e.batch[:0]
	e.gitFailed = map[string]int{}
	for _, p := range order {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if del := e.decide(ctx, p, e.manifest[p], h[p], g[p]); del != nil {
			deletes = append(deletes, del)
		}
	}
	e.finishPass(ctx, deletes)
	return nil
}

// finishPass ends a pass: the gathered guest writes go out, then the
// deletions, children before their directories; the manifest is saved.
func (e *Engine) finishPass(ctx context.Context, deletes []func()) {
	e.flushBatch(ctx)
	for i := len(deletes) - 1; i >= 0; i-- {
		deletes[i]()
	}
	e.lastSync = time.Now()
	if e.onChange != nil {
		e.onChange(e.manifestCopy())
	}
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
	var order []string
	for p := range all {
		if !e.Excluded(p) {
			order = append(order, p)
		}
	}
	slices.SortFunc(order, func(a, b string) int {
		if ra, rb := gitRank(a), gitRank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
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
// a deletion (a tombstone, so a rewind knows who deleted it).
func (e *Engine) setManifest(p string, ent *Entry, origin string) {
	if ent == nil {
		delete(e.manifest, p)
		e.tombs[p] = origin
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
	delete(e.tombs, p)
}

func (e *Engine) fail(p string, err error) {
	msg := p + ": " + err.Error()
	e.errs = append(e.errs, msg)
	if len(e.errs) > 100 {
		e.errs = e.errs[len(e.errs)-100:]
	}
}

// decide handles one path. Deletions are returned, to run after all
// creations and children-first.
func (e *Engine) decide(ctx context.Context, p string, b, h, g *Entry) func() {
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
// version next to it, on both sides.
func (e *Engine) conflict(ctx context.Context, p string, h, g *Entry) func() {
	stamp := e.opts.Now().UTC().Format("20060102-150405")
	cp := p + ".sandbox-conflict-" + stamp
	if g.Type != 'd' {
		if err := e.copyEntry(ctx, e.guest, p, e.host, cp, g); err != nil {
			e.fail(p, err)
			return nil
		}
		if err := e.copyEntry(ctx, e.guest, p, e.guest, cp, g); err != nil {
			e.fail(p, err)
		}
	}
	if err := e.replace(ctx, e.host, e.guest, p, g, h); err != nil {
		e.fail(p, err)
		return nil
	}
	e.setManifest(p, h, "host")
	e.conflicts = append(e.conflicts, Conflict{Path: p, Copy: cp, Time: e.opts.Now().UTC()})
	return nil
}

// toHost applies the guest's state of p to the host (which holds h),
// unless it is held, waiting for review, or refused.
func (e *Engine) toHost(ctx context.Context, p string, b, h, g *Entry) func() {
	kind := "modified"
	switch {
	case g == nil:
		kind = "deleted"
	case b == nil:
		kind = "added"
	}
	if g != nil && g.Big {
		e.skipped[p] = "larger than the size cap"
		return nil
	}
	if why := e.holdReason(ctx, p, g); why != "" {
		e.held[p] = Change{Path: p, Kind: kind, Why: why, Guest: g}
		return nil
	}
	if e.opts.Review {
		e.pending[p] = Change{Path: p, Kind: kind, Why: "review", Guest: g}
		return nil
	}
	return e.applyToHost(ctx, p, h, g)
}

func (e *Engine) applyToHost(ctx context.Context, p string, cur, g *Entry) func() {
	delete(e.held, p)
	delete(e.pending, p)
	if g == nil {
		return func() {
			if err := e.host.Remove(ctx, p); err != nil {
				if !isNotEmpty(err) {
					e.fail(p, err)
				}
				// A directory the user put new files in stays; the next
				// sync sees it on both sides again.
				return
			}
			e.setManifest(p, nil, "guest")
		}
	}
	// A repository goes out in git's order: once a step failed (git on the
	// host holds a lock, say), its later steps wait for the next pass, so
	// the host never has a ref to a missing object or an index ahead of
	// its refs.
	gitDir, rank := gitDirOf(p), gitRank(p)
	if failed, ok := e.gitFailed[gitDir]; ok && gitDir != "" && failed < rank {
		return nil
	}
	if err := e.replace(ctx, e.guest, e.host, p, cur, g); err != nil {
		e.fail(p, err)
		if failed, ok := e.gitFailed[gitDir]; gitDir != "" && (!ok || rank < failed) {
			if e.gitFailed == nil {
				e.gitFailed = map[string]int{}
			}
			e.gitFailed[gitDir] = rank
		}
		return nil
	}
	e.setManifest(p, g, "guest")
	return nil
}

// holdReason says why a guest change to p waits for approval, or "".
func (e *Engine) holdReason(ctx context.Context, p string, g *Entry) string {
	if g != nil && g.Type == 'l' && !LinkStaysInside(p, g.Link) {
		return "symlink leaves the folder (" + g.Link + ")"
	}
	if !e.opts.Hold.Held(p) {
		return ""
	}
	if IsGitConfig(p) && g != nil && g.Type == 'f' {
		old, _ := readAll(ctx, e.host, p)
		new, err := readAll(ctx, e.guest, p)
		if err == nil && old != nil && GitConfigHarmless(old, new) {
			return ""
		}
		return "git config change beyond branch tracking"
	}
	return "host tools run or obey this file"
}

func readAll(ctx context.Context, s Side, p string) ([]byte, error) {
	r, err := s.Read(ctx, p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, 1<<20))
}

// toGuest applies the host's state of p to the guest (which holds cur).
func (e *Engine) toGuest(ctx context.Context, p string, cur, h *Entry) func() {
	delete(e.held, p)
	delete(e.pending, p)
	if h != nil && h.Big {
		e.skipped[p] = "larger than the size cap"
		return nil
	}
	if h == nil {
		return func() {
			if err := e.guest.Remove(ctx, p); err != nil {
				if !isNotEmpty(err) {
					e.fail(p, err)
				}
				return
			}
			e.setManifest(p, nil, "host")
		}
	}
	if _, ok := e.guest.(BatchSide); ok && (cur == nil || cur.Type == h.Type && h.Type != 'd') {
		want := h
		e.batch = append(e.batch, PutItem{Entry: want, Open: func() (io.ReadCloser, error) { return e.host.Read(ctx, p) }})
		return nil
	}
	if err := e.replace(ctx, e.host, e.guest, p, cur, h); err != nil {
		e.fail(p, err)
		return nil
	}
	e.setManifest(p, h, "host")
	return nil
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
			if !errors.Is(failed[p], errChanged) {
				e.fail(p, failed[p])
			}
		default:
			e.setManifest(p, it.Entry, "host")
		}
	}
}

// replace makes dst's p what src's want is, dst currently holding cur.
func (e *Engine) replace(ctx context.Context, src, dst Side, p string, cur, want *Entry) error {
	if cur != nil && cur.Type != want.Type {
		if cur.Type == 'd' {
			return fmt.Errorf("a directory stands where a %s should go", typeName(want.Type))
		}
		if err := dst.Remove(ctx, p); err != nil {
			return err
		}
	}
	return e.copyEntry(ctx, src, p, dst, p, want)
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

// copyEntry copies want (src's entry at sp) to dst at dp.
func (e *Engine) copyEntry(ctx context.Context, src Side, sp string, dst Side, dp string, want *Entry) error {
	switch want.Type {
	case 'd':
		return dst.Mkdir(ctx, dp, want.Mode)
	case 'l':
		return dst.Symlink(ctx, dp, want.Link)
	}
	r, err := src.Read(ctx, sp)
	if err != nil {
		return err
	}
	defer r.Close()
	hash, err := dst.Write(ctx, dp, want.Mode, r, want.Hash)
	if err != nil {
		return err
	}
	if hash != want.Hash {
		return errChanged
	}
	return nil
}

// isNotEmpty reports a directory that could not be removed because
// something new is in it.
func isNotEmpty(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) || strings.Contains(err.Error(), "not empty"))
}

// Status reports what is held, pending and conflicting.
func (e *Engine) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := Status{LastSync: e.lastSync, Files: len(e.manifest), Conflicts: slices.Clone(e.conflicts), Errors: slices.Clone(e.errs)}
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
	var deletes []func()
	for _, p := range todo {
		g, err := e.guest.Scan(ctx, []string{p})
		if err != nil {
			return nil, err
		}
		h, err := e.host.Scan(ctx, []string{p})
		if err != nil {
			return nil, err
		}
		if del := e.applyToHost(ctx, p, h[p], g[p]); del != nil {
			deletes = append(deletes, del)
		}
	}
	for i := len(deletes) - 1; i >= 0; i-- {
		deletes[i]()
	}
	if e.onChange != nil {
		e.onChange(e.manifestCopy())
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
	var deletes []func()
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
			deletes = append(deletes, del)
		}
	}
	e.flushBatch(ctx)
	for i := len(deletes) - 1; i >= 0; i-- {
		deletes[i]()
	}
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
	h, err := e.host.Scan(ctx, nil)
	if err != nil {
		return err
	}
	g, err := e.guest.Scan(ctx, nil)
	if err != nil {
		return err
	}
	var known []string
	for p := range e.manifest {
		known = append(known, p)
	}
	for p := range e.tombs {
		known = append(known, p)
	}
	order := e.order(h, g, known)
	var deletes []func()
	e.batch = e.batch[:0]
	e.gitFailed = map[string]int{}
	for _, p := range order {
		m, hp, gp := e.manifest[p], h[p], g[p]
		agentMade := hp.Same(m) && ((m != nil && m.Origin != "host") || (m == nil && e.tombs[p] != "host"))
		switch {
		case hp.Same(gp):
			e.setManifest(p, gp, "")
		case agentMade:
			// Back to the checkpoint on the host, whatever the policy on
			// held files: these are the host's own earlier contents.
			if del := e.applyToHost(ctx, p, hp, gp); del != nil {
				deletes = append(deletes, del)
			}
		default:
			if gp != nil && !(gp.Type == 'd' && hp != nil && hp.Type == 'd') {
				e.conflicts = append(e.conflicts, Conflict{Path: p, Copy: "(kept your version over the checkpoint's)", Time: e.opts.Now().UTC()})
			}
			if del := e.toGuest(ctx, p, gp, hp); del != nil {
				deletes = append(deletes, del)
			}
		}
	}
	e.finishPass(ctx, deletes)
	return nil
}

// Manifest returns a copy of the manifest.
func (e *Engine) Manifest() map[string]*Entry {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.manifestCopy()
}
