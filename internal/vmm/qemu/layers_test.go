package qemu

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
