package oci_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// unpackTar writes a tar stream into dir (the test's own output).
func unpackTar(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWriteLayoutAndImport: images in the cache (one pulled with Docker's
// media types) are written as one OCI layout naming each, which reads back
// as OCI images with the same config and layers; an archive imported under
// a name is found as built, and only as built.
func TestWriteLayoutAndImport(t *testing.T) {
	dir := t.TempDir()
	cache := oci.NewCache(t.TempDir())
	// A docker save tarball: Docker media types.
	img := testImage("amd64", "docker")
	tp := filepath.Join(dir, "saved.tar")
	tag, _ := name.NewTag("example.com/app:1")
	f, _ := os.Create(tp)
	if err := tarball.Write(tag, img, f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	docker, err := oci.Pull(context.Background(), cache, tp, oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := cache.WriteLayout(tw, "from", []*oci.Record{docker, docker}, []string{"from-1", "from-2"})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	out := t.TempDir()
	unpackTar(t, pr, out)
	b, err := os.ReadFile(filepath.Join(out, "from", "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(b, &idx); err != nil || len(idx.Manifests) != 2 || idx.Manifests[1].Annotations["org.opencontainers.image.ref.name"] != "from-2" {
		t.Fatalf("index.json %s: %v", b, err)
	}
	// The layout pulls back: OCI media types, the same layers.
	back := oci.NewCache(t.TempDir())
	rec, err := oci.Pull(context.Background(), back, filepath.Join(out, "from"), oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil {
		t.Fatalf("the written layout does not pull: %v", err)
	}
	if rec.Config != docker.Config || len(rec.Layers) != len(docker.Layers) {
		t.Fatalf("read back %+v, wrote %+v", rec, docker)
	}
	for i, l := range rec.Layers {
		if l.Digest != docker.Layers[i].Digest || l.MediaType != string(types.OCILayer) {
			t.Errorf("layer %d: %+v", i, l)
		}
	}

	// An OCI archive of it, imported as built under a name.
	arch := filepath.Join(dir, "out.tar")
	af, _ := os.Create(arch)
	tw := tar.NewWriter(af)
	filepath.Walk(filepath.Join(out, "from"), func(p string, fi os.FileInfo, err error) error {
		rel, _ := filepath.Rel(filepath.Join(out, "from"), p)
		if fi.IsDir() || err != nil {
			return err
		}
		b, _ := os.ReadFile(p)
		tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
		return nil
	})
	tw.Close()
	af.Close()
	built, err := oci.Import(context.Background(), cache, arch, "myproj:1", "sha256:key", oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil {
		t.Fatal(err)
	}
	if built.Source != oci.SourceBuilt || built.Name != "myproj:1" || built.BuildKey != "sha256:key" {
		t.Errorf("imported %+v", built)
	}
	if r := cache.FindBuilt("myproj:1", oci.PlatformString(vmspec.AMD64)); r == nil || r.Manifest != built.Manifest {
		t.Errorf("FindBuilt: %+v", r)
	}
	if cache.FindBuilt("myproj:1", oci.PlatformString(vmspec.ARM64)) != nil || cache.FindBuilt(tp, oci.PlatformString(vmspec.AMD64)) != nil {
		t.Error("FindBuilt found another platform's image, or a pulled one")
	}
}

// TestPushBuiltImage: an image in the cache pushes to a real registry as
// the same manifest, config and layers.
func TestPushBuiltImage(t *testing.T) {
	reg := startRegistry(t)
	cache := oci.NewCache(t.TempDir())
	pushTestImage(t, reg+"/src/app:1", testImage("amd64", "push"))
	rec, err := oci.Pull(context.Background(), cache, reg+"/src/app:1", oci.PullOptions{Arch: vmspec.AMD64})
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	d, err := oci.PushImage(context.Background(), cache, rec, reg+"/dst/app:2", oci.PullOptions{}, func(s string) { steps = append(steps, s) })
	if err != nil {
		t.Fatal(err)
	}
	if d != rec.Manifest || len(steps) != 3 {
		t.Errorf("pushed %s (steps %q), want %s", d, steps, rec.Manifest)
	}
	ref, _ := name.ParseReference(reg + "/dst/app:2")
	got, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	gd, _ := got.Digest()
	if gd.String() != rec.Manifest {
		t.Errorf("registry has %s, want %s", gd, rec.Manifest)
	}
	// A record whose blobs are gone is refused before anything is sent.
	os.Chmod(cache.BlobPath(rec.Layers[0].Digest), 0o644)
	os.Remove(cache.BlobPath(rec.Layers[0].Digest))
	if _, err := oci.PushImage(context.Background(), cache, rec, reg+"/dst/app:3", oci.PullOptions{}, nil); err == nil || !strings.Contains(err.Error(), "not in the cache") {
		t.Errorf("a push without its layer: %v", err)
	}
}
