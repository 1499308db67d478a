package wsync

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// diskLinks is a LinkView over a real folder, as the engine's over the
// host: Lstat asks the file system, Links are those made so far.
type diskLinks struct {
	r     *Root
	links map[string]string
}

func (d *diskLinks) Lstat(p string) (byte, string) {
	e, err := d.r.Lstat(p)
	if err != nil || e == nil {
		return 0, ""
	}
	return e.Type, e.Link
}

func (d *diskLinks) Links() map[string]string { return d.links }

// indexedLinks is diskLinks with the engine's link index: LinkWhy must
// answer through it exactly as through a walk of every link.
type indexedLinks struct {
	*diskLinks
	x *linkIndex
}

func (d indexedLinks) ThroughLink(p string) string { return d.x.throughLink(p) }

// FuzzLinkRule plays a script of link, folder and removal operations on a
// real folder, making links only where LinkWhy allows, and after every
// step resolves every link with the kernel: none may lead out. Scripts
// are lines "L path target", "D path", "R path".
func FuzzLinkRule(f *testing.F) {
	f.Add("D a/b/c\nL a/b/c/up ../..\nL escape a/b/c/up/../../x")
	f.Add("D a/b/c\nL escape a/b/c/up/../../x\nL a/b/c/up ../..")
	f.Add("D d/e\nL l d/e/../../x\nR d/e\nD d/f/g\nL d/e f/g")
	f.Add("L a b\nL b c/..\nL c ../x")
	f.Add("D a\nL a/l ..\nL m a/l/a/l/..")
	f.Add("L x y\nL y x\nL z x/..")
	f.Fuzz(func(t *testing.T, script string) {
		if len(script) > 2000 {
			return
		}
		base := t.TempDir()
		os.MkdirAll(filepath.Join(base, "x"), 0o755) // outside, so escapes resolve
		dir := filepath.Join(base, "root")
		os.Mkdir(dir, 0o755)
		r, err := OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		v := &diskLinks{r: r, links: map[string]string{}}
		iv := indexedLinks{v, newLinkIndex()}
		sc := bufio.NewScanner(strings.NewReader(script))
		for steps := 0; sc.Scan() && steps < 30; steps++ {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			p := f[1]
			if _, err := CleanRel(p); err != nil || strings.Count(p, "/") > 6 {
				continue
			}
			cur, _ := r.Lstat(p)
			switch f[0] {
			case "L":
				if len(f) < 3 {
					continue
				}
				why := LinkWhy(v, p, f[2])
				if iwhy := LinkWhy(iv, p, f[2]); (why == "") != (iwhy == "") {
					t.Fatalf("link %s -> %s: walking every link says %q, the index %q (links %v)", p, f[2], why, iwhy, v.links)
				}
				if why != "" {
					continue
				}
				if d := filepath.Dir(p); d != "." && r.MkdirAll(d, 0o755) != nil {
					continue
				}
				if cur != nil && cur.Type == 'd' {
					continue
				}
				if err := r.Symlink(p, f[2], Anything); err == nil {
					v.links[p] = f[2]
					iv.x.set(p, f[2], true)
				}
			case "D":
				if cur != nil && cur.Type != 'd' {
					if r.Remove(p, Anything) != nil {
						continue
					}
					delete(v.links, p)
					iv.x.set(p, "", false)
				}
				r.MkdirAll(p, 0o755)
			case "R":
				if r.Remove(p, Anything) == nil {
					delete(v.links, p)
					iv.x.set(p, "", false)
				}
			}
			fd, _ := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			for l, target := range v.links {
				lfd, err := unix.Openat2(fd, l, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH})
				if err == nil {
					unix.Close(lfd)
				}
				if err == unix.EXDEV {
					unix.Close(fd)
					t.Fatalf("after %q: link %s -> %s leads out of the folder (links %v)", sc.Text(), l, target, v.links)
				}
			}
			unix.Close(fd)
		}
	})
}

// FuzzHoldWhy checks the held-path decision against what git and host
// tools are known to run or obey: whatever else it says, those are never
// let through, and inside a git directory only the allow-list is.
func FuzzHoldWhy(f *testing.F) {
	for _, s := range []string{".git/hooks/pre-commit", ".GIT/HOOKS/x", "a/.git/commondir", ".git/objects/info/alternates",
		".git\u200c/config", "x/.git", ".envrc", "A/.VSCode/tasks.json", "sub/HEAD", ".git/objects/ab/cd", ".git/refs/heads/m",
		"gd/config", "gd/hooks/x", ".git/worktrees/w/commondir", ".git/modules/m/hooks/h"} {
		f.Add(s, byte('f'), true)
	}
	f.Fuzz(func(t *testing.T, p string, typ byte, hostHasDirs bool) {
		if _, err := CleanRel(p); err != nil {
			return
		}
		gitDirs := map[string]bool{"gd": true}
		why, cfg := HoldRules{}.holdWhy(p, typ, gitDirs, func(string) bool { return hostHasDirs })
		if why != "" {
			return
		}
		parts := strings.Split(p, "/")
		if slices.Contains(heldNames, foldName(parts[len(parts)-1])) {
			t.Fatalf("%s let through", p)
		}
		for i, c := range parts {
			if i < len(parts)-1 && slices.Contains(heldDirs, foldName(c)) {
				t.Fatalf("%s (in a settings folder) let through", p)
			}
			inGit := isDotGit(c) || gitDirs[strings.Join(parts[:i+1], "/")]
			if !inGit || i == len(parts)-1 {
				if isDotGit(c) && typ != 0 && (typ != 'd' || !hostHasDirs) {
					t.Fatalf("%s: a .git (type %q) let through", p, typ)
				}
				continue
			}
			if isDotGit(c) && !hostHasDirs && typ != 0 {
				t.Fatalf("%s: inside a new repository let through", p)
			}
			rest := parts[i+1:]
			first := rest[0]
			ok := slices.Contains([]string{"objects", "refs", "logs", "HEAD", "index", "packed-refs", "COMMIT_EDITMSG"}, first) ||
				first == "config" && len(rest) == 1 || strings.HasSuffix(first, "_HEAD") && len(rest) == 1
			if !ok {
				t.Fatalf("%s: %s is off the allow-list but was let through", p, strings.Join(rest, "/"))
			}
			if first == "config" && !cfg {
				t.Fatalf("%s: a git config let through without the config check", p)
			}
			if first == "objects" && slices.ContainsFunc(rest, func(s string) bool { return strings.Contains(foldName(s), "alternates") }) {
				t.Fatalf("%s: alternates let through", p)
			}
		}
		if typ != 0 && typ != 'd' && foldName(parts[len(parts)-1]) == "head" {
			in := false
			for i, c := range parts[:len(parts)-1] {
				in = in || isDotGit(c) || gitDirs[strings.Join(parts[:i+1], "/")]
			}
			if !in {
				t.Fatalf("%s: a HEAD outside a git directory let through", p)
			}
		}
	})
}

// FuzzGitConfigGit holds GitConfigHarmless to git's own reading: when it
// calls a change harmless, git itself must list the same keys and values
// in both files but for branch.*.remote/merge/rebase.
func FuzzGitConfigGit(f *testing.F) {
	git, err := exec.LookPath("git")
	base := "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://example.com/r\n"
	f.Add(base, base+"[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n")
	f.Add(base, base+"[branch \"main\"]\n\tremote = origin\n[core] fsmonitor = evil\n")
	f.Add(base, base+"[branch \"main\"]\n\tremote = origin ; x\n\trebase = true\n")
	f.Add(base, base+"[branch \"m\\\"] [core\"]\n\tmerge = refs/heads/m\n")
	f.Add(base, "\ufeff"+base+"[branch.main]\n\tremote = origin\n")
	f.Fuzz(func(t *testing.T, a, b string) {
		if !GitConfigHarmless([]byte(a), []byte(b)) || err != nil {
			return
		}
		list := func(s string) ([]string, bool) {
			dir := t.TempDir()
			p := filepath.Join(dir, "config")
			os.WriteFile(p, []byte(s), 0o600)
			cmd := exec.Command(git, "config", "-f", p, "--list", "-z") // key, newline, value: a subsection may hold "="
			cmd.Env = []string{"HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
			out, err := cmd.Output()
			if err != nil {
				return nil, false
			}
			var keep []string
			for _, l := range strings.Split(string(out), "\x00") {
				k, _, _ := strings.Cut(l, "\n")
				if l != "" && !harmlessGitKeys.MatchString(k) {
					keep = append(keep, l)
				}
			}
			// Keys apart may change places (git's meaning is each key's
			// values in order); one key's values may not.
			slices.SortStableFunc(keep, func(x, y string) int {
				kx, _, _ := strings.Cut(x, "\n")
				ky, _, _ := strings.Cut(y, "\n")
				return strings.Compare(kx, ky)
			})
			return keep, true
		}
		la, okA := list(a)
		lb, okB := list(b)
		if !okB {
			return // git refuses the file: it runs nothing with it
		}
		if !okA || !slices.Equal(la, lb) {
			t.Fatalf("called harmless, but git reads other keys:\nold %q\nnew %q", la, lb)
		}
	})
}
