package wsync

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// The host's own git configuration can name files of the folder that git
// then runs or obeys: core.hooksPath = tools/hooks makes every file there
// a hook, include.path pulls in a config, core.fsmonitor, filters, diff
// drivers and aliases run commands, any of which may be a script in the
// folder. Those configs are the user's (a guest change to one inside the
// folder is held), but the files they name are ordinary workspace paths:
// the sync holds a guest change to them too. The list is read from the
// host at every pass, erring toward naming more: a path named for nothing
// only costs an approval.
//
// Read: every git directory's config and config.worktree (and those of
// its linked worktrees), what they include (recursively, as deep as git
// goes), the system and global configs, the config of a repository
// above the folder, and those of a git directory outside the folder that
// a .git file in it points to (the folder is a linked worktree, a
// submodule, a --separate-git-dir checkout), with its common directory's
// and the links of its hooks folder. Relative names are taken from every
// work tree in the folder and from each git directory, as git resolves
// hooksPath from the work tree a command runs in and includes from the
// including file.

const (
	// maxHostGitConfig bounds what is read of one host git config: at
	// least a config the guest may make harmlessly (MaxGitConfig), so
	// that padding one never pushes a key past what is read; a longer
	// config holds every change (gitRunSet.all).
	maxHostGitConfig = MaxGitConfig
	// maxIncludeDepth is git's own limit on nested includes.
	maxIncludeDepth = 10
)

// maxGitConfigReads bounds the git configs a pass reads (includes count
// each time they are reached): a folder of thousands of repositories, or
// includes that fan out, would otherwise make every pass read without
// end. Past it the pass cannot tell what git would run, so it holds every
// guest change (gitRunSet.all) until the user trims the configs. A
// variable for a test's sake.
var maxGitConfigReads = 20000

// gitHookNames are the hooks git runs: held by name where hooksPath is a
// work tree's root (the folder itself cannot be held whole).
var gitHookNames = []string{"applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
	"prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge", "pre-push",
	"pre-receive", "update", "proc-receive", "post-receive", "post-update", "reference-transaction", "push-to-checkout",
	"pre-auto-gc", "post-rewrite", "sendemail-validate", "fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist",
	"p4-post-changelist", "p4-pre-submit", "post-index-change"}

// gitEntry is one key and value of a git config.
type gitEntry struct{ key, value string }

// gitConfigEntries reads a git config leniently (the file is the host's,
// not the guest's): sections with or without subsections, values parsed
// as git does (quotes, escapes, comments), continuation lines joined.
func gitConfigEntries(b []byte) []gitEntry {
	var out []gitEntry
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), len(b)+1) // a line as long as the file: never a scanner's error ending the reading early
	pending := ""
	for sc.Scan() {
		line := pending + sc.Text()
		pending = ""
		if continues(line) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			end := sectionEnd(line)
			if end < 0 {
				continue
			}
			// A tab parts a subsection from its section as a space does.
			head := strings.TrimSpace(line[1:end])
			name, sub := head, ""
			if i := strings.IndexAny(head, " \t"); i >= 0 {
				name, sub = head[:i], strings.TrimSpace(head[i:])
			}
			section = strings.ToLower(name)
			if len(sub) >= 2 && sub[0] == '"' && sub[len(sub)-1] == '"' {
				section += "." + unescapeSubsection(sub[1:len(sub)-1]) // "" too: "[x \"\"]" is x..key
			} else if sub = gitValue(sub); sub != "" {
				section += "." + sub
			}
			line = strings.TrimSpace(line[end+1:])
			if line == "" {
				continue
			}
		}
		k, v, _ := strings.Cut(line, "=")
		out = append(out, gitEntry{section + "." + strings.ToLower(strings.TrimSpace(k)), gitValue(v)})
	}
	return out
}

// sectionEnd is the index of the "]" that ends a section line's header
// (not one in a quoted subsection), or -1.
func sectionEnd(line string) int {
	quoted := false
	for i := 1; i < len(line); i++ {
		switch line[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case ']':
			if !quoted {
				return i
			}
		}
	}
	return -1
}

// continues reports whether git reads a config line (joined with those
// it continues) as going on on the next: it ends in a backslash that is
// not escaped and not in a comment. A comment ends at its newline even
// after a backslash: read as a continuation, it would swallow the key
// below it (a harmless change to .git/config hiding core.hooksPath).
func continues(line string) bool {
	s := strings.TrimLeft(line, " \t")
	if strings.HasPrefix(s, "[") {
		i := sectionEnd(s)
		if i < 0 {
			return false
		}
		s = s[i+1:]
	}
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && i+1 == len(s):
			return true
		case c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case (c == '#' || c == ';') && !quoted:
			return false
		}
	}
	return false
}

// gitValue is a config value as git reads it: double quotes toggle, # and
// ; outside quotes start a comment, \" \\ \n \t \b are escapes; spaces
// around it go.
func gitValue(v string) string {
	var b strings.Builder
	quoted := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\' && i+1 < len(v):
			i++
			switch v[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'b':
				b.WriteByte('\b')
			default:
				b.WriteByte(v[i])
			}
		case c == '"':
			quoted = !quoted
		case (c == '#' || c == ';') && !quoted:
			return strings.TrimSpace(b.String())
		default:
			b.WriteByte(c)
		}
	}
	return strings.TrimSpace(b.String())
}

// gitNamed is what a config names: a hooks folder, an included config, or
// a word of a command (that may be a script of the folder).
type gitNamed struct {
	kind  byte // 'h' hooks folder, 'i' include, 'w' word with a slash, 'b' bare word (a file if it exists)
	value string
}

// commandKey tells whether git runs a config key's value as a command
// (or a program): only their words may name scripts of the folder.
func commandKey(key string) bool {
	top, _, _ := strings.Cut(key, ".")
	last := key[strings.LastIndexByte(key, '.')+1:]
	switch top {
	case "alias", "pager":
		return true
	case "difftool", "mergetool", "man", "browser":
		if last == "path" {
			return true // the tool's program (difftool.<tool>.path)
		}
	}
	switch last {
	case "fsmonitor", "editor", "pager", "sshcommand", "askpass", "program", "external", "textconv", "command", "cmd",
		"driver", "clean", "smudge", "process", "helper", "difffilter", "uploadpack", "receivepack", "packobjectshook", "update", "exec",
		"gitproxy", "tocmd", "cccmd", "defaultkeycommand", "alternaterefscommand",
		"sendmailcmd", "smtpserver": // send-email: smtpServer as a path is a sendmail-like program
		return true
	}
	return false
}

// gitNamedPaths classifies a config's values: the whole value of
// core.hooksPath and of include paths, and the words of the values git
// runs as commands.
func gitNamedPaths(b []byte) []gitNamed {
	var out []gitNamed
	for _, e := range gitConfigEntries(b) {
		top, _, _ := strings.Cut(e.key, ".")
		last := e.key[strings.LastIndexByte(e.key, '.')+1:]
		switch {
		case e.value == "":
		case e.key == "core.hookspath":
			out = append(out, gitNamed{'h', e.value})
		case (top == "include" || top == "includeif") && last == "path":
			out = append(out, gitNamed{'i', e.value})
		case e.key == "init.templatedir":
			// git init and clone copy its hooks into the new repository,
			// and clone runs post-checkout from there at once.
			out = append(out, gitNamed{'w', e.value})
		case commandKey(e.key):
			for _, w := range strings.FieldsFunc(e.value, func(r rune) bool {
				return strings.ContainsRune(" \t\n'\";&|<>`(=", r)
			}) {
				w = strings.TrimLeft(w, "!")
				if i := strings.LastIndexAny(w, ")}"); i >= 0 {
					w = w[i+1:] // "$(git rev-parse --show-toplevel)/x.sh" names /x.sh of a work tree
					w = strings.TrimPrefix(w, "/")
				}
				if strings.HasPrefix(w, "$") {
					_, w, _ = strings.Cut(w, "/") // $PWD/x.sh, $GIT_WORK_TREE/x.sh
				}
				switch {
				case w == "" || strings.Contains(w, "://") || strings.HasPrefix(w, "-"):
				case strings.Contains(w, "/"):
					out = append(out, gitNamed{'w', w})
				default:
					out = append(out, gitNamed{'b', w})
				}
			}
		}
	}
	return out
}

// gitRunsFinder gathers what the host's git configs name.
type gitRunsFinder struct {
	ctx       context.Context
	e         *Engine
	roots     []string // the folder's absolute path, and its path with links resolved
	worktrees []string // absolute: every work tree git may run in
	runs      map[string]string
	walkFrom  map[string]string // more paths to follow links from (to the reason), not named themselves
	work      int               // named paths and links visited: for a test's bound
	reads     int               // git configs read (or tried) this pass
	tooLong   string            // a config longer than maxHostGitConfig, if any
}

// rel turns an absolute host path into a path of the folder, or "".
func (f *gitRunsFinder) rel(abs string) string {
	abs = filepath.Clean(abs)
	for _, r := range f.roots {
		if abs == r {
			return "."
		}
		if rest, ok := strings.CutPrefix(abs, r+"/"); ok {
			if _, err := CleanRel(rest); err == nil {
				return rest
			}
		}
	}
	return ""
}

func (f *gitRunsFinder) add(rel, from string) {
	if rel == "" || rel == "." {
		return // the folder itself: not held whole
	}
	f.runs[rel] = from
}

// addHooks adds a hooks folder; one that is a work tree's root (hooksPath
// = .) is held by git's hook names, not whole.
func (f *gitRunsFinder) addHooks(rel, from string, isWorktree bool) {
	if rel == "" {
		return
	}
	if rel == "." || isWorktree {
		for _, h := range gitHookNames {
			f.runs[path.Join(rel, h)] = from
		}
		return
	}
	f.runs[rel] = from
}

// abs resolves a configured name from base (absolute): "~/" and "~" from
// the home folder, "~user/" from that user's, as git does. A name that
// cannot be resolved ("" back) names nothing of the folder's: a user
// unknown here has no home inside it.
func abs(name, base string) string {
	if rest, ok := strings.CutPrefix(name, "~"); ok {
		who, rest, _ := strings.Cut(rest, "/")
		var home string
		if who == "" {
			h, err := os.UserHomeDir()
			if err != nil {
				return ""
			}
			home = h
		} else {
			u, err := user.Lookup(who)
			if err != nil || u.HomeDir == "" {
				return ""
			}
			home = u.HomeDir
		}
		return filepath.Join(home, rest)
	}
	if filepath.IsAbs(name) {
		return filepath.Clean(name)
	}
	return filepath.Join(base, name)
}

// read reads a config by its absolute path: inside the folder through the
// root (never following a link out), elsewhere as the user's own file.
func (f *gitRunsFinder) read(file string) []byte {
	if f.reads++; f.reads > maxGitConfigReads {
		return nil // findGitRuns reports it: every change is held
	}
	var b []byte
	err := os.ErrNotExist
	if rel := f.rel(file); rel != "" {
		b, err = readAllMax(f.ctx, f.e.host.Read, rel, maxHostGitConfig+1)
	}
	if err != nil {
		// Outside the folder, or a link in it (the root refuses to
		// follow one): git follows it. The guest cannot plant it,
		// include paths being held.
		if b, err = readFileMax(file, maxHostGitConfig+1); err != nil {
			return nil
		}
	}
	if len(b) > maxHostGitConfig {
		f.tooLong = file // findGitRuns reports it: every change is held
		return nil
	}
	return b
}

// config adds what the config file names; bases are where its relative
// command and hooks names are taken from (its includes: from its folder).
func (f *gitRunsFinder) config(file string, bases []string, depth int) {
	if depth > maxIncludeDepth {
		return
	}
	b := f.read(file)
	if b == nil {
		return
	}
	from := file
	if rel := f.rel(file); rel != "" {
		from = rel
	}
	for _, n := range gitNamedPaths(b) {
		switch n.kind {
		case 'i':
			inc := abs(n.value, filepath.Dir(file))
			if inc == "" {
				continue
			}
			f.add(f.rel(inc), from)
			f.config(inc, bases, depth+1)
		case 'h':
			for _, base := range bases {
				if p := abs(n.value, base); p != "" {
					f.addHooks(f.rel(p), from, slices.Contains(f.worktrees, p))
				}
			}
		case 'w':
			for _, base := range bases {
				if p := abs(n.value, base); p != "" {
					f.add(f.rel(p), from)
				}
			}
		case 'b':
			// A bare word of a command: a script in the work tree it runs
			// in, whether or not it is there yet.
			for _, base := range f.worktrees {
				f.add(f.rel(filepath.Join(base, n.value)), from)
			}
		}
	}
}

// findGitRuns finds the folder's paths (to the config naming each) that
// host git configs name, and the in-folder targets of host links on the
// way to them.
func (e *Engine) findGitRuns(ctx context.Context, gitDirs map[string]bool) gitRunSet {
	runs, f := e.gitRunsFound(ctx, gitDirs)
	s := newGitRunSet(runs)
	if f != nil && f.reads > maxGitConfigReads {
		s.all = fmt.Sprintf("the host's git configs here are too many to read at every pass (more than %d, includes counted); until fewer, the sync cannot tell what git would run", maxGitConfigReads)
	}
	if f != nil && f.tooLong != "" {
		s.all = fmt.Sprintf("the git config %s is longer than %d bytes; until shorter, the sync cannot tell what git would run", f.tooLong, maxHostGitConfig)
	}
	return s
}

// gitRunsFound is findGitRuns' list of named paths, and its finder (nil
// for a host without a folder).
func (e *Engine) gitRunsFound(ctx context.Context, gitDirs map[string]bool) (map[string]string, *gitRunsFinder) {
	d, ok := e.host.(interface{ Dir() string })
	if !ok {
		return nil, nil
	}
	root := filepath.Clean(d.Dir())
	f := &gitRunsFinder{ctx: ctx, e: e, roots: []string{root}, runs: map[string]string{}, walkFrom: map[string]string{}}
	if real, err := filepath.EvalSymlinks(root); err == nil && real != root {
		f.roots = append(f.roots, real)
	}
	// The git directories of the folder, and its work trees: every folder
	// holding a .git (folder or file), and each git directory's parent.
	dirs := map[string]bool{}
	for g := range gitDirs {
		dirs[g] = true
	}
	wts := map[string]bool{}
	var outside []string // git directories outside the folder that .git files of it point to
	for p := range e.gitMarks {
		if foldName(path.Base(p)) != ".git" {
			continue
		}
		ent := e.hostStat(ctx, p)
		if ent == nil {
			continue
		}
		wts[path.Dir(p)] = true
		if ent.Type == 'd' {
			dirs[p] = true
		}
		if ent.Type == 'f' {
			// The folder is (or holds) a linked worktree, a submodule or
			// a --separate-git-dir checkout of a repository elsewhere:
			// git reads that repository's configs for this work tree.
			if gd := f.gitFileDir(filepath.Join(root, p)); gd != "" && f.rel(gd) == "" {
				outside = append(outside, gd)
			}
		}
	}
	for g := range dirs {
		wts[path.Dir(g)] = true
		wts[g] = true
	}
	for w := range wts {
		f.worktrees = append(f.worktrees, filepath.Join(root, w))
	}
	// A repository above the folder: its config may name paths inside.
	for dir := filepath.Dir(root); ; dir = filepath.Dir(dir) {
		// Stat, not Lstat: git follows a .git that is a link to a folder.
		if fi, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
			gd := filepath.Join(dir, ".git")
			if !fi.IsDir() {
				b, _ := readFileMax(gd, 4096)
				t, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir:")
				if !ok {
					break
				}
				gd = abs(strings.TrimSpace(t), dir)
			}
			f.worktrees = append(f.worktrees, dir)
			outside = append(outside, gd)
			break
		}
		if dir == "/" || dir == "." {
			break
		}
	}
	if len(f.worktrees) == 0 {
		return f.runs, f // no repository: no config of git's applies here
	}
	for g := range dirs {
		f.coreWorktree(filepath.Join(root, g))
	}
	for _, gd := range outside {
		f.coreWorktree(gd)
	}
	for g := range dirs {
		gabs := filepath.Join(root, g)
		bases := append([]string{gabs}, f.worktrees...)
		f.config(filepath.Join(gabs, "config"), bases, 0)
		f.config(filepath.Join(gabs, "config.worktree"), bases, 0)
		// Linked worktrees' own configs: worktrees/<id>/config.worktree,
		// listed, not scanned (a scan hashes every index file there).
		if l, ok := e.host.(interface {
			List(context.Context, string) ([]string, error)
		}); ok {
			ids, _ := l.List(ctx, path.Join(g, "worktrees"))
			for _, id := range ids {
				f.config(filepath.Join(gabs, "worktrees", id, "config.worktree"), bases, 0)
			}
		} else if wt, err := e.host.Scan(ctx, []string{path.Join(g, "worktrees")}); err == nil {
			for p, ent := range wt {
				if ent.Type == 'f' && path.Base(p) == "config.worktree" {
					f.config(filepath.Join(root, p), bases, 0)
				}
			}
		}
		// Hooks in the default place are held already (gitAllowed); links
		// there lead git to files elsewhere in the folder.
		h := path.Join(g, "hooks")
		f.walkFrom[h] = "a link in " + h
	}
	for _, gd := range outside {
		for _, c := range f.gitDirConfigs(gd) {
			f.config(c, f.worktrees, 0)
		}
	}
	home, _ := os.UserHomeDir()
	var system []string
	if s := os.Getenv("GIT_CONFIG_SYSTEM"); s != "" {
		system = append(system, s)
	} else {
		system = append(system, "/etc/gitconfig", "/opt/homebrew/etc/gitconfig", "/usr/local/etc/gitconfig")
	}
	if g := os.Getenv("GIT_CONFIG_GLOBAL"); g != "" {
		system = append(system, g)
	} else if home != "" {
		xdg := os.Getenv("XDG_CONFIG_HOME")
		if xdg == "" {
			xdg = filepath.Join(home, ".config")
		}
		system = append(system, filepath.Join(home, ".gitconfig"), filepath.Join(xdg, "git", "config"))
	}
	for _, c := range system {
		// Itself in the folder (GIT_CONFIG_GLOBAL=./team.gitconfig, a
		// workspace holding the home folder): git obeys it everywhere.
		f.add(f.rel(c), "git's system or global config")
		f.config(c, f.worktrees, 0)
	}
	f.linkTargets()
	return f.runs, f
}

// coreWorktree adds the work tree a git directory's core.worktree names
// (relative to the git directory): git runs hooks there and takes a
// relative hooksPath from there.
func (f *gitRunsFinder) coreWorktree(gd string) {
	for _, c := range []string{"config", "config.worktree"} {
		for _, e := range gitConfigEntries(f.read(filepath.Join(gd, c))) {
			if e.key != "core.worktree" || e.value == "" {
				continue
			}
			if p := abs(e.value, gd); p != "" && !slices.Contains(f.worktrees, p) {
				f.worktrees = append(f.worktrees, p)
			}
		}
	}
}

// gitFileDir returns the git directory (absolute) a .git file at file
// points to, or "".
func (f *gitRunsFinder) gitFileDir(file string) string {
	t, ok := strings.CutPrefix(strings.TrimSpace(string(f.read(file))), "gitdir:")
	if !ok {
		return ""
	}
	t = strings.TrimSpace(strings.SplitN(t, "\n", 2)[0])
	if t == "" || strings.HasPrefix(t, "~") {
		return ""
	}
	return abs(t, filepath.Dir(file))
}

// gitDirConfigs lists the configs git reads for the git directory gd
// (absolute): its own config and config.worktree and, for a linked
// worktree's, those of the repository's common directory; and, from
// hooks folders outside the folder, what their links lead to inside it.
func (f *gitRunsFinder) gitDirConfigs(gd string) []string {
	dirs := []string{gd}
	if b := f.read(filepath.Join(gd, "commondir")); b != nil {
		if c := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]); c != "" && !strings.HasPrefix(c, "~") {
			dirs = append(dirs, abs(c, gd))
		}
	}
	var out []string
	for _, d := range dirs {
		out = append(out, filepath.Join(d, "config"), filepath.Join(d, "config.worktree"))
		if f.rel(d) != "" {
			continue // inside: its hooks are held (gitAllowed), its links followed by linkTargets
		}
		ents, _ := os.ReadDir(filepath.Join(d, "hooks"))
		for _, ent := range ents {
			if ent.Type()&os.ModeSymlink == 0 {
				continue
			}
			if real, err := filepath.EvalSymlinks(filepath.Join(d, "hooks", ent.Name())); err == nil {
				f.add(f.rel(real), filepath.Join(d, "hooks", ent.Name()))
			}
		}
	}
	return out
}

// linkTargets adds, for every named path, where host links lead git from
// it: the targets of links at or below it, and its rest below a link on
// its way; and so on from each of those, for as many links as the kernel
// follows (past maxLinkHops it refuses: git runs nothing there). Each
// path is walked once per pass, whatever number of named paths lead to it
// (walking every link for every named path was named × links).
func (f *gitRunsFinder) linkTargets() {
	// The links known, sorted: those at or below p are a range. The
	// scan's and the manifest's may differ: both are followed.
	sorted := make([]string, 0, len(f.e.passLinks)+len(f.e.links))
	for l := range f.e.passLinks {
		sorted = append(sorted, l)
	}
	for l := range f.e.links {
		if _, ok := f.e.passLinks[l]; !ok {
			sorted = append(sorted, l)
		}
	}
	slices.Sort(sorted)
	texts := func(l string) []string {
		var out []string
		for _, links := range []map[string]string{f.e.passLinks, f.e.links} {
			if t, ok := links[l]; ok && !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
		return out
	}
	target := func(l, t string) string {
		if strings.HasPrefix(t, "/") {
			return f.rel(t)
		}
		if j := path.Join(path.Dir(l), t); j != ".." && !strings.HasPrefix(j, "../") {
			return j
		}
		// Out of the folder and, maybe, back in through its own name.
		return f.rel(filepath.Join(f.roots[0], filepath.FromSlash(path.Dir(l)), t))
	}
	type step struct {
		p, from string
		hops    int
	}
	var todo []step
	for p, from := range f.runs {
		todo = append(todo, step{p, from, 0})
	}
	for p, from := range f.walkFrom {
		todo = append(todo, step{p, from, 0})
	}
	done := map[string]int{} // path → fewest hops it was walked at
	reach := func(t, from string, hops int) {
		if t == "" || t == "." {
			return
		}
		if _, named := f.runs[t]; !named {
			f.add(t, from)
		}
		todo = append(todo, step{t, from, hops})
	}
	for len(todo) > 0 {
		s := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if s.hops >= maxLinkHops {
			continue
		}
		if h, ok := done[s.p]; ok && h <= s.hops {
			continue
		}
		done[s.p] = s.hops
		f.work++
		// The link at p, and those below it (a range: "p/" sorts after
		// "p-x", so it is searched for itself).
		for _, t := range texts(s.p) {
			f.work++
			reach(target(s.p, t), s.from, s.hops+1)
		}
		for i, _ := slices.BinarySearch(sorted, s.p+"/"); i < len(sorted) && strings.HasPrefix(sorted[i], s.p+"/"); i++ {
			for _, t := range texts(sorted[i]) {
				f.work++
				reach(target(sorted[i], t), s.from, s.hops+1)
			}
		}
		// A link on p's way: p's rest goes on from its target.
		for i := strings.IndexByte(s.p, '/'); i >= 0; i = nextSlash(s.p, i) {
			l := s.p[:i]
			for _, t := range texts(l) {
				f.work++
				if t := target(l, t); t != "" {
					reach(path.Join(t, s.p[i+1:]), s.from, s.hops+1)
				}
			}
		}
	}
}

// nextSlash is the index of the next slash of p after i, or -1.
func nextSlash(p string, i int) int {
	if j := strings.IndexByte(p[i+1:], '/'); j >= 0 {
		return i + 1 + j
	}
	return -1
}

// readFileMax reads at most max bytes of a file of the host user's.
// Regular files only, opened without blocking: a FIFO or a device named
// by a config must not stall the sync.
func readFileMax(name string, max int64) ([]byte, error) {
	if fi, err := os.Stat(name); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", name)
	}
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", name)
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// gitRunSet is what the host's git configs name, folded once (see
// linkFold) so that a decision looks up p's own folders, not every named
// path: named paths to the config naming each, and every folder above
// one to such a config.
type gitRunSet struct {
	named, above map[string]string
	// all, when set, holds every guest change: the finder could not read
	// everything git would (a cap was hit), so it cannot tell what is safe.
	all string
}

func newGitRunSet(runs map[string]string) gitRunSet {
	s := gitRunSet{named: make(map[string]string, len(runs)), above: map[string]string{}}
	for r, from := range runs {
		fr := linkFold(r)
		s.named[fr] = from
		for i := strings.LastIndexByte(fr, '/'); i > 0; i = strings.LastIndexByte(fr[:i], '/') {
			if _, ok := s.above[fr[:i]]; ok {
				break // and the folders above it, by an earlier path
			}
			s.above[fr[:i]] = from
		}
	}
	return s
}

// gitRunWhy says why a guest change to p (of type typ) is held because a
// host git config names it: p is a named path or below one, or a link or
// file in place of a folder above one (it would redirect git there).
func gitRunWhy(p string, typ byte, runs map[string]string) string {
	return newGitRunSet(runs).why(p, typ)
}

func (s gitRunSet) why(p string, typ byte) string {
	if s.all != "" {
		return s.all
	}
	fp := linkFold(p)
	from, ok := s.named[fp]
	for i := strings.IndexByte(fp, '/'); !ok && i >= 0; i = nextSlash(fp, i) {
		from, ok = s.named[fp[:i]]
	}
	switch {
	case ok && typ == 0:
		// A deletion first, the guest's own file in its place on a
		// later pass: the deletion waits too.
		return "deletes what the host's git runs or reads (named in " + from + ")"
	case ok:
		return "the host's git runs or reads this (named in " + from + ")"
	}
	from, ok = s.above[fp]
	switch {
	case ok && typ == 0:
		return "deletes what the host's git runs or reads (named in " + from + ")"
	case ok && typ != 'd':
		return "in place of a folder the host's git runs or reads from (named in " + from + ")"
	}
	return ""
}
