package wsync

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
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
	// maxHostGitConfig bounds what is read of one host git config.
	maxHostGitConfig = 256 << 10
	// maxIncludeDepth is git's own limit on nested includes.
	maxIncludeDepth = 10
)

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
	sc.Buffer(make([]byte, 0, 4096), maxHostGitConfig)
	pending := ""
	for sc.Scan() {
		line := pending + sc.Text()
		pending = ""
		if strings.HasSuffix(line, `\`) && !strings.HasSuffix(line, `\\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			end := strings.IndexByte(line, ']')
			if end < 0 {
				continue
			}
			name, sub, _ := strings.Cut(strings.TrimSpace(line[1:end]), " ")
			section = strings.ToLower(name)
			if sub = gitValue(strings.TrimSpace(sub)); sub != "" {
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
		"gitproxy", "tocmd", "cccmd", "defaultkeycommand", "alternaterefscommand":
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

// abs resolves a configured name from base (absolute), "~/" from home.
func abs(name, base string) string {
	if strings.HasPrefix(name, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		return filepath.Join(home, name[2:])
	}
	if strings.HasPrefix(name, "~") {
		return "" // ~user: another user's home, never the folder's
	}
	if filepath.IsAbs(name) {
		return filepath.Clean(name)
	}
	return filepath.Join(base, name)
}

// read reads a config by its absolute path: inside the folder through the
// root (never following a link out), elsewhere as the user's own file.
func (f *gitRunsFinder) read(file string) []byte {
	if rel := f.rel(file); rel != "" {
		if b, err := readAllMax(f.ctx, f.e.host.Read, rel, maxHostGitConfig); err == nil {
			return b
		}
		// A link (the root refuses to follow one): git follows it. The
		// guest cannot plant it, include paths being held.
	}
	b, err := readFileMax(file, maxHostGitConfig)
	if err != nil {
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

// findGitRuns lists the folder's paths (to the config naming each) that
// host git configs name, and the in-folder targets of host links on the
// way to them.
func (e *Engine) findGitRuns(ctx context.Context, gitDirs map[string]bool) map[string]string {
	d, ok := e.host.(interface{ Dir() string })
	if !ok {
		return nil
	}
	root := filepath.Clean(d.Dir())
	f := &gitRunsFinder{ctx: ctx, e: e, roots: []string{root}, runs: map[string]string{}}
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
		if fi, err := os.Lstat(filepath.Join(dir, ".git")); err == nil {
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
		return f.runs // no repository: no config of git's applies here
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
		if wt, err := e.host.Scan(ctx, []string{path.Join(g, "worktrees")}); err == nil {
			for p, ent := range wt {
				if ent.Type == 'f' && path.Base(p) == "config.worktree" {
					f.config(filepath.Join(root, p), bases, 0)
				}
			}
		}
		// Hooks in the default place are held already (gitAllowed); links
		// there lead git to files elsewhere in the folder.
		f.linkTargets(path.Join(g, "hooks"))
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
	for p := range f.runs {
		f.linkTargets(p)
	}
	return f.runs
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

// linkTargets adds, for a named path p, where host links lead git from it:
// the targets of links at or below p, and p's rest below a link on its way.
func (f *gitRunsFinder) linkTargets(p string) {
	seen := map[string]bool{}
	var walk func(p, from string, depth int)
	walk = func(p, from string, depth int) {
		if depth > 8 || seen[p] {
			return
		}
		seen[p] = true
		for _, links := range []map[string]string{f.e.passLinks, f.e.links} {
			for l, text := range links {
				var target string
				if strings.HasPrefix(text, "/") {
					target = f.rel(text)
				} else if j := path.Join(path.Dir(l), text); j != ".." && !strings.HasPrefix(j, "../") {
					target = j
				}
				if target == "" {
					continue
				}
				switch {
				case l == p || strings.HasPrefix(l, p+"/"):
					f.add(target, from)
					walk(target, from, depth+1)
				case strings.HasPrefix(p, l+"/"):
					t := path.Join(target, strings.TrimPrefix(p, l+"/"))
					f.add(t, from)
					walk(t, from, depth+1)
				}
			}
		}
	}
	from := f.runs[p]
	if from == "" {
		from = "a link in " + p
	}
	walk(p, from, 0)
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

// gitRunWhy says why a guest change to p (of type typ) is held because a
// host git config names it: p is a named path or below one, or a link or
// file in place of a folder above one (it would redirect git there).
func gitRunWhy(p string, typ byte, runs map[string]string) string {
	fp := foldName(p)
	for r, from := range runs {
		fr := foldName(r)
		switch {
		case typ == 0 && (fp == fr || strings.HasPrefix(fp, fr+"/") || strings.HasPrefix(fr, fp+"/")):
			// A deletion first, the guest's own file in its place on a
			// later pass: the deletion waits too.
			return "deletes what the host's git runs or reads (named in " + from + ")"
		case fp == fr || strings.HasPrefix(fp, fr+"/"):
			return "the host's git runs or reads this (named in " + from + ")"
		case typ != 'd' && strings.HasPrefix(fr, fp+"/"):
			return "in place of a folder the host's git runs or reads from (named in " + from + ")"
		}
	}
	return ""
}
