package wsync

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// gitIndex makes a repository with files at names and returns its index
// bytes, in index version v (3: an intent-to-add entry sets extended
// flags), each name in it then replaced by its pair in rename (of the same
// length), the checksum made right: what a guest can write.
func gitIndex(t *testing.T, v string, names []string, rename map[string]string) []byte {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	d := t.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = d
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	run("init", "-q", ".")
	for _, n := range names {
		write(t, d, n, "x\n")
	}
	run("add", ".")
	if v == "3" {
		write(t, d, "ita", "x\n")
		run("add", "-N", "ita")
	} else {
		run("update-index", "--index-version", v)
	}
	b, err := os.ReadFile(filepath.Join(d, ".git/index"))
	if err != nil {
		t.Fatal(err)
	}
	for from, to := range rename {
		i := bytes.Index(b, []byte(from))
		if i < 0 || len(from) != len(to) {
			t.Fatalf("no %q in the index", from)
		}
		copy(b[i:], to)
	}
	sum := sha1.Sum(b[:len(b)-20])
	copy(b[len(b)-20:], sum[:])
	return b
}

func checkIndex(b []byte, chunk int) error {
	r := newIndexCheck(&chunked{b: b, n: chunk}, 20)
	_, err := io.Copy(io.Discard, r)
	return err
}

// chunked reads b n bytes at a time.
type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), c.n, len(c.b))
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

func TestIndexCheck(t *testing.T) {
	names := []string{"a.txt", "dir/b.txt", "dir/sub/c.go", "yy/esc-target", "xgit/hooks/post-checkout"}
	for _, v := range []string{"2", "3", "4"} {
		for _, chunk := range []int{1, 7, 4096} {
			if err := checkIndex(gitIndex(t, v, names, nil), chunk); err != nil {
				t.Errorf("v%s, %d-byte reads: git's own index refused: %v", v, chunk, err)
			}
		}
		for from, to := range map[string]string{
			"yy/esc-target":            "../esc-target",
			"xgit/hooks/post-checkout": ".git/hooks/post-checkout",
			"xgit/hooks":               ".GIT/hooks",
			"dir/b.txt":                "dir//.txt",
		} {
			b := gitIndex(t, v, names, map[string]string{from: to})
			if err := checkIndex(b, 4096); !errors.Is(err, errBadIndex) {
				t.Errorf("v%s: an index naming %q passed (%v)", v, to, err)
			}
		}
	}
	b := gitIndex(t, "2", names, nil)
	if err := checkIndex(b[:len(b)/2], 4096); err == nil {
		t.Error("half an index passed")
	}
}

// The attack end to end: the guest's index names ../outside and a hook;
// git checkout -- . on the host would write both. It never lands.
func TestGuestIndexOutsideHeld(t *testing.T) {
	names := []string{"f", "yy/esc-target", "xgit/hooks/post-checkout"}
	good := gitIndex(t, "2", names, nil)
	bad := gitIndex(t, "2", names, map[string]string{"yy/esc-target": "../esc-target", "xgit/hooks/post-checkout": ".git/hooks/post-checkout"})
	p := newPair(t, Options{})
	p.both(t, map[string]string{
		".git/HEAD":   "ref: refs/heads/main\n",
		".git/config": "[core]\n\tbare = false\n",
		".git/index":  string(good),
	})
	p.sync(t)
	write(t, p.guest, ".git/index", string(bad))
	p.e.Sync(context.Background(), nil) // fails for the index, as it should
	if read(p.host, ".git/index") != string(good) {
		t.Fatal("an index naming ../esc-target and .git/hooks/post-checkout reached the host")
	}
	good2 := gitIndex(t, "4", append(names, "new"), nil)
	write(t, p.guest, ".git/index", string(good2))
	p.e.Sync(context.Background(), nil)
	if read(p.host, ".git/index") != string(good2) {
		t.Fatalf("a good index did not cross: %+v", p.e.Status())
	}
}

// The check never panics, whatever the guest's bytes and however they
// arrive, and reads a clean index the same in any pieces.
func FuzzIndexCheck(f *testing.F) {
	f.Add([]byte("DIRC\x00\x00\x00\x04\x00\x00\x00\x01"), 3)
	f.Add([]byte("DIRC\x00\x00\x00\x02\x00\x00\x00\x02"), 1)
	f.Fuzz(func(t *testing.T, b []byte, chunk int) {
		if chunk < 1 || chunk > 1<<16 {
			chunk = 1
		}
		e1 := checkIndex(b, chunk)
		e2 := checkIndex(b, 1<<16)
		if (e1 == nil) != (e2 == nil) {
			t.Fatalf("in %d-byte pieces: %v; whole: %v", chunk, e1, e2)
		}
	})
}
