package dockerfile

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The build context is the folder a build reads (COPY, ADD): it is copied
// into the builder sandbox as a tar stream, never attached, so nothing the
// build does reaches it. It is read without following a link anywhere
// (os.Root keeps every lookup under the folder; a file is opened without
// following its last component and checked to be the file the walk saw),
// and a link is sent as a link: one that leads out of the context
// (absolute, or climbing above it, through other links or not) is refused
// with its name, since the build would read the builder's files through
// it where Docker reads none. Sockets, FIFOs and devices are not sent.

// ContextLimits bound what a context may hold once .dockerignore is
// applied.
type ContextLimits struct {
	Bytes int64 // the files' sizes together
	Files int   // entries sent (files, folders, links)
	Visit int   // entries looked at, sent or not
}

// DefaultContextLimits: a context of more than 4 GiB or 300,000 entries is
// almost always a folder that .dockerignore should have left out
// (node_modules, a virtualenv, build output, .git of a large repository).
var DefaultContextLimits = ContextLimits{Bytes: 4 << 30, Files: 300_000, Visit: 2_000_000}

// maxCtxPath bounds a path in the context, as a Linux path is bounded.
const maxCtxPath = 4096

// maxLinkHops bounds a chain of links resolved, as the kernel's 40.
const maxLinkHops = 40

// ErrContext marks a build context that is refused.
var ErrContext = errors.New("build context")

// Context is a walked build context.
type Context struct {
	Dir     string
	Bytes   int64    // the files' sizes together
	Skipped []string // sockets, FIFOs and devices, not sent
	// Digest hashes every entry sent: path, type, mode, link text and
	// content. Two contexts with the same digest build the same.
	Digest  string
	entries []ctxEntry
}

type ctxEntry struct {
	rel  string
	fi   fs.FileInfo
	link string
	sum  [sha256.Size]byte // a regular file's content
}

// Entries is how many files, folders and links are sent.
func (c *Context) Entries() int { return len(c.entries) }

// ReadContext walks dir, leaving out what ig excludes (ig may be nil), and
// hashes what it will send. It fails, naming the path, on a link out of
// the context, a path too long, or a context over lim.
func ReadContext(dir string, ig *Ignore, lim ContextLimits) (*Context, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrContext, err)
	}
	defer root.Close()
	c := &Context{Dir: dir}
	visits := 0
	var walk func(rel string) error
	walk = func(rel string) error {
		d, err := root.Open(rel)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrContext, rel, err)
		}
		defer d.Close()
		var names []string
		for {
			ents, err := d.ReadDir(1024)
			for _, e := range ents {
				visits++
				if visits > lim.Visit {
					return fmt.Errorf("%w: %s holds more than %d entries: list what the build does not need in .dockerignore", ErrContext, dir, lim.Visit)
				}
				names = append(names, e.Name())
			}
			if err == io.EOF || len(ents) == 0 {
				break
			}
			if err != nil {
				return fmt.Errorf("%w: %s: %v", ErrContext, rel, err)
			}
		}
		slices.Sort(names)
		for _, n := range names {
			r := n
			if rel != "." {
				r = rel + "/" + n
			}
			if len(r) > maxCtxPath {
				return fmt.Errorf("%w: a path longer than %d bytes under %s", ErrContext, maxCtxPath, clip(rel))
			}
			fi, err := root.Lstat(r)
			if err != nil {
				return fmt.Errorf("%w: %s: %v", ErrContext, clip(r), err)
			}
			excluded := ig.Excluded(r)
			if excluded && (!fi.IsDir() || ig.SkipDir(r)) {
				continue
			}
			e := ctxEntry{rel: r, fi: fi}
			switch {
			case fi.IsDir():
			case fi.Mode().IsRegular():
				c.Bytes += fi.Size()
				if c.Bytes > lim.Bytes {
					return fmt.Errorf("%w: %s holds more than %s of files (after .dockerignore): list what the build does not need in .dockerignore (node_modules, virtualenvs, build output)", ErrContext, dir, sizeText(lim.Bytes))
				}
			case fi.Mode()&fs.ModeSymlink != 0:
				if e.link, err = root.Readlink(r); err != nil {
					return fmt.Errorf("%w: %s: %v", ErrContext, clip(r), err)
				}
			default:
				c.Skipped = append(c.Skipped, r)
				continue
			}
			if !excluded {
				c.entries = append(c.entries, e)
				if len(c.entries) > lim.Files {
					return fmt.Errorf("%w: %s holds more than %d files and folders (after .dockerignore): list what the build does not need in .dockerignore", ErrContext, dir, lim.Files)
				}
			}
			if fi.IsDir() {
				if err := walk(r); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk("."); err != nil {
		return nil, err
	}
	if err := c.checkLinks(); err != nil {
		return nil, err
	}
	h := sha256.New()
	for i := range c.entries {
		if err := c.hashEntry(root, h, &c.entries[i]); err != nil {
			return nil, err
		}
	}
	c.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return c, nil
}

// checkLinks refuses a link that leads out of the context, resolved
// through the other links sent.
func (c *Context) checkLinks() error {
	links := map[string]string{}
	for _, e := range c.entries {
		if e.fi.Mode()&fs.ModeSymlink != 0 {
			links[e.rel] = e.link
		}
	}
	for _, e := range c.entries {
		if e.fi.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		if !linkInside(links, e.rel, e.link) {
			return fmt.Errorf("%w: %s is a link to %s, which leads out of the build context %s: kosa8 sends no such link (the build would read the builder's files through it); add it to .dockerignore, or copy what it points to into the context",
				ErrContext, clip(e.rel), clip(e.link), c.Dir)
		}
	}
	return nil
}

// linkInside resolves the link at rel with target through links (the
// other links in the context, by path) and reports whether it stays under
// the context's root.
func linkInside(links map[string]string, rel, target string) bool {
	if strings.HasPrefix(target, "/") {
		return false
	}
	var cur []string
	if d := path.Dir(rel); d != "." {
		cur = strings.Split(d, "/")
	}
	queue := strings.Split(target, "/")
	hops := 0
	for len(queue) > 0 {
		comp := queue[0]
		queue = queue[1:]
		switch comp {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return false
			}
			cur = cur[:len(cur)-1]
			continue
		}
		p := strings.Join(append(slices.Clone(cur), comp), "/")
		if t, ok := links[p]; ok {
			hops++
			if hops > maxLinkHops || strings.HasPrefix(t, "/") {
				return false
			}
			queue = append(strings.Split(t, "/"), queue...)
			continue
		}
		cur = append(cur, comp)
	}
	return true
}

func (c *Context) hashEntry(root *os.Root, h hash.Hash, e *ctxEntry) error {
	fmt.Fprintf(h, "%d:%s\x00%o\x00%d:%s\x00", len(e.rel), e.rel, e.fi.Mode(), len(e.link), e.link)
	if !e.fi.Mode().IsRegular() {
		return nil
	}
	f, err := openSame(root, *e)
	if err != nil {
		return err
	}
	defer f.Close()
	fh := sha256.New()
	if n, err := io.Copy(fh, io.LimitReader(f, e.fi.Size())); err != nil || n != e.fi.Size() {
		return fmt.Errorf("%w: %s changed while it was read (%d of %d bytes): %v", ErrContext, clip(e.rel), n, e.fi.Size(), err)
	}
	fh.Sum(e.sum[:0])
	fmt.Fprintf(h, "%d\x00%x\x00", e.fi.Size(), e.sum)
	return nil
}

// openSame opens the regular file e without following a link, and checks
// it is the file the walk saw.
func openSame(root *os.Root, e ctxEntry) (*os.File, error) {
	f, err := root.OpenFile(e.rel, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrContext, clip(e.rel), err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || !os.SameFile(fi, e.fi) || fi.Size() != e.fi.Size() {
		f.Close()
		return nil, fmt.Errorf("%w: %s changed while the context was read: build again", ErrContext, clip(e.rel))
	}
	return f, nil
}

// TarSize is the length of the tar WriteTar writes.
func (c *Context) TarSize() int64 {
	n := int64(1024)
	for _, e := range c.entries {
		n += 1024 // a header, and a PAX header for long names
		if e.fi.Mode().IsRegular() {
			n += (e.fi.Size() + 511) &^ 511
		}
	}
	return n
}

// WriteTar writes the context into tw under prefix (a folder name in the
// archive), each file read again without following links and checked to
// be the one walked and hashed. Owners are root, as Docker sends them to
// COPY; modes and times are kept. tw is not closed.
func (c *Context) WriteTar(tw *tar.Writer, prefix string) error {
	root, err := os.OpenRoot(c.Dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrContext, err)
	}
	defer root.Close()
	if err := tw.WriteHeader(&tar.Header{Name: prefix + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		return err
	}
	for _, e := range c.entries {
		hdr := &tar.Header{Name: prefix + "/" + e.rel, Mode: int64(e.fi.Mode().Perm()), ModTime: e.fi.ModTime().Truncate(time.Second), Format: tar.FormatPAX}
		switch {
		case e.fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case e.fi.Mode()&fs.ModeSymlink != 0:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		default:
			f, err := openSame(root, e)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, e.fi.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				f.Close()
				return err
			}
			fh := sha256.New()
			n, err := io.Copy(io.MultiWriter(tw, fh), io.LimitReader(f, e.fi.Size()))
			f.Close()
			if err != nil {
				return err
			}
			// What is sent is what was hashed (the build's cache key).
			if n != e.fi.Size() || !bytes.Equal(fh.Sum(nil), e.sum[:]) {
				return fmt.Errorf("%w: %s changed while it was sent: build again", ErrContext, clip(e.rel))
			}
		}
	}
	return nil
}

func sizeText(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
