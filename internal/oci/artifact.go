package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// kosa8's own images are published as OCI artifacts: one image manifest
// per architecture whose config is kosa8's image manifest and whose blobs
// are the finished files (the ext4 root, compressed; the kernel; its
// module tree as a compressed tar), gathered by an index. A sandbox needs
// nothing of them unpacked in a VM: they are kosa8's own build, pinned by
// digest.
const (
	ArtifactType      = "application/vnd.kosa8.image.v1"
	MediaKosa8Config  = "application/vnd.kosa8.image.config.v1+json"
	MediaRootFS       = "application/vnd.kosa8.rootfs.ext4.v1+zstd"
	MediaKernel       = "application/vnd.kosa8.kernel.v1"
	MediaKernelModule = "application/vnd.kosa8.kernel-modules.v1.tar+zstd"
)

// Blob is a file in the cache, pushed or pulled as part of an artifact.
type Blob struct {
	MediaType string `json:"media_type"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// Artifact is one architecture's kosa8 image.
type Artifact struct {
	Arch   vmspec.Arch
	Config []byte
	Blobs  []Blob
}

// fileLayer is a cached blob as go-containerregistry's layer, for upload.
type fileLayer struct {
	c Cache
	b Blob
	h v1.Hash
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.h, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.h, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)   { return l.c.OpenBlob(l.b.Digest) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return l.c.OpenBlob(l.b.Digest) }
func (l *fileLayer) Size() (int64, error)                 { return l.b.Size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return types.MediaType(l.b.MediaType), nil }

// rawManifest is a document to put; its media type is the request's
// Content-Type (go-containerregistry assumes Docker's without it).
type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (r rawManifest) RawManifest() ([]byte, error)        { return r.b, nil }
func (r rawManifest) MediaType() (types.MediaType, error) { return r.mt, nil }

// PushArtifacts uploads each artifact's blobs and manifest, then an index
// naming them by platform, to ref (a tag), and returns the index's digest:
// the value to pin.
func PushArtifacts(ctx context.Context, c Cache, ref string, arts []Artifact, o PullOptions, progress func(string)) (string, error) {
	if progress == nil {
		progress = func(string) {}
	}
	r, err := ParseReference(ref, o.insecure())
	if err != nil {
		return "", err
	}
	opts := o.remoteOptions(ctx, r.Context().Registry)
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for _, a := range arts {
		cfgDigest, err := c.PutBytes(a.Config, "config")
		if err != nil {
			return "", err
		}
		cfg := Blob{MediaType: MediaKosa8Config, Digest: cfgDigest, Size: int64(len(a.Config))}
		m := struct {
			SchemaVersion int               `json:"schemaVersion"`
			MediaType     string            `json:"mediaType"`
			ArtifactType  string            `json:"artifactType"`
			Config        v1.Descriptor     `json:"config"`
			Layers        []v1.Descriptor   `json:"layers"`
			Annotations   map[string]string `json:"annotations,omitempty"`
		}{SchemaVersion: 2, MediaType: MediaOCIManifest, ArtifactType: ArtifactType}
		for i, b := range append([]Blob{cfg}, a.Blobs...) {
			h, err := v1.NewHash(b.Digest)
			if err != nil {
				return "", err
			}
			progress(fmt.Sprintf("pushing %s blob %d of %d (%d MiB)", a.Arch, i+1, len(a.Blobs)+1, b.Size>>20))
			if err := remote.WriteLayer(r.Context(), &fileLayer{c: c, b: b, h: h}, opts...); err != nil {
				return "", fmt.Errorf("push %s: %w", b.Digest, err)
			}
			d := v1.Descriptor{MediaType: types.MediaType(b.MediaType), Digest: h, Size: b.Size}
			if i == 0 {
				m.Config = d
			} else {
				m.Layers = append(m.Layers, d)
			}
		}
		mb, err := json.Marshal(m)
		if err != nil {
			return "", err
		}
		md := Digest(mb)
		mh, _ := v1.NewHash(md)
		if err := remote.Put(r.Context().Digest(md), rawManifest{mb, types.OCIManifestSchema1}, opts...); err != nil {
			return "", fmt.Errorf("push the %s manifest: %w", a.Arch, err)
		}
		p := Platform(a.Arch)
		idx.Manifests = append(idx.Manifests, v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: mh, Size: int64(len(mb)), Platform: &p,
			ArtifactType: ArtifactType})
	}
	ib, err := json.Marshal(idx)
	if err != nil {
		return "", err
	}
	if err := remote.Put(r, rawManifest{ib, types.OCIImageIndex}, opts...); err != nil {
		return "", fmt.Errorf("push the index: %w", err)
	}
	return Digest(ib), nil
}

// PulledArtifact is one architecture's kosa8 image fetched into the cache.
type PulledArtifact struct {
	Ref      string
	Manifest string
	Config   []byte
	Blobs    []Blob
}

// maxArtifactConfig bounds a kosa8 image's config (its manifest.json).
const maxArtifactConfig = 1 << 20

// PullArtifact fetches the kosa8 image ref names for o.Arch into the
// cache: ref must pin a digest (the index's, or one manifest's). Each
// blob's size is bounded by maxBlob (by media type) and its digest
// checked.
func PullArtifact(ctx context.Context, c Cache, ref string, o PullOptions, maxBlob map[string]int64) (*PulledArtifact, error) {
	r, err := ParseReference(ref, o.insecure())
	if err != nil {
		return nil, err
	}
	if _, ok := r.(name.Digest); !ok {
		return nil, fmt.Errorf("%s names no digest: kosa8's own images are pulled only by a pinned digest (REPOSITORY@sha256:...)", ref)
	}
	s, err := openRegistry(ctx, ref, &o)
	if err != nil {
		return nil, err
	}
	lim := o.limits()
	b, mt, err := s.manifest(ctx, "", lim.Manifest)
	if err != nil {
		return nil, err
	}
	want := Platform(o.Arch)
	if isIndex(mt, b) {
		idx, err := v1.ParseIndexManifest(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: the index does not parse: %w", ref, err)
		}
		var pick *v1.Descriptor
		var have []string
		for i := range idx.Manifests {
			m := &idx.Manifests[i]
			if m.Platform != nil {
				have = append(have, platformString(*m.Platform))
			}
			if platformMatches(m.Platform, want) {
				pick = m
				break
			}
		}
		if pick == nil {
			return nil, fmt.Errorf("%s has no kosa8 image for %s (it has: %s)", ref, platformString(want), strings.Join(have, ", "))
		}
		if err := checkDigest(pick.Digest.String()); err != nil {
			return nil, err
		}
		if b, mt, err = s.manifest(ctx, pick.Digest.String(), lim.Manifest); err != nil {
			return nil, err
		}
	}
	var m struct {
		MediaType    string          `json:"mediaType"`
		ArtifactType string          `json:"artifactType"`
		Config       v1.Descriptor   `json:"config"`
		Layers       []v1.Descriptor `json:"layers"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: the manifest does not parse: %w", ref, err)
	}
	if m.ArtifactType != ArtifactType || string(m.Config.MediaType) != MediaKosa8Config {
		return nil, fmt.Errorf("%s is not a kosa8 image (artifact type %q, config %q)", ref, clip(m.ArtifactType), clip(string(m.Config.MediaType)))
	}
	out := &PulledArtifact{Ref: ref, Manifest: Digest(b)}
	if m.Config.Size > maxArtifactConfig {
		return nil, fmt.Errorf("%s: its config is %d bytes: %w", ref, m.Config.Size, ErrTooLarge)
	}
	if err := fetchBlob(ctx, c, s, m.Config, maxArtifactConfig, "the config of "+ref, nil); err != nil {
		return nil, err
	}
	if out.Config, err = c.ReadBlob(m.Config.Digest.String(), maxArtifactConfig); err != nil {
		return nil, err
	}
	var total int64
	for _, l := range m.Layers {
		total += l.Size
	}
	var done int64
	for i, l := range m.Layers {
		max, ok := maxBlob[string(l.MediaType)]
		if !ok {
			return nil, fmt.Errorf("%s: blob %d has media type %q, not one of a kosa8 image", ref, i+1, clip(string(l.MediaType)))
		}
		if err := checkDigest(l.Digest.String()); err != nil {
			return nil, err
		}
		if l.Size < 0 || l.Size > max {
			return nil, fmt.Errorf("%s: blob %d is %d bytes, more than the %d allowed: %w", ref, i+1, l.Size, max, ErrTooLarge)
		}
		if err := fetchBlob(ctx, c, s, l, max, fmt.Sprintf("blob %d of %s", i+1, ref), func(n int64) {
			done += n
			if o.Progress != nil {
				o.Progress(done, total)
			}
		}); err != nil {
			return nil, err
		}
		out.Blobs = append(out.Blobs, Blob{MediaType: string(l.MediaType), Digest: l.Digest.String(), Size: l.Size})
	}
	return out, nil
}

// RemoveBlobs removes blobs no pulled image names (after they were
// installed elsewhere).
func (c Cache) RemoveBlobs(blobs []Blob) {
	live := map[string]bool{}
	recs, _ := c.Records()
	for _, r := range recs {
		for _, l := range r.Layers {
			live[l.Digest] = true
		}
	}
	for _, b := range blobs {
		if !live[b.Digest] && ValidDigest(b.Digest) {
			_ = os.Remove(c.BlobPath(b.Digest))
		}
	}
}

// TempFile makes a temporary file in the cache (for a blob being made).
func (c Cache) TempFile() (*os.File, error) {
	tmp := filepath.Join(c.Dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, err
	}
	return os.CreateTemp(tmp, "blob-*")
}

// Adopt moves the finished temporary file f, whose bytes hash to d, into
// the cache as blob d.
func (c Cache) Adopt(f *os.File, d string) error {
	if err := checkDigest(d); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.BlobPath(d)), 0o755); err != nil {
		return err
	}
	if err := f.Chmod(0o444); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), c.BlobPath(d))
}
