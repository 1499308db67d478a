package wsync

import (
	"bufio"
	"bytes"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// HoldRules decide which guest changes wait for the user's approval
// instead of being written to the host: files that host tools execute or
// obey by themselves (git hooks and config, direnv, editor and agent
// settings, kosa8's own config).
type HoldRules struct {
	// Extra are more patterns: a name matched against every path component
	// ("secrets.env"), or a path glob ("config/*.yaml").
	Extra []string
}

// Compared folded (see foldName): on a case-insensitive host file system
// ".ENVRC" is the ".envrc" direnv reads.
var heldNames = []string{"kosa8.toml", ".gitmodules", ".envrc", ".mise.toml", ".tool-versions", ".exrc", ".nvim.lua", ".nvimrc",
	".vimrc", ".dir-locals.el", ".aider.conf.yml", ".mcp.json", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs"}
var heldDirs = []string{".vscode", ".idea", ".cursor", ".zed", ".claude", ".devcontainer",
	".gemini", ".codex", ".hg", ".jj", ".cargo", ".husky", ".githooks"}

// foldName is a name as a case-insensitive host file system (macOS, a
// Windows drive under WSL) sees it: lower case, without the code points
// HFS+ ignores (git's is_hfs_dotgit), so ".Git\u200c" is ".git".
func foldName(s string) string {
	if !utf8.ValidString(s) {
		return strings.ToLower(s)
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 0x200c && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x206a && r <= 0x206f, r == 0xfeff:
			return -1
		}
		return unicode.ToLower(r)
	}, s)
}

func isDotGit(c string) bool { return foldName(c) == ".git" }

// miseRE is the names of mise's project configs: mise.toml, .mise.toml
// and their local and per-environment variants (mise.dev.local.toml).
var miseRE = regexp.MustCompile(`^\.?mise(\.[^/]+)?\.toml$`)

// miseConfig reports whether parts (a path's components) name a config
// mise reads in a project, and whose [hooks] it runs when the user's
// shell enters the folder: mise trusts a config by its path.
func miseConfig(parts []string) bool {
	n := len(parts)
	base := foldName(parts[n-1])
	dir := func(i int) string {
		if i < 0 {
			return ""
		}
		return foldName(parts[i])
	}
	switch {
	case miseRE.MatchString(base):
		return true // also .config/mise.toml
	case base == "config.toml" && (dir(n-2) == "mise" || dir(n-2) == ".mise"):
		return true // mise/config.toml, .mise/config.toml, .config/mise/config.toml
	case dir(n-2) == "conf.d" && dir(n-3) == "mise":
		return true // .config/mise/conf.d/*.toml
	}
	return false
}

// Held reports whether a change to p (relative, slash-separated) is held
// by its path alone, knowing of no other git directory than those named
// .git. A git directory's config is held here too: whether a change to it
// is harmless needs both versions (GitConfigHarmless), which the engine's
// gate checks.
func (h HoldRules) Held(p string) bool {
	why, cfg := h.pathHold(p, nil)
	return why != "" || cfg
}

// pathHold says why a guest change to p is held by its path, or "".
// gitDirs are the folders, besides those named .git, that git on the host
// uses as a git directory (the targets of gitdir: files and commondir,
// folders holding a HEAD). cfg reports a git directory's config, held
// unless the change is harmless.
func (h HoldRules) pathHold(p string, gitDirs map[string]bool) (why string, cfg bool) {
	parts := strings.Split(p, "/")
	base := foldName(parts[len(parts)-1])
	if slices.Contains(heldNames, base) || miseConfig(parts) {
		return "host tools run or obey this file", false
	}
	// The folder itself too: a link in its place would point host tools
	// at files the guest chose elsewhere.
	for _, c := range parts {
		if slices.Contains(heldDirs, foldName(c)) {
			return "host tools run or obey this folder's files", false
		}
	}
	// Every git directory p is in decides, the innermost last: a .git
	// below objects/ of another is still a .git.
	for i, c := range parts {
		var rest []string
		switch {
		case isDotGit(c):
			rest = parts[i+1:]
		case gitDirs[strings.Join(parts[:i+1], "/")]:
			rest = parts[i+1:]
			if len(rest) == 0 {
				continue
			}
		default:
			continue
		}
		w, isCfg := gitAllowed(rest)
		if w != "" {
			return w, false
		}
		cfg = cfg || isCfg
	}
	if matchAny(p, h.Extra) {
		return "matches a hold pattern", false
	}
	return "", cfg
}

var (
	hexObj   = regexp.MustCompile(`^[0-9a-f]{2}$`)
	hexLoose = regexp.MustCompile(`^[0-9a-f]{38}$|^[0-9a-f]{62}$`)
	packRE   = regexp.MustCompile(`^pack-[0-9a-f]{40,64}\.(pack|idx|rev|bitmap|mtimes|keep|promisor)$`)
	graphRE  = regexp.MustCompile(`^(commit-graph-chain|graph-[0-9a-f]{40,64}\.graph)$`)
)

// gitAllowed is the allow-list inside a git directory: rest is a path
// inside one (nil or empty: the directory itself). It returns why a change
// there is held, or "" with cfg set for the config (held unless harmless).
//
// Why each allowed entry cannot make git run anything:
//   - objects: zlib-compressed blobs, trees, commits and tags, packs and
//     their indexes, commit-graphs: data git hashes and checks. Only
//     objects/info/alternates and http-alternates would point git at other
//     object stores; they are not on the list.
//   - refs/, packed-refs, logs/: object ids and ref names (git validates
//     both), reflog lines. git reads them, never runs them.
//   - HEAD and *_HEAD (ORIG_HEAD, FETCH_HEAD, MERGE_HEAD, …): an object id
//     or "ref: <refname>".
//   - index: paths, modes and object ids of the staging area; its
//     extensions (cache tree, untracked cache, the fsmonitor token) are
//     data too; the fsmonitor command itself only ever comes from config.
//   - COMMIT_EDITMSG: the last commit message, text.
//   - config: only when GitConfigHarmless says every change is to
//     branch.<name>.remote/merge/rebase with plain values.
//
// Everything else (hooks/, info/ with its attributes and excludes,
// commondir, worktrees/, modules/, gitdir, sharedindex files, any file git
// may learn to read one day) is held.
func gitAllowed(rest []string) (why string, cfg bool) {
	if len(rest) == 0 {
		return "", false
	}
	n := len(rest)
	switch rest[0] {
	case "objects":
		switch {
		case n == 1:
			return "", false
		case n == 2 && (hexObj.MatchString(rest[1]) || rest[1] == "pack" || rest[1] == "info"):
			return "", false
		case n == 3 && hexObj.MatchString(rest[1]) && hexLoose.MatchString(rest[2]):
			return "", false
		case n == 3 && rest[1] == "pack" && packRE.MatchString(rest[2]):
			return "", false
		case n == 3 && rest[1] == "info" && (rest[2] == "packs" || rest[2] == "commit-graph" || rest[2] == "commit-graphs"):
			return "", false
		case n == 4 && rest[1] == "info" && rest[2] == "commit-graphs" && graphRE.MatchString(rest[3]):
			return "", false
		}
	case "refs", "logs":
		return "", false
	case "HEAD", "index", "packed-refs", "COMMIT_EDITMSG":
		if n == 1 {
			return "", false
		}
	case "config":
		if n == 1 {
			return "", true
		}
	default:
		if n == 1 && strings.HasSuffix(rest[0], "_HEAD") && rest[0] == strings.ToUpper(rest[0]) {
			return "", false
		}
	}
	return "git runs or obeys this part of a git directory (only objects, refs, HEAD, the index and logs cross unheld)", false
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

// holdWhy is the held-path decision for a guest change to p: typ is the
// type the guest wants there (0: a deletion); hostDir reports whether the
// host has a real directory at a path now. On top of pathHold:
//   - a .git that is a file or link (it points git at another folder), a
//     .git folder where the host has none (a new repository, with its
//     config and hooks to come), and anything inside such a new one;
//   - a file or link named HEAD outside a git directory: git takes any
//     folder with a HEAD (and objects/, refs/) for a bare repository and
//     obeys its config when run there.
//
// Deletions only obey the path rules: removing a file runs nothing.
func (h HoldRules) holdWhy(p string, typ byte, gitDirs map[string]bool, hostDir func(string) bool) (why string, cfg bool) {
	why, cfg = h.pathHold(p, gitDirs)
	if why != "" || typ == 0 {
		return why, cfg
	}
	if controlName(p) {
		return "a name with control characters (listing it would send them to a terminal)", false
	}
	parts := strings.Split(p, "/")
	inGit := false
	for i, c := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		if gitDirs[prefix] && i < len(parts)-1 {
			inGit = true
		}
		if !isDotGit(c) {
			continue
		}
		inGit = inGit || i < len(parts)-1
		switch {
		case i == len(parts)-1 && typ != 'd':
			return "a .git file or link points git at another folder", false
		case !hostDir(prefix) && i == len(parts)-1:
			return "a new git repository (its config and hooks would run on the host)", false
		case !hostDir(prefix):
			return "inside a new git repository (" + prefix + " is not on the host)", false
		}
	}
	if inGit && typ == 'l' {
		// git writes through links it finds there (a reflog appended to
		// a hook through logs/HEAD).
		return "a link inside a git directory (git would write through it)", false
	}
	if !inGit && typ != 'd' && foldName(parts[len(parts)-1]) == "head" {
		return "a HEAD would make its folder a git repository", false
	}
	return "", cfg
}

// controlName reports whether p holds a control character (C0, DEL, C1)
// or is not UTF-8: such a name, created on the host, reaches the user's
// terminal raw through ls, git status or an editor's file list.
func controlName(p string) bool {
	if !utf8.ValidString(p) {
		return true
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 {
			return true
		}
	}
	return false
}

// IsGitConfig reports whether p is the config of a directory named .git.
func IsGitConfig(p string) bool {
	_, cfg := HoldRules{}.pathHold(p, nil)
	return cfg
}

// MaxGitConfig is the largest git config checked for harmlessness; a
// larger one is held whole (never its first part checked and the rest
// copied).
const MaxGitConfig = 1 << 20

// maxGitConfigKeys bounds the parser's memory on a file of keys only.
const maxGitConfigKeys = 20000

// harmlessGitKeys may change without approval: they only say which remote
// branch a local branch tracks.
var harmlessGitKeys = regexp.MustCompile(`^branch\.[^\x00-\x1f]+\.(remote|merge|rebase)$`)

var (
	refValue    = regexp.MustCompile(`^refs/[A-Za-z0-9._/-]+$`)
	remoteValue = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	rebaseValue = map[string]bool{"true": true, "false": true, "merges": true, "interactive": true, "i": true, "m": true, "b": true, "preserve": true, "p": true, "yes": true, "no": true, "on": true, "off": true, "1": true, "0": true}
)

// GitConfigHarmless reports whether new differs from old only in harmless
// keys with plain values: branch.<name>.merge a ref, .rebase a mode,
// .remote a remote old already configures (or "."), so that a remote
// named like a path or a transport ("ext::…") cannot come in this way.
// Both files are parsed whole; anything it cannot parse, a file over
// MaxGitConfig, or more than maxGitConfigKeys keys is not harmless.
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
		if slices.Equal(a[k], b[k]) {
			continue
		}
		m := harmlessGitKeys.FindStringSubmatch(k)
		if m == nil {
			return false
		}
		for _, v := range b[k] {
			v = strings.Trim(v, `"`)
			switch m[1] {
			case "merge":
				if !refValue.MatchString(v) || strings.Contains(v, "..") {
					return false
				}
			case "rebase":
				if !rebaseValue[strings.ToLower(v)] {
					return false
				}
			case "remote":
				if v != "." && (!remoteValue.MatchString(v) || !hasRemote(a, v)) {
					return false
				}
			}
		}
	}
	return true
}

// hasRemote reports whether cfg configures remote name with a url.
func hasRemote(cfg map[string][]string, name string) bool {
	return len(cfg["remote."+name+".url"]) > 0
}

var (
	// As git reads a section line: no blank inside the brackets but the
	// one before a subsection ("[ core]" and "[core ]" are errors to git,
	// so a file with them runs nothing and may not be called harmless).
	sectionRE = regexp.MustCompile(`^\[([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\]\s*(?:[#;].*)?$`)
	keyRE     = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9-]*)\s*(?:(=)\s*(.*))?$`)
)

// parseGitConfig reads git's config format into "section.subsection.key"
// → values, the whole file. It is strict: includes, continuation lines,
// control characters, a key on a section's line and anything odd make it
// fail, so that such a file is held for the user to look at. Bounded:
// MaxGitConfig bytes, maxGitConfigKeys keys.
func parseGitConfig(b []byte) (map[string][]string, bool) {
	if len(b) > MaxGitConfig {
		return nil, false
	}
	for _, c := range b {
		if c < 0x20 && c != '\t' && c != '\n' && c != '\r' || c == 0x7f {
			return nil, false
		}
	}
	if bytes.Contains(b, []byte("\r")) && !bytes.Contains(b, []byte("\r\n")) {
		return nil, false // a lone CR: git and this parser may split lines differently
	}
	out := map[string][]string{}
	nkeys := 0
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), MaxGitConfig+1)
	for sc.Scan() {
		raw := sc.Text()
		if strings.ContainsRune(raw, '\r') && !strings.HasSuffix(raw, "\r") {
			return nil, false
		}
		line := strings.TrimSpace(raw)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			return nil, false
		}
		if line[0] == '[' {
			m := sectionRE.FindStringSubmatchIndex(line)
			if m == nil {
				return nil, false
			}
			section = strings.ToLower(line[m[2]:m[3]])
			if m[4] >= 0 {
				// A subsection, named as git names it: unescaped, and
				// kept when empty ("[x \"\"]" is "x..key", not "x.key").
				section += "." + unescapeSubsection(line[m[4]:m[5]])
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
		if nkeys++; nkeys > maxGitConfigKeys {
			return nil, false
		}
		k := section + "." + strings.ToLower(m[1])
		v := strings.TrimSpace(m[3])
		if m[2] == "" {
			v = "\x00" // a key without "=" (true), apart from "key =" (empty)
		}
		out[k] = append(out[k], v)
	}
	return out, sc.Err() == nil
}

// unescapeSubsection reads a subsection's quoted text as git does: a
// backslash keeps the character after it.
func unescapeSubsection(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// gitDirRest returns p's path inside its git directory ("refs/heads/main"
// for "a/.git/refs/heads/main"; submodules' git directories under
// .git/modules/NAME/ count as their own), or ok false outside one.
func gitDirRest(p string) (rest string, ok bool) {
	parts := strings.Split(p, "/")
	k := slices.IndexFunc(parts, isDotGit)
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
	k := slices.IndexFunc(parts, isDotGit)
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
