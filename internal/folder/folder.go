// Package folder is the one way a host folder named by anyone becomes a
// path kosa8 uses: a CLI argument or the current folder, an SDK field, an
// MCP tool's argument, the folder kosa8.toml is read from and trusted in,
// the MCP server's --folder, a sandbox's recorded workspace when its
// supervisor opens it. Every later check (is it inside the MCP server's
// folders? does another sandbox sync it? is it the home directory?) and
// every use takes the Path that Resolve returns, never the name it was
// given.
//
// The rule that makes the answer the file system's own: links are
// resolved on the real file system before a ".." is applied, so "A/in/.."
// is the parent of wherever the link A/in points, as the kernel reads it,
// not A. Nothing here calls filepath.Abs or filepath.Clean on a name
// before its links are resolved: both drop ".." by the text, which is how
// "A/in/../../S" once passed as A/S to one check and reached S in the
// next (issue 28). A test enumerates the entry points (entry_ast_test.go).
//
// Names are compared byte for byte: a Unicode look-alike (a Cyrillic "о"
// for a Latin "o") names another folder, which must pass the checks on
// its own. On a case-insensitive file system (macOS) two spellings of one
// folder are two Paths: a check that asks "is it inside?" can only refuse
// more, but two sandboxes could sync one folder through two spellings
// (the supervisor's folder lock is by path).
package folder

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Path is a host folder's canonical path: absolute, every link resolved,
// no "." or "..", an existing directory when it was resolved. Only Resolve
// and Current make one, so a Path in a field or an argument says the
// folder went through them.
type Path struct{ p string }

// String is the canonical path ("" for the zero Path).
func (p Path) String() string { return p.p }

// IsZero reports whether p names no folder.
func (p Path) IsZero() bool { return p.p == "" }

// Resolve returns the folder that name means: relative to the process's
// current folder unless absolute, links resolved on the real file system
// before each "..". It fails when the folder does not exist, is not a
// directory, or changed while it was being resolved.
func Resolve(name string) (Path, error) {
	if name == "" {
		return Path{}, errors.New("no folder given")
	}
	if strings.ContainsRune(name, 0) {
		return Path{}, fmt.Errorf("folder %q: a path holds no NUL byte", name)
	}
	raw := name
	if !filepath.IsAbs(name) {
		// Joined as text, not with filepath.Join (which cleans): the
		// current folder's own links are resolved by the walk below,
		// before the name's "..".
		wd, err := os.Getwd()
		if err != nil {
			return Path{}, fmt.Errorf("folder %s: the current folder: %w", name, err)
		}
		raw = wd + string(filepath.Separator) + name
	}
	// EvalSymlinks walks the raw path one component at a time and applies
	// ".." to what it has resolved so far, so a link is followed before
	// the ".." after it: the kernel's reading of the path.
	real, err := filepath.EvalSymlinks(raw)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Path{}, fmt.Errorf("folder %s does not exist", name)
		}
		return Path{}, fmt.Errorf("folder %s: %w", name, err)
	}
	if !filepath.IsAbs(real) {
		return Path{}, fmt.Errorf("folder %s resolved to %q, not an absolute path", name, real)
	}
	// The result has no link left in it, unless one was swapped in while
	// the walk ran: walked again, it must come back unchanged (a folder
	// whose links a sandbox's guest can change, through the sync, is one
	// kosa8 must not read two ways).
	again, err := filepath.EvalSymlinks(real)
	if err != nil || again != real {
		return Path{}, fmt.Errorf("folder %s changed while it was being resolved (%s): try again", name, real)
	}
	fi, err := os.Lstat(real)
	if err != nil {
		return Path{}, fmt.Errorf("folder %s: %w", name, err)
	}
	if !fi.IsDir() {
		return Path{}, fmt.Errorf("%s is not a folder", name)
	}
	return Path{real}, nil
}

// Current is the process's current folder, resolved.
func Current() (Path, error) {
	return Resolve(".")
}

// Within reports whether p is one of roots or a folder below one.
func (p Path) Within(roots ...Path) bool {
	if p.IsZero() {
		return false
	}
	for _, r := range roots {
		if r.IsZero() {
			continue
		}
		if p.p == r.p || r.p == string(filepath.Separator) ||
			strings.HasPrefix(p.p, r.p+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// Holds reports whether p is an ancestor of other, or other itself.
func (p Path) Holds(other Path) bool { return other.Within(p) }
