// Package wsync keeps a sandbox's workspace (a directory on a disk of the
// VM) and the host folder it came from in step, both ways, without ever
// letting the guest reach past the folder on the host.
//
// The host side never follows a symlink, never leaves the folder, never
// creates devices, FIFOs, sockets or set-id bits, and refuses hostile
// names (safefs.go). Every write of guest data to the host folder goes
// through one function, Engine.gate (engine.go; gate_ast_test.go holds
// that), which applies the hold rules (held.go: files host tools run or
// obey, git by allow-list), the link rule (LinkWhy), review mode and the
// quotas. Sync decisions compare three states of each path: the last
// synced one (the manifest), the host's and the guest's (engine.go).
package wsync

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"sync/atomic"
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
// above the root. It is only the first half of the link rule: see LinkWhy.
func LinkStaysInside(rel, target string) bool {
	_, final, ok := linkWalk(rel, target)
	return ok && final != "."
}

// maxLinkHops bounds a chain of links followed, as the kernel's 40.
const maxLinkHops = 40

// linkWalks counts linkWalk's calls, for a test's bound on the work of
// landing many links.
var linkWalks atomic.Int64

// maxLinkComps bounds the components of a link text the rule resolves: a
// longer one is held. Resolving a link costs work in its components at
// every hop, and the folders its way runs through are indexed for the
// rest of the pass; real link texts have a handful.
const maxLinkComps = 64

// linkWalk resolves a link at rel with target lexically, from rel's folder:
// through are the paths the resolution passes through as folders (each
// component of target that another follows), final where it ends ("." the
// root); ok false when the target is empty, absolute, holds a NUL or
// climbs above the root.
func linkWalk(rel, target string) (through []string, final string, ok bool) {
	linkWalks.Add(1)
	if target == "" || strings.HasPrefix(target, "/") || strings.ContainsRune(target, 0) || len(target) > MaxPathLen {
		return nil, "", false
	}
	var cur []string
	if d := path.Dir(rel); d != "." {
		cur = strings.Split(d, "/")
	}
	var comps []string
	for _, c := range strings.Split(target, "/") {
		if c != "" && c != "." {
			comps = append(comps, c)
		}
	}
	for j, c := range comps {
		if j > 0 && len(cur) > 0 {
			// The previous component is looked up as a folder to go on.
			through = append(through, strings.Join(cur, "/"))
		}
		if c == ".." {
			if len(cur) == 0 {
				return nil, "", false
			}
			cur = cur[:len(cur)-1]
			continue
		}
		cur = append(cur, c)
	}
	if len(cur) == 0 {
		return through, ".", true
	}
	return through, strings.Join(cur, "/"), true
}

// LinkView is the host folder as the link rule sees it, at the moment of
// the decision.
type LinkView interface {
	// Lstat returns the type of what is at p ('f', 'd', 'l', 0 for
	// nothing) and, for a link, its text; never following a link.
	Lstat(p string) (typ byte, link string)
	// Links are the links the folder holds (path → text), as far as
	// known: those a sync made or saw, the user's included.
	Links() map[string]string
}

// throughView is a LinkView that knows, without listing every link, a
// link whose way runs through a path (the engine's, see linkIndex).
type throughView interface {
	// ThroughLink returns a link other than p whose text, resolved from
	// its folder, passes through p as a folder; or "".
	ThroughLink(p string) string
}

// LinkWhy is the link rule: a link at p with target is created on the
// host only if it stays inside when resolved through every link the
// folder holds, and cannot be made to leave later. It returns why not, or
// "". The invariant it keeps: no link's path runs through another link as
// a folder, so every link resolves as its text reads, from hop to hop,
// and each hop stays inside. Hence:
//   - the target must stay inside lexically (never above the root, never
//     the root itself);
//   - no folder on its way may be a link now (a/b/c/up/../../x where up
//     is a link would leave through up);
//   - where it ends on a link, that link's chain must stay inside too;
//   - p itself must not lie on the way of a link already there (else that
//     link, checked while p was a folder or absent, would then run through
//     p). Folders and files never redirect a link: once no link runs
//     through a link, a folder appearing on the way only makes the path
//     real as it was read.
func LinkWhy(v LinkView, p, target string) string {
	if linkComps(target) > maxLinkComps {
		return fmt.Sprintf("symlink text of more than %d components", maxLinkComps)
	}
	through, final, ok := linkWalk(p, target)
	if !ok || final == "." {
		return "symlink leaves the folder (" + target + ")"
	}
	checked := map[string]bool{} // a folder on the way of several hops is asked once
	check := func(through []string) string {
		for _, t := range through {
			if checked[t] {
				continue
			}
			checked[t] = true
			if typ, _ := v.Lstat(t); typ == 'l' {
				return "symlink's target runs through the link " + t
			}
		}
		return ""
	}
	if why := check(through); why != "" {
		return why
	}
	for hop := 0; ; hop++ {
		if hop >= maxLinkHops {
			return "symlink chain longer than 40 links"
		}
		if final == p {
			return "symlink points at itself"
		}
		typ, link := v.Lstat(final)
		if typ != 'l' {
			break
		}
		var ok bool
		through, final, ok = linkWalk(final, link)
		if !ok || final == "." {
			return "symlink leads out of the folder through the link " + final
		}
		if why := check(through); why != "" {
			return why
		}
	}
	if tv, ok := v.(throughView); ok {
		if k := tv.ThroughLink(p); k != "" {
			return "a link here would redirect the link " + k
		}
		return ""
	}
	for k, t := range v.Links() {
		if k != p && linkRunsThrough(k, t, p) {
			return "a link here would redirect the link " + k
		}
	}
	return ""
}
