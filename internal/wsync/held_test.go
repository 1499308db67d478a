package wsync

import (
	"slices"
	"strings"
	"testing"
)

func TestHeld(t *testing.T) {
	h := HoldRules{Extra: []string{"*.pem", "deploy/prod.yaml"}}
	held := []string{
		"kosa8.toml", "sub/kosa8.toml", ".envrc", "a/.envrc", ".mise.toml", ".tool-versions", ".exrc", ".nvim.lua",
		".gitmodules", ".git/hooks/pre-commit", ".git/info/attributes", ".git/config",
		"vendor/lib/.git/hooks/post-checkout", ".git/modules/sub/hooks/pre-push", ".git/modules/sub/config",
		".git/modules/a/modules/b/hooks/x", ".vscode/settings.json", "web/.vscode/tasks.json",
		".idea/workspace.xml", ".cursor/rules", ".zed/settings.json", ".claude/settings.json",
		".devcontainer/devcontainer.json", "certs/server.pem", "deploy/prod.yaml",
		// The folder itself: a link named .vscode or .claude points host
		// tools at settings elsewhere in the workspace.
		".vscode", ".claude", "web/.idea",
		".gemini/settings.json", ".codex/config.toml", ".hg/hgrc", ".jj/repo/config.toml", ".cargo/config.toml",
		".husky/pre-commit", ".githooks/pre-commit", ".aider.conf.yml", ".mcp.json", ".npmrc", ".vimrc", ".dir-locals.el",
	}
	free := []string{
		"main.go", "README.md", ".git/objects/ab/" + strings.Repeat("c", 38), ".git/refs/heads/main", ".git/HEAD", ".git/index",
		"docs/hooks/pre-commit.md", "config", "src/config", ".gitignore", "deploy/dev.yaml", "vscode",
	}
	for _, p := range held {
		if !h.Held(p) {
			t.Errorf("%s is not held", p)
		}
	}
	for _, p := range free {
		if h.Held(p) {
			t.Errorf("%s is held", p)
		}
	}
}

func TestGitConfigHarmless(t *testing.T) {
	base := "[core]\n\trepositoryformatversion = 0\n\tbare = false\n[remote \"origin\"]\n\turl = https://github.com/a/b\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
	cases := map[string]bool{
		base + "[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n": true,
		base + "[core]\n\thooksPath = /tmp/evil\n":                                 false,
		base + "[core]\n\tfsmonitor = /tmp/evil.sh\n":                              false,
		base + "[core]\n\tsshCommand = sh -c evil\n":                               false,
		base + "[filter \"x\"]\n\tclean = evil\n":                                  false,
		base + "[alias]\n\tst = !evil\n":                                           false,
		base + "[include]\n\tpath = /tmp/x\n":                                      false,
		"[core]\n\tbare = false \\\n\t\thooksPath = x\n":                           false,
		base[:len(base)-1] + "\n[remote \"origin\"]\n\turl = https://evil\n":       false,
	}
	for cfg, want := range cases {
		if got := GitConfigHarmless([]byte(base), []byte(cfg)); got != want {
			t.Errorf("harmless=%v, want %v for:\n%s", got, want, cfg)
		}
	}
	if !IsGitConfig(".git/config") || !!IsGitConfig("a/.git/modules/x/config") || IsGitConfig("config") || IsGitConfig(".git/hooks/config") {
		t.Error("IsGitConfig")
	}
}

func TestGitRank(t *testing.T) {
	paths := []string{"src/a.go", ".git/index", ".git/HEAD", ".git/refs/heads/main", ".git/objects/aa/bb", ".git/COMMIT_EDITMSG", "sub/.git/objects/x"}
	slices.SortStableFunc(paths, func(a, b string) int { return gitRank(a) - gitRank(b) })
	want := []string{".git/objects/aa/bb", "sub/.git/objects/x", ".git/COMMIT_EDITMSG", ".git/refs/heads/main", ".git/HEAD", ".git/index", "src/a.go"}
	if !slices.Equal(paths, want) {
		t.Fatalf("order %v, want %v", paths, want)
	}
}

func FuzzGitConfig(f *testing.F) {
	f.Add([]byte("[core]\n\tbare = false\n"), []byte("[core]\n\tbare = true\n"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if GitConfigHarmless(a, b) {
			// Harmless means: the parsed configs differ only in branch keys.
			pa, _ := parseGitConfig(a)
			pb, _ := parseGitConfig(b)
			for k, v := range pb {
				if !slices.Equal(pa[k], v) && !harmlessGitKeys.MatchString(k) {
					t.Fatalf("key %s changed but was called harmless", k)
				}
			}
		}
	})
}

func FuzzGitRank(f *testing.F) {
	for _, s := range []string{"repo/.git", ".git", "a/.git/", ".git/objects", "x/.git/refs/heads/m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if r := gitRank(p); r < 0 || r > 5 {
			t.Fatalf("rank %d", r)
		}
	})
}

// A link anywhere in a git directory is held: git writes through it (a
// reflog appended to a hook through logs/HEAD), whatever the allow-list
// says of the name.
func TestLinkInGitDirHeld(t *testing.T) {
	hostDir := func(string) bool { return true }
	for _, p := range []string{".git/logs/HEAD", ".git/COMMIT_EDITMSG", ".git/refs/heads/main", "sub/.git/index"} {
		if why, _ := (HoldRules{}).holdWhy(p, 'l', nil, hostDir); why == "" {
			t.Errorf("a link at %s is not held", p)
		}
		if why, _ := (HoldRules{}).holdWhy(p, 'f', nil, hostDir); why != "" {
			t.Errorf("a file at %s is held: %s", p, why)
		}
	}
	if why, _ := (HoldRules{}).holdWhy("gd/logs/HEAD", 'l', map[string]bool{"gd": true}, hostDir); why == "" {
		t.Error("a link in a gitdir: target is not held")
	}
}

// The host's git config is read at every pass: no input panics or names a
// path outside the folder's rules, and a held decision never panics.
func FuzzGitNamedPaths(f *testing.F) {
	f.Add([]byte("[core]\n\thooksPath = tools/hooks\n[alias]\n\tx = !sh a/b.sh\n"), "tools/hooks/pre-commit")
	f.Add([]byte("[include]path=\"../x\"\n[remote \"o\"]\nurl=https://h/r\n"), "x")
	f.Add([]byte("[core]\nhooksPath=T\u200c/Hooks/x\n"), "t/hooks")
	f.Add([]byte("[core]\nhooksPath=a/b\n[alias]\nx=!sh a/bc.sh\n"), "a/b/c")
	f.Fuzz(func(t *testing.T, cfg []byte, p string) {
		runs := map[string]string{}
		for _, n := range gitNamedPaths(cfg) {
			if n.value == "" {
				t.Fatal("an empty name")
			}
			if _, err := CleanRel(n.value); err == nil {
				runs[n.value] = ".git/config"
			}
		}
		if _, err := CleanRel(p); err != nil {
			return
		}
		for _, typ := range []byte{0, 'f', 'd', 'l'} {
			why := gitRunWhy(p, typ, runs)
			if want := gitRunWhyWalk(p, typ, runs); (why == "") != (want == "") {
				t.Fatalf("%q (%q): the index says %q, comparing every named path %q", p, typ, why, want)
			}
			if _, named := runs[p]; named && typ != 0 && why == "" {
				t.Fatalf("%q is named by the config but not held", p)
			}
		}
	})
}

// gitRunWhyWalk is gitRunWhy as it was, comparing p with every named
// path: the reference for the folded index.
func gitRunWhyWalk(p string, typ byte, runs map[string]string) string {
	fp := foldName(p)
	for r, from := range runs {
		fr := foldName(r)
		switch {
		case typ == 0 && (fp == fr || strings.HasPrefix(fp, fr+"/") || strings.HasPrefix(fr, fp+"/")):
			return "deletes (named in " + from + ")"
		case fp == fr || strings.HasPrefix(fp, fr+"/"):
			return "runs (named in " + from + ")"
		case typ != 'd' && strings.HasPrefix(fr, fp+"/"):
			return "in place of a folder (named in " + from + ")"
		}
	}
	return ""
}

// mise reads more project configs than .mise.toml, and runs their
// [hooks] (enter, cd) when the user's shell enters the folder; it trusts
// a config by its path, so the guest's edit of a trusted one runs.
func TestMiseConfigsHeld(t *testing.T) {
	for _, p := range []string{"mise.toml", "sub/mise.toml", "mise.local.toml", ".mise.local.toml", "mise.dev.toml",
		".mise.ci.local.toml", ".config/mise.toml", ".config/mise/config.toml", "mise/config.toml", ".mise/config.toml",
		".config/mise/conf.d/x.toml", "MISE.TOML"} {
		if !(HoldRules{}).Held(p) {
			t.Errorf("%s is not held", p)
		}
	}
	for _, p := range []string{"config.toml", "src/config.toml", "mise.txt", "promise.toml", "notmise/config.toml"} {
		if (HoldRules{}).Held(p) {
			t.Errorf("%s is held", p)
		}
	}
}
