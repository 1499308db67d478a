package qemu

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
	chain, err := l.Chain(ctx, top)
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
