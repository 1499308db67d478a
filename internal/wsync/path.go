// Package wsync keeps a sandbox's workspace (a directory on a disk of the
// VM) and the host folder it came from in step, both ways, without ever
// letting the guest reach past the folder on the host.
//
// The host side never follows a symlink, never leaves the folder, never
// creates devices, FIFOs, sockets or set-id bits, and refuses hostile
// names (safefs_*.go). Changes to files that host tools run or obey by
// themselves are held for approval (held.go). Sync decisions compare three
// states of each path: the last synced one (the manifest), the host's and
// the guest's (engine.go).
package wsync

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// Limits on names from the guest.
const (
	MaxPathLen = 4096
	MaxNameLen = 255
)

// ErrBadPath is returned for a path the host side refuses.
var ErrBadPath = errors.New("refused path")

// CleanRel checks a slash-separated path relative to the workspace root:
// not absolute, no "." or ".." components, no NUL, no empty components,
// bounded length. It returns the path unchanged, or an error.
func CleanRel(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: empty", ErrBadPath)
	}
	if len(p) > MaxPathLen {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrBadPath, MaxPathLen)
	}
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: %q is absolute", ErrBadPath, p)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: NUL in name", ErrBadPath)
	}
	for _, c := range strings.Split(p, "/") {
		switch {
		case c == "" || c == "." || c == "..":
			return "", fmt.Errorf("%w: %q has an empty, '.' or '..' component", ErrBadPath, p)
		case len(c) > MaxNameLen:
			return "", fmt.Errorf("%w: a component of %q is longer than %d bytes", ErrBadPath, p, MaxNameLen)
		}
	}
	return p, nil
}

// LinkStaysInside reports whether a symlink at rel with target stays
// within the root when resolved lexically: relative, and never climbing
// above the root.
func LinkStaysInside(rel, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") || strings.ContainsRune(target, 0) {
		return false
	}
	joined := path.Join(path.Dir(rel), target)
	return joined != ".." && !strings.HasPrefix(joined, "../") && joined != "."
}
