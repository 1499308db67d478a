package wsync

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// busyFile is a side on which someone writes to one file while the engine
// copies it: the hook runs on the copy's first read, after the scan.
type busyFile struct {
	*HostSide
	path  string
	hook  func() // changes the file
	reads int    // how many reads run the hook (then the file is quiet)
}

func (b *busyFile) Read(ctx context.Context, p string) (io.ReadCloser, error) {
	r, err := b.HostSide.Read(ctx, p)
	if err != nil || p != b.path || b.reads == 0 {
		return r, err
	}
	b.reads--
	return &hookedReader{ReadCloser: r, hook: b.hook}, nil
}

type hookedReader struct {
	io.ReadCloser
	hook func()
}

func (h *hookedReader) Read(p []byte) (int, error) {
	if h.hook != nil {
		h.hook()
		h.hook = nil
	}
	return h.ReadCloser.Read(p)
}

// busyBatch is busyFile as a BatchSide, writing each item with Write: the
// agent's ws_put.
type busyBatch struct{ *busyFile }

func (b busyBatch) Put(ctx context.Context, items []PutItem) (map[string]error, error) {
	failed := map[string]error{}
	for _, it := range items {
		e := it.Entry
		var err error
		switch e.Type {
		case 'd':
			err = b.Mkdir(ctx, e.Path, e.Mode)
		case 'l':
			err = b.Symlink(ctx, e.Path, e.Link, it.Was)
		default:
			var r io.ReadCloser
			if r, err = it.Open(); err == nil {
				var hash string
				hash, err = b.Write(ctx, e.Path, e.Mode, r, e.Hash, it.Was)
				r.Close()
				if err == nil && hash != e.Hash {
					err = errChanged
				}
			}
		}
		if err != nil {
			failed[e.Path] = err
		}
	}
	return failed, nil
}

func appendTo(t *testing.T, dir, rel, s string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, rel), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// conflictCopies lists the conflict copies in dir.
func conflictCopies(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.Contains(filepath.Base(p), ".sandbox-conflict-") {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// syncQuiet is a pass whose only tolerated failures are copies whose
// source changed meanwhile (the next pass takes the new version).
func syncQuiet(t *testing.T, e *Engine) {
	t.Helper()
	if err := e.Sync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range e.Status().Errors {
		if !strings.Contains(m, errChanged.Error()) {
			t.Fatalf("sync error: %s", m)
		}
	}
}

// A file one side writes to while the sync copies it (a user's `tee
// log.txt`, a build log) is that side's change alone: no pass may mistake
// the half-copied version on the other side for a change made there, and
// so no conflict copy may appear, let alone copies of copies.
func TestOneSidedWritesDuringCopyMakeNoConflict(t *testing.T) {
	const f = "log.txt"
	for _, c := range []struct {
		name   string
		writer string // the side writing to f: host or guest
		batch  bool   // the guest takes writes in batches (the real agent)
		change string // append; rewrite (another length); same size (new bytes)
	}{
		{"host appends", "host", false, "append"},
		{"host appends, batch guest", "host", true, "append"},
		{"host rewrites", "host", false, "rewrite"},
		{"host rewrites, batch guest", "host", true, "rewrite"},
		{"guest appends", "guest", false, "append"},
		{"guest rewrites", "guest", false, "rewrite"},
		{"host rewrites in place", "host", false, "same size"},
		{"host rewrites in place, batch guest", "host", true, "same size"},
		{"guest rewrites in place", "guest", false, "same size"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, Options{})
			dir := p.host
			if c.writer == "guest" {
				dir = p.guest
			}
			n := 0
			change := func() {
				n++
				switch c.change {
				case "append":
					appendTo(t, dir, f, strings.Repeat("x", n)+"\n")
				case "rewrite":
					write(t, dir, f, strings.Repeat("rewritten\n", n))
				default:
					old := read(dir, f)
					write(t, dir, f, strings.Repeat(string(rune('a'+n%26)), len(old)))
				}
			}
			busy := &busyFile{path: f, hook: change}
			plain := func(h *HostSide) Side { return h }
			wrap := func(h *HostSide) Side { busy.HostSide = h; return busy }
			wrapHost, wrapGuest := wrap, plain
			if c.writer == "guest" {
				wrapHost, wrapGuest = plain, wrap
			}
			if c.batch {
				wrapGuest = func(h *HostSide) Side { return busyBatch{&busyFile{HostSide: h}} }
			}
			e := p.engineSides(t, nil, Options{}, wrapHost, wrapGuest)

			write(t, dir, f, "line 0\n")
			for i := 0; i < 6; i++ {
				busy.reads = 1 // the file changes during this pass's copy
				change()       // and between passes
				syncQuiet(t, e)
				if cc := conflictCopies(t, p.host); len(cc) > 0 {
					t.Fatalf("pass %d: conflict copies on the host: %v", i, cc)
				}
				// A host log arrives as scanned, appended to or not.
				if c.writer == "host" && c.change == "append" {
					if errs := e.Status().Errors; len(errs) > 0 {
						t.Fatalf("pass %d: %v", i, errs)
					}
					if h, g := read(p.host, f), read(p.guest, f); !strings.HasPrefix(h, g) || len(g) == 0 {
						t.Fatalf("pass %d: the guest's %q is no prefix of the host's %q", i, g, h)
					}
				}
			}
			// Quiet now: the writer's last version reaches the other side.
			busy.reads = 0
			syncQuiet(t, e)
			syncQuiet(t, e)
			if cc := append(conflictCopies(t, p.host), conflictCopies(t, p.guest)...); len(cc) > 0 {
				t.Fatalf("conflict copies: %v", cc)
			}
			if cs := e.Status().Conflicts; len(cs) > 0 {
				t.Fatalf("conflicts reported: %+v", cs)
			}
			if h, g := read(p.host, f), read(p.guest, f); h != g || h != read(dir, f) {
				t.Fatalf("not in step: host %q, guest %q", h, g)
			}

			// Both sides change it: one conflict copy, the host's version
			// stays, and the host writing on makes no copy of the copy.
			write(t, p.host, f, "the user's\n")
			write(t, p.guest, f, "the agent's\n")
			syncQuiet(t, e)
			want := f + ".sandbox-conflict-20260102-030405"
			if cc := conflictCopies(t, p.host); len(cc) != 1 || cc[0] != want || read(p.host, want) != "the agent's\n" {
				t.Fatalf("after a two-sided change, host copies %v (%q)", cc, read(p.host, want))
			}
			if read(p.host, f) != "the user's\n" {
				t.Fatalf("the user's version was overwritten: %q", read(p.host, f))
			}
			for i := 0; i < 4; i++ {
				busy.reads = 1
				change()
				syncQuiet(t, e)
			}
			busy.reads = 0
			syncQuiet(t, e)
			if cc := conflictCopies(t, p.host); len(cc) != 1 {
				t.Fatalf("host copies %v, want only %s", cc, want)
			}
			if cc := conflictCopies(t, p.guest); len(cc) != 1 {
				t.Fatalf("guest copies %v, want only %s", cc, want)
			}
			if n := len(e.Status().Conflicts); n != 1 {
				t.Fatalf("%d conflicts reported, want 1", n)
			}
		})
	}
}

// Conflict copies never replace anything, and a conflict on a copy is
// named after the file: two conflicts in one second (the clock is fixed
// here) keep both of the agent's versions, and no name grows a second
// suffix.
func TestConflictCopyNames(t *testing.T) {
	p := newPair(t, Options{})
	write(t, p.host, "f.txt", "base")
	p.sync(t)
	stamp := ".sandbox-conflict-20260102-030405"
	for i, want := range []string{"f.txt" + stamp, "f.txt" + stamp + "-2"} {
		write(t, p.host, "f.txt", "user "+string(rune('1'+i)))
		write(t, p.guest, "f.txt", "agent "+string(rune('1'+i)))
		p.sync(t)
		if got := read(p.host, want); got != "agent "+string(rune('1'+i)) {
			t.Fatalf("conflict %d: host %s = %q", i+1, want, got)
		}
	}
	if read(p.host, "f.txt"+stamp) != "agent 1" || read(p.guest, "f.txt"+stamp) != "agent 1" {
		t.Fatal("the first conflict copy was replaced")
	}
	// Both sides edit a copy: its copy is named after f.txt.
	write(t, p.host, "f.txt"+stamp, "user edits the copy")
	write(t, p.guest, "f.txt"+stamp, "agent edits the copy")
	p.sync(t)
	if got := read(p.host, "f.txt"+stamp+"-3"); got != "agent edits the copy" {
		t.Fatalf("the copy's copy: %q (copies: %v)", got, conflictCopies(t, p.host))
	}
	if read(p.host, "f.txt"+stamp) != "user edits the copy" {
		t.Fatal("the user's edit of a conflict copy was overwritten")
	}
	if cc := conflictCopies(t, p.host); len(cc) != 3 {
		t.Fatalf("host copies: %v", cc)
	}
	// A name taken on the guest alone is not reused either.
	write(t, p.guest, "g.txt"+stamp, "the agent's own file")
	write(t, p.host, "g.txt", "base")
	p.sync(t)
	write(t, p.host, "g.txt", "user")
	write(t, p.guest, "g.txt", "agent")
	p.sync(t)
	if read(p.host, "g.txt"+stamp) != "the agent's own file" || read(p.host, "g.txt"+stamp+"-2") != "agent" {
		t.Fatalf("g.txt copies: %v", conflictCopies(t, p.host))
	}
}

// savesFirst is a side on which someone saves path just before the sync
// changes it there: after the pass looked, before its change lands.
type savesFirst struct {
	Side
	path string
	save func()
}

func (s *savesFirst) hook(p string) {
	if p == s.path && s.save != nil {
		s.save()
		s.save = nil
	}
}

func (s *savesFirst) Write(ctx context.Context, p string, mode fs.FileMode, r io.Reader, hash string, was *Entry) (string, error) {
	s.hook(p)
	return s.Side.Write(ctx, p, mode, r, hash, was)
}

func (s *savesFirst) Remove(ctx context.Context, p string, was *Entry) error {
	s.hook(p)
	return s.Side.Remove(ctx, p, was)
}

// savesFirstBatch is savesFirst for the guest as the real agent is, a
// BatchSide: the save comes as the batch starts.
type savesFirstBatch struct{ *savesFirst }

func (s savesFirstBatch) Put(ctx context.Context, items []PutItem) (map[string]error, error) {
	for _, it := range items {
		s.hook(it.Entry.Path)
	}
	return busyBatch{&busyFile{HostSide: s.Side.(*HostSide)}}.Put(ctx, items)
}

// One side's change synced over a file the other side saves meanwhile
// (after the pass's scan, before the change lands) must not erase that
// save: the user who saves shared.txt as the agent's version arrives
// keeps their edit, and the agent's goes beside it on the next pass; an
// agent that writes as the user's version is sent in keeps its work the
// same way. Deletions too. Before the was check, each lost the save.
func TestSaveDuringSyncIsKept(t *testing.T) {
	const f = "shared.txt"
	for _, c := range []struct {
		name   string
		from   string // the side whose change the pass brings over
		delete bool   // that change is a deletion
		batch  bool   // the guest takes writes in batches (the real agent)
	}{
		{"agent's edit over the user's save", "guest", false, false},
		{"agent's deletion over the user's save", "guest", true, false},
		{"user's edit over the agent's save", "host", false, false},
		{"user's edit over the agent's save, batch guest", "host", false, true},
		{"user's deletion over the agent's save", "host", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, Options{})
			src, dst := p.guest, p.host
			if c.from == "host" {
				src, dst = p.host, p.guest
			}
			const saved = "saved on the other side\n"
			saver := &savesFirst{path: f}
			plain := func(h *HostSide) Side { return h }
			wrap := func(h *HostSide) Side {
				saver.Side = h
				if c.batch {
					return savesFirstBatch{saver}
				}
				return saver
			}
			wrapHost, wrapGuest := wrap, plain // the save is on the side written to
			if c.from == "host" {
				wrapHost, wrapGuest = plain, wrap
			}
			e := p.engineSides(t, nil, Options{}, wrapHost, wrapGuest)
			write(t, p.host, f, "v1\n")
			syncQuiet(t, e)
			if read(p.guest, f) != "v1\n" {
				t.Fatal("not in step at the start")
			}

			change := "the change\n"
			if c.delete {
				change = ""
				os.Remove(filepath.Join(src, f))
			} else {
				write(t, src, f, change)
			}
			saver.save = func() { write(t, dst, f, saved) }
			syncQuiet(t, e)
			if saver.save != nil {
				t.Fatal("the pass never changed the file: the test tests nothing")
			}
			if got := read(dst, f); got != saved {
				t.Fatalf("the save was lost: %q", got)
			}
			syncQuiet(t, e)
			syncQuiet(t, e)
			// Nothing lost: the save and the change are both on the host,
			// the host's version at f on both sides.
			onHost := map[string]bool{read(p.host, f): true}
			for _, cp := range conflictCopies(t, p.host) {
				onHost[read(p.host, cp)] = true
			}
			if !onHost[saved] || (change != "" && !onHost[change]) {
				t.Fatalf("lost a version: the host holds %v", onHost)
			}
			if h, g := read(p.host, f), read(p.guest, f); h != g {
				t.Fatalf("not in step: host %q, guest %q", h, g)
			}
		})
	}
}

// A file edited while a pass copies it is the next pass's work, not an
// error for 'sync status' to show ("errors: changed while being copied"
// after a routine edit); only a file changing during every pass, from the
// staleReport-th in a row, is reported.
func TestChangedWhileCopiedIsNoError(t *testing.T) {
	const f = "notes.txt"
	p := newPair(t, Options{})
	n := 0
	busy := &busyFile{path: f, hook: func() { n++; write(t, p.host, f, strings.Repeat("edited\n", n)) }}
	e := p.engineSides(t, nil, Options{}, func(h *HostSide) Side { busy.HostSide = h; return busy }, func(h *HostSide) Side { return h })
	write(t, p.host, f, "first\n")
	pass := func() {
		t.Helper()
		if err := e.Sync(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	busy.reads = 1
	pass()
	if errs := e.Status().Errors; len(errs) != 0 {
		t.Fatalf("one edit during a copy: errors %q", errs)
	}
	busy.reads = 0
	pass()
	if h, g := read(p.host, f), read(p.guest, f); h != g {
		t.Fatalf("not in step after the next pass: host %q, guest %q", h, g)
	}
	for i := 0; i < staleReport; i++ {
		busy.reads = 1
		write(t, p.host, f, fmt.Sprintf("again %d\n", i))
		pass()
	}
	if errs := e.Status().Errors; len(errs) != 1 || !strings.Contains(errs[0], errChanged.Error()) || !strings.Contains(errs[0], "passes in a row") {
		t.Fatalf("a file changing during every pass: errors %q", errs)
	}
}
