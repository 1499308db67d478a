package qemu

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestLayers(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (qemu-utils)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.ext4")
	pattern := []byte("the base image's first bytes")
	if err := os.WriteFile(base, append(pattern, make([]byte, 1<<20)...), 0o600); err != nil {
		t.Fatal(err)
	}
	l := Layers{}
	root, top := filepath.Join(dir, "root.qcow2"), filepath.Join(dir, "top.qcow2")
	if err := l.Create(ctx, root, base, "raw", 4<<30); err != nil {
		t.Fatal(err)
	}
	if err := l.Create(ctx, top, root, l.Format(), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := VirtualSize(top, "qcow2"); err != nil || n != 4<<30 {
		t.Fatalf("the top layer's size: %d %v (its size comes from the layer under it)", n, err)
	}
	chain, err := l.Chain(ctx, top, l.Format())
	if err != nil || strings.Join(chain, " ") != top+" "+root+" "+base {
		t.Fatalf("chain %v %v", chain, err)
	}
	flat := filepath.Join(dir, "flat.raw")
	if err := l.Flatten(ctx, top, flat, io.Discard); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(flat)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, len(pattern))
	if _, err := io.ReadFull(f, head); err != nil || !bytes.Equal(head, pattern) {
		t.Fatalf("the flattened disk starts %q (%v)", head, err)
	}
	if fi, _ := f.Stat(); fi.Size() != 4<<30 {
		t.Fatalf("the flattened disk is %d bytes", fi.Size())
	}
	if err := l.Create(ctx, filepath.Join(dir, "x.qcow2"), filepath.Join(dir, "missing"), "raw", 1<<30); err == nil {
		t.Fatal("a layer over a missing file")
	}
	if _, err := VirtualSize(base, "qcow2"); err == nil {
		t.Fatal("a raw file read as qcow2")
	}
}

// fifoOpened makes a FIFO at path and reports, once asked, whether
// anything opened it for reading (a reader is what lets a writer's open
// return).
func fifoOpened(t *testing.T, path string) func() bool {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	opened := make(chan struct{})
	go func() {
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			close(opened)
			f.Close()
		}
	}()
	t.Cleanup(func() { // release the writer if nothing did
		if f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			time.Sleep(10 * time.Millisecond)
			f.Close()
		}
	})
	return func() bool {
		select {
		case <-opened:
			return true
		case <-time.After(200 * time.Millisecond):
			return false
		}
	}
}

// A layer's header is QEMU's to write, and a compromised QEMU names what
// it likes as its backing file: a chain (read by root, to collect disk
// layers) opens nothing that is not a regular file, follows no json: or
// protocol name and no external data file.
func TestChainOpensOnlyLayers(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (qemu-utils)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	opened := fifoOpened(t, fifo)
	top := filepath.Join(dir, "top.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-u", "-f", "qcow2",
		"-o", "backing_file="+fifo+",backing_fmt=raw", top, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	if _, err := (Layers{}).Chain(ctx, top, "qcow2"); err == nil {
		t.Error("a chain through a FIFO")
	}
	// The same header in a raw disk (the guest's workspace, its own bytes)
	// is data: the chain ends there.
	ws := filepath.Join(dir, "workspace.img")
	if err := os.Rename(top, ws); err != nil {
		t.Fatal(err)
	}
	if chain, err := (Layers{}).Chain(ctx, ws, "raw"); err != nil || len(chain) != 1 || chain[0] != ws {
		t.Errorf("a raw disk's chain: %v, %v; want only itself", chain, err)
	}
	// Named as a qcow2 layer, or by a json: name.
	for _, backing := range []string{"backing_file=" + fifo + ",backing_fmt=qcow2", "backing_file=json:{},backing_fmt=raw"} {
		if out, err := exec.Command("qemu-img", "create", "-q", "-u", "-f", "qcow2", "-o", backing, top, "1M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create: %v: %s", err, out)
		}
		if _, err := (Layers{}).Chain(ctx, top, "qcow2"); err == nil {
			t.Errorf("a chain through %s", backing)
		}
	}
	if opened() {
		t.Error("the chain opened the FIFO a layer names")
	}
}

// qcow2Backing reads headers a hostile party wrote: whatever the bytes,
// it neither panics nor names a backing file that is not a plain name
// of a raw or qcow2 file.
func FuzzQcow2Backing(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-u", "-f", "qcow2",
		"-o", "backing_file=/base.img,backing_fmt=raw", seed, "1M").CombinedOutput(); err == nil {
		b, _ := os.ReadFile(seed)
		f.Add(b[:min(len(b), 4096)])
	} else {
		f.Logf("no qemu-img seed: %v: %s", err, out)
	}
	f.Add([]byte("QFI\xfb"))
	f.Add(make([]byte, 104))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "layer")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		name, format, err := qcow2Backing(p)
		if err != nil {
			return
		}
		if name == "" {
			return
		}
		if format != "raw" && format != "qcow2" {
			t.Fatalf("backing format %q accepted", format)
		}
		if len(name) > 1023 {
			t.Fatalf("a backing name of %d bytes", len(name))
		}
		if i := strings.IndexByte(name, ':'); i >= 0 && !strings.Contains(name[:i], "/") {
			t.Fatalf("backing name %q is a protocol or json: name", name)
		}
	})
}

// The layers Create writes itself are what qemu-img makes: the same
// header, no errors found by qemu-img check, reads that fall through to
// the backing file, and writes that allocate as QEMU's own would.
func TestCreateWritesWhatQemuImgMakes(t *testing.T) {
	for _, tool := range []string{"qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (qemu-utils)", tool)
		}
	}
	ctx := context.Background()
	dir := t.TempDir()
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
		return string(out)
	}
	base := filepath.Join(dir, "base.raw")
	pattern := []byte("the base image's first bytes")
	if err := os.WriteFile(base, append(pattern, make([]byte, 1<<20)...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{4 << 30, 16<<30 + 100, 5 << 40} {
		ours, theirs := filepath.Join(dir, "ours.qcow2"), filepath.Join(dir, "theirs.qcow2")
		os.Remove(ours)
		os.Remove(theirs)
		if err := (Layers{}).Create(ctx, ours, base, "raw", size); err != nil {
			t.Fatal(err)
		}
		run("qemu-img", "create", "-q", "-u", "-f", "qcow2", "-o", "backing_file="+base+",backing_fmt=raw,lazy_refcounts=on", theirs, strconv.FormatInt(size, 10))
		a, b := readHead(t, ours), readHead(t, theirs)
		// The fields up to the header's end, but for where the backing
		// file's name sits (qemu-img puts a feature name table first).
		for _, r := range [][2]int{{0, 8}, {16, 104}} {
			if !bytes.Equal(a[r[0]:r[1]], b[r[0]:r[1]]) {
				t.Errorf("size %d: header bytes %d-%d: ours % x, qemu-img's % x", size, r[0], r[1], a[r[0]:r[1]], b[r[0]:r[1]])
			}
		}
		if fa, fb := fileSize(t, ours), fileSize(t, theirs); fa != fb {
			t.Errorf("size %d: our layer is %d bytes, qemu-img's %d", size, fa, fb)
		}
		if out := run("qemu-img", "check", "-f", "qcow2", ours); !strings.Contains(out, "No errors") {
			t.Errorf("size %d: qemu-img check: %s", size, out)
		}
		info := run("qemu-img", "info", "-U", "--output=json", ours)
		for _, want := range []string{`"backing-filename": "` + base + `"`, `"backing-filename-format": "raw"`, `"cluster-size": 65536`, `"lazy-refcounts": true`,
			`"virtual-size": ` + strconv.FormatInt((size+511)&^511, 10)} {
			if !strings.Contains(info, want) {
				t.Errorf("size %d: qemu-img info lacks %s:\n%s", size, want, info)
			}
		}
	}
	// A layer over a layer: reads fall through, writes land in the top.
	mid, top := filepath.Join(dir, "mid.qcow2"), filepath.Join(dir, "top.qcow2")
	if err := (Layers{}).Create(ctx, mid, base, "raw", 1<<30); err != nil {
		t.Fatal(err)
	}
	run("qemu-io", "-f", "qcow2", "-c", "write -P 0x6d 65536 4096", mid)
	if err := (Layers{}).Create(ctx, top, mid, "qcow2", 0); err != nil {
		t.Fatal(err)
	}
	run("qemu-io", "-f", "qcow2", "-c", "write -P 0x74 1048576 65536", top)
	for _, p := range []string{mid, top} {
		if out := run("qemu-img", "check", "-f", "qcow2", p); !strings.Contains(out, "No errors") {
			t.Errorf("%s after writes: %s", p, out)
		}
	}
	flat := filepath.Join(dir, "flat.raw")
	run("qemu-img", "convert", "-f", "qcow2", "-O", "raw", top, flat)
	f, err := os.Open(flat)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range []struct {
		off  int64
		want []byte
	}{{0, pattern}, {65536, bytes.Repeat([]byte{0x6d}, 4096)}, {1 << 20, bytes.Repeat([]byte{0x74}, 65536)}, {1<<20 + 65536, make([]byte, 512)}} {
		got := make([]byte, len(c.want))
		if _, err := f.ReadAt(got, c.off); err != nil || !bytes.Equal(got, c.want) {
			t.Errorf("the flattened disk at %d: %q… (%v), want %q…", c.off, got[:min(len(got), 16)], err, c.want[:min(len(c.want), 16)])
		}
	}
	// Bad requests write nothing.
	for _, bad := range []struct {
		size    int64
		backing string
		format  string
	}{{0, base, "raw"}, {-1, base, "raw"}, {1 << 60, base, "raw"}, {1 << 30, base, "vmdk"}, {1 << 30, "/" + strings.Repeat("x", 1100), "raw"}} {
		if _, _, err := qcow2Overlay(bad.size, bad.backing, bad.format); err == nil {
			t.Errorf("a layer of %d bytes over %.20q (%s) was made", bad.size, bad.backing, bad.format)
		}
	}
	// Never through a link.
	link := filepath.Join(dir, "link.qcow2")
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if err := (Layers{}).Create(ctx, link, base, "raw", 1<<30); err == nil {
		t.Error("a layer written through a link")
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the link's target now holds %q", b)
	}
}

func readHead(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 104)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
