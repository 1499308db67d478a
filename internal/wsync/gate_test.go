//go:build linux

package wsync

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// checkpoint copies the guest's tree aside, as a checkpoint keeps its disk.
func (p *pair) checkpoint(t *testing.T) string {
	snap := filepath.Join(t.TempDir(), "snap")
	copyTree(t, p.guest, snap)
	return snap
}

// rewind puts snap back as the guest's tree and merges the host folder,
// with an engine started from the manifest before the rewind.
func (p *pair) rewind(t *testing.T, snap string, opts Options) *Engine {
	t.Helper()
	pre := p.e.Manifest()
	copyTree(t, snap, p.guest)
	e := p.engine(t, pre, opts)
	if err := e.Rewind(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

// A rewind brings back to the host only what passes the gate: files the
// guest wrote that were held stay held (issue 9, attack 1).
func TestRewindKeepsHeldFilesHeld(t *testing.T) {
	p := newPair(t, Options{})
	write(t, p.host, ".git/HEAD", "ref: refs/heads/main\n")
	write(t, p.host, ".git/hooks/README", "sample")
	p.sync(t)
	evil := []string{".git/hooks/pre-commit", ".envrc", ".vscode/tasks.json"}
	for _, f := range evil {
		write(t, p.guest, f, "#!/bin/sh\ntouch /tmp/pwned\n")
	}
	write(t, p.guest, "notes.txt", "fine")
	p.sync(t)
	snap := p.checkpoint(t)
	write(t, p.guest, "later.txt", "after the checkpoint")
	p.sync(t)
	e := p.rewind(t, snap, Options{})
	for _, f := range evil {
		if exists(p.host, f) {
			t.Errorf("the rewind wrote held %s to the host", f)
		}
	}
	held := map[string]bool{}
	for _, c := range e.Status().Held {
		held[c.Path] = true
	}
	for _, f := range evil {
		if !held[f] {
			t.Errorf("%s not reported held after the rewind: %+v", f, e.Status().Held)
		}
	}
	if read(p.host, "notes.txt") != "fine" || exists(p.host, "later.txt") {
		t.Error("the rewind did not bring the host back to the checkpoint")
	}
}

// In review mode a rewind writes nothing of the agent's without apply.
func TestRewindInReviewMode(t *testing.T) {
	p := newPair(t, Options{Review: true})
	write(t, p.host, "app.py", "v1")
	p.sync(t)
	write(t, p.guest, "new.txt", "agent")
	write(t, p.guest, "app.py", "v2")
	p.sync(t)
	snap := p.checkpoint(t)
	e := p.rewind(t, snap, Options{Review: true})
	if exists(p.host, "new.txt") || read(p.host, "app.py") != "v1" {
		t.Fatal("a rewind in review mode wrote the agent's files to the host")
	}
	// app.py: the host's is the user's version; it stays (and goes into
	// the guest, reported). new.txt waits for review.
	if pend := e.Status().Pending; len(pend) != 1 || pend[0].Path != "new.txt" {
		t.Fatalf("pending after the rewind: %+v", pend)
	}
	if _, err := e.Apply(context.Background(), nil, false); err != nil {
		t.Fatal(err)
	}
	if read(p.host, "new.txt") != "agent" {
		t.Fatal("apply after the rewind did not write")
	}
}

// Every git indirection is held: commondir, gitdir files, worktrees/,
// modules/, new repositories, HEADs that make bare repositories, hook
// paths and includes in config, and a config whose risky part comes after
// the first MiB (issue 9, attacks 2 and 3).
func TestGitIndirectionsHeld(t *testing.T) {
	p := newPair(t, Options{})
	base := "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://example.com/r\n"
	p.both(t, map[string]string{
		".git/HEAD":            "ref: refs/heads/main\n",
		".git/config":          base,
		"wt/.git":              "gitdir: ../gitdirs/wt\n",
		"gitdirs/wt/HEAD":      "ref: refs/heads/wt\n",
		"gitdirs/wt/commondir": "../../shared\n",
		"shared/config":        base,
	})
	p.sync(t)
	huge := base + strings.Repeat("# padding\n", (MaxGitConfig/10)+1) + "[core]\n\tfsmonitor = touch /tmp/pwned\n"
	cases := map[string]string{
		".git/commondir":                    "../elsewhere\n",
		".git/worktrees/x/gitdir":           "/tmp/x\n",
		".git/worktrees/x/config.worktree":  "[core]\n\tfsmonitor = evil\n",
		".git/modules/sub/config":           "[core]\n\tfsmonitor = evil\n",
		".git/modules/sub/hooks/post-merge": "evil",
		".git/info/attributes":              "* filter=evil",
		".git/objects/info/alternates":      "/home/user/other/.git/objects\n",
		".git/sharedindex.0123":             "x",
		"sub/.git":                          "gitdir: ../evil\n",
		"newrepo/.git/HEAD":                 "ref: refs/heads/main\n",
		"newrepo/.git/config":               "[core]\n\tfsmonitor = evil\n",
		"bare/HEAD":                         "ref: refs/heads/main\n",
		"gitdirs/wt/config":                 "[core]\n\tfsmonitor = evil\n",
		"gitdirs/wt/hooks/pre-commit":       "evil",
		"shared/hooks/pre-commit":           "evil",
		".GIT/hooks/pre-push":               "evil",
	}
	for f, c := range cases {
		write(t, p.guest, f, c)
	}
	// Config changes git would obey.
	write(t, p.guest, "shared/config", base+"[core]\n\thooksPath = /tmp/evil\n")
	p.sync(t)
	write(t, p.guest, ".git/config", huge)
	p.sync(t)
	held := map[string]string{}
	for _, c := range p.e.Status().Held {
		held[c.Path] = c.Why
	}
	for f := range cases {
		if exists(p.host, f) && f != ".GIT/hooks/pre-push" {
			t.Errorf("%s reached the host", f)
		}
		if _, ok := held[f]; !ok {
			t.Errorf("%s is not held: %v", f, held)
		}
	}
	if strings.Contains(read(p.host, "shared/config"), "hooksPath") {
		t.Error("a commondir's config with core.hooksPath reached the host")
	}
	if strings.Contains(read(p.host, ".git/config"), "fsmonitor") {
		t.Error("a config over 1 MiB with core.fsmonitor at its end reached the host")
	}
	if !strings.Contains(held[".git/config"], "1 MiB") {
		t.Errorf(".git/config held for %q", held[".git/config"])
	}
	// An include is held too, as is a remote the config does not know.
	for _, c := range []string{base + "[include]\n\tpath = ../x\n", base + "[branch \"main\"]\n\tremote = ../evil\n"} {
		write(t, p.guest, ".git/config", c)
		p.sync(t)
		if read(p.host, ".git/config") != base {
			t.Errorf("config reached the host:\n%s", c)
		}
	}
	// The allow-list lets a commit through.
	obj := ".git/objects/ab/" + strings.Repeat("c", 38)
	write(t, p.guest, obj, "blob")
	write(t, p.guest, ".git/refs/heads/main", strings.Repeat("a", 40)+"\n")
	write(t, p.guest, ".git/logs/HEAD", "log")
	write(t, p.guest, ".git/index", "index")
	write(t, p.guest, ".git/ORIG_HEAD", "x")
	p.sync(t)
	for _, f := range []string{obj, ".git/refs/heads/main", ".git/logs/HEAD", ".git/index", ".git/ORIG_HEAD"} {
		if !exists(p.host, f) {
			t.Errorf("%s (allowed) did not reach the host", f)
		}
	}
}

// Links that chain out of the folder, in either order, and a link swapped
// for a folder, never leave it (issue 9, attack 4).
func TestLinkChainsStayInside(t *testing.T) {
	for _, order := range []string{"up first", "escape first"} {
		t.Run(order, func(t *testing.T) {
			p := newPair(t, Options{})
			write(t, p.host, "a/b/c/keep", "x")
			p.sync(t)
			mk := func(target, at string) {
				if err := os.Symlink(target, filepath.Join(p.guest, at)); err != nil {
					t.Fatal(err)
				}
				p.sync(t)
			}
			if order == "up first" {
				mk("../..", "a/b/c/up")
				mk("a/b/c/up/../../x", "escape")
			} else {
				mk("a/b/c/up/../../x", "escape")
				mk("../..", "a/b/c/up")
			}
			assertLinksInside(t, p.host)
			if len(p.e.Status().Held) != 1 {
				t.Fatalf("want one link held: %+v", p.e.Status().Held)
			}
		})
	}
	t.Run("link then folder", func(t *testing.T) {
		p := newPair(t, Options{})
		p.sync(t)
		os.MkdirAll(filepath.Join(p.guest, "d/e"), 0o755)
		os.Symlink("d/e/../../x", filepath.Join(p.guest, "l")) // lexically "x"
		p.sync(t)
		// Swap d/e for a link to somewhere deep, then for a folder again.
		os.RemoveAll(filepath.Join(p.guest, "d/e"))
		os.MkdirAll(filepath.Join(p.guest, "d/f/g"), 0o755)
		os.Symlink("f/g", filepath.Join(p.guest, "d/e"))
		p.sync(t)
		assertLinksInside(t, p.host)
		if fi, err := os.Lstat(filepath.Join(p.host, "d/e")); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			t.Fatal("a link was made on the way of another link")
		}
	})
	t.Run("to a user's link out", func(t *testing.T) {
		p := newPair(t, Options{})
		os.Symlink("/etc", filepath.Join(p.host, "userlink"))
		p.e.Sync(context.Background(), nil) // the test's guest refuses the link out
		os.Symlink("userlink", filepath.Join(p.guest, "via"))
		os.Symlink("userlink/passwd", filepath.Join(p.guest, "via2"))
		p.e.Sync(context.Background(), nil)
		if exists(p.host, "via") || exists(p.host, "via2") {
			t.Fatal("a link through the user's link out of the folder was made")
		}
	})
}

// assertLinksInside resolves every link in dir with the kernel, beneath
// dir: none may lead out of it.
func assertLinksInside(t *testing.T, dir string) {
	t.Helper()
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if escapes(fd, rel) {
			l, _ := os.Readlink(p)
			t.Errorf("link %s -> %s leads out of the folder", rel, l)
		}
		return nil
	})
}

// The guest's sparse file keeps its holes on the host; the quota stops
// the sync writing more than it allows, and says so (issue 9, attack 7).
func TestSparseAndQuota(t *testing.T) {
	p := newPair(t, Options{QuotaBytes: 120 << 20, QuotaFiles: 50})
	p.sync(t)
	for i := range 3 {
		f, err := os.Create(filepath.Join(p.guest, fmt.Sprintf("sparse%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte("end"), 40<<20-3)
		f.Close()
	}
	p.e.Sync(context.Background(), nil)
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(p.host, "sparse0"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 40<<20 || st.Blocks*512 > 1<<20 {
		t.Fatalf("sparse file on the host: size %d, %d bytes allocated", st.Size, st.Blocks*512)
	}
	if read(p.host, "sparse0")[40<<20-3:] != "end" {
		t.Fatal("content lost")
	}
	// 3 × 40 MiB fit in 120 MiB; one more does not.
	f, _ := os.Create(filepath.Join(p.guest, "one-more"))
	f.Truncate(1 << 20)
	f.Close()
	p.e.Sync(context.Background(), nil)
	if exists(p.host, "one-more") {
		t.Fatal("the byte quota did not stop a write")
	}
	st2 := p.e.Status()
	if st2.Quota.Refused == 0 || !strings.Contains(strings.Join(st2.Skipped, "\n"), "sync quota") || st2.Quota.Bytes != 120<<20 {
		t.Fatalf("quota not reported: %+v skipped %v", st2.Quota, st2.Skipped)
	}
	// Deleting inside frees the quota.
	os.Remove(filepath.Join(p.guest, "sparse1"))
	p.e.Sync(context.Background(), nil)
	p.e.Sync(context.Background(), nil)
	if !exists(p.host, "one-more") {
		t.Fatal("the quota did not free up after a delete")
	}
	// The file quota.
	for i := range 60 {
		write(t, p.guest, fmt.Sprintf("many/%d", i), "x")
	}
	p.e.Sync(context.Background(), nil)
	if n := p.e.Status().Quota.Files; n > 50 {
		t.Fatalf("%d files of the guest's on the host, quota 50", n)
	}
}

// tombFiles: issue 9 saw 10,003 tombstones after 5,000 files created and
// deleted twice; 2,000 show the same and keep go test quick.
var tombFiles = 2000

// Files created and deleted twice leave no tombstones behind (issue 9,
// attack 10).
func TestTombstonesBounded(t *testing.T) {
	p := newPair(t, Options{})
	p.sync(t)
	for range 2 {
		for i := range tombFiles {
			write(t, p.guest, fmt.Sprintf("d/%d", i), "x")
		}
		p.sync(t)
		os.RemoveAll(filepath.Join(p.guest, "d"))
		p.sync(t)
	}
	tombs := 0
	for _, e := range p.saved {
		if e.Type == 'x' {
			tombs++
		}
	}
	if tombs > 10 {
		t.Fatalf("%d tombstones after the agent's creates and deletes", tombs)
	}
	// The user's deletions are kept, capped.
	for i := range 20 {
		write(t, p.host, fmt.Sprintf("u/%d", i), "x")
	}
	p.sync(t)
	os.RemoveAll(filepath.Join(p.host, "u"))
	p.sync(t)
	tombs = 0
	for _, e := range p.saved {
		if e.Type == 'x' && e.Origin == "host" {
			tombs++
		}
	}
	if tombs != 21 {
		t.Fatalf("%d tombstones of the user's deletions, want 21", tombs)
	}
}

// escapes reports whether rel, resolved by the kernel beneath the folder
// fd, leaves it (openat2 RESOLVE_BENEATH fails with EXDEV).
func escapes(fd int, rel string) bool {
	lfd, err := unix.Openat2(fd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH})
	if err == nil {
		unix.Close(lfd)
	}
	return err == unix.EXDEV
}

// A fetch inside updates remote-tracking refs beside refs/remotes/*/HEAD:
// those HEADs are refs, not repositories, and the refs next to them cross.
func TestRemoteRefsNextToHEADCross(t *testing.T) {
	p := newPair(t, Options{})
	p.both(t, map[string]string{
		".git/HEAD":                     "ref: refs/heads/main\n",
		".git/refs/remotes/origin/HEAD": "ref: refs/remotes/origin/main\n",
		".git/logs/HEAD":                "x\n",
	})
	p.sync(t)
	write(t, p.guest, ".git/refs/remotes/origin/main", strings.Repeat("a", 40)+"\n")
	write(t, p.guest, ".git/logs/refs/remotes/origin/main", "log\n")
	p.sync(t)
	if !exists(p.host, ".git/refs/remotes/origin/main") || !exists(p.host, ".git/logs/refs/remotes/origin/main") {
		t.Fatalf("remote-tracking refs held: %+v", p.e.Status().Held)
	}
}

// The host's own git config names folders and scripts of the workspace
// that git runs (core.hooksPath, includes, fsmonitor, filters, aliases):
// guest changes there are held, as are links in place of their folders.
func TestHostGitConfigNamesHeld(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	p := newPair(t, Options{})
	cfg := "[core]\n\thooksPath = tools/hooks\n\tfsmonitor = \"scripts/fsmon.sh\"\n" +
		"[include]\n\tpath = ../team.gitconfig\n" +
		"[filter \"lfsx\"]\n\tclean = ./bin/clean %f\n" +
		"[alias]\n\tup = !sh ci/up.sh --fast\n" +
		"[remote \"origin\"]\n\turl = https://example.com/r\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n" +
		"[branch \"main\"]\n\tmerge = refs/heads/main\n"
	p.both(t, map[string]string{
		".git/HEAD":       "ref: refs/heads/main\n",
		".git/config":     cfg,
		"tools/readme.md": "tools\n",
	})
	p.sync(t)
	heldWant := []string{"tools/hooks/pre-commit", "scripts/fsmon.sh", "team.gitconfig", "bin/clean", "ci/up.sh"}
	for _, f := range heldWant {
		write(t, p.guest, f, "#!/bin/sh\ntouch /tmp/pwned\n")
	}
	write(t, p.guest, "tools/other.txt", "fine\n")
	write(t, p.guest, "refs/heads/main", "not a ref, a plain file\n")
	p.sync(t)
	st := p.e.Status()
	held := map[string]string{}
	for _, h := range st.Held {
		held[h.Path] = h.Why
	}
	for _, f := range heldWant {
		if exists(p.host, f) {
			t.Errorf("%s reached the host", f)
		}
		if !strings.Contains(held[f], ".git/config") {
			t.Errorf("%s: held %q, want a reason naming .git/config", f, held[f])
		}
	}
	for _, f := range []string{"tools/other.txt", "refs/heads/main"} {
		if !exists(p.host, f) {
			t.Errorf("%s did not cross (held: %q)", f, held[f])
		}
	}
	// A link in place of the hooks folder's parent would move it.
	os.RemoveAll(filepath.Join(p.guest, "ci"))
	if err := os.Symlink("tools", filepath.Join(p.guest, "ci")); err != nil {
		t.Fatal(err)
	}
	p.sync(t)
	if fi, err := os.Lstat(filepath.Join(p.host, "ci")); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		t.Error("a link replaced a folder the host's git config names")
	}

	// The user's global config, relative to every work tree.
	write(t, os.Getenv("HOME"), ".gitconfig", "[core]\n\thooksPath = myhooks\n")
	write(t, p.guest, "myhooks/post-checkout", "evil")
	p.sync(t)
	if exists(p.host, "myhooks/post-checkout") {
		t.Error("a hook in the global core.hooksPath reached the host")
	}
}

// Names with control characters would reach the user's terminal through
// ls or git status: held.
func TestControlCharacterNamesHeld(t *testing.T) {
	p := newPair(t, Options{})
	p.sync(t)
	bad := []string{"a\x1b]0;pwned\x07b", "d\x9bir/x", "tab\there", "del\x7f"}
	for _, n := range bad {
		write(t, p.guest, n, "x")
	}
	write(t, p.guest, "ok-ünïcode.txt", "x")
	p.sync(t)
	for _, n := range bad {
		if exists(p.host, n) {
			t.Errorf("%q reached the host", n)
		}
	}
	if !exists(p.host, "ok-ünïcode.txt") {
		t.Error("a plain Unicode name was held")
	}
}

func TestGitNamedPaths(t *testing.T) {
	cfg := "[core]\nhooksPath=hooks ; c\n[includeIf \"gitdir:~/w/\"]\n\tpath = x.inc\n[diff \"p\"]\n\ttextconv = 'tools/conv' --x\n" +
		"[url \"git@h:\"]\n\tinsteadOf = https://h/\n[core]\n\tfsmonitor = \"sc ri/fs.sh\" # the team's\n" +
		"[alias]\n\tx = !\"$(git rev-parse --show-toplevel)/scripts/x.sh\"\n\ty = !sh lint.sh\n[remote \"o\"]\n\turl = a/b\n\tuploadpack = ./up/pack\n"
	cfg += "[init]\n\tdefaultBranch = main\n[core]\n\tworktree = ../../sub\n[user]\n\tname = J Smith\n" +
		"[filter \"r\"]\n\tclean = lint --rules=scripts/r.py\n[alias]\n\tz = !$PWD/scripts/a.sh\n"
	var got []string
	for _, n := range gitNamedPaths([]byte(cfg)) {
		got = append(got, string(n.kind)+":"+n.value)
	}
	want := []string{"h:hooks", "i:x.inc", "w:tools/conv", "b:sc", "w:ri/fs.sh", "b:git", "b:rev-parse", "w:scripts/x.sh", "b:sh", "b:lint.sh", "w:./up/pack",
		"b:lint", "w:scripts/r.py", "w:scripts/a.sh"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	// Keys whose value git runs as a program, beyond the usual ones.
	more := "[core]\n\tgitProxy = tools/proxy.sh\n\talternateRefsCommand = tools/refs.sh\n[mergetool \"m\"]\n\tpath = tools/merge.sh\n" +
		"[difftool \"d\"]\n\tpath = tools/diff.sh\n[sendemail]\n\ttoCmd = tools/to.sh\n\tccCmd = tools/cc.sh\n" +
		"[gpg \"ssh\"]\n\tdefaultKeyCommand = tools/key.sh\n[submodule \"s\"]\n\tpath = libs/s\n"
	got = nil
	for _, n := range gitNamedPaths([]byte(more)) {
		got = append(got, string(n.kind)+":"+n.value)
	}
	want = []string{"w:tools/proxy.sh", "w:tools/refs.sh", "w:tools/merge.sh", "w:tools/diff.sh", "w:tools/to.sh", "w:tools/cc.sh", "w:tools/key.sh"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if v := gitValue(` "tools/hooks" # team hooks`); v != "tools/hooks" {
		t.Errorf("quoted value with a comment: %q", v)
	}
	if v := gitValue(`a\"b;c`); v != `a"b` {
		t.Errorf("escaped quote: %q", v)
	}
}

// growing is a guest whose files grow between the scan and the copy.
type growing struct {
	Side
	extra int64
}

func (g growing) Read(ctx context.Context, p string) (io.ReadCloser, error) {
	rc, err := g.Side.Read(ctx, p)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(rc, io.LimitReader(zeros{}, g.extra)), rc}, nil
}

// A file that grows while it is copied never lands bigger than the scan
// saw (and the quota counted): issue 9's quota bypass.
func TestGrowingFileKeepsQuota(t *testing.T) {
	p := newPair(t, Options{QuotaBytes: 8 << 20})
	p.sync(t)
	write(t, p.guest, "grows", "small\n")
	p.engineWith(t, p.e.Manifest(), Options{QuotaBytes: 8 << 20}, func(s Side) Side { return growing{s, 64 << 20} })
	p.e.Sync(context.Background(), nil)
	if fi, err := os.Stat(filepath.Join(p.host, "grows")); err == nil {
		t.Fatalf("a file that grew during the copy landed: %d bytes", fi.Size())
	}
	if st := p.e.Status(); st.Quota.Bytes > 8<<20 {
		t.Fatalf("quota bytes %d over the 8 MiB quota", st.Quota.Bytes)
	}
	if ents, _ := os.ReadDir(p.host); len(ents) != 0 {
		t.Fatalf("left on the host: %v", ents)
	}
}

// What the host's git reaches indirectly: an included config's hooksPath,
// a linked worktree's relative hooksPath, a hook that is a link to a
// script of the folder, a script an alias names without a slash.
func TestHostGitConfigIndirect(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("GIT_CONFIG_SYSTEM", "/dev/null")
	p := newPair(t, Options{})
	p.both(t, map[string]string{
		".git/HEAD":                    "ref: refs/heads/main\n",
		".git/config":                  "[include]\n\tpath = ../.gitconfig\n[alias]\n\tlint = !sh lint.sh\n",
		".gitconfig":                   "[core]\n\thooksPath = \"scripts/hooks\" # the team's hooks\n",
		"wt1/.git":                     "gitdir: ../.git/worktrees/wt1\n",
		".git/worktrees/wt1/HEAD":      "ref: refs/heads/wt1\n",
		".git/worktrees/wt1/commondir": "../..\n",
		"lint.sh":                      "echo lint\n",
		"tools/pre-push":               "echo push\n",
	})
	if err := os.Symlink("../../tools/pre-push", filepath.Join(p.host, ".git/hooks/pre-push")); err != nil {
		os.MkdirAll(filepath.Join(p.host, ".git/hooks"), 0o755)
		if err := os.Symlink("../../tools/pre-push", filepath.Join(p.host, ".git/hooks/pre-push")); err != nil {
			t.Fatal(err)
		}
	}
	p.sync(t)
	evil := []string{"scripts/hooks/pre-commit", "wt1/scripts/hooks/pre-commit", "lint.sh", "tools/pre-push", ".gitconfig"}
	for _, f := range evil {
		write(t, p.guest, f, "#!/bin/sh\ntouch /tmp/pwned\n")
	}
	p.sync(t)
	held := map[string]string{}
	for _, h := range p.e.Status().Held {
		held[h.Path] = h.Why
	}
	for _, f := range evil {
		if strings.Contains(read(p.host, f), "pwned") {
			t.Errorf("%s reached the host (held: %q)", f, held[f])
		}
		if held[f] == "" {
			t.Errorf("%s not reported held", f)
		}
	}
}

// lying is a guest that reports a size of its choosing for every file.
type lying struct {
	Side
	size int64
}

func (l lying) Scan(ctx context.Context, paths []string) (map[string]*Entry, error) {
	m, err := l.Side.Scan(ctx, paths)
	for _, e := range m {
		if e.Type == 'f' {
			e.Size = l.size
		}
	}
	return m, err
}

// Sizes come from the guest: none of them breaks the quota or the sync.
func TestGuestSizesNotTrusted(t *testing.T) {
	for _, size := range []int64{-1 << 40, 1<<63 - 1, 1<<63 - 4, 0} {
		p := newPair(t, Options{QuotaBytes: 1 << 20})
		write(t, p.guest, "f", strings.Repeat("x", 4096))
		p.engineWith(t, nil, Options{QuotaBytes: 1 << 20}, func(s Side) Side { return lying{s, size} })
		p.e.Sync(context.Background(), nil) // must not panic
		if st := p.e.Status(); st.Quota.Bytes < 0 || st.Quota.Bytes > 1<<20 {
			t.Errorf("size %d: quota bytes %d", size, st.Quota.Bytes)
		}
		if exists(p.host, "f") {
			t.Errorf("size %d: a file of 4096 bytes landed for a claimed %d", size, size)
		}
	}
}

// A link's text reaches a terminal through ls -l: no control characters.
func TestLinkTextControlCharactersHeld(t *testing.T) {
	p := newPair(t, Options{})
	p.sync(t)
	if err := os.Symlink("a\x1b]0;pwned\x07", filepath.Join(p.guest, "l")); err != nil {
		t.Fatal(err)
	}
	p.sync(t)
	if exists(p.host, "l") {
		t.Error("a link whose text has an escape sequence reached the host")
	}
}

// A deletion first, the guest's file in its place on a later pass: the
// deletions of a git config and of what it names are held too.
func TestDeletingWhatGitNamesHeld(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("GIT_CONFIG_SYSTEM", "/dev/null")
	p := newPair(t, Options{})
	p.both(t, map[string]string{
		".git/HEAD":   "ref: refs/heads/main\n",
		".git/config": "[core]\n\thooksPath = tools/hooks\n[alias]\n\tlint = !sh lint.sh\n",
		"lint.sh":     "echo lint\n",
	})
	p.sync(t)
	os.Remove(filepath.Join(p.guest, ".git/config"))
	os.Remove(filepath.Join(p.guest, "lint.sh"))
	p.sync(t)
	for _, f := range []string{".git/config", "lint.sh"} {
		if !exists(p.host, f) {
			t.Errorf("the guest's deletion of %s reached the host", f)
		}
	}
	write(t, p.guest, "tools/hooks/pre-commit", "evil")
	p.sync(t)
	if exists(p.host, "tools/hooks/pre-commit") {
		t.Error("a hook landed after the guest deleted the config naming its folder")
	}
}

// Review fixes of issue 9's containment pass: what the host's git reaches
// through a link text that leaves the folder and comes back by its name,
// through a repository above the folder whose .git is a link, and names
// of the ~user/ form.
func TestHostGitConfigReachesBack(t *testing.T) {
	t.Run("link text out and back in", func(t *testing.T) {
		gitEnv(t)
		p := newPair(t, Options{})
		p.both(t, map[string]string{
			".git/HEAD":   "ref: refs/heads/main\n",
			".git/config": "[core]\n\tbare = false\n",
			"tools/pc.sh": "echo ok\n",
		})
		os.MkdirAll(filepath.Join(p.host, ".git/hooks"), 0o755)
		back := "../../../" + filepath.Base(p.host) + "/tools/pc.sh"
		if err := os.Symlink(back, filepath.Join(p.host, ".git/hooks/pre-commit")); err != nil {
			t.Fatal(err)
		}
		p.e.Sync(context.Background(), nil) // the test's guest refuses the link out
		write(t, p.guest, "tools/pc.sh", "touch /tmp/pwned\n")
		p.e.Sync(context.Background(), nil)
		if strings.Contains(read(p.host, "tools/pc.sh"), "pwned") {
			t.Fatal("a hook reached through a link out and back in was overwritten")
		}
	})
	t.Run("repository above through a .git link", func(t *testing.T) {
		gitEnv(t)
		p := newPair(t, Options{})
		above := filepath.Dir(p.host)
		write(t, above, "real-git/HEAD", "ref: refs/heads/main\n")
		write(t, above, "real-git/config", "[core]\n\thooksPath = host/hooks2\n")
		if err := os.Symlink("real-git", filepath.Join(above, ".git")); err != nil {
			t.Fatal(err)
		}
		p.sync(t)
		write(t, p.guest, "hooks2/pre-commit", "touch /tmp/pwned\n")
		p.sync(t)
		if exists(p.host, "hooks2/pre-commit") {
			t.Fatal("a hook named by the config of a repository above (its .git a link) reached the host")
		}
	})
	t.Run("~user/", func(t *testing.T) {
		u, err := user.Current()
		if err != nil || u.HomeDir == "" {
			t.Skip("no current user:", err)
		}
		if got, want := abs("~"+u.Username+"/hooks", "/base"), filepath.Join(u.HomeDir, "hooks"); got != want {
			t.Errorf("~%s/hooks: %q, want %q", u.Username, got, want)
		}
		if got := abs("~no-such-user-kosa8/hooks", "/base"); got != "" {
			t.Errorf("an unknown user's home resolved to %q", got)
		}
		home, _ := os.UserHomeDir()
		if got := abs("~", "/base"); got != filepath.Clean(home) {
			t.Errorf("~: %q, want %q", got, home)
		}
	})
}

// The folder's git directory may lie outside it: the folder is a linked
// worktree, a --separate-git-dir checkout or a submodule, or is below one.
// git reads that repository's configs (the common directory's too) for
// the folder's work tree: what they name is held as if they were inside.
func TestGitDirOutsideFolderConfigsRead(t *testing.T) {
	cfg := "[core]\n\thooksPath = tools/hooks\n\tfsmonitor = scripts/fsmon.sh\n"
	for name, c := range map[string]struct {
		dotGit   string            // what the folder's .git file says ("" for none); BASE: the folder's parent
		aboveGit string            // the .git file of the folder's parent, if any
		files    map[string]string // outside the folder, below the base
	}{
		"linked worktree": {
			dotGit: "gitdir: BASE/main/.git/worktrees/ws",
			files: map[string]string{"main/.git/HEAD": "ref: refs/heads/main\n", "main/.git/config": cfg,
				"main/.git/worktrees/ws/HEAD": "ref: refs/heads/ws\n", "main/.git/worktrees/ws/commondir": "../..\n"},
		},
		"separate git dir, relative": {
			dotGit: "gitdir: ../sep.git",
			files:  map[string]string{"sep.git/HEAD": "ref: refs/heads/main\n", "sep.git/config": cfg},
		},
		"submodule": {
			dotGit: "gitdir: ../.git/modules/host",
			files: map[string]string{".git/HEAD": "ref: refs/heads/main\n", ".git/config": "[core]\n\tbare = false\n",
				".git/modules/host/HEAD": "ref: refs/heads/main\n", ".git/modules/host/config": cfg + "\tworktree = ../../../host\n"},
		},
		"below a linked worktree": {
			aboveGit: "gitdir: BASE/main/.git/worktrees/wt",
			files: map[string]string{"main/.git/HEAD": "ref: refs/heads/main\n",
				"main/.git/config":            "[core]\n\thooksPath = host/tools/hooks\n\tfsmonitor = host/scripts/fsmon.sh\n",
				"main/.git/worktrees/wt/HEAD": "ref: refs/heads/wt\n", "main/.git/worktrees/wt/commondir": "../..\n"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("HOME", t.TempDir())
			t.Setenv("GIT_CONFIG_SYSTEM", "/dev/null")
			p := newPair(t, Options{})
			base := filepath.Dir(p.host)
			for f, content := range c.files {
				write(t, base, f, content)
			}
			if c.aboveGit != "" {
				write(t, base, ".git", strings.ReplaceAll(c.aboveGit, "BASE", base)+"\n")
			}
			// A hook of the repository's is the user's link to a script of
			// the folder.
			gd := filepath.Join(base, "main/.git")
			if _, err := os.Stat(gd); err == nil {
				if err := os.Symlink(filepath.Join(p.host, "lint/pre-push.sh"), filepath.Join(gd, "hooks-link")); err != nil {
					t.Fatal(err)
				}
				os.MkdirAll(filepath.Join(gd, "hooks"), 0o755)
				os.Rename(filepath.Join(gd, "hooks-link"), filepath.Join(gd, "hooks", "pre-push"))
			}
			for _, d := range []string{p.host, p.guest} {
				if c.dotGit != "" {
					write(t, d, ".git", strings.ReplaceAll(c.dotGit, "BASE", base)+"\n")
				}
				write(t, d, "lint/pre-push.sh", "echo lint\n")
			}
			p.sync(t)
			evil := []string{"tools/hooks/pre-commit", "scripts/fsmon.sh"}
			if _, err := os.Stat(gd); err == nil {
				evil = append(evil, "lint/pre-push.sh")
			}
			for _, f := range evil {
				write(t, p.guest, f, "#!/bin/sh\ntouch /tmp/pwned\n")
			}
			write(t, p.guest, "ok.txt", "fine\n")
			p.sync(t)
			held := map[string]string{}
			for _, h := range p.e.Status().Held {
				held[h.Path] = h.Why
			}
			for _, f := range evil {
				if strings.Contains(read(p.host, f), "pwned") {
					t.Errorf("%s reached the host", f)
				}
				if held[f] == "" {
					t.Errorf("%s not reported held", f)
				}
			}
			if !exists(p.host, "ok.txt") {
				t.Errorf("an ordinary file did not cross (held: %v)", held)
			}
		})
	}
}

// core.worktree moves a repository's work tree elsewhere in the folder:
// git runs hooks there, and takes a relative hooksPath from there.
func TestCoreWorktreeHooksPathHeld(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("GIT_CONFIG_SYSTEM", "/dev/null")
	p := newPair(t, Options{})
	p.both(t, map[string]string{
		".git/HEAD":   "ref: refs/heads/main\n",
		".git/config": "[core]\n\tworktree = ../app\n\thooksPath = tools/hooks\n",
		"app/README":  "hi\n",
	})
	p.sync(t)
	write(t, p.guest, "app/tools/hooks/pre-commit", "#!/bin/sh\ntouch /tmp/pwned\n")
	p.sync(t)
	if exists(p.host, "app/tools/hooks/pre-commit") {
		t.Error("a hook in the hooksPath of core.worktree's work tree reached the host")
	}
}

// The user's global git config may itself be a file of the folder: a
// guest change to it would reach every git command on the host.
func TestGlobalGitConfigInFolderHeld(t *testing.T) {
	p := newPair(t, Options{})
	t.Setenv("HOME", p.host)
	t.Setenv("GIT_CONFIG_SYSTEM", "/dev/null")
	p.both(t, map[string]string{
		".git/HEAD":          "ref: refs/heads/main\n",
		".gitconfig":         "[user]\n\tname = u\n",
		".config/git/config": "[user]\n\tname = u\n",
	})
	p.sync(t)
	for _, f := range []string{".gitconfig", ".config/git/config"} {
		write(t, p.guest, f, "[core]\n\tfsmonitor = touch /tmp/pwned\n")
	}
	p.sync(t)
	for _, f := range []string{".gitconfig", ".config/git/config"} {
		if strings.Contains(read(p.host, f), "pwned") {
			t.Errorf("%s reached the host", f)
		}
	}
}
