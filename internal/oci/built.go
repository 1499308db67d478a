package oci

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Images built from a Dockerfile (kosa8 image build) come back from the
// builder sandbox as an OCI archive, which is pulled like any archive
// (bounded, every blob checked against its digest: the builder ran the
// Dockerfile's RUN lines and is not trusted) and recorded under the name
// the user gave (-t), with Source "built". 'kosa8 run --image NAME' finds
// such a record before it asks a registry, as docker finds a local image.

// SourceBuilt is the Source of an image built here from a Dockerfile.
const SourceBuilt = "built"

// Import brings the image in the OCI archive at path into the cache as
// name, an image built here. key identifies what it was built from (the
// Dockerfile, its context and arguments, its base images): a build with
// the same key can reuse it.
func Import(ctx context.Context, c Cache, path, name, key string, o PullOptions) (*Record, error) {
	s, err := openArchive(c, path, o.limits())
	if err != nil {
		return nil, err
	}
	defer s.Close()
	rec, err := pull(ctx, c, s, &o)
	if err != nil {
		return nil, err
	}
	rec.Name, rec.Ref, rec.Source, rec.BuildKey = name, name, SourceBuilt, key
	if err := c.SaveRecord(rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// FindBuilt returns the image built here as name for platform, or nil.
func (c Cache) FindBuilt(name, platform string) *Record {
	r, err := c.Find(name, platform)
	if err != nil || r.Source != SourceBuilt || !ValidDigest(r.Manifest) {
		return nil
	}
	return r
}

// ociLayerType is the OCI media type of a layer of media type mt (a
// Docker one is the same bytes under another name).
func ociLayerType(mt string) (string, error) {
	comp, err := LayerCompression(mt)
	if err != nil {
		return "", err
	}
	switch comp {
	case Gzip:
		return string(types.OCILayer), nil
	case Zstd:
		return string(types.OCILayerZStd), nil
	}
	return string(types.OCIUncompressedLayer), nil
}

// ociManifest makes an OCI image manifest of r's config and layers: a
// builder reads an OCI layout, and an image pulled with Docker's media
// types is the same blobs under OCI's names.
func (c Cache) ociManifest(r *Record) ([]byte, error) {
	fi, err := os.Lstat(c.BlobPath(r.Config))
	if err != nil || !ValidDigest(r.Config) {
		return nil, fmt.Errorf("the config of %s is not in the cache: pull it again", r.Name)
	}
	cfg, _ := v1.NewHash(r.Config)
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1,
		Config: v1.Descriptor{MediaType: types.OCIConfigJSON, Digest: cfg, Size: fi.Size()}}
	for i, l := range r.Layers {
		mt, err := ociLayerType(l.MediaType)
		if err != nil {
			return nil, fmt.Errorf("layer %d of %s: %w", i+1, r.Name, err)
		}
		h, err := v1.NewHash(l.Digest)
		if err != nil || !c.HasBlob(l.Digest, l.Size) {
			return nil, fmt.Errorf("layer %d of %s is not in the cache: pull it again", i+1, r.Name)
		}
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: types.MediaType(mt), Digest: h, Size: l.Size})
	}
	return json.Marshal(m)
}

// LayoutSize is about how many bytes WriteLayout writes for recs.
func (c Cache) LayoutSize(recs []*Record) int64 {
	n := int64(64 << 10)
	seen := map[string]bool{}
	for _, r := range recs {
		for _, l := range r.Layers {
			if !seen[l.Digest] {
				seen[l.Digest] = true
				n += l.Size + 1024
			}
		}
		n += 16 << 10
	}
	return n
}

// WriteLayout writes recs as one OCI image layout under prefix in tw:
// each image's blobs from the cache (a blob shared by two written once),
// an OCI manifest for each, and index.json naming image i names[i]
// (org.opencontainers.image.ref.name), so a builder reads it as
// oci:DIR:NAME. Nothing is read but blobs of the cache, by digest.
func (c Cache) WriteLayout(tw *tar.Writer, prefix string, recs []*Record, names []string) error {
	if len(recs) != len(names) {
		return fmt.Errorf("%d images and %d names", len(recs), len(names))
	}
	epoch := time.Unix(0, 0)
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: prefix + "/" + name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	for _, d := range []string{"", "/blobs", "/blobs/sha256"} {
		if err := tw.WriteHeader(&tar.Header{Name: prefix + d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	written := map[string]bool{}
	blob := func(d string, size int64) error {
		if written[d] {
			return nil
		}
		written[d] = true
		f, err := c.OpenBlob(d)
		if err != nil {
			return err
		}
		defer f.Close()
		_, hex, _ := strings.Cut(d, ":")
		if err := tw.WriteHeader(&tar.Header{Name: prefix + "/blobs/sha256/" + hex, Typeflag: tar.TypeReg, Mode: 0o444, Size: size, ModTime: epoch}); err != nil {
			return err
		}
		n, err := io.Copy(tw, io.LimitReader(f, size))
		if err == nil && n != size {
			err = fmt.Errorf("blob %s in the cache is %d bytes, not %d: run 'kosa8 image prune' and pull again", d, n, size)
		}
		return err
	}
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for i, r := range recs {
		mb, err := c.ociManifest(r)
		if err != nil {
			return err
		}
		md := Digest(mb)
		var m v1.Manifest
		_ = json.Unmarshal(mb, &m)
		if err := blob(r.Config, m.Config.Size); err != nil {
			return err
		}
		for _, l := range r.Layers {
			if err := blob(l.Digest, l.Size); err != nil {
				return err
			}
		}
		if !written[md] {
			written[md] = true
			_, hex, _ := strings.Cut(md, ":")
			if err := file("blobs/sha256/"+hex, mb); err != nil {
				return err
			}
		}
		h, _ := v1.NewHash(md)
		idx.Manifests = append(idx.Manifests, v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: h, Size: int64(len(mb)),
			Annotations: map[string]string{"org.opencontainers.image.ref.name": names[i]}})
	}
	ib, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	return file("index.json", ib)
}

// PushImage pushes the OCI image r (pulled or built here) to ref: its
// layers, config and manifest as they are in the cache, so the digest a
// registry reports is the manifest's own. It returns that digest.
func PushImage(ctx context.Context, c Cache, r *Record, ref string, o PullOptions, progress func(string)) (string, error) {
	if progress == nil {
		progress = func(string) {}
	}
	dst, err := ParseReference(ref, o.insecure())
	if err != nil {
		return "", err
	}
	opts := o.remoteOptions(ctx, dst.Context().Registry)
	mb, err := c.ReadBlob(r.Manifest, DefaultLimits.Manifest)
	if err != nil {
		return "", fmt.Errorf("the manifest of %s: %w", r.Name, err)
	}
	m, err := v1.ParseManifest(strings.NewReader(string(mb)))
	if err != nil {
		return "", fmt.Errorf("the manifest of %s: %w", r.Name, err)
	}
	blobs := append([]v1.Descriptor{m.Config}, m.Layers...)
	for i, d := range blobs {
		if i == 0 && d.Digest.String() != r.Config {
			return "", fmt.Errorf("the manifest of %s names another config than its record", r.Name)
		}
		progress(fmt.Sprintf("pushing blob %d of %d (%d MiB)", i+1, len(blobs), d.Size>>20))
		b := Blob{MediaType: string(d.MediaType), Digest: d.Digest.String(), Size: d.Size}
		if !c.HasBlob(b.Digest, b.Size) {
			return "", fmt.Errorf("blob %s of %s is not in the cache: pull or build it again", b.Digest, r.Name)
		}
		if err := remote.WriteLayer(dst.Context(), &fileLayer{c: c, b: b, h: d.Digest}, opts...); err != nil {
			return "", fmt.Errorf("push %s: %w", b.Digest, err)
		}
	}
	mt := types.MediaType(sniffMediaType(mb))
	if err := remote.Put(dst, rawManifest{mb, mt}, opts...); err != nil {
		return "", fmt.Errorf("push the manifest: %w", err)
	}
	return r.Manifest, nil
}
