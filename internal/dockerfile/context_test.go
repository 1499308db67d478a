package dockerfile

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for rel, body := range files {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(body, "->") {
			if err := os.Symlink(strings.TrimPrefix(body, "->"), p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func tarNames(t *testing.T, c *Context) map[string]string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := c.WriteTar(tw, "context"); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if int64(buf.Len()) > c.TarSize() {
		t.Errorf("tar of %d bytes, TarSize said %d", buf.Len(), c.TarSize())
	}
	out := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			out[h.Name] = "dir"
		case tar.TypeSymlink:
			out[h.Name] = "->" + h.Linkname
		default:
			b, _ := io.ReadAll(tr)
			out[h.Name] = string(b)
		}
	}
}

func TestContextWalk(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"Dockerfile":            "FROM a:1\n",
		"src/main.go":           "package main",
		"src/link":              "->main.go",
		"src/up":                "->../README",
		"README":                "hi",
		"node_modules/x/i.js":   "x",
		"build/out.bin":         "x",
		"build/keep.txt":        "keep",
		"venv/bin/python":       "->/usr/bin/python3", // out, but ignored
		"logs/a.log":            "x",
		"docs/sub/deep/file.md": "d",
	})
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	ig, err := ParseIgnore([]byte("node_modules\nbuild\n!build/keep.txt\nvenv\n*/*.log\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ReadContext(dir, ig, DefaultContextLimits)
	if err != nil {
		t.Fatal(err)
	}
	got := tarNames(t, c)
	want := map[string]string{
		"context/": "dir", "context/Dockerfile": "FROM a:1\n", "context/README": "hi",
		"context/src/": "dir", "context/src/main.go": "package main", "context/src/link": "->main.go", "context/src/up": "->../README",
		"context/build/keep.txt": "keep", "context/logs/": "dir",
		"context/docs/": "dir", "context/docs/sub/": "dir", "context/docs/sub/deep/": "dir", "context/docs/sub/deep/file.md": "d",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s was sent", k)
		}
	}
	if !slices.Equal(c.Skipped, []string{"fifo"}) {
		t.Errorf("skipped %q, want the FIFO", c.Skipped)
	}
	// The digest follows content, not only names and sizes.
	c2, _ := ReadContext(dir, ig, DefaultContextLimits)
	writeFiles(t, dir, map[string]string{"README": "ho"})
	c3, _ := ReadContext(dir, ig, DefaultContextLimits)
	if c.Digest != c2.Digest || c.Digest == c3.Digest {
		t.Errorf("digests %s %s %s: same context must hash the same, a changed file otherwise", c.Digest, c2.Digest, c3.Digest)
	}
}

// A link that leads out of the context, directly or through other links,
// is refused with its name; nothing is written anywhere.
func TestContextLinksOut(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		bad   string
	}{
		{"absolute", map[string]string{"etc": "->/etc"}, "etc"},
		{"climbs", map[string]string{"a/b/up": "->../../.."}, "a/b/up"},
		{"through a link", map[string]string{"sub/root": "->..", "sub/out": "->root/.."}, "sub/out"},
		{"chain", map[string]string{"c1": "->c2", "c2": "->sub/c3", "sub/c3": "->../../x"}, "c"},
		{"loop", map[string]string{"l1": "->l2", "l2": "->l1", "x": "->l1/y"}, "l"},
		{"to the home", map[string]string{"ssh": "->../../../../../../root/.ssh"}, "ssh"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, c.files)
			_, err := ReadContext(dir, nil, DefaultContextLimits)
			if err == nil || !errors.Is(err, ErrContext) || !strings.Contains(err.Error(), "leads out of the build context") || !strings.Contains(err.Error(), c.bad) {
				t.Errorf("err %v", err)
			}
		})
	}
	// Links that stay inside are kept, however they get there.
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"sub/root": "->..", "sub/in": "->root/sub/../README", "README": "x", "dangling": "->nowhere"})
	if _, err := ReadContext(dir, nil, DefaultContextLimits); err != nil {
		t.Errorf("inside links refused: %v", err)
	}
}

func TestContextLimits(t *testing.T) {
	dir := t.TempDir()
	// A sparse 5 GiB file: its size is refused before a byte of it is read.
	f, err := os.Create(filepath.Join(dir, "huge.img"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(5 << 30); err != nil {
		t.Skipf("the file system here cannot hold a sparse 5 GiB file: %v", err)
	}
	f.Close()
	_, err = ReadContext(dir, nil, DefaultContextLimits)
	if err == nil || !strings.Contains(err.Error(), "more than 4 GiB") || !strings.Contains(err.Error(), ".dockerignore") {
		t.Errorf("a 5 GiB context: %v", err)
	}
	ig, _ := ParseIgnore([]byte("*.img\n"))
	if _, err := ReadContext(dir, ig, DefaultContextLimits); err != nil {
		t.Errorf("the huge file ignored: %v", err)
	}
	writeFiles(t, dir, map[string]string{"a": "1", "b": "2", "c/d": "3"})
	if _, err := ReadContext(dir, ig, ContextLimits{Bytes: 1 << 20, Files: 3, Visit: 100}); err == nil || !strings.Contains(err.Error(), "more than 3 files") {
		t.Errorf("files bound: %v", err)
	}
	if _, err := ReadContext(dir, ig, ContextLimits{Bytes: 1 << 20, Files: 100, Visit: 3}); err == nil || !strings.Contains(err.Error(), "more than 3 entries") {
		t.Errorf("visit bound: %v", err)
	}
}

// A file replaced by a link between the walk and the tar is not followed:
// the tar fails.
func TestContextSwappedFile(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("O_NOFOLLOW's error differs elsewhere; the check is the same")
	}
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	writeFiles(t, dir, map[string]string{"a.txt": "public"})
	os.WriteFile(secret, []byte("host secret"), 0o600)
	c, err := ReadContext(dir, nil, DefaultContextLimits)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "a.txt"))
	os.Symlink(secret, filepath.Join(dir, "a.txt"))
	var buf bytes.Buffer
	err = c.WriteTar(tar.NewWriter(&buf), "context")
	if err == nil || bytes.Contains(buf.Bytes(), []byte("host secret")) {
		t.Errorf("a file swapped for a link was followed: %v", err)
	}
	// Replaced by another file of the same size: refused too.
	os.Remove(filepath.Join(dir, "a.txt"))
	writeFiles(t, dir, map[string]string{"a.txt": "PUBLIC"})
	if err := c.WriteTar(tar.NewWriter(io.Discard), "context"); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Errorf("a replaced file: %v", err)
	}
}
