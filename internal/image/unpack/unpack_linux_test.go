package unpack_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/image/unpack"
	"github.com/kosa8/kosa8/internal/oci/ocitest"
)

type E = ocitest.Entry

// disk lays uncompressed layers one after another, as the host writes the
// converter's layers disk.
func disk(layers ...[]byte) (*bytes.Reader, []unpack.Layer) {
	var b bytes.Buffer
	var ls []unpack.Layer
	for _, l := range layers {
		ls = append(ls, unpack.Layer{Off: int64(b.Len()), Size: int64(len(l))})
		b.Write(l)
	}
	return bytes.NewReader(b.Bytes()), ls
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("owners, devices and capabilities need root (CI runs as root)")
	}
}

func tree(t *testing.T, root string) []string {
	var out []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, rel)
		return nil
	})
	sort.Strings(out)
	return out
}

// TestLayersApplied: whiteouts and opaque directories remove what lower
// layers put there (and only that), hard links share one inode, owners,
// set-id bits and file capabilities arrive, devices are skipped.
func TestLayersApplied(t *testing.T) {
	needRoot(t)
	capV2 := string([]byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) // cap_net_raw, permitted
	l1 := ocitest.Tar([]E{
		{Name: "etc/", Type: tar.TypeDir},
		{Name: "etc/gone", Body: "1"},
		{Name: "etc/kept", Body: "1"},
		{Name: "opq/", Type: tar.TypeDir},
		{Name: "opq/old", Body: "old"},
		{Name: "opq/sub/", Type: tar.TypeDir},
		{Name: "opq/sub/old", Body: "old"},
		{Name: "dir-to-file/", Type: tar.TypeDir},
		{Name: "dir-to-file/x", Body: "x"},
		{Name: "dev/", Type: tar.TypeDir},
		{Name: "dev/null", Type: tar.TypeChar, Mode: 0o666},
		{Name: "fifo", Type: tar.TypeFifo},
	})
	l2 := ocitest.Tar([]E{
		{Name: "etc/.wh.gone"},
		{Name: "opq/new", Body: "new"}, // before the marker: kept all the same
		{Name: "opq/.wh..wh..opq"},
		{Name: "opq/sub/new", Body: "new"},
		{Name: "dir-to-file", Body: "now a file"},
		{Name: "bin/", Type: tar.TypeDir},
		{Name: "bin/su", Body: "suid", Mode: 0o4755, UID: 0, GID: 0},
		{Name: "bin/ping", Body: "ping", Mode: 0o755, PAX: map[string]string{"SCHILY.xattr.security.capability": capV2, "SCHILY.xattr.security.selinux": "x"}},
		{Name: "bin/link", Type: tar.TypeLink, Link: "bin/su"},
		{Name: "home/", Type: tar.TypeDir},
		{Name: "home/app/", Type: tar.TypeDir, UID: 1234, GID: 4321, Mode: 0o2750},
		{Name: "home/app/f", Body: "f", UID: 1234, GID: 4321},
		{Name: "sh", Type: tar.TypeSymlink, Link: "/bin/su"},
	})
	src, layers := disk(l1, l2)
	root := t.TempDir()
	st, err := unpack.Apply(root, src, layers, unpack.Options{MaxFiles: 1000})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(tree(t, root), " ")
	want := "bin bin/link bin/ping bin/su dev dir-to-file etc etc/kept fifo-skipped home home/app home/app/f opq opq/new opq/sub opq/sub/new sh"
	want = strings.Replace(want, " fifo-skipped", "", 1)
	if got != want {
		t.Errorf("tree:\n got %s\nwant %s", got, want)
	}
	if st.Devices != 2 || st.Whiteouts != 1 || st.Opaque != 1 || st.HardLinks != 1 || st.Xattrs != 1 || st.Skipped != 1 {
		t.Errorf("stats %+v", st)
	}
	var a, b syscall.Stat_t
	syscall.Lstat(filepath.Join(root, "bin/su"), &a)
	syscall.Lstat(filepath.Join(root, "bin/link"), &b)
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link: inodes %d %d, links %d", a.Ino, b.Ino, a.Nlink)
	}
	if a.Mode&0o7777 != 0o4755 {
		t.Errorf("bin/su mode %o, want 4755", a.Mode&0o7777)
	}
	syscall.Lstat(filepath.Join(root, "home/app"), &a)
	if a.Uid != 1234 || a.Gid != 4321 || a.Mode&0o7777 != 0o2750 {
		t.Errorf("home/app: %d:%d %o", a.Uid, a.Gid, a.Mode&0o7777)
	}
	buf := make([]byte, 64)
	n, err := unix.Getxattr(filepath.Join(root, "bin/ping"), "security.capability", buf)
	if err != nil || string(buf[:n]) != capV2 {
		t.Errorf("bin/ping capability: %q, %v", buf[:n], err)
	}
	if l, _ := os.Readlink(filepath.Join(root, "sh")); l != "/bin/su" {
		t.Errorf("symlink text %q", l)
	}
}

// TestHostileLayersStayInside: names climbing out are refused; absolute,
// relative and chained symlinks (and hard links through them) resolve in
// the root, never outside it.
func TestHostileLayersStayInside(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("host file"), 0o644)
	// The links' targets exist inside the root too: a link resolves there.
	in := E{Name: strings.TrimPrefix(outside, "/") + "/", Type: tar.TypeDir}
	for _, tc := range []struct {
		name    string
		entries []E
		wantErr string
		inside  string // a file that must land inside the root
	}{
		{"dot-dot", []E{{Name: "../../../" + strings.TrimPrefix(outside, "/") + "/pwned", Body: "x"}}, "climb out", ""},
		{"dot-dot in the middle", []E{{Name: "a/../../pwned", Body: "x"}}, "climb out", ""},
		{"absolute link", []E{in, {Name: "esc", Type: tar.TypeSymlink, Link: outside}, {Name: "esc/pwned", Body: "x"}}, "", strings.TrimPrefix(outside, "/") + "/pwned"},
		{"relative link", []E{in, {Name: "a/", Type: tar.TypeDir}, {Name: "a/up", Type: tar.TypeSymlink, Link: "../../../../../../../../" + strings.TrimPrefix(outside, "/")}, {Name: "a/up/pwned", Body: "x"}}, "", strings.TrimPrefix(outside, "/") + "/pwned"},
		{"chained links", []E{in, {Name: "l1", Type: tar.TypeSymlink, Link: "l2"}, {Name: "l2", Type: tar.TypeSymlink, Link: "/l3"}, {Name: "l3", Type: tar.TypeSymlink, Link: "../../../../" + strings.TrimPrefix(outside, "/")}, {Name: "l1/pwned", Body: "x"}}, "", strings.TrimPrefix(outside, "/") + "/pwned"},
		{"link to nothing inside", []E{{Name: "esc", Type: tar.TypeSymlink, Link: outside}, {Name: "esc/pwned", Body: "x"}}, "symlink to nothing", ""},
		{"link then overwrite through it", []E{{Name: "victim", Type: tar.TypeSymlink, Link: victim}, {Name: "victim", Body: "overwritten"}}, "", "victim"},
		{"hard link out", []E{{Name: "h", Type: tar.TypeLink, Link: "../../../" + strings.TrimPrefix(victim, "/")}}, "climb out", ""},
		{"hard link through a link", []E{{Name: "esc", Type: tar.TypeSymlink, Link: outside}, {Name: "h", Type: tar.TypeLink, Link: "esc/victim"}}, "no such file", ""},
		{"whiteout through a link", []E{{Name: "esc", Type: tar.TypeSymlink, Link: outside}, {Name: "esc/.wh.victim"}}, "", ""},
		{"whiteout of ..", []E{{Name: ".wh..."}}, `whiteout of ".."`, ""},
		{"whiteout of .. in a directory", []E{{Name: "d/", Type: tar.TypeDir}, {Name: "d/.wh..."}}, `whiteout of ".."`, ""},
		{"whiteout of .", []E{{Name: "d/", Type: tar.TypeDir}, {Name: "d/.wh.."}}, `whiteout of "."`, ""},
		{"opaque through a link", []E{{Name: "esc", Type: tar.TypeSymlink, Link: outside}, {Name: "esc/.wh..wh..opq"}}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			src, layers := disk(ocitest.Tar(tc.entries))
			_, err := unpack.Apply(root, src, layers, unpack.Options{MaxFiles: 100})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("err %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Errorf("err %v", err)
			}
			if tc.inside != "" {
				if _, err := os.Lstat(filepath.Join(root, tc.inside)); err != nil {
					t.Errorf("%s not made inside the root: %v", tc.inside, err)
				}
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("outside the root: %v", ents)
			}
			if b, _ := os.ReadFile(victim); string(b) != "host file" {
				t.Errorf("the victim now holds %q", b)
			}
		})
	}
}

// TestBounds: a sparse member of 10 GiB in a layer of kilobytes, more
// members than allowed, a truncated layer: refused, saying why.
func TestBounds(t *testing.T) {
	root := t.TempDir()
	src, layers := disk(ocitest.SparseTar("big", 10<<30))
	_, err := unpack.Apply(root, src, layers, unpack.Options{MaxFiles: 10})
	if !errors.Is(err, unpack.ErrBounds) || !strings.Contains(err.Error(), "sparse") {
		t.Errorf("10 GiB sparse member: %v", err)
	}
	var many []E
	for i := 0; i < 50; i++ {
		many = append(many, E{Name: "f" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Body: "x"})
	}
	src, layers = disk(ocitest.Tar(many))
	if n, err := unpack.Count(src, layers, 49); !errors.Is(err, unpack.ErrBounds) || !strings.Contains(err.Error(), "more than 49") {
		t.Errorf("count of 50 members with a bound of 49: %d, %v", n, err)
	}
	if n, err := unpack.Count(src, layers, 50); err != nil || n != 50 {
		t.Errorf("count: %d, %v", n, err)
	}
	if _, err := unpack.Apply(t.TempDir(), src, layers, unpack.Options{MaxFiles: 49}); !errors.Is(err, unpack.ErrBounds) {
		t.Errorf("apply past the bound: %v", err)
	}
	whole := ocitest.Tar([]E{{Name: "f", Body: strings.Repeat("x", 4096)}})
	src, layers = disk(whole[:1024])
	if _, err := unpack.Apply(t.TempDir(), src, layers, unpack.Options{}); err == nil {
		t.Error("a truncated layer unpacked")
	}
}

// TestFixup: an image without accounts, CA bundle or /tmp gets them; its
// shell, sudo and User are reported.
func TestFixup(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "bin"), 0o755)
	os.WriteFile(filepath.Join(root, "bin/busybox"), []byte("elf"), 0o755)
	os.Symlink("busybox", filepath.Join(root, "bin/sh"))
	ca := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n"), 0o644)
	rep, err := unpack.Fixup(root, ca, "")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Shell != "/bin/sh" || rep.Sudo || rep.User != nil {
		t.Errorf("report %+v", rep)
	}
	for _, f := range []string{"etc/passwd", "etc/group", unpack.CABundle, "tmp"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("%s not added: %v", f, err)
		}
	}
	fi, _ := os.Stat(filepath.Join(root, "tmp"))
	if fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode %v", fi.Mode())
	}
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nstaff:x:50:\n"), 0o644)
	for spec, want := range map[string]unpack.User{"node": {"node", 1000, 1000}, "1000": {"node", 1000, 1000}, "node:staff": {"node", 1000, 50}, "1000:7": {"node", 1000, 7}} {
		rep, err := unpack.Fixup(root, ca, spec)
		if err != nil || rep.User == nil || *rep.User != want {
			t.Errorf("User %q: %+v %v", spec, rep.User, err)
		}
	}
	if rep, err := unpack.Fixup(root, ca, "root"); err != nil || rep.User != nil {
		t.Errorf("User root: %+v %v", rep, err)
	}
	if _, err := unpack.Fixup(root, ca, "nobody-here"); err == nil {
		t.Error("an unknown User was accepted")
	}
}

// FuzzApply: whatever a layer holds, Apply returns (no panic, no hang)
// and writes nothing outside its root.
func FuzzApply(f *testing.F) {
	f.Add(ocitest.Tar([]E{{Name: "a/", Type: tar.TypeDir}, {Name: "a/b", Body: "x"}, {Name: "l", Type: tar.TypeSymlink, Link: "/a"}, {Name: "l/c", Body: "y"}}))
	f.Add(ocitest.Tar([]E{{Name: "x/.wh..wh..opq"}, {Name: ".wh.x"}, {Name: "h", Type: tar.TypeLink, Link: "x"}}))
	f.Add(ocitest.SparseTar("s", 1<<20))
	f.Fuzz(func(t *testing.T, b []byte) {
		parent, err := os.MkdirTemp("", "fuzz-apply-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(parent)
		root := filepath.Join(parent, "root")
		os.Mkdir(root, 0o755)
		src, layers := disk(b)
		t0 := time.Now()
		_, _ = unpack.Apply(root, src, layers, unpack.Options{MaxFiles: 1000, MaxBytes: 1 << 20})
		if d := time.Since(t0); d > 2*time.Second {
			t.Fatalf("Apply took %s", d)
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 1 {
			t.Fatalf("wrote beside the root: %v", ents)
		}
	})
}
