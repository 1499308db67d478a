package wsync

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// setup makes a workspace next to a folder the guest must never reach.
func setup(t *testing.T) (*Root, string, string) {
	t.Helper()
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	outside := filepath.Join(base, "home")
	for _, d := range []string{ws, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "id_rsa"), []byte("PRIVATE KEY"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, ws, outside
}

func TestLinkOutIsNeverFollowed(t *testing.T) {
	r, ws, outside := setup(t)
	secret := filepath.Join(outside, "id_rsa")
	if err := os.Symlink(secret, filepath.Join(ws, "leak")); err != nil {
		t.Fatal(err)
	}
	e, err := r.Stat("leak")
	if err != nil || e.Type != 'l' || e.Link != secret || e.Hash != "" {
		t.Fatalf("stat of the link: %+v %v", e, err)
	}
	if f, err := r.Open("leak"); err == nil {
		b, _ := io.ReadAll(f)
		f.Close()
		t.Fatalf("read through the link: %q", b)
	}
	if _, err := r.WriteFile("leak", 0o644, strings.NewReader("overwritten"), 1<<20, "", Anything); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "PRIVATE KEY" {
		t.Fatalf("wrote through the link: the target holds %q", b)
	}
	if fi, _ := os.Lstat(filepath.Join(ws, "leak")); !fi.Mode().IsRegular() {
		t.Fatal("the link should have been replaced by a file")
	}
}

func TestLinkedParentIsRefused(t *testing.T) {
	r, ws, outside := setup(t)
	if err := os.Symlink(outside, filepath.Join(ws, "dir")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WriteFile("dir/planted", 0o644, strings.NewReader("x"), 1<<20, "", Anything); err == nil {
		t.Fatal("wrote through a linked parent")
	}
	if _, err := r.Stat("dir/id_rsa"); err == nil {
		if e, _ := r.Stat("dir/id_rsa"); e != nil {
			t.Fatal("stat through a linked parent")
		}
	}
	if _, err := r.Open("dir/id_rsa"); err == nil {
		t.Fatal("opened through a linked parent")
	}
	if err := r.MkdirAll("dir/sub", 0o755); err == nil {
		t.Fatal("mkdir through a linked parent")
	}
	if err := r.Remove("dir/id_rsa", Anything); err == nil {
		if _, err := os.Stat(filepath.Join(outside, "id_rsa")); err != nil {
			t.Fatal("removed through a linked parent")
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Fatal("a file appeared outside the workspace")
	}
}

func TestParentSwappedMidWay(t *testing.T) {
	r, ws, outside := setup(t)
	if err := r.MkdirAll("a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WriteFile("a/b/f", 0o644, strings.NewReader("1"), 10, "", Anything); err != nil {
		t.Fatal(err)
	}
	// The guest (or a race) swaps a/b for a link to the outside.
	os.RemoveAll(filepath.Join(ws, "a", "b"))
	if err := os.Symlink(outside, filepath.Join(ws, "a", "b")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WriteFile("a/b/f", 0o644, strings.NewReader("2"), 10, "", Anything); err == nil {
		t.Fatal("write followed the swapped parent")
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); err == nil {
		t.Fatal("the write landed outside")
	}
}

func TestHostileNames(t *testing.T) {
	r, _, _ := setup(t)
	for _, p := range []string{"../escape", "a/../../escape", "/etc/passwd", "a\x00b", "", ".", "a//b", "./a", strings.Repeat("x", 256), strings.Repeat("a/", 2100) + "b"} {
		if _, err := r.WriteFile(p, 0o644, strings.NewReader("x"), 10, "", Anything); !errors.Is(err, ErrBadPath) {
			t.Errorf("WriteFile(%q): %v", p, err)
		}
		if _, err := r.Stat(p); !errors.Is(err, ErrBadPath) && p != "" {
			t.Errorf("Stat(%q): %v", p, err)
		}
	}
}

func TestSpecialFilesAndBits(t *testing.T) {
	r, ws, _ := setup(t)
	if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Stat("fifo"); err == nil || !strings.Contains(err.Error(), "special file") {
		t.Fatalf("stat of a FIFO: %v", err)
	}
	if _, err := r.Open("fifo"); err == nil {
		t.Fatal("opened a FIFO")
	}
	if _, err := r.WriteFile("suid", 0o4755|os.ModeSetuid|os.ModeSticky, strings.NewReader("#!/bin/sh"), 100, "", Anything); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(ws, "suid"))
	if fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if err := r.Chmod("suid", 0o6777); err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Stat(filepath.Join(ws, "suid"))
	if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
		t.Fatalf("chmod set special bits: %v", fi.Mode())
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestSizeCap(t *testing.T) {
	r, ws, _ := setup(t)
	// A "10 GiB" file from the guest against a 1 MiB cap: refused after the
	// cap, nothing left behind.
	_, err := r.WriteFile("huge", 0o644, io.LimitReader(zeros{}, 10<<30), 1<<20, "", Anything)
	if err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("over the cap: %v", err)
	}
	entries, _ := os.ReadDir(ws)
	if len(entries) != 0 {
		t.Fatalf("left behind: %v", entries)
	}
	// A sparse 10 GiB file on the host is described, not read.
	f, _ := os.Create(filepath.Join(ws, "sparse"))
	f.Truncate(10 << 30)
	f.Close()
	start := time.Now()
	e, err := r.Stat("sparse")
	if err != nil || e.Size != 10<<30 || !e.Big || e.Hash != "" {
		t.Fatalf("sparse: %+v %v", e, err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("describing a file over the cap took %s: it was read", time.Since(start))
	}
}

func TestSymlinkRules(t *testing.T) {
	r, ws, _ := setup(t)
	ok := map[string]string{"a/l1": "../b", "l2": "b/c", "a/b/l3": "../../x"}
	bad := map[string]string{"l4": "/etc/passwd", "a/l5": "../../etc", "l6": "..", "l7": "", "l8": "a/../../x"}
	r.MkdirAll("a/b", 0o755)
	for p, target := range ok {
		if err := r.Symlink(p, target, Anything); err != nil {
			t.Errorf("%s -> %s refused: %v", p, target, err)
		}
	}
	for p, target := range bad {
		if err := r.Symlink(p, target, Anything); err == nil {
			t.Errorf("%s -> %s created", p, target)
		}
	}
	if l, _ := os.Readlink(filepath.Join(ws, "a/l1")); l != "../b" {
		t.Fatalf("link text %q", l)
	}
}

func FuzzCleanRel(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "a/./b", "/abs", "a\x00", "ok.txt"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := CleanRel(p)
		if err != nil {
			return
		}
		if filepath.IsAbs(c) || strings.Contains("/"+c+"/", "/../") || strings.Contains("/"+c+"/", "/./") || strings.ContainsRune(c, 0) {
			t.Fatalf("accepted %q", c)
		}
		if rel, err := filepath.Rel("/root", filepath.Join("/root", c)); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("%q escapes", c)
		}
	})
}

// A sync root is opened as the path reads, following no link: the
// supervisor checks that a workspace's recorded path still leads to the
// folder it names (folder.Resolve) and then opens it; a link swapped into
// the path between the two (by anyone who can write a folder above it)
// must not take the sync to another folder.
func TestOpenRootFollowsNoLink(t *testing.T) {
	top := t.TempDir()
	real := filepath.Join(top, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Symlink("real", filepath.Join(top, "ws"))
	up := filepath.Join(t.TempDir(), "up")
	os.Symlink(top, up)
	for _, p := range []string{filepath.Join(top, "ws"), filepath.Join(up, "real")} { // the link last, and on the way
		if r, err := OpenRoot(p); err == nil {
			r.Close()
			t.Errorf("OpenRoot(%s) followed the link", p)
		}
	}
	r, err := OpenRoot(real)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
}
