package podimage

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// fakeWriter stands for internal/oci's image writer: it records what it
// is given.
type fakeWriter struct {
	cfg    Config
	layers []Layer
}

func (w *fakeWriter) Write(_ context.Context, ref string, cfg Config, layers []Layer) (string, error) {
	w.cfg, w.layers = cfg, layers
	return "sha256:fake", nil
}

func TestAssembleHoldsWhatThePodRuns(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("no qemu-system-x86_64 on this machine to assemble from")
	}
	bin, cache := t.TempDir(), t.TempDir()
	self, _ := os.Executable() // a dynamic or static binary stands for kosa8
	for _, b := range []string{"kosa8", "kosa8-agent"} {
		data, _ := os.ReadFile(self)
		if err := os.WriteFile(filepath.Join(bin, b), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(cache, "images", "x")
	for _, f := range []string{"kernel/vmlinuz", "rootfs.ext4", "manifest.json"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(img, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(img, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("vmlinuz", filepath.Join(img, "kernel", "current")); err != nil {
		t.Fatal(err)
	}
	w := &fakeWriter{}
	d, err := Build(context.Background(), w, "oci:out", Sources{BinDir: bin, QEMU: []string{qemu}, ImageDir: img, CacheDir: cache})
	if err != nil || d != "sha256:fake" {
		t.Fatal(d, err)
	}
	paths := map[string]File{}
	for _, l := range w.layers {
		for _, f := range l.Files {
			paths[f.Path] = f
		}
	}
	for _, want := range []string{"/usr/bin/qemu-system-x86_64", "/usr/local/bin/kosa8", "/usr/local/bin/kosa8-agent",
		CacheDir + "/images/x/kernel/vmlinuz", CacheDir + "/images/x/rootfs.ext4", "/var/lib/kosa8/state"} {
		if _, ok := paths[want]; !ok {
			t.Errorf("the image lacks %s", want)
		}
	}
	if l := paths[CacheDir+"/images/x/kernel/current"]; l.Link != "vmlinuz" {
		t.Errorf("a link in the guest image became %+v", l)
	}
	// QEMU's libraries: every one ldd names is in the image.
	libs, err := sharedLibs(qemu)
	if err != nil {
		t.Fatal(err)
	}
	for _, lib := range libs {
		if _, ok := paths[lib]; !ok {
			t.Errorf("the image lacks QEMU's %s", lib)
		}
	}
	if w.cfg.User != "1000" || strings.Join(w.cfg.Entrypoint, " ") != "/usr/local/bin/kosa8 serve" {
		t.Errorf("config %+v", w.cfg)
	}
}

func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x1)\n\t/lib64/ld-linux-x86-64.so.2 (0x2)\n"
	libs, err := parseLdd([]byte(out))
	if err != nil || strings.Join(libs, " ") != "/lib/x86_64-linux-gnu/libz.so.1 /lib64/ld-linux-x86-64.so.2" {
		t.Fatal(libs, err)
	}
	if _, err := parseLdd([]byte("\tlibfoo.so => not found\n")); err == nil {
		t.Fatal("a missing library was taken")
	}
}

// The image written by kosa8's OCI code is one kosa8's OCI code pulls
// back: an OCI layout whose manifest names the three layers, whose config
// runs `kosa8 serve` as uid 1000, and whose layers hold the files.
func TestOCIWriterWritesALayoutThatPullsBack(t *testing.T) {
	bin, cache, out := t.TempDir(), t.TempDir(), t.TempDir()
	for _, b := range []string{"kosa8", "kosa8-agent"} {
		// A static stand-in: ldd names no library.
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(cache, "images", "x")
	if err := os.MkdirAll(filepath.Join(img, "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(img, "kernel", "vmlinuz"), []byte("kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := OCIWriter{TempDir: t.TempDir()}
	layout := filepath.Join(out, "layout")
	d, err := Build(context.Background(), w, "oci:"+layout+":dev", Sources{BinDir: bin, ImageDir: img, CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	c := oci.NewCache(t.TempDir())
	rec, err := oci.Pull(context.Background(), c, layout, oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil {
		t.Fatalf("kosa8's OCI code pulls the layout back: %v", err)
	}
	if rec.Manifest != d || len(rec.Layers) != 3 {
		t.Fatalf("pulled %s with %d layers, wrote %s", rec.Manifest, len(rec.Layers), d)
	}
	cf, err := oci.ReadConfig(c, rec)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/kosa8 serve" || cf.Config.User != "1000" || cf.OS != "linux" {
		t.Fatalf("config %+v", cf.Config)
	}
	if _, ok := cf.Config.ExposedPorts["8888/tcp"]; !ok {
		t.Fatalf("ports %v", cf.Config.ExposedPorts)
	}
}

func TestWriteTarOwnsThePodsFoldersToItsUser(t *testing.T) {
	var buf bytes.Buffer
	src := filepath.Join(t.TempDir(), "f")
	os.WriteFile(src, []byte("x"), 0o644)
	if err := writeTar(&buf, Layer{Files: []File{
		{Path: "/var/lib/kosa8/state", Dir: true, Mode: 0o755},
		{Path: "/usr/bin/qemu", Source: src, Mode: 0o755},
		{Path: "/lib/a.so", Link: "b.so"},
	}}); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	got := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		got[h.Name] = h
	}
	if h := got["var/lib/kosa8/state/"]; h == nil || h.Uid != UID || h.Typeflag != tar.TypeDir {
		t.Errorf("state folder: %+v", h)
	}
	if h := got["usr/bin/qemu"]; h == nil || h.Uid != 0 || h.Size != 1 || h.Mode != 0o755 {
		t.Errorf("qemu: %+v", h)
	}
	if h := got["lib/a.so"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "b.so" {
		t.Errorf("link: %+v", h)
	}
}
