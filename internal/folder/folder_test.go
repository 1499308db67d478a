package folder

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree makes A/proj/sub, A/S, S beside A, and the link A/in -> proj/sub
// (relative, staying inside A: the kind the sync makes on the host from a
// guest); it returns the resolved parent of A.
func tree(t *testing.T) string {
	t.Helper()
	top, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"A/proj/sub", "A/S", "S"} {
		if err := os.MkdirAll(filepath.Join(top, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("proj/sub", filepath.Join(top, "A", "in")); err != nil {
		t.Fatal(err)
	}
	return top
}

// A link is followed before the ".." after it: A/in/../../S is A/S (the
// parent of A/proj/sub is A/proj, its parent A), never S beside A, which
// is what filepath.Abs or Clean make of the text.
func TestResolveFollowsLinksBeforeDotDot(t *testing.T) {
	top := tree(t)
	a := filepath.Join(top, "A")
	for _, tc := range []struct{ name, want string }{
		{a + "/in/../../S", a + "/S"},
		{a + "/in/..", a + "/proj"},
		{a + "/in", a + "/proj/sub"},
		{a + "/./proj//sub/", a + "/proj/sub"},
		{a + "/proj/sub/../../../S", top + "/S"},
	} {
		got, err := Resolve(tc.name)
		if err != nil || got.String() != tc.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.name, got, err, tc.want)
		}
		if lexical := filepath.Clean(tc.name); lexical != tc.want && got.String() == lexical {
			t.Errorf("Resolve(%q) read the path as text", tc.name)
		}
	}
}

// A relative name is read from the current folder as the kernel has it,
// even when the shell's $PWD reaches it through a link.
func TestResolveRelative(t *testing.T) {
	top := tree(t)
	t.Chdir(filepath.Join(top, "A", "in"))
	t.Setenv("PWD", filepath.Join(top, "A", "in")) // as a shell that cd'ed through the link has it
	for _, tc := range []struct{ name, want string }{
		{".", top + "/A/proj/sub"},
		{"..", top + "/A/proj"},
		{"../../S", top + "/A/S"},
	} {
		got, err := Resolve(tc.name)
		if err != nil || got.String() != tc.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if cur, err := Current(); err != nil || cur.String() != top+"/A/proj/sub" {
		t.Errorf("Current() = %q, %v", cur, err)
	}
}

func TestResolveRefuses(t *testing.T) {
	top := tree(t)
	os.WriteFile(filepath.Join(top, "file"), []byte("x"), 0o644)
	os.Symlink("file", filepath.Join(top, "tofile"))
	os.Symlink("loop", filepath.Join(top, "loop"))
	for name, want := range map[string]string{
		"":                       "no folder",
		top + "/nope":            "does not exist",
		top + "/file":            "not a folder",
		top + "/tofile":          "not a folder",
		top + "/loop":            "",
		top + "/A\x00/../etc":    "NUL",
		top + "/file/..":         "",
		top + "/A/in/../../nope": "does not exist",
	} {
		got, err := Resolve(name)
		if err == nil {
			t.Errorf("Resolve(%q) = %q, want an error", name, got)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("Resolve(%q): %v, want %q", name, err, want)
		}
	}
}

func TestWithin(t *testing.T) {
	p := func(s string) Path { return Path{s} }
	for _, tc := range []struct {
		p     string
		roots []string
		want  bool
	}{
		{"/a/b", []string{"/a/b"}, true},
		{"/a/b/c", []string{"/a/b"}, true},
		{"/a/bc", []string{"/a/b"}, false},
		{"/a", []string{"/a/b"}, false},
		{"/x", []string{"/a", "/"}, true},
		{"/x", nil, false},
		{"", []string{"/"}, false},
		{"/x", []string{""}, false},
		{"/a/prоj", []string{"/a/proj"}, false}, // Cyrillic о
	} {
		var roots []Path
		for _, r := range tc.roots {
			roots = append(roots, p(r))
		}
		if got := p(tc.p).Within(roots...); got != tc.want {
			t.Errorf("%q within %q = %v", tc.p, tc.roots, got)
		}
	}
}
