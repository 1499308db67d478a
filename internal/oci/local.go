package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// layoutSource reads an OCI image layout directory (index.json, oci-layout,
// blobs/sha256/...), as written by skopeo, buildah, crane or oras.
type layoutSource struct{ dir string }

func openLayout(dir string) (*layoutSource, error) {
	b, err := os.ReadFile(filepath.Join(dir, "oci-layout"))
	if err != nil {
		return nil, fmt.Errorf("%s is not an OCI image layout (no oci-layout file): %w", dir, err)
	}
	var l struct {
		Version string `json:"imageLayoutVersion"`
	}
	if json.Unmarshal(b, &l) != nil || l.Version != "1.0.0" {
		return nil, fmt.Errorf("%s: oci-layout says version %q, kosa8 reads 1.0.0", dir, clip(l.Version))
	}
	return &layoutSource{dir: dir}, nil
}

func (s *layoutSource) name() string { return s.dir }
func (s *layoutSource) kind() string { return SourceLayout }

func (s *layoutSource) manifest(_ context.Context, d string, max int64) ([]byte, string, error) {
	p := filepath.Join(s.dir, "index.json")
	what := "index.json of " + s.dir
	if d != "" {
		if err := checkDigest(d); err != nil {
			return nil, "", err
		}
		p = filepath.Join(s.dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
		what = "manifest " + d + " of " + s.dir
	}
	f, err := openRegular(p)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	b, err := readLimited(f, max, what)
	if err != nil {
		return nil, "", err
	}
	if err := verifyDoc(b, d, what); err != nil {
		return nil, "", err
	}
	return b, sniffMediaType(b), nil
}

func (s *layoutSource) blob(_ context.Context, desc v1.Descriptor) (io.ReadCloser, error) {
	if err := checkDigest(desc.Digest.String()); err != nil {
		return nil, err
	}
	return openRegular(filepath.Join(s.dir, "blobs", "sha256", desc.Digest.Hex))
}

// openRegular opens a regular file (a FIFO or device there would block or
// read forever).
func openRegular(p string) (*os.File, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	return f, nil
}

// archiveSource reads a tarball: `docker save` and `podman save` write a
// manifest.json naming the config and layer members (Docker 25 and later
// add an OCI layout beside it); an OCI archive (podman save --format
// oci-archive, skopeo) holds an OCI layout. The tarball is indexed once
// (names to offsets, bounded), then members are read in place: nothing is
// extracted to the host's file system.
type archiveSource struct {
	path    string
	f       *os.File
	members map[string]member
	// doc is the manifest made for a docker-archive, whose own
	// manifest.json is not an OCI document.
	doc []byte
}

type member struct{ off, size int64 }

// maxArchiveMembers bounds the members of an image tarball indexed.
const maxArchiveMembers = 100_000

func openArchive(c Cache, p string, lim Limits) (*archiveSource, error) {
	f, err := openRegular(p)
	if err != nil {
		return nil, err
	}
	s := &archiveSource{path: p, f: f, members: map[string]member{}}
	if err := s.index(); err != nil {
		f.Close()
		return nil, err
	}
	_, hasIndex := s.members["index.json"]
	_, hasLayout := s.members["oci-layout"]
	if hasIndex && hasLayout {
		return s, nil
	}
	if _, ok := s.members["manifest.json"]; ok {
		if err := s.dockerManifest(c, lim); err != nil {
			f.Close()
			return nil, err
		}
		return s, nil
	}
	f.Close()
	return nil, fmt.Errorf("%s is neither a docker/podman save tarball (manifest.json) nor an OCI archive (index.json, oci-layout)", p)
}

func (s *archiveSource) Close() error { return s.f.Close() }

func (s *archiveSource) name() string { return s.path }
func (s *archiveSource) kind() string { return SourceArchive }

// offsetReader tracks the offset tar.Reader has reached in the file; it
// seeks over members' data, so indexing reads headers only.
type offsetReader struct {
	f   *os.File
	off int64
}

func (o *offsetReader) Read(b []byte) (int, error) {
	n, err := o.f.Read(b)
	o.off += int64(n)
	return n, err
}

func (o *offsetReader) Seek(off int64, whence int) (int64, error) {
	n, err := o.f.Seek(off, whence)
	if err == nil {
		o.off = n
	}
	return n, err
}

func (s *archiveSource) index() error {
	var magic [4]byte
	if _, err := s.f.ReadAt(magic[:], 0); err == nil {
		if magic[0] == 0x1f && magic[1] == 0x8b {
			return fmt.Errorf("%s is compressed (gzip): decompress it first (gunzip), kosa8 reads the tarball in place", s.path)
		}
		if bytes.Equal(magic[:], []byte{0x28, 0xb5, 0x2f, 0xfd}) {
			return fmt.Errorf("%s is compressed (zstd): decompress it first (unzstd), kosa8 reads the tarball in place", s.path)
		}
	}
	or := &offsetReader{f: s.f}
	tr := tar.NewReader(or)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: not a readable tarball: %w", s.path, err)
		}
		if n == maxArchiveMembers {
			return fmt.Errorf("%s: more than %d members", s.path, maxArchiveMembers)
		}
		if h.Typeflag != tar.TypeReg || h.Size < 0 {
			continue
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if strings.HasPrefix(name, "../") || strings.HasPrefix(name, "/") {
			continue
		}
		s.members[name] = member{off: or.off, size: h.Size}
	}
}

func (s *archiveSource) open(name string) (*io.SectionReader, error) {
	m, ok := s.members[name]
	if !ok {
		return nil, fmt.Errorf("%s has no member %s", s.path, clip(name))
	}
	return io.NewSectionReader(s.f, m.off, m.size), nil
}

func (s *archiveSource) manifest(_ context.Context, d string, max int64) ([]byte, string, error) {
	if d == "" && s.doc != nil {
		return s.doc, MediaOCIManifest, nil
	}
	name, what := "index.json", "index.json of "+s.path
	if d != "" {
		if err := checkDigest(d); err != nil {
			return nil, "", err
		}
		name, what = "blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), "manifest "+d+" of "+s.path
	}
	r, err := s.open(name)
	if err != nil {
		return nil, "", err
	}
	b, err := readLimited(r, max, what)
	if err != nil {
		return nil, "", err
	}
	if err := verifyDoc(b, d, what); err != nil {
		return nil, "", err
	}
	return b, sniffMediaType(b), nil
}

func (s *archiveSource) blob(_ context.Context, desc v1.Descriptor) (io.ReadCloser, error) {
	if err := checkDigest(desc.Digest.String()); err != nil {
		return nil, err
	}
	r, err := s.open("blobs/sha256/" + desc.Digest.Hex)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(r), nil
}

// dockerManifest reads a docker-archive's manifest.json, stores its config
// and layers in the cache (named by the digests of their bytes, which
// docker's format does not state) and makes an OCI manifest of them.
func (s *archiveSource) dockerManifest(c Cache, lim Limits) error {
	r, err := s.open("manifest.json")
	if err != nil {
		return err
	}
	b, err := readLimited(r, lim.Manifest, "manifest.json of "+s.path)
	if err != nil {
		return err
	}
	var entries []struct {
		Config   string   `json:"Config"`
		RepoTags []string `json:"RepoTags"`
		Layers   []string `json:"Layers"`
	}
	if err := json.Unmarshal(b, &entries); err != nil {
		return fmt.Errorf("manifest.json of %s does not parse: %w", s.path, err)
	}
	if len(entries) == 0 {
		return fmt.Errorf("manifest.json of %s lists no image", s.path)
	}
	e := entries[0]
	if len(e.Layers) > lim.Layers {
		return fmt.Errorf("%s has %d layers, more than the %d allowed", s.path, len(e.Layers), lim.Layers)
	}
	put := func(name string, max int64, what string) (v1.Descriptor, error) {
		name = path.Clean(strings.TrimPrefix(name, "./"))
		r, err := s.open(name)
		if err != nil {
			return v1.Descriptor{}, err
		}
		if r.Size() > max {
			return v1.Descriptor{}, fmt.Errorf("%s of %s is %d bytes, more than the %d allowed: %w", what, s.path, r.Size(), max, ErrTooLarge)
		}
		var head [4]byte
		n, _ := r.ReadAt(head[:], 0)
		d, err := c.putUnknown(r, max, what+" of "+s.path)
		if err != nil {
			return v1.Descriptor{}, err
		}
		mt := types.OCIUncompressedLayer
		switch {
		case n >= 2 && head[0] == 0x1f && head[1] == 0x8b:
			mt = types.OCILayer
		case n == 4 && bytes.Equal(head[:], []byte{0x28, 0xb5, 0x2f, 0xfd}):
			mt = types.OCILayerZStd
		}
		h, _ := v1.NewHash(d)
		return v1.Descriptor{MediaType: mt, Digest: h, Size: r.Size()}, nil
	}
	cfg, err := put(e.Config, lim.Config, "the config")
	if err != nil {
		return err
	}
	cfg.MediaType = types.OCIConfigJSON
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, Config: cfg}
	for i, l := range e.Layers {
		d, err := put(l, lim.Layer, fmt.Sprintf("layer %d", i+1))
		if err != nil {
			return err
		}
		m.Layers = append(m.Layers, d)
	}
	if len(e.RepoTags) > 0 {
		m.Annotations = map[string]string{"org.opencontainers.image.ref.name": e.RepoTags[0]}
	}
	s.doc, err = json.Marshal(m)
	return err
}

// putUnknown stores r as a blob named by the digest of its bytes.
func (c Cache) putUnknown(r io.Reader, max int64, what string) (string, error) {
	tmp := filepath.Join(c.Dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(tmp, "blob-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, max+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if n > max {
		return "", fmt.Errorf("%s: more than %d bytes: %w", what, max, ErrTooLarge)
	}
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if c.HasBlob(d, n) {
		return d, nil
	}
	if err := os.MkdirAll(filepath.Dir(c.BlobPath(d)), 0o755); err != nil {
		return "", err
	}
	if err := f.Chmod(0o444); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return d, os.Rename(f.Name(), c.BlobPath(d))
}
