package wsync

import (
	"hash/maphash"
	"slices"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// linkIndex holds the folder's links for the link rule, kept up to date
// as a pass makes and removes links, so that LinkWhy asks it which link
// runs through a path instead of walking every link at every call
// (landing N links was N × links; issue 9, containment).
//
// A link's way (linkWalk's through) is kept as hashes of its folders, not
// as strings: a link text of k components at a path of n bytes has up to
// k folders of up to n+k bytes each. A hash only points at candidates;
// each is checked by walking its text again, so a collision costs a
// walk, never a wrong answer. Texts of more than maxLinkComps components
// (only the user's: LinkWhy holds the guest's) are kept aside and walked
// at every question, as before.
type linkIndex struct {
	seed    maphash.Seed
	text    map[string]string              // path (or scanKey) → text of every link known
	through map[uint64]map[string]struct{} // hash of a folder → links whose way runs through it
	long    map[string]struct{}            // links whose text is too long to index
}

func newLinkIndex() *linkIndex {
	return &linkIndex{seed: maphash.MakeSeed(), text: map[string]string{},
		through: map[uint64]map[string]struct{}{}, long: map[string]struct{}{}}
}

// set records the link at p with its text, or none there (ok false).
func (x *linkIndex) set(p, text string, ok bool) {
	if old, had := x.text[p]; had {
		if ok && old == text {
			return
		}
		x.index(p, old, false)
		delete(x.text, p)
	}
	if ok {
		x.text[p] = text
		x.index(p, text, true)
	}
}

// index adds (or removes) p's way through the folder.
func (x *linkIndex) index(p, text string, add bool) {
	if linkComps(text) > maxLinkComps {
		if add {
			x.long[p] = struct{}{}
		} else {
			delete(x.long, p)
		}
		return
	}
	through, _, ok := linkWalk(linkPath(p), text)
	if !ok {
		return // a user's link out; nothing of ours runs through it
	}
	for _, t := range through {
		h := maphash.String(x.seed, linkFold(t))
		m := x.through[h]
		switch {
		case add && m == nil:
			x.through[h] = map[string]struct{}{p: {}}
		case add:
			m[p] = struct{}{}
		case m != nil:
			delete(m, p)
			if len(m) == 0 {
				delete(x.through, h)
			}
		}
	}
}

// throughLink returns a link, other than p, whose way runs through p as
// a folder, or "".
func (x *linkIndex) throughLink(p string) string {
	runs := func(k string) bool { return linkPath(k) != p && linkRunsThrough(linkPath(k), x.text[k], p) }
	for k := range x.through[maphash.String(x.seed, linkFold(p))] {
		if runs(k) {
			return linkPath(k)
		}
	}
	for k := range x.long {
		if runs(k) {
			return linkPath(k)
		}
	}
	return ""
}

// scanKey is the key the index keeps the text the pass's scan saw at p
// under, when the manifest's text there differs (the user changed the
// link since the last pass): until the pass writes p, the host's link is
// the scan's, and a link made on its way would redirect it.
func scanKey(p string) string { return p + "\x00" }

// linkPath is the path of a key of the index.
func linkPath(k string) string { return strings.TrimSuffix(k, "\x00") }

// linkComps is about how many components a link text has (its slashes
// and one): what bounds the work of resolving it.
func linkComps(text string) int { return strings.Count(text, "/") + 1 }

// linkRunsThrough reports whether the link at k with text runs through p
// as a folder, names compared as a case- or normalization-insensitive
// host compares them (linkFold): there a link at a/d redirects one whose
// text runs through a/D.
func linkRunsThrough(k, text, p string) bool {
	th, _, ok := linkWalk(k, text)
	if !ok {
		return false // a user's own link out; nothing of ours runs through it
	}
	fp := linkFold(p)
	return slices.ContainsFunc(th, func(t string) bool { return t == p || linkFold(t) == fp })
}

// linkFold is a name as a host that ignores case and Unicode
// normalization (macOS) may take it: two names that fold alike may be one
// entry there. Folding more than a host does only refuses more links.
func linkFold(s string) string { return foldName(norm.NFD.String(s)) }
