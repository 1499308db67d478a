package wsync

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// The host's own git configuration can name files of the folder that git
// then runs or obeys: core.hooksPath = tools/hooks makes every file there
// a hook, include.path pulls in a config, core.fsmonitor, filters, diff
// drivers and aliases run commands, any of which may be a script in the
// folder. Those configs are the user's (a guest change to them is held),
// but the files they name are ordinary workspace paths: the sync holds a
// guest change to them too. The list is read from the host at every pass.

// maxHostGitConfig bounds what is read of one host git config.
const maxHostGitConfig = 256 << 10

// gitNamedPaths returns the values of a git config that may name a path git
// runs or reads: the whole value of core.hooksPath and of include paths,
// and every word containing a slash of any other value but remotes',
// branches' and URL-like ones. It is lenient (the file is the host's, not
// the guest's) and errs toward naming more: a path named for nothing only
// costs an approval.
func gitNamedPaths(b []byte) []string {
	var out []string
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxHostGitConfig)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
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
			if sub = strings.Trim(strings.TrimSpace(sub), `"`); sub != "" {
				section += "." + sub
			}
			line = strings.TrimSpace(line[end+1:])
			if line == "" {
				continue
			}
		}
		k, v, _ := strings.Cut(line, "=")
		key := section + "." + strings.ToLower(strings.TrimSpace(k))
		v = strings.TrimSpace(v)
		if i := strings.IndexAny(v, "#;"); i >= 0 && !strings.Contains(v[:i], `"`) {
			v = strings.TrimSpace(v[:i])
		}
		v = strings.TrimSuffix(v, `\`)
		top, _, _ := strings.Cut(section, ".")
		switch {
		case key == "core.hookspath", top == "include" || top == "includeif" && strings.HasSuffix(key, ".path"):
			if w := strings.Trim(v, `"`); w != "" {
				out = append(out, w)
			}
		case top == "remote", top == "branch", top == "url", top == "submodule":
		default:
			for _, w := range strings.FieldsFunc(v, func(r rune) bool {
				return r == ' ' || r == '\t' || r == '"' || r == '\'' || r == ';' || r == '&' || r == '|'
			}) {
				w = strings.TrimPrefix(w, "!")
				if strings.Contains(w, "/") && !strings.Contains(w, "://") {
					out = append(out, w)
				}
			}
		}
	}
	return out
}

// findGitRuns lists the folder's paths (with the config naming each) that
// a host git config names: the configs of the git directories in gitDirs
// and of every .git folder the host holds, and the user's global ones.
// Relative names are taken both from the work tree and from the git
// directory, as git resolves hooksPath from one and includes from the
// other.
func (e *Engine) findGitRuns(ctx context.Context, gitDirs map[string]bool) map[string]string {
	var root string
	if d, ok := e.host.(interface{ Dir() string }); ok {
		root = d.Dir()
	}
	home, _ := os.UserHomeDir()
	runs := map[string]string{}
	add := func(p, from string) {
		if _, err := CleanRel(p); err == nil && p != "." {
			runs[p] = from
		}
	}
	// resolve adds a value named by a config, relative ones from each base.
	resolve := func(v, from string, bases ...string) {
		switch {
		case strings.HasPrefix(v, "~/") && home != "":
			v = filepath.Join(home, v[2:])
		case strings.HasPrefix(v, "~"):
			return
		}
		if strings.HasPrefix(v, "/") {
			if root != "" && strings.HasPrefix(v, root+"/") {
				add(path.Clean(strings.TrimPrefix(v, root+"/")), from)
			}
			return
		}
		for _, b := range bases {
			add(path.Join(b, v), from)
		}
	}
	dirs := []string{}
	for d := range gitDirs {
		dirs = append(dirs, d)
	}
	for p := range e.gitMarks {
		if foldName(path.Base(p)) == ".git" {
			if ent := e.hostStat(ctx, p); ent != nil && ent.Type == 'd' {
				dirs = append(dirs, p)
			}
		}
	}
	var worktrees []string
	for _, d := range dirs {
		wt := path.Dir(d)
		worktrees = append(worktrees, wt, d)
		cfg := path.Join(d, "config")
		b, err := readAllMax(ctx, e.host.Read, cfg, maxHostGitConfig)
		if err != nil {
			continue
		}
		for _, v := range gitNamedPaths(b) {
			resolve(v, cfg, wt, d)
		}
	}
	if home != "" && len(worktrees) > 0 {
		xdg := os.Getenv("XDG_CONFIG_HOME")
		if xdg == "" {
			xdg = filepath.Join(home, ".config")
		}
		for _, g := range []string{filepath.Join(home, ".gitconfig"), filepath.Join(xdg, "git", "config")} {
			b, err := readFileMax(g, maxHostGitConfig)
			if err != nil {
				continue
			}
			for _, v := range gitNamedPaths(b) {
				resolve(v, g, worktrees...)
			}
		}
	}
	return runs
}

// readFileMax reads at most max bytes of a file of the host user's.
func readFileMax(name string, max int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

// gitRunWhy says why a guest change to p (of type typ) is held because a
// host git config names it: p is a named path or below one, or a link or
// file in place of a folder above one (it would redirect git there).
func gitRunWhy(p string, typ byte, runs map[string]string) string {
	if typ == 0 {
		return "" // removing a file runs nothing
	}
	fp := foldName(p)
	for r, from := range runs {
		fr := foldName(r)
		switch {
		case fp == fr || strings.HasPrefix(fp, fr+"/"):
			return "the host's git runs or reads this (named in " + from + ")"
		case typ != 'd' && strings.HasPrefix(fr, fp+"/"):
			return "in place of a folder the host's git runs or reads from (named in " + from + ")"
		}
	}
	return ""
}
