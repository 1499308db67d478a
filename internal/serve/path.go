package serve

import (
	"errors"
	"path"
	"strings"
)

// ErrOutside is a contract path that leaves the base directory.
var ErrOutside = errors.New("the path leaves the sandbox's base directory")

// maxPath bounds a path taken from a request (Linux's PATH_MAX).
const maxPath = 4096

// contractPath turns a path of agent-sandbox's runtime contract into the
// guest path the file commands take. The contract reads every path under
// the runtime's base directory: a leading "/" is dropped ("/a" is base/a,
// as the python runtime's get_safe_path has it), and a path that climbs out
// of the base with ".." is refused. The answer is relative ("./a", so a
// name starting with '-' is never an option) when base is "" (the guest's
// default working directory: the workspace, else the user's home), else
// base joined with it. It is lexical: links are the guest's own business,
// inside the VM, and reach nothing of the host.
func contractPath(base, p string) (string, error) {
	if p == "" {
		return "", errors.New("no path given")
	}
	if len(p) > maxPath {
		return "", errors.New("the path is too long")
	}
	if strings.ContainsRune(p, 0) {
		return "", errors.New("the path contains NUL")
	}
	rel := path.Clean("/" + strings.TrimLeft(p, "/"))
	// Clean of a rooted path drops leading ".." (/../a is /a), so compare
	// with what was asked: any ".." that would climb above the base counts.
	if climbs(strings.TrimLeft(p, "/")) {
		return "", ErrOutside
	}
	rel = strings.TrimPrefix(rel, "/")
	if rel == "" {
		rel = "."
	}
	if base == "" {
		if rel == "." {
			return ".", nil
		}
		return "./" + rel, nil
	}
	return path.Join(base, rel), nil
}

// climbs says whether the relative path p goes above its start at any
// point ("a/../../b" does, "a/../b" does not).
func climbs(p string) bool {
	depth := 0
	for _, el := range strings.Split(p, "/") {
		switch el {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}
