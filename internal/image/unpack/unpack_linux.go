package unpack

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	maxName      = 4096
	maxComponent = 255
)

// ErrBounds: an image past one of the bounds.
var ErrBounds = errors.New("past the unpacking bounds")

// Count returns how many members the layers hold, reading headers only,
// and fails past maxFiles.
func Count(src io.ReaderAt, layers []Layer, maxFiles int) (int, error) {
	n := 0
	for i, l := range layers {
		tr := tar.NewReader(io.NewSectionReader(src, l.Off, l.Size))
		for {
			_, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return n, fmt.Errorf("layer %d: not a readable tar archive: %w", i+1, err)
			}
			n++
			if maxFiles > 0 && n > maxFiles {
				return n, fmt.Errorf("the image's layers hold more than %d files and directories: %w", maxFiles, ErrBounds)
			}
		}
	}
	return n, nil
}

// cleanName returns a member's name relative to the root ("" for the root
// itself), refusing names that climb out.
func cleanName(name string) (string, error) {
	if len(name) > maxName || strings.IndexByte(name, 0) >= 0 {
		return "", errors.New("name longer than 4096 bytes or holding NUL")
	}
	n := strings.TrimLeft(name, "/")
	for strings.HasPrefix(n, "./") {
		n = strings.TrimLeft(n[2:], "/")
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", errors.New("a '..' component: it would climb out of the root")
		}
		if len(c) > maxComponent {
			return "", errors.New("a component longer than 255 bytes")
		}
	}
	n = path.Clean(n)
	if n == "." {
		return "", nil
	}
	return n, nil
}

// applier applies layers to one root.
type applier struct {
	root  int // O_PATH descriptor of the root
	opts  Options
	stats Stats
	bytes int64
	// touched holds this layer's members and their parents (opaque
	// directories keep them); dirs the directories whose times are set
	// when the layer ends.
	touched map[string]bool
	dirs    map[string]time.Time
	// last caches the parent directory of the previous member.
	lastDir string
	lastFD  int
	buf     []byte
}

// Apply applies layers, in order, to the directory root.
func Apply(root string, src io.ReaderAt, layers []Layer, o Options) (*Stats, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the root %s: %w", root, err)
	}
	defer unix.Close(fd)
	if o.MaxBytes <= 0 {
		for _, l := range layers {
			o.MaxBytes += l.Size
		}
	}
	a := &applier{root: fd, opts: o, lastFD: -1, buf: make([]byte, 256<<10)}
	defer a.dropDir()
	for i, l := range layers {
		if err := a.layer(io.NewSectionReader(src, l.Off, l.Size)); err != nil {
			return &a.stats, fmt.Errorf("layer %d: %w", i+1, err)
		}
	}
	return &a.stats, nil
}

func (a *applier) dropDir() {
	if a.lastFD >= 0 {
		unix.Close(a.lastFD)
	}
	a.lastFD, a.lastDir = -1, ""
}

func (a *applier) layer(r io.Reader) error {
	a.touched, a.dirs = map[string]bool{}, map[string]time.Time{}
	a.dropDir()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("not a readable tar archive: %w", err)
		}
		a.stats.Members++
		if a.opts.MaxFiles > 0 && a.stats.Members > a.opts.MaxFiles {
			return fmt.Errorf("more than %d files and directories in the image: %w", a.opts.MaxFiles, ErrBounds)
		}
		name, err := cleanName(h.Name)
		if err != nil {
			return fmt.Errorf("member %q: %w", clip(h.Name), err)
		}
		if err := a.member(name, h, tr); err != nil {
			return fmt.Errorf("member %q: %w", clip(h.Name), err)
		}
	}
	// Directories' times last: writing into them changed them.
	names := make([]string, 0, len(a.dirs))
	for n := range a.dirs {
		names = append(names, n)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	for _, n := range names {
		t := unix.NsecToTimespec(a.dirs[n].UnixNano())
		_ = unix.UtimesNanoAt(a.root, n, []unix.Timespec{t, t}, unix.AT_SYMLINK_NOFOLLOW)
	}
	a.dropDir()
	return nil
}

func (a *applier) touch(name string) {
	for p := name; p != "." && p != "" && !a.touched[p]; p = path.Dir(p) {
		a.touched[p] = true
	}
}

func (a *applier) member(name string, h *tar.Header, r io.Reader) error {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if name == "" {
		// The root itself: its metadata, as any directory's.
		if h.Typeflag != tar.TypeDir {
			return errors.New("the root is not a directory")
		}
		a.stats.Dirs++
		fd, err := unix.Openat(a.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return a.meta(fd, h)
	}
	// Whiteouts.
	if strings.HasPrefix(base, ".wh.") {
		if base == ".wh..wh..opq" {
			a.stats.Opaque++
			return a.opaque(dir)
		}
		if strings.HasPrefix(base, ".wh..wh.") {
			return nil // other aufs markers mean nothing here
		}
		a.stats.Whiteouts++
		target := strings.TrimPrefix(base, ".wh.")
		if target == "" || target == "." || target == ".." {
			// ".wh..." would remove the root's parent's entries.
			return fmt.Errorf("a whiteout of %q", target)
		}
		pfd, err := a.parent(dir, false)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		a.invalidate(path.Join(dir, target))
		if err := removeAllAt(pfd, target); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("whiteout: %w", err)
		}
		return nil
	}
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		a.stats.Devices++
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeRegA, tar.TypeGNUSparse: // a regular file too (old spellings)
		h.Typeflag = tar.TypeReg
	default:
		a.stats.Devices++ // nothing kosa8 can make: skipped and counted
		return nil
	}
	a.touch(name)
	if h.Typeflag != tar.TypeReg {
		a.invalidate(name)
	}
	pfd, err := a.parent(dir, true)
	if err != nil {
		return fmt.Errorf("its directory: %w", err)
	}
	var st unix.Stat_t
	exists := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	isDir := exists && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if exists && !(isDir && h.Typeflag == tar.TypeDir) {
		if isDir {
			a.invalidate(name)
		}
		if err := removeAllAt(pfd, base); err != nil {
			return fmt.Errorf("remove what was there: %w", err)
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		a.stats.Dirs++
		if !isDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return err
			}
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		a.dirs[name] = h.ModTime
		return a.meta(fd, h)
	case tar.TypeReg:
		a.stats.Files++
		if h.Size < 0 {
			return errors.New("negative size")
		}
		if a.bytes += h.Size; a.bytes > a.opts.MaxBytes {
			return fmt.Errorf("its %d bytes take the image's files past %d bytes, more than its layers hold (a sparse file?): %w", h.Size, a.opts.MaxBytes, ErrBounds)
		}
		a.stats.Bytes += h.Size
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		defer f.Close()
		if err := a.copySparse(f, r, h.Size); err != nil {
			return err
		}
		if err := a.meta(fd, h); err != nil {
			return err
		}
		return times(pfd, base, h)
	case tar.TypeSymlink:
		a.stats.Symlinks++
		if len(h.Linkname) > maxName || h.Linkname == "" || strings.IndexByte(h.Linkname, 0) >= 0 {
			return errors.New("symlink target empty, longer than 4096 bytes or holding NUL")
		}
		// The link's text is stored as it is: it is resolved in the
		// sandbox's own root when used, and here only through
		// RESOLVE_IN_ROOT.
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
		return times(pfd, base, h)
	case tar.TypeLink:
		a.stats.HardLinks++
		target, err := cleanName(h.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("hard link to %q: %v", clip(h.Linkname), err)
		}
		tfd, err := unix.Openat2(a.root, target, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", clip(h.Linkname), err)
		}
		defer unix.Close(tfd)
		var ts unix.Stat_t
		if err := unix.Fstat(tfd, &ts); err != nil {
			return err
		}
		if ts.Mode&unix.S_IFMT == unix.S_IFDIR {
			return fmt.Errorf("hard link to the directory %q", clip(h.Linkname))
		}
		return unix.Linkat(tfd, "", pfd, base, unix.AT_EMPTY_PATH)
	}
	return nil
}

// meta sets owner, mode (after the chown, which clears set-id bits),
// extended attributes (after both: a chown clears file capabilities).
func (a *applier) meta(fd int, h *tar.Header) error {
	if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
		return fmt.Errorf("chown %d:%d: %w", h.Uid, h.Gid, err)
	}
	if err := unix.Fchmod(fd, uint32(h.Mode&0o7777)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	keys := make([]string, 0, len(h.PAXRecords))
	for k := range h.PAXRecords {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if !xattrAllowed(name) || len(h.PAXRecords[k]) > 64<<10 {
			a.stats.Skipped++
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(h.PAXRecords[k]), 0); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
				a.stats.Skipped++
				continue
			}
			return fmt.Errorf("xattr %s: %w", name, err)
		}
		a.stats.Xattrs++
	}
	return nil
}

// xattrAllowed: what an image's files may carry into the root. Others
// (security.selinux labels of the image's builder, kernel-reserved names)
// are skipped and counted.
func xattrAllowed(name string) bool {
	return name == "security.capability" || strings.HasPrefix(name, "user.") || strings.HasPrefix(name, "trusted.") ||
		name == "system.posix_acl_access" || name == "system.posix_acl_default"
}

func times(pfd int, base string, h *tar.Header) error {
	t := unix.NsecToTimespec(h.ModTime.UnixNano())
	if err := unix.UtimesNanoAt(pfd, base, []unix.Timespec{t, t}, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("times: %w", err)
	}
	return nil
}

// copySparse writes size bytes of r to f, leaving blocks of zeros as holes.
func (a *applier) copySparse(f *os.File, r io.Reader, size int64) error {
	var off int64
	for off < size {
		n := int64(len(a.buf))
		if size-off < n {
			n = size - off
		}
		b := a.buf[:n]
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("the layer ends inside the file: %w", err)
		}
		if !allZero(b) {
			if _, err := f.WriteAt(b, off); err != nil {
				return err
			}
		}
		off += n
	}
	return f.Truncate(size)
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// invalidate forgets the cached directory if name is it or holds it.
func (a *applier) invalidate(name string) {
	if a.lastFD >= 0 && (a.lastDir == name || strings.HasPrefix(a.lastDir, name+"/")) {
		a.dropDir()
	}
}

// parent returns a descriptor of directory dir ("" the root), resolved in
// the root (symlinks on the way stay inside it), made with 0755 where
// missing when create is set. The descriptor stays owned by the applier.
func (a *applier) parent(dir string, create bool) (int, error) {
	if dir == "" {
		return a.root, nil
	}
	if a.lastFD >= 0 && a.lastDir == dir {
		return a.lastFD, nil
	}
	a.dropDir()
	fd, err := a.openDir(dir)
	if errors.Is(err, unix.ENOENT) && create {
		// Made one component at a time, each resolved in the root.
		comps := strings.Split(dir, "/")
		for i := range comps {
			p := strings.Join(comps[:i+1], "/")
			cfd, err := a.openDir(p)
			if err == nil {
				unix.Close(cfd)
				continue
			}
			if !errors.Is(err, unix.ENOENT) {
				return -1, err
			}
			pfd := a.root
			if i > 0 {
				if pfd, err = a.openDir(strings.Join(comps[:i], "/")); err != nil {
					return -1, err
				}
			}
			err = unix.Mkdirat(pfd, comps[i], 0o755)
			if pfd != a.root {
				unix.Close(pfd)
			}
			if errors.Is(err, unix.EEXIST) {
				return -1, fmt.Errorf("%s is a symlink to nothing in the image, or not a directory", p)
			}
			if err != nil {
				return -1, fmt.Errorf("make %s: %w", p, err)
			}
		}
		fd, err = a.openDir(dir)
	}
	if err != nil {
		return -1, err
	}
	a.lastDir, a.lastFD = dir, fd
	return fd, nil
}

func (a *applier) openDir(p string) (int, error) {
	return unix.Openat2(a.root, p, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
}

// opaque removes what the layers below put in dir, keeping what this
// layer writes there (before or after the marker).
func (a *applier) opaque(dir string) error {
	a.touch(path.Join(dir, ".wh..wh..opq"))
	a.dropDir()
	fd, err := a.parentFD(dir)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return a.clean(fd, dir)
}

func (a *applier) parentFD(dir string) (int, error) {
	if dir == "" {
		return unix.Openat(a.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	return a.openDir(dir)
}

// clean removes the entries of the directory fd (at dir) this layer did
// not write, descending into those it wrote under.
func (a *applier) clean(fd int, dir string) error {
	names, err := readNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !a.touched[p] {
			if err := removeAllAt(fd, n); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
			continue
		}
		cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // a file or link this layer wrote
		}
		err = a.clean(cfd, p)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

func readNames(fd int) ([]string, error) {
	dfd, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dfd), "dir")
	defer f.Close()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}

// removeAllAt removes name in the directory pfd and, for a directory,
// everything in it, following no link.
func removeAllAt(pfd int, name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("remove %q: not a name in its directory", name)
	}
	err := unix.Unlinkat(pfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return err
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readNames(fd)
	if err == nil {
		for _, n := range names {
			if err = removeAllAt(fd, n); err != nil && !errors.Is(err, unix.ENOENT) {
				break
			}
			err = nil
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
}

// clip shortens a member's name for an error (it comes from the image).
func clip(s string) string {
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
