package wsync

import (
	"bufio"
	"bytes"
	"path"
	"regexp"
	"slices"
	"strings"
)

// HoldRules decide which guest changes wait for the user's approval
// instead of being written to the host: files that host tools execute or
// obey by themselves (git hooks, direnv, editor and agent settings, kosa8's
// own config).
type HoldRules struct {
	// Extra are more patterns: a name matched against every path component
	// ("secrets.env"), or a path glob ("config/*.yaml").
	Extra []string
}

var heldNames = []string{"kosa8.toml", ".gitmodules", ".envrc", ".mise.toml", ".tool-versions", ".exrc", ".nvim.lua", ".nvimrc"}
var heldDirs = []string{".vscode", ".idea", ".cursor", ".zed", ".claude", ".devcontainer"}

// Held reports whether a change to p (relative, slash-separated) is held.
// A .git/config is held unless only harmless keys changed; that needs
// both versions, see GitConfigHarmless.
func (h HoldRules) Held(p string) bool {
	parts := strings.Split(p, "/")
	base := parts[len(parts)-1]
	if slices.Contains(heldNames, base) {
		return true
	}
	for i, c := range parts {
		if slices.Contains(heldDirs, c) && i < len(parts)-1 {
			return true
		}
		if c == ".git" {
			rest := parts[i+1:]
			if gitHeld(rest) {
				return true
			}
		}
	}
	return matchAny(p, h.Extra)
}

// matchAny reports whether p matches one of pats: a pattern with a slash
// is a path glob (and covers what is below a match), one without is
// matched against every component of p.
func matchAny(p string, pats []string) bool {
	parts := strings.Split(p, "/")
	for _, pat := range pats {
		if strings.Contains(pat, "/") {
			pat = strings.TrimSuffix(pat, "/")
			if ok, _ := path.Match(pat, p); ok {
				return true
			}
			// Below a matched directory.
			for i := 1; i < len(parts); i++ {
				if ok, _ := path.Match(pat, strings.Join(parts[:i], "/")); ok {
					return true
				}
			}
			continue
		}
		for _, c := range parts {
			if ok, _ := path.Match(pat, c); ok {
				return true
			}
		}
	}
	return false
}

// gitHeld: hooks/, info/, config, and the same inside modules/*/ (a
// submodule's git directory) and worktrees/*/.
func gitHeld(rest []string) bool {
	if len(rest) == 0 {
		return false
	}
	switch rest[0] {
	case "hooks", "info":
		return len(rest) > 1
	case "config":
		return len(rest) == 1
	case "modules", "worktrees":
		// modules/NAME/... may nest deeper (modules/a/modules/b/...).
		for i := 1; i < len(rest); i++ {
			if gitHeld(rest[i:]) {
				return true
			}
		}
	}
	return false
}

// IsGitConfig reports whether p is a git config file (held unless
// harmless).
func IsGitConfig(p string) bool {
	parts := strings.Split(p, "/")
	if parts[len(parts)-1] != "config" {
		return false
	}
	for i, c := range parts {
		if c == ".git" {
			rest := parts[i+1:]
			return len(rest) == 1 || (len(rest) > 1 && (rest[0] == "modules" || rest[0] == "worktrees"))
		}
	}
	return false
}

// harmlessGitKeys may change without approval: they only say which remote
// branch a local branch tracks.
var harmlessGitKeys = regexp.MustCompile(`^branch\..+\.(remote|merge|rebase)$`)

// GitConfigHarmless reports whether new differs from old only in
// harmless keys. Anything it cannot parse is not harmless.
func GitConfigHarmless(old, new []byte) bool {
	a, ok1 := parseGitConfig(old)
	b, ok2 := parseGitConfig(new)
	if !ok1 || !ok2 {
		return false
	}
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		if !slices.Equal(a[k], b[k]) && !harmlessGitKeys.MatchString(k) {
			return false
		}
	}
	return true
}

var (
	sectionRE = regexp.MustCompile(`^\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(?:[#;].*)?$`)
	keyRE     = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*))?$`)
)

// parseGitConfig reads git's config format into "section.subsection.key"
// → values. It is strict: includes, continuation lines and anything odd
// make it fail, so that such a file is held for the user to look at.
func parseGitConfig(b []byte) (map[string][]string, bool) {
	if len(b) > 1<<20 {
		return nil, false
	}
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			return nil, false
		}
		if line[0] == '[' {
			m := sectionRE.FindStringSubmatch(line)
			if m == nil {
				return nil, false
			}
			section = strings.ToLower(m[1])
			if m[2] != "" {
				section += "." + m[2]
			}
			if strings.HasPrefix(section, "include") {
				return nil, false
			}
			continue
		}
		if section == "" {
			return nil, false
		}
		m := keyRE.FindStringSubmatch(line)
		if m == nil {
			return nil, false
		}
		k := section + "." + strings.ToLower(m[1])
		out[k] = append(out[k], strings.TrimSpace(m[2]))
	}
	return out, sc.Err() == nil
}

// gitDirRest returns p's path inside its git directory ("refs/heads/main"
// for "a/.git/refs/heads/main"; submodules' git directories under
// .git/modules/NAME/ count as their own), or ok false outside one.
func gitDirRest(p string) (rest string, ok bool) {
	parts := strings.Split(p, "/")
	k := slices.Index(parts, ".git")
	if k < 0 {
		return "", false
	}
	parts = parts[k+1:]
	for len(parts) > 2 && parts[0] == "modules" {
		parts = parts[2:]
	}
	return strings.Join(parts, "/"), true
}

// gitDirOf returns the git directory p is in ("a/.git", or
// "a/.git/modules/NAME" for a submodule's), or "".
func gitDirOf(p string) string {
	parts := strings.Split(p, "/")
	k := slices.Index(parts, ".git")
	if k < 0 {
		return ""
	}
	k++
	for len(parts)-k > 2 && parts[k] == "modules" {
		k += 2
	}
	return strings.Join(parts[:k], "/")
}

// gitRank orders the paths of a batch so that a repository on the host is
// never half-written: objects before refs, refs before HEAD, HEAD before
// the index, the index before the work tree.
func gitRank(p string) int {
	rest, ok := gitDirRest(p)
	if !ok {
		return 5
	}
	switch {
	case strings.HasPrefix(rest, "objects/"):
		return 0
	case strings.HasPrefix(rest, "refs/") || rest == "packed-refs" || strings.HasPrefix(rest, "logs/"):
		return 2
	case rest == "HEAD" || strings.HasSuffix(rest, "_HEAD"):
		return 3
	case rest == "index":
		return 4
	}
	return 1
}

// gitLocked tells whether git changes p only under a lock file (p + ".lock",
// created exclusively, renamed over p): refs, HEAD and the like, the index,
// packed-refs, config, shallow. Writes from the sandbox take the same lock,
// so a git running on the host never sees them half-done, nor they its.
func gitLocked(p string) bool {
	rest, ok := gitDirRest(p)
	if !ok || strings.HasSuffix(rest, ".lock") {
		return false
	}
	switch {
	case strings.HasPrefix(rest, "refs/"), rest == "HEAD", strings.HasSuffix(rest, "_HEAD") && !strings.Contains(rest, "/"),
		rest == "index", rest == "packed-refs", rest == "config", rest == "shallow":
		return true
	}
	return false
}

// isGitLock tells whether p is a lock file of git's: state of a git
// process at work on one side, never synced to the other.
func isGitLock(p string) bool {
	_, ok := gitDirRest(p)
	return ok && strings.HasSuffix(p, ".lock")
}
