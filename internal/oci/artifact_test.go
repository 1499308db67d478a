package oci_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// TestPushPullArtifact: kosa8 images pushed as artifacts to a real
// registry come back, by the index's digest, for each architecture, with
// every blob checked; a tag, a container image, a blob over its bound and
// an architecture the index lacks are refused.
func TestPushPullArtifact(t *testing.T) {
	reg := startRegistry(t)
	src := oci.NewCache(t.TempDir())
	var arts []oci.Artifact
	for _, a := range []vmspec.Arch{vmspec.AMD64, vmspec.ARM64} {
		d, err := src.PutBytes([]byte("rootfs of "+string(a)), "rootfs")
		if err != nil {
			t.Fatal(err)
		}
		k, _ := src.PutBytes([]byte("kernel"), "kernel")
		arts = append(arts, oci.Artifact{Arch: a, Config: []byte(`{"key":"` + string(a) + `"}`), Blobs: []oci.Blob{
			{MediaType: oci.MediaRootFS, Digest: d, Size: int64(len("rootfs of " + string(a)))},
			{MediaType: oci.MediaKernel, Digest: k, Size: 6},
		}})
	}
	digest, err := oci.PushArtifacts(context.Background(), src, reg+"/kosa8/base:t", arts, oci.PullOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	max := map[string]int64{oci.MediaRootFS: 1 << 20, oci.MediaKernel: 1 << 20}
	for _, a := range []vmspec.Arch{vmspec.AMD64, vmspec.ARM64} {
		dst := oci.NewCache(t.TempDir())
		got, err := oci.PullArtifact(context.Background(), dst, reg+"/kosa8/base@"+digest, oci.PullOptions{Arch: a}, max)
		if err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		if string(got.Config) != `{"key":"`+string(a)+`"}` || len(got.Blobs) != 2 || !dst.HasBlob(got.Blobs[0].Digest, got.Blobs[0].Size) {
			t.Errorf("%s: pulled %+v", a, got)
		}
	}
	dst := oci.NewCache(t.TempDir())
	if _, err := oci.PullArtifact(context.Background(), dst, reg+"/kosa8/base:t", oci.PullOptions{Arch: vmspec.AMD64}, max); err == nil || !strings.Contains(err.Error(), "pinned digest") {
		t.Errorf("pull by tag: %v", err)
	}
	small := map[string]int64{oci.MediaRootFS: 4, oci.MediaKernel: 1 << 20}
	if _, err := oci.PullArtifact(context.Background(), dst, reg+"/kosa8/base@"+digest, oci.PullOptions{Arch: vmspec.AMD64}, small); !errors.Is(err, oci.ErrTooLarge) {
		t.Errorf("a blob over its bound: %v", err)
	}
	one, err := oci.PushArtifacts(context.Background(), src, reg+"/kosa8/base:amd64only", arts[:1], oci.PullOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.PullArtifact(context.Background(), dst, reg+"/kosa8/base@"+one, oci.PullOptions{Arch: vmspec.ARM64}, max); err == nil || !strings.Contains(err.Error(), "no kosa8 image for linux/arm64") {
		t.Errorf("an architecture the index lacks: %v", err)
	}
	// A container image is not a kosa8 image.
	img := testImage("amd64", "c")
	rec := pushTestImage(t, reg+"/other/img:1", img)
	if _, err := oci.PullArtifact(context.Background(), dst, reg+"/other/img@"+rec, oci.PullOptions{Arch: vmspec.AMD64}, max); err == nil || !strings.Contains(err.Error(), "not a kosa8 image") {
		t.Errorf("a container image as a kosa8 image: %v", err)
	}
}
