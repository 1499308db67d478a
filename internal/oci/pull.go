package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kosa8/kosa8/internal/folder"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// PullOptions control a pull.
type PullOptions struct {
	// Arch is the sandbox's architecture: an index's entry for it is
	// chosen (linux/amd64, linux/arm64/v8).
	Arch vmspec.Arch
	// Keychain finds registry credentials (nil: the user's docker and
	// podman config files and credential helpers).
	Keychain authn.Keychain
	// Transport is the HTTP transport under the registry protocol (nil:
	// Go's default, with the host's proxy settings).
	Transport http.RoundTripper
	// Insecure names registries (host or host:port) that may be spoken to
	// over plain HTTP besides loopback ones; InsecureEnv adds to it.
	Insecure []string
	// Limits bound what is accepted (zero: DefaultLimits).
	Limits *Limits
	// Progress is told the bytes fetched so far and the total to fetch.
	Progress func(done, total int64)
}

// InsecureEnv lists registries (comma-separated host or host:port) that
// may be reached over plain HTTP although they are not on loopback.
const InsecureEnv = "KOSA8_INSECURE_REGISTRIES"

func (o *PullOptions) limits() Limits {
	if o.Limits != nil {
		return *o.Limits
	}
	return DefaultLimits
}

func (o *PullOptions) insecure() []string {
	out := append([]string(nil), o.Insecure...)
	for _, s := range strings.Split(os.Getenv(InsecureEnv), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// source is where an image's documents and blobs come from.
type source interface {
	// manifest returns the document named by digest d ("" for the one
	// the user named) with its media type, at most max bytes, checked
	// against d when d is set.
	manifest(ctx context.Context, d string, max int64) (b []byte, mediaType string, err error)
	// blob opens blob desc; the caller checks size and digest.
	blob(ctx context.Context, desc v1.Descriptor) (io.ReadCloser, error)
	// name is the canonical reference or path, for records and errors.
	name() string
	kind() string
}

// Pull brings the image src names into the cache: a registry reference
// (python:3.12-slim, 127.0.0.1:5000/x/y@sha256:...), an OCI image layout
// directory, or a tarball written by docker save, podman save or as an OCI
// archive. A path is told from a reference by starting with /, ./ or ../
// (or being an existing file or directory). It returns the record.
func Pull(ctx context.Context, c Cache, src string, o PullOptions) (*Record, error) {
	s, err := openSource(ctx, c, src, &o)
	if err != nil {
		return nil, err
	}
	if cl, ok := s.(io.Closer); ok {
		defer cl.Close()
	}
	rec, err := pull(ctx, c, s, &o)
	if err != nil {
		return nil, err
	}
	rec.Name = src
	if s.kind() != SourceRegistry {
		rec.Name = s.name()
	}
	if err := c.SaveRecord(rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// IsPath reports whether src names a file or directory rather than a
// registry reference.
func IsPath(src string) bool {
	if strings.HasPrefix(src, "/") || strings.HasPrefix(src, "./") || strings.HasPrefix(src, "../") || src == "." {
		return true
	}
	if strings.HasSuffix(src, ".tar") {
		return true
	}
	_, err := os.Stat(src)
	return err == nil
}

func openSource(ctx context.Context, c Cache, src string, o *PullOptions) (source, error) {
	if !IsPath(src) {
		return openRegistry(ctx, src, o)
	}
	abs, dir, err := resolveSource(src)
	if err != nil {
		return nil, err
	}
	if dir {
		return openLayout(abs)
	}
	return openArchive(c, abs, o.limits())
}

// resolveSource is where an image path leads, through the one folder
// resolver (links resolved before ".."): a layout folder, or a file (a
// tarball) in a folder.
func resolveSource(src string) (string, bool, error) {
	if d, err := folder.Resolve(src); err == nil {
		return d.String(), true, nil
	}
	// Split as text: filepath.Dir would drop a ".." before the links
	// ahead of it are resolved.
	parent, base := ".", src
	if i := strings.LastIndexByte(src, filepath.Separator); i >= 0 {
		parent, base = src[:i+1], src[i+1:]
	}
	if base == "" || base == "." || base == ".." {
		return "", false, fmt.Errorf("image %s: no such folder", src)
	}
	d, err := folder.Resolve(parent)
	if err != nil {
		return "", false, fmt.Errorf("image %s: %w", src, err)
	}
	abs := filepath.Join(d.String(), base)
	fi, err := os.Lstat(abs)
	if err != nil {
		return "", false, fmt.Errorf("image %s: %w", src, err)
	}
	if !fi.Mode().IsRegular() {
		return "", false, fmt.Errorf("image %s is neither an OCI layout folder nor an image archive (a regular file)", src)
	}
	return abs, false, nil
}

// pull resolves s to the image for o.Arch and fetches what the cache
// lacks of it.
func pull(ctx context.Context, c Cache, s source, o *PullOptions) (*Record, error) {
	lim := o.limits()
	want := Platform(o.Arch)
	rec := &Record{Source: s.kind(), Ref: s.name(), Platform: platformString(want), Pulled: time.Now().UTC()}
	b, mt, err := s.manifest(ctx, "", lim.Manifest)
	if err != nil {
		return nil, err
	}
	// An index names one manifest per platform; at most two levels of
	// them (an index of indexes is rare, deeper is refused).
	for depth := 0; isIndex(mt, b); depth++ {
		if depth == 2 {
			return nil, fmt.Errorf("%s: indexes nested more than two deep", s.name())
		}
		d, err := c.PutBytes(b, "index of "+s.name())
		if err != nil {
			return nil, err
		}
		if rec.Index == "" {
			rec.Index = d
		}
		idx, err := v1.ParseIndexManifest(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: the index does not parse: %w", s.name(), err)
		}
		var pick *v1.Descriptor
		var have []string
		for i := range idx.Manifests {
			m := &idx.Manifests[i]
			if m.Platform != nil && m.Platform.OS != "unknown" {
				have = append(have, platformString(*m.Platform))
			}
			if platformMatches(m.Platform, want) {
				pick = m
				break
			}
		}
		if pick == nil {
			// A layout's index.json often names its image without a
			// platform: the config's, checked below, decides.
			for i := range idx.Manifests {
				if idx.Manifests[i].Platform == nil {
					pick = &idx.Manifests[i]
					break
				}
			}
		}
		if pick == nil {
			return nil, fmt.Errorf("%s has no image for %s (it has: %s)", s.name(), platformString(want), strings.Join(have, ", "))
		}
		if err := checkDigest(pick.Digest.String()); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name(), err)
		}
		if b, mt, err = s.manifest(ctx, pick.Digest.String(), lim.Manifest); err != nil {
			return nil, err
		}
	}
	if mt == "" {
		mt = sniffMediaType(b)
	}
	if mt != MediaOCIManifest && mt != MediaDockerManifest {
		if strings.Contains(mt, "v1+prettyjws") || strings.Contains(mt, "manifest.v1+json") {
			return nil, fmt.Errorf("%s is a Docker schema 1 image, which kosa8 does not read: push it again with a current docker or podman", s.name())
		}
		return nil, fmt.Errorf("%s: manifest media type %q is not an image manifest", s.name(), clip(mt))
	}
	d, err := c.PutBytes(b, "manifest of "+s.name())
	if err != nil {
		return nil, err
	}
	rec.Manifest = d
	m, err := v1.ParseManifest(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: the manifest does not parse: %w", s.name(), err)
	}
	cfgDesc := m.Config
	if ct := string(cfgDesc.MediaType); ct != MediaOCIConfig && ct != MediaDockerConfig {
		return nil, fmt.Errorf("%s: config media type %q: an artifact, not a container image", s.name(), clip(ct))
	}
	if err := checkDigest(cfgDesc.Digest.String()); err != nil {
		return nil, fmt.Errorf("%s: config: %w", s.name(), err)
	}
	if cfgDesc.Size > lim.Config || cfgDesc.Size < 0 {
		return nil, fmt.Errorf("%s: the image config is %d bytes, more than the %d allowed: %w", s.name(), cfgDesc.Size, lim.Config, ErrTooLarge)
	}
	if len(m.Layers) > lim.Layers {
		return nil, fmt.Errorf("%s has %d layers, more than the %d allowed", s.name(), len(m.Layers), lim.Layers)
	}
	var total int64
	for i, l := range m.Layers {
		if _, err := LayerCompression(string(l.MediaType)); err != nil {
			return nil, fmt.Errorf("%s: layer %d: %w", s.name(), i+1, err)
		}
		if err := checkDigest(l.Digest.String()); err != nil {
			return nil, fmt.Errorf("%s: layer %d: %w", s.name(), i+1, err)
		}
		if l.Size < 0 || l.Size > lim.Layer {
			return nil, fmt.Errorf("%s: layer %d is %d bytes, more than the %d allowed: %w", s.name(), i+1, l.Size, lim.Layer, ErrTooLarge)
		}
		if !c.HasBlob(l.Digest.String(), l.Size) {
			total += l.Size
		}
	}
	if err := fetchBlob(ctx, c, s, cfgDesc, lim.Config, "the config of "+s.name(), nil); err != nil {
		return nil, err
	}
	cb, err := c.ReadBlob(cfgDesc.Digest.String(), lim.Config)
	if err != nil {
		return nil, err
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(cb))
	if err != nil {
		return nil, fmt.Errorf("%s: the image config does not parse: %w", s.name(), err)
	}
	if cfg.OS != "" && cfg.OS != want.OS || cfg.Architecture != "" && cfg.Architecture != want.Architecture {
		return nil, fmt.Errorf("%s is an image for %s/%s, and this sandbox runs %s", s.name(), clip(cfg.OS), clip(cfg.Architecture), platformString(want))
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("%s: the config lists %d layers and the manifest %d", s.name(), len(cfg.RootFS.DiffIDs), len(m.Layers))
	}
	rec.Config = cfgDesc.Digest.String()
	var done int64
	report := func(n int64) {
		done += n
		if o.Progress != nil {
			o.Progress(done, total)
		}
	}
	for i, l := range m.Layers {
		if err := checkDigest(cfg.RootFS.DiffIDs[i].String()); err != nil {
			return nil, fmt.Errorf("%s: diff id of layer %d: %w", s.name(), i+1, err)
		}
		what := fmt.Sprintf("layer %d of %s", i+1, s.name())
		if err := fetchBlob(ctx, c, s, l, lim.Layer, what, report); err != nil {
			return nil, err
		}
		rec.Layers = append(rec.Layers, Layer{Digest: l.Digest.String(), Size: l.Size, MediaType: string(l.MediaType), DiffID: cfg.RootFS.DiffIDs[i].String()})
	}
	return rec, nil
}

func fetchBlob(ctx context.Context, c Cache, s source, desc v1.Descriptor, max int64, what string, progress func(int64)) error {
	if c.HasBlob(desc.Digest.String(), desc.Size) {
		return nil
	}
	rc, err := s.blob(ctx, desc)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer rc.Close()
	stop := context.AfterFunc(ctx, func() { rc.Close() })
	defer stop()
	_, err = c.PutBlob(rc, desc.Digest.String(), desc.Size, max, what, progress)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func isIndex(mt string, b []byte) bool {
	if mt == "" {
		mt = sniffMediaType(b)
	}
	return mt == MediaOCIIndex || mt == MediaDockerList
}

// sniffMediaType reads a document's mediaType field, or tells an index
// (manifests) from a manifest (config) when it has none.
func sniffMediaType(b []byte) string {
	var probe struct {
		MediaType string          `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
		Config    json.RawMessage `json:"config"`
	}
	if json.Unmarshal(b, &probe) != nil {
		return ""
	}
	switch {
	case probe.MediaType != "":
		return probe.MediaType
	case probe.Manifests != nil:
		return MediaOCIIndex
	case probe.Config != nil:
		return MediaOCIManifest
	}
	return ""
}

// readLimited reads r up to max bytes, refusing more.
func readLimited(r io.Reader, max int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is more than %d bytes: %w", what, max, ErrTooLarge)
	}
	return b, nil
}

// verifyDoc checks a document fetched by digest d.
func verifyDoc(b []byte, d, what string) error {
	if d == "" {
		return nil
	}
	if got := Digest(b); got != d {
		return fmt.Errorf("%s: its bytes hash to %s, not %s: %w", what, got, d, ErrDigest)
	}
	return nil
}

var errNotFound = errors.New("not found")
