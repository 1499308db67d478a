package debian

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// parallelDownloads is how many .debs are fetched at once: enough to hide
// per-request latency, few enough to be polite to a mirror.
const parallelDownloads = 4

// Download fetches pkgs into the cache directory and returns their local
// paths in the order of pkgs. Each file is named by the base name of its
// Filename and written through a temporary file that is renamed into place
// only once its size and SHA256 match, so a path returned always holds the
// verified package. A cached file is reused only if its SHA256 matches;
// otherwise it is replaced. progress, if not nil, is called after each
// package with the number done, the total and the bytes downloaded so far.
func (ix *Index) Download(ctx context.Context, pkgs []*Package, progress func(done, total int, bytes int64)) ([]string, error) {
	if ix.cacheDir == "" {
		return nil, errors.New("Download needs Options.CacheDir")
	}
	if err := os.MkdirAll(ix.cacheDir, 0o755); err != nil {
		return nil, err
	}
	paths := make([]string, len(pkgs))
	owner := map[string]*Package{} // file name -> the package it is for
	for i, p := range pkgs {
		if p.problem != "" {
			return nil, fmt.Errorf("package %s cannot be downloaded: %s", p.Name, p.problem)
		}
		if err := checkFilename(p.Filename); err != nil {
			return nil, fmt.Errorf("package %s: %v", p.Name, err)
		}
		if !validSHA256(p.SHA256) || p.Size <= 0 || p.Size > maxDebSize {
			return nil, fmt.Errorf("package %s: bad SHA256 or size", p.Name)
		}
		name, err := cacheName(p.Filename)
		if err != nil {
			return nil, fmt.Errorf("package %s: %v", p.Name, err)
		}
		// Keyed without case: on a Mac's file system X_1.deb and x_1.deb
		// are one file, and two downloads would rename over each other.
		key := strings.ToLower(name)
		if q := owner[key]; q != nil && q.SHA256 != p.SHA256 {
			return nil, fmt.Errorf("packages %s and %s both want the cache file %s", q.Name, p.Name, name)
		}
		owner[key] = p
		paths[i] = filepath.Join(ix.cacheDir, name)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		done     int
		total    int64
		wg       sync.WaitGroup
		sem      = make(chan struct{}, parallelDownloads)
	)
	// Entries naming the same file (in any case) are fetched once.
	first := map[string]int{}
	for i := range pkgs {
		if _, ok := first[strings.ToLower(paths[i])]; !ok {
			first[strings.ToLower(paths[i])] = i
		}
	}
	for i, p := range pkgs {
		if first[strings.ToLower(paths[i])] != i {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			n, err := ix.fetchDeb(ctx, p, paths[i])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
					cancel()
				}
				return
			}
			done++
			total += n
			if progress != nil {
				progress(done, len(first), total)
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return paths, nil
}

// cacheName is the cache file name for a Filename: its base name, which
// must not be empty, start with a dot or contain a path separator, and is
// ASCII (Debian's are: name_version_arch.deb, an epoch's colon as %3a), so
// no two names a file system normalises alike (a Mac's: é composed and
// decomposed) can differ here.
func cacheName(filename string) (string, error) {
	name := path.Base(filename)
	if name == "" || name == "." || name == "/" || strings.HasPrefix(name, ".") || strings.ContainsAny(name, "/\\\x00") {
		return "", fmt.Errorf("Filename %q has no usable base name", clip(filename))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return "", fmt.Errorf("Filename %q: the base name is not printable ASCII", clip(filename))
		}
	}
	return name, nil
}

// fetchDeb makes dst hold p's verified .deb, reusing a cached copy whose
// SHA256 matches, and returns the bytes downloaded (0 when reused).
func (ix *Index) fetchDeb(ctx context.Context, p *Package, dst string) (int64, error) {
	if ok, err := fileHasSum(dst, p.Size, p.SHA256); ok {
		ix.logf("reusing cached %s", dst)
		return 0, nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		ix.logf("replacing cached %s: %v", dst, err)
	}
	u, err := url.JoinPath(p.Base, p.Filename)
	if err != nil {
		return 0, fmt.Errorf("package %s: %v", p.Name, err)
	}
	start := time.Now()
	resp, err := ix.get(ctx, u, p.Size)
	if err != nil {
		return 0, fmt.Errorf("package %s: %w", p.Name, err)
	}
	defer resp.Body.Close()
	f, tmp, err := createTemp(filepath.Dir(dst), filepath.Base(dst))
	if err != nil {
		return 0, err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, p.Size+1))
	if err != nil {
		return 0, fmt.Errorf("GET %s: %v", u, err)
	}
	if n != p.Size {
		return 0, fmt.Errorf("GET %s: %d bytes, the index says %d: the mirror may be mid-sync or broken", u, n, p.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != p.SHA256 {
		return 0, fmt.Errorf("GET %s: SHA256 %s, the index says %s: the mirror may be mid-sync or broken", u, got, p.SHA256)
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return 0, err
	}
	ok = true
	ix.logf("fetched %s (%d bytes, %d ms)", u, n, time.Since(start).Milliseconds())
	return n, nil
}

// fileHasSum reports whether path is a regular file (not a symlink) of the
// given size and SHA256. A false result with a nil error means the file
// differs.
func fileHasSum(name string, size int64, sum string) (bool, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("not a regular file")
	}
	if fi.Size() != size {
		return false, fmt.Errorf("%d bytes, want %d", fi.Size(), size)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, size+1)); err != nil {
		return false, err
	}
	if hex.EncodeToString(h.Sum(nil)) != sum {
		return false, fmt.Errorf("SHA256 does not match")
	}
	return true, nil
}

// createTemp creates a new temporary file in dir that cannot be a symlink
// planted in advance: O_EXCL fails on any existing name, O_NOFOLLOW on a
// link.
func createTemp(dir, base string) (*os.File, string, error) {
	for range 10 {
		var b [8]byte
		rand.Read(b[:])
		name := filepath.Join(dir, ".tmp-"+hex.EncodeToString(b[:])+"-"+base)
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
		if err == nil {
			return f, name, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, "", err
		}
	}
	return nil, "", fmt.Errorf("cannot create a temporary file in %s", dir)
}
