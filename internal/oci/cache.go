package oci

import (
	"bytes"

	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Cache is the content-addressed store of OCI blobs and the images pulled
// into it (see the package doc for its layout).
type Cache struct{ Dir string }

// NewCache returns the cache under kosa8's cache directory.
func NewCache(kosa8Cache string) Cache { return Cache{Dir: filepath.Join(kosa8Cache, "oci")} }

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ValidDigest reports whether d is a sha256 digest kosa8 accepts (the only
// algorithm it stores blobs under).
func ValidDigest(d string) bool { return digestRE.MatchString(d) }

func checkDigest(d string) error {
	if !ValidDigest(d) {
		return fmt.Errorf("digest %q is not sha256:<64 hex digits>", clip(d))
	}
	return nil
}

// BlobPath is where blob d lives (whether or not it is there).
func (c Cache) BlobPath(d string) string {
	_, h, _ := strings.Cut(d, ":")
	return filepath.Join(c.Dir, "blobs", "sha256", h)
}

// HasBlob reports whether blob d is in the cache with size bytes.
func (c Cache) HasBlob(d string, size int64) bool {
	if !ValidDigest(d) {
		return false
	}
	fi, err := os.Lstat(c.BlobPath(d))
	return err == nil && fi.Mode().IsRegular() && (size < 0 || fi.Size() == size)
}

// ErrTooLarge: a blob or a document is larger than its bound or than its
// descriptor says.
var ErrTooLarge = errors.New("larger than allowed")

// ErrDigest: a blob's bytes do not hash to its digest.
var ErrDigest = errors.New("digest mismatch")

// PutBlob copies r into the cache as blob d of exactly size bytes (size
// < 0: any size up to max), checking the digest, and returns the path.
// Nothing is stored unless every check passes. what names the blob in
// errors ("layer 2 of python:3.12").
func (c Cache) PutBlob(r io.Reader, d string, size, max int64, what string, progress func(int64)) (string, error) {
	if err := checkDigest(d); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if size > max {
		return "", fmt.Errorf("%s is %d bytes, more than the %d allowed: %w", what, size, max, ErrTooLarge)
	}
	dst := c.BlobPath(d)
	if c.HasBlob(d, size) {
		return dst, nil
	}
	tmp := filepath.Join(c.Dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(tmp, "blob-*")
	if err != nil {
		return "", err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	limit := max
	if size >= 0 {
		limit = size
	}
	h := sha256.New()
	w := io.MultiWriter(f, h)
	if progress != nil {
		w = io.MultiWriter(w, progressWriter(progress))
	}
	// One byte more than allowed is read: a source that has it sent more
	// than its descriptor said, which is refused, not cut short.
	n, err := io.Copy(w, io.LimitReader(r, limit+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if n > limit {
		if size >= 0 {
			return "", fmt.Errorf("%s: the source sent more than the %d bytes its descriptor says: %w", what, size, ErrTooLarge)
		}
		return "", fmt.Errorf("%s: more than %d bytes: %w", what, max, ErrTooLarge)
	}
	if size >= 0 && n != size {
		return "", fmt.Errorf("%s: the source sent %d bytes where its descriptor says %d", what, n, size)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != d {
		return "", fmt.Errorf("%s: its bytes hash to %s, not %s: %w", what, got, d, ErrDigest)
	}
	if err := f.Chmod(0o444); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), dst); err != nil {
		return "", err
	}
	ok = true
	return dst, nil
}

// PutBytes stores b as a blob and returns its digest.
func (c Cache) PutBytes(b []byte, what string) (string, error) {
	d := Digest(b)
	_, err := c.PutBlob(strings.NewReader(string(b)), d, int64(len(b)), int64(len(b)), what, nil)
	return d, err
}

// Digest is the sha256 digest of b.
func Digest(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// ReadBlob reads blob d, refusing one larger than max.
func (c Cache) ReadBlob(d string, max int64) ([]byte, error) {
	if err := checkDigest(d); err != nil {
		return nil, err
	}
	f, err := os.Open(c.BlobPath(d))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("blob %s: more than %d bytes: %w", d, max, ErrTooLarge)
	}
	if Digest(b) != d {
		return nil, fmt.Errorf("blob %s in the cache is damaged: %w (run 'kosa8 image prune' and pull again)", d, ErrDigest)
	}
	return b, nil
}

// OpenBlob opens blob d for reading.
func (c Cache) OpenBlob(d string) (*os.File, error) {
	if err := checkDigest(d); err != nil {
		return nil, err
	}
	return os.Open(c.BlobPath(d))
}

// SaveRecord writes r, replacing the record of the same name and platform.
func (c Cache) SaveRecord(r *Record) error {
	dir := filepath.Join(c.Dir, "refs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".rec-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), filepath.Join(dir, recordKey(r.Name, r.Platform)+".json"))
}

// Records lists the pulled images, newest first.
func (c Cache) Records() ([]*Record, error) {
	files, _ := filepath.Glob(filepath.Join(c.Dir, "refs", "*.json"))
	var out []*Record
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var r Record
		if json.Unmarshal(b, &r) != nil || !ValidDigest(r.Manifest) {
			continue
		}
		out = append(out, &r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pulled.After(out[j].Pulled) })
	return out, nil
}

// Find returns the record of name for platform, if it was pulled.
func (c Cache) Find(name, platform string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(c.Dir, "refs", recordKey(name, platform)+".json"))
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Lookup finds the records matching what: a name as given, a canonical
// reference, a manifest digest or a unique prefix of its hex.
func (c Cache) Lookup(what string) ([]*Record, error) {
	all, err := c.Records()
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, r := range all {
		_, h, _ := strings.Cut(r.Manifest, ":")
		if r.Name == what || r.Ref == what || r.Manifest == what || (len(what) >= 6 && strings.HasPrefix(h, what)) {
			out = append(out, r)
		}
	}
	return out, nil
}

// RemoveRecord forgets r (its blobs stay until Prune).
func (c Cache) RemoveRecord(r *Record) error {
	err := os.Remove(filepath.Join(c.Dir, "refs", recordKey(r.Name, r.Platform)+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Prune removes the blobs no record reaches (besides keep) and downloads
// older than an hour left in tmp/, and returns how many bytes it freed.
func (c Cache) Prune(keep map[string]bool) (int64, error) {
	live := map[string]bool{}
	for d := range keep {
		live[d] = true
	}
	recs, err := c.Records()
	if err != nil {
		return 0, err
	}
	for _, r := range recs {
		for _, d := range []string{r.Index, r.Manifest, r.Config} {
			if d != "" {
				live[d] = true
			}
		}
		for _, l := range r.Layers {
			live[l.Digest] = true
		}
	}
	var freed int64
	ents, _ := os.ReadDir(filepath.Join(c.Dir, "blobs", "sha256"))
	for _, e := range ents {
		if live["sha256:"+e.Name()] {
			continue
		}
		p := filepath.Join(c.Dir, "blobs", "sha256", e.Name())
		if fi, err := os.Lstat(p); err == nil {
			if os.Remove(p) == nil {
				freed += fi.Size()
			}
		}
	}
	tmps, _ := os.ReadDir(filepath.Join(c.Dir, "tmp"))
	for _, e := range tmps {
		p := filepath.Join(c.Dir, "tmp", e.Name())
		if fi, err := os.Lstat(p); err == nil && time.Since(fi.ModTime()) > time.Hour {
			if os.RemoveAll(p) == nil {
				freed += fi.Size()
			}
		}
	}
	return freed, nil
}

type progressWriter func(int64)

func (p progressWriter) Write(b []byte) (int, error) { p(int64(len(b))); return len(b), nil }

// clip shortens s for an error message (it may come from a registry).
func clip(s string) string {
	if len(s) > 100 {
		s = s[:100] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

// hashingReader hashes what is read through it.
type hashingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (h *hashingReader) Read(b []byte) (int, error) {
	n, err := h.r.Read(b)
	h.h.Write(b[:n])
	h.n += int64(n)
	return n, err
}

// ReadConfig reads the image config of a pulled image.
func ReadConfig(c Cache, r *Record) (*v1.ConfigFile, error) {
	b, err := c.ReadBlob(r.Config, DefaultLimits.Config)
	if err != nil {
		return nil, fmt.Errorf("the config of %s: %w", r.Name, err)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("the config of %s: %w", r.Name, err)
	}
	return cfg, nil
}
