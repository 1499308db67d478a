package wsync

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// agentKeepsWriting is a guest side whose agent rewrites path every time
// the sync is about to write it (a log the agent appends to, or a hostile
// guest): the write lands stale.
type agentKeepsWriting struct {
	*HostSide
	dir, path string
	n         int
}

func (a *agentKeepsWriting) Write(ctx context.Context, p string, mode fs.FileMode, r io.Reader, hash string, was *Entry) (string, error) {
	if p == a.path {
		a.n++
		os.WriteFile(filepath.Join(a.dir, p), []byte(fmt.Sprintf("agent v%d\n", a.n)), 0o644)
	}
	return a.HostSide.Write(ctx, p, mode, r, hash, was)
}

// REDTEAM 1: a conflict whose putGuest lands stale is redone on every
// pass: one new conflict copy on the host per pass, silently (ErrStale is
// not a failure), until the quota. Before 91812d2 the host's version
// replaced the guest's at once and there was one copy.
func TestRedteamStaleConflictCopiesPileUp(t *testing.T) {
	p := newPair(t, Options{})
	ag := &agentKeepsWriting{dir: p.guest, path: "f.txt"}
	e := p.engineSides(t, nil, Options{}, func(h *HostSide) Side { return h },
		func(g *HostSide) Side { ag.HostSide = g; return ag })
	write(t, p.host, "f.txt", "base\n")
	syncQuiet(t, e)
	write(t, p.host, "f.txt", "user edit\n")
	write(t, p.guest, "f.txt", "agent edit\n")
	for i := 0; i < 5; i++ {
		if err := e.Sync(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	cps := conflictCopies(t, p.host)
	st := e.Status()
	t.Logf("host conflict copies: %v; status errors %v; conflicts reported %d", cps, st.Errors, len(st.Conflicts))
	if len(cps) > 1 {
		t.Fatalf("%d conflict copies of one file after 5 passes (the user's edit never reached the guest; nothing in status errors)", len(cps))
	}
	if read(p.host, "f.txt") != "user edit\n" {
		t.Fatalf("the user's edit is gone from the host: %q", read(p.host, "f.txt"))
	}
	// Stale on every pass is said, not kept quiet.
	if len(st.Errors) == 0 || !strings.Contains(st.Errors[len(st.Errors)-1], "passes in a row") {
		t.Fatalf("a path stale on every pass is not reported: %v", st.Errors)
	}
	// Once the agent stops, the conflict resolves: one copy, the
	// agent's last version in it.
	ag.path = ""
	e.Sync(context.Background(), nil)
	e.Sync(context.Background(), nil)
	cps = conflictCopies(t, p.host)
	if len(cps) != 1 || read(p.host, "f.txt") != "user edit\n" || read(p.guest, "f.txt") != "user edit\n" || !strings.HasPrefix(read(p.host, cps[0]), "agent v") {
		t.Fatalf("after the agent stopped: copies %v, host %q, guest %q", cps, read(p.host, "f.txt"), read(p.guest, "f.txt"))
	}
}

// REDTEAM 3: Root.still checks rel by resolving its parent again, while
// the rename lands in the parent descriptor opened before the copy: when
// the folder is moved and recreated meanwhile, the check looks at one
// directory and the write lands in another, over a user's edit.
func TestRedteamStillChecksAnotherDirectory(t *testing.T) {
	ws := t.TempDir()
	r, err := OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	write(t, ws, "d/f", "v1\n")
	was, err := r.Stat("d/f")
	if err != nil {
		t.Fatal(err)
	}
	src := &hookedReader{ReadCloser: io.NopCloser(strings.NewReader("agent\n")), hook: func() {
		write(t, ws, "d/f", "user edit\n")                            // the user's save...
		os.Rename(filepath.Join(ws, "d"), filepath.Join(ws, "d.old")) // ...then a folder move
		write(t, ws, "d/f", "v1\n")                                   // and a fresh copy of the old version
	}}
	_, err = r.WriteFile("d/f", 0o644, src, 1<<20, "", was)
	t.Logf("WriteFile: %v", err)
	if got := read(ws, "d.old/f"); got != "user edit\n" {
		t.Fatalf("the user's save in d.old/f was overwritten with %q although the check passed on d/f", got)
	}
}

// REDTEAM 4: a host file this user cannot read is left out of the scan
// (OnSkip), so the gate writes the guest's file there with was = nil;
// Root.still sees a file (Lstat, no hash) and answers ErrStale, which the
// engine drops: the guest's file never lands, on every pass, and nothing
// says so (no error, not held, not skipped). Run as a non-root user.
func TestRedteamUnreadableHostFileSilentlyStale(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("needs a user DAC applies to")
	}
	p := newPair(t, Options{})
	write(t, p.host, "secret.key", "not yours\n")
	os.Chmod(filepath.Join(p.host, "secret.key"), 0)
	write(t, p.guest, "secret.key", "the agent's key\n")
	for i := 0; i < 3; i++ {
		if err := p.e.Sync(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	st := p.e.Status()
	n, why := p.e.PassFailures()
	t.Logf("errors %v held %v skipped %v passFailures %d %v", st.Errors, st.Held, st.Skipped, n, why)
	if len(st.Errors) == 0 && len(st.Held) == 0 && len(st.Skipped) == 0 && n == 0 {
		t.Fatal("the guest's secret.key never reaches the host and nothing reports it")
	}
}

// Check (expected to pass): a stale write of an earlier git step still
// holds the later steps of the same repository for the pass.
func TestRedteamGitOrderUnderStale(t *testing.T) {
	p := newPair(t, Options{})
	obj := ".git/objects/bb/" + strings.Repeat("b", 38)
	for _, dir := range []string{p.host, p.guest} {
		write(t, dir, ".git/HEAD", "ref: refs/heads/main\n")
		write(t, dir, ".git/refs/heads/main", "aaaa\n")
		write(t, dir, ".git/index", "index A")
		write(t, dir, obj, "object v1")
	}
	saver := &savesFirst{path: obj}
	e := p.engineSides(t, nil, Options{}, func(h *HostSide) Side { saver.Side = h; return saver }, func(g *HostSide) Side { return g })
	syncQuiet(t, e)
	write(t, p.guest, obj, "object v2")
	write(t, p.guest, ".git/refs/heads/main", "bbbb\n")
	write(t, p.guest, ".git/index", "index B")
	saver.save = func() { write(t, p.host, obj, "host git's object") }
	syncQuiet(t, e)
	if saver.save != nil {
		t.Fatal("hook not run")
	}
	if got := read(p.host, ".git/refs/heads/main"); got != "aaaa\n" {
		t.Fatalf("the ref went ahead of a stale object: %q", got)
	}
	if got := read(p.host, ".git/index"); got != "index A" {
		t.Fatalf("the index went ahead of a stale object: %q", got)
	}
}

type writeOnlyHook struct{ *savesFirst }

func (w writeOnlyHook) Remove(ctx context.Context, p string, was *Entry) error {
	return w.Side.Remove(ctx, p, was)
}

// Check (expected to pass): the gate's type change (remove, then write
// over nothing) keeps a user's save made before the removal or between
// the removal and the write.
func TestRedteamTypeChangeKeepsSaves(t *testing.T) {
	for _, at := range []string{"remove", "write"} {
		t.Run(at, func(t *testing.T) {
			p := newPair(t, Options{})
			write(t, p.host, "a", "a\n")
			write(t, p.guest, "a", "a\n")
			os.Symlink("a", filepath.Join(p.host, "l"))
			os.Symlink("a", filepath.Join(p.guest, "l"))
			saver := &savesFirst{path: "l"}
			wrap := func(h *HostSide) Side { saver.Side = h; return saver }
			if at == "write" {
				wrap = func(h *HostSide) Side { saver.Side = h; return writeOnlyHook{saver} }
			}
			e := p.engineSides(t, nil, Options{}, wrap, func(g *HostSide) Side { return g })
			syncQuiet(t, e)
			os.Remove(filepath.Join(p.guest, "l"))
			write(t, p.guest, "l", "agent's file\n")
			saver.save = func() {
				os.Remove(filepath.Join(p.host, "l"))
				write(t, p.host, "l", "user's file\n")
			}
			syncQuiet(t, e)
			if saver.save != nil {
				t.Fatal("hook not run")
			}
			if got := read(p.host, "l"); got != "user's file\n" {
				t.Fatalf("user's save lost: %q", got)
			}
		})
	}
}

// Check (expected to pass): still never follows a link nor opens a FIFO
// or device: a path swapped for a link to /dev/zero or a FIFO answers at
// once, and nothing outside is touched.
func TestRedteamStillFollowsNothing(t *testing.T) {
	ws := t.TempDir()
	r, _ := OpenRoot(ws)
	defer r.Close()
	write(t, ws, "f", "v1")
	was, _ := r.Stat("f")
	os.Remove(filepath.Join(ws, "f"))
	os.Symlink("/dev/zero", filepath.Join(ws, "f"))
	if _, err := r.WriteFile("f", 0o644, strings.NewReader("x"), 10, "", was); err == nil {
		t.Fatal("wrote over a link that was a file")
	} else {
		t.Log(err)
	}
	os.Remove(filepath.Join(ws, "f"))
	if err := syscall.Mkfifo(filepath.Join(ws, "f"), 0o644); err != nil {
		t.Skip(err)
	}
	if _, err := r.WriteFile("f", 0o644, strings.NewReader("x"), 10, "", was); err == nil {
		t.Fatal("wrote over a FIFO")
	} else {
		t.Log(err)
	}
	if err := r.Remove("f", was); err == nil {
		t.Fatal("removed a FIFO as the file")
	}
	os.Remove(filepath.Join(ws, "f"))
	os.Mkdir(filepath.Join(ws, "out"), 0o755)
	os.Symlink(filepath.Join(ws, "out"), filepath.Join(ws, "d"))
	if err := r.Remove("d/x", nil); err == nil {
		t.Log("Remove through a linked parent: nil (parent refused?)")
	}
}
