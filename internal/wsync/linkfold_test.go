//go:build linux

package wsync

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// foldView is a case-insensitive host (macOS's APFS, a casefold ext4
// folder) as the link rule sees it: a name finds what any of its cases
// names. Links go into the engine's index under the name the guest gave.
type foldView struct {
	links map[string]string // folded path → text
	names map[string]string // folded path → the name it was made under
	x     *linkIndex
}

func (v *foldView) Lstat(p string) (byte, string) {
	if t, ok := v.links[strings.ToLower(p)]; ok {
		return 'l', t
	}
	return 0, ""
}

func (v *foldView) Links() map[string]string {
	m := map[string]string{}
	for k, t := range v.links {
		m[v.names[k]] = t
	}
	return m
}

func (v *foldView) ThroughLink(p string) string { return v.x.throughLink(p) }

func (v *foldView) link(t *testing.T, p, text string) bool {
	t.Helper()
	if why := LinkWhy(v, p, text); why != "" {
		return false
	}
	v.links[strings.ToLower(p)] = text
	v.names[strings.ToLower(p)] = p
	v.x.set(p, text, true)
	return true
}

// On a case-insensitive host, a link at a/d lies on the way of a link
// whose text runs through a/D: made after it, it redirects it ("." then
// "../.." climbs out of the folder). The rule must compare names as the
// host does.
func TestLinkRuleCaseInsensitiveHost(t *testing.T) {
	for _, c := range []struct{ way, link string }{
		{"D", "d"},
		{"É", "é"},
		{"\u00e9", "e\u0301"}, // APFS: normalization-insensitive too
	} {
		v := &foldView{links: map[string]string{}, names: map[string]string{}, x: newLinkIndex()}
		if !v.link(t, "a/k", c.way+"/../../y") {
			t.Fatalf("%q: a link staying inside lexically was refused", c.way)
		}
		if v.link(t, "a/"+c.link, ".") {
			t.Errorf("%q then %q: a link at a/%s redirects a/k -> %s/../../y out of the folder", c.way, c.link, c.link, c.way)
		}
	}
}

// The user changes a link on the host while the guest makes one on its
// new way, in one pass (the guest's comes first in the pass's order): the
// rule must know the host's text, not only the manifest's older one.
func TestLinkRuleSeesHostsNewText(t *testing.T) {
	p := newPair(t, Options{})
	write(t, p.host, "sub/keep", "x")
	os.Symlink("z", filepath.Join(p.host, "sub/u"))
	p.sync(t)
	os.Remove(filepath.Join(p.host, "sub/u"))
	os.Symlink("c/../../y", filepath.Join(p.host, "sub/u")) // the user's: "y", lexically
	os.Symlink(".", filepath.Join(p.guest, "sub/c"))
	p.sync(t)
	assertLinksInside(t, p.host)
}

// A named path of the host's git config is found whatever the case and
// Unicode normalization the guest writes it in: on macOS, "tööls" composed
// and decomposed are one folder.
func TestGitRunSetFoldsNormalization(t *testing.T) {
	s := newGitRunSet(map[string]string{"t\u00f6\u00f6ls/hooks": ".git/config"})
	for _, p := range []string{"t\u00f6\u00f6ls/hooks/pre-commit", "to\u0308o\u0308ls/hooks/pre-commit", "TO\u0308O\u0308LS/HOOKS/pre-commit"} {
		if s.why(p, 'f') == "" {
			t.Errorf("%q: not held", p)
		}
	}
	if s.why("to\u0308o\u0308ls", 'l') == "" {
		t.Error("a link in place of the hooks folder's parent, decomposed: not held")
	}
}
