package dockerfile

import (
	"strings"
	"testing"
)

func TestIgnore(t *testing.T) {
	ig, err := ParseIgnore([]byte(`# build output
node_modules
/dist
*.log
**/*.pyc
docs/
!docs/keep.md
tmp?
[a-c].bin
\*.lit
.git
`))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		"node_modules":              true,
		"node_modules/x/index.js":   true,
		"src/node_modules":          false, // a pattern without ** matches from the root only
		"dist/app.js":               true,
		"a.log":                     true,
		"sub/a.log":                 false,
		"a.pyc":                     true,
		"deep/er/a.pyc":             true,
		"docs/readme.md":            true,
		"docs/keep.md":              false,
		"tmp1":                      true,
		"tmp12":                     false,
		"b.bin":                     true,
		"d.bin":                     false,
		"*.lit":                     true,
		"x.lit":                     false,
		".git/config":               true,
		"main.go":                   false,
		"Dockerfile":                false,
		"src/nested/file.go":        false,
		"node_modules_not_same_dir": false,
	} {
		if got := ig.Excluded(path); got != want {
			t.Errorf("Excluded(%q) = %v, want %v", path, got, want)
		}
	}
	// With an exception no excluded folder is skipped whole.
	if ig.SkipDir("docs") || ig.SkipDir("node_modules") {
		t.Error("a folder was skipped although a ! pattern may take something under it back in")
	}
	ig2, _ := ParseIgnore([]byte("node_modules\n"))
	if !ig2.SkipDir("node_modules") || ig2.SkipDir("src") {
		t.Error("SkipDir without exceptions")
	}
	var none *Ignore
	if none.Excluded("x") || none.SkipDir("x") {
		t.Error("a nil Ignore excluded something")
	}
	for _, bad := range []string{"[abc", "a[]b", strings.Repeat("a", maxPatternLen+1)} {
		if _, err := ParseIgnore([]byte(bad + "\n")); err == nil {
			t.Errorf("pattern %q accepted", bad)
		}
	}
	if _, err := ParseIgnore([]byte(strings.Repeat("x\n", maxIgnorePatterns+1))); err == nil {
		t.Error("more than maxIgnorePatterns accepted")
	}
}

// FuzzIgnore: any .dockerignore and path are matched without panicking,
// and a pattern matching a folder excludes what is under it.
func FuzzIgnore(f *testing.F) {
	f.Add("node_modules\n!a\n**/*.go\n[a-c]?\\*\n", "node_modules/a/b.go")
	f.Add("/dist\n#c\n!dist/keep\n", "dist/keep")
	f.Fuzz(func(t *testing.T, patterns, path string) {
		ig, err := ParseIgnore([]byte(patterns))
		if err != nil {
			return
		}
		if len(path) > maxCtxPath || path == "" || strings.HasPrefix(path, "/") {
			return
		}
		ex := ig.Excluded(path)
		if ex && !ig.exceptions && !ig.Excluded(path+"/child") {
			t.Fatalf("%q is excluded but %q under it is not (patterns %q)", path, path+"/child", patterns)
		}
	})
}
