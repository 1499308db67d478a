// Package oci brings OCI images into kosa8's cache: from a registry, an OCI
// image layout directory, or a `docker save` / `podman save` tarball. It
// runs on the host, outside every sandbox's allow-list: a pull reaches the
// registry the host can reach, with the user's own registry credentials
// (docker's and podman's config files and credential helpers, read by
// go-containerregistry's keychain). Nothing here unpacks a layer: layers
// are untrusted tar archives, unpacked inside a builder VM (package image).
//
// # Cache layout
//
//	CACHE/oci/blobs/sha256/HEX     one blob (manifest, index, config, layer),
//	                               named by the SHA-256 of its bytes, 0444;
//	                               written to tmp/ first and renamed here only
//	                               once its size and digest were checked
//	CACHE/oci/refs/KEY.json        one pulled image (Record): the name the user
//	                               gave, the platform, the manifest's digest and
//	                               its layers; KEY hashes the name and platform
//	CACHE/oci/tmp/                 downloads under way (swept by prune)
//
// Blobs are shared: two images with a layer in common store it once, and a
// blob already in the cache is not fetched again. A blob no record reaches
// is removed by Prune.
//
// # Bounds
//
// Everything read from a registry or a file is bounded before it is
// trusted (Limits): a manifest or index of more than 4 MiB, an image
// config of more than 8 MiB, a layer larger than its descriptor says, a
// blob whose bytes do not hash to its digest, are refused with an error
// that names them. Plain HTTP is spoken only to loopback registries and to
// those named insecure by the user.
package oci

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// Limits bound what a pull accepts.
type Limits struct {
	// Manifest bounds a manifest or an index.
	Manifest int64
	// Config bounds an image's config blob.
	Config int64
	// Layers bounds how many layers an image has.
	Layers int
	// Layer bounds one layer's compressed size.
	Layer int64
	// Unpacked bounds the uncompressed size of all layers together.
	Unpacked int64
	// Ratio bounds how much a layer may grow when decompressed, once it
	// is past RatioFloor bytes uncompressed (a decompression bomb grows
	// a thousandfold; real layers two to ten times).
	Ratio      int64
	RatioFloor int64
	// Files bounds the entries of all layers together (checked while
	// unpacking, in the guest).
	Files int
}

// DefaultLimits are the bounds of a pull unless the caller sets others.
var DefaultLimits = Limits{
	Manifest:   4 << 20,
	Config:     8 << 20,
	Layers:     256,
	Layer:      16 << 30,
	Unpacked:   64 << 30,
	Ratio:      100,
	RatioFloor: 1 << 30,
	Files:      1_000_000,
}

// Media types kosa8 reads.
const (
	MediaOCIIndex       = string(types.OCIImageIndex)
	MediaOCIManifest    = string(types.OCIManifestSchema1)
	MediaDockerList     = string(types.DockerManifestList)
	MediaDockerManifest = string(types.DockerManifestSchema2)
	MediaOCIConfig      = string(types.OCIConfigJSON)
	MediaDockerConfig   = string(types.DockerConfigJSON)
)

// Compression of a layer, from its media type.
type Compression string

const (
	Uncompressed Compression = "none"
	Gzip         Compression = "gzip"
	Zstd         Compression = "zstd"
)

// LayerCompression returns how a layer of media type mt is compressed, or
// an error for a media type that is not an image layer kosa8 can unpack
// (a Windows or foreign layer, an artifact's blob).
func LayerCompression(mt string) (Compression, error) {
	switch mt {
	case string(types.OCILayer), string(types.DockerLayer):
		return Gzip, nil
	case string(types.OCILayerZStd):
		return Zstd, nil
	case string(types.OCIUncompressedLayer), "application/vnd.docker.image.rootfs.diff.tar":
		return Uncompressed, nil
	case string(types.OCIRestrictedLayer), string(types.DockerForeignLayer):
		return "", fmt.Errorf("layer media type %s is a foreign (non-distributable) layer, which kosa8 does not fetch from elsewhere", mt)
	}
	return "", fmt.Errorf("layer media type %q is not a tar layer kosa8 can unpack", mt)
}

// Layer is one layer of a cached image.
type Layer struct {
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	MediaType string `json:"media_type"`
	// DiffID is the digest of the uncompressed tar, from the image config;
	// checked when the layer is decompressed.
	DiffID string `json:"diff_id"`
}

// Record is a pulled image in the cache.
type Record struct {
	// Name is what the user gave: a reference, or a path.
	Name string `json:"name"`
	// Source is where it came from: registry, layout or archive.
	Source string `json:"source"`
	// Ref is the canonical reference (registry) or the absolute path.
	Ref string `json:"ref"`
	// Index is the digest of the index the manifest was chosen from.
	Index    string    `json:"index,omitempty"`
	Manifest string    `json:"manifest"`
	Platform string    `json:"platform"`
	Config   string    `json:"config"`
	Layers   []Layer   `json:"layers"`
	Pulled   time.Time `json:"pulled"`
	// BuildKey identifies what a built image was made from (Source
	// "built"): the Dockerfile, its context, arguments and base images.
	BuildKey string `json:"build_key,omitempty"`
}

// Sources.
const (
	SourceRegistry = "registry"
	SourceLayout   = "layout"
	SourceArchive  = "archive"
)

// Size is the compressed size of the image's layers.
func (r *Record) Size() int64 {
	var n int64
	for _, l := range r.Layers {
		n += l.Size
	}
	return n
}

// Arch is the record's architecture.
func (r *Record) Arch() vmspec.Arch {
	_, a, _ := strings.Cut(r.Platform, "/")
	a, _, _ = strings.Cut(a, "/")
	return vmspec.Arch(a)
}

// ShortDigest is the manifest's digest, shortened for listings.
func (r *Record) ShortDigest() string {
	_, h, _ := strings.Cut(r.Manifest, ":")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// recordKey names the record of name for platform.
func recordKey(name, platform string) string {
	h := sha256.Sum256([]byte(name + "\x00" + platform))
	return hex.EncodeToString(h[:16])
}

// Platform is the OCI platform of a sandbox of arch: kosa8 runs Linux
// guests of amd64 or arm64 (v8).
func Platform(arch vmspec.Arch) v1.Platform {
	if arch == vmspec.ARM64 {
		return v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	}
	return v1.Platform{OS: "linux", Architecture: string(arch)}
}

// PlatformString is the platform of a sandbox of arch as records name it
// (linux/amd64, linux/arm64/v8).
func PlatformString(arch vmspec.Arch) string { return platformString(Platform(arch)) }

func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// platformMatches reports whether an index entry's platform p runs on a
// sandbox of want: same OS and architecture; for arm64 an entry without a
// variant or with v8 (or later: v8 guests run v8 code only, so exactly v8
// or none).
func platformMatches(p *v1.Platform, want v1.Platform) bool {
	if p == nil || p.OS != want.OS || p.Architecture != want.Architecture {
		return false
	}
	if want.Architecture == "arm64" {
		return p.Variant == "" || p.Variant == "v8"
	}
	return true
}
