package wsync

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Root is the host folder, opened once. Every operation goes through a
// descriptor of the root and resolves the rest without following any
// symlink and without leaving the root: on Linux with openat2
// (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), checked
// by the kernel atomically with the lookup, elsewhere one component at a
// time with O_NOFOLLOW. A parent swapped for a link mid-operation makes
// the operation fail instead of redirecting it.
type Root struct {
	dir  string
	fd   int
	hash *hashCache
	// MaxFile is the largest file synced; larger ones are described (Big)
	// but never read or hashed.
	MaxFile int64

	mu    sync.Mutex
	dirty map[string]bool // what this Root changed since the last Sync: files, and directories whose entries changed
}

// DefaultMaxFile is the default size cap of one synced file.
const DefaultMaxFile = 1 << 30

// OpenRoot opens dir as a sync root, following no link on its way: dir is
// a folder's canonical path (folder.Resolve), and a link put into it after
// that check must not take the sync to another folder.
func OpenRoot(dir string) (*Root, error) {
	fd, err := openRootDir(dir)
	if err != nil {
		switch err {
		case unix.ELOOP:
			err = fmt.Errorf("a link is on its way (a sync opens only the folder the path names): %w", err)
		case unix.ENOSYS:
			err = fmt.Errorf("openat2 is not available (Linux 5.6 or newer is needed for safe workspace sync): %w", err)
		}
		return nil, fmt.Errorf("open workspace %s: %w", dir, err)
	}
	if err := checkResolver(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Root{dir: dir, fd: fd, hash: newHashCache(), MaxFile: DefaultMaxFile}, nil
}

// Dir is the root's host path.
func (r *Root) Dir() string { return r.dir }

// Close releases the root.
func (r *Root) Close() error { return unix.Close(r.fd) }

func (r *Root) openat(rel string, flags int, mode uint32) (int, error) {
	if rel != "." {
		if _, err := CleanRel(rel); err != nil {
			return -1, err
		}
	}
	fd, err := openBeneath(r.fd, rel, flags|unix.O_CLOEXEC, mode)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: rel, Err: err}
	}
	return fd, nil
}

// parent opens the directory that holds rel and returns it with the name.
func (r *Root) parent(rel string) (int, string, error) {
	if _, err := CleanRel(rel); err != nil {
		return -1, "", err
	}
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	fd, err := r.openat(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	return fd, name, err
}

// parentOf is the directory holding rel ("." at the top).
func parentOf(rel string) string {
	if d := path.Dir(rel); d != "" {
		return d
	}
	return "."
}

// touched notes paths this Root changed, for Sync.
func (r *Root) touched(paths ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dirty == nil {
		r.dirty = map[string]bool{}
	}
	for _, p := range paths {
		r.dirty[p] = true
	}
}

// syncEach is how many changed paths Sync fsyncs one by one; more take
// one syncfs of the whole filesystem, which also waits for whatever else
// wrote to it (and so costs more than a few fsyncs, less than thousands).
const syncEach = 64

// Sync makes every change this Root made so far durable (a host write
// counts in the sync's record only once it would survive the host losing
// power): each changed file is fsynced, and each directory whose entries
// changed; past syncEach of them, one syncfs instead where the system has
// it. Paths gone since (the user deleted them) need nothing. Through the
// root's descriptor, never following a link.
func (r *Root) Sync() error {
	r.mu.Lock()
	paths := r.dirty
	r.dirty = nil
	r.mu.Unlock()
	if len(paths) == 0 {
		return nil
	}
	if len(paths) > syncEach && syncFS(r.fd) == nil {
		return nil
	}
	var failed []string
	var errs []error
	for p := range paths {
		fd, err := r.openat(p, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			// Gone, or replaced by a link (nothing of ours to sync).
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				continue
			}
			failed, errs = append(failed, p), append(errs, err)
			continue
		}
		err = unix.Fsync(fd)
		unix.Close(fd)
		if err != nil {
			failed, errs = append(failed, p), append(errs, &fs.PathError{Op: "fsync", Path: p, Err: err})
		}
	}
	if len(failed) > 0 {
		r.touched(failed...) // tried again by the next Sync
		return errors.Join(errs...)
	}
	return nil
}

// Entry describes one path in a tree.
type Entry struct {
	Path string      `json:"path"`
	Type byte        `json:"type"` // 'f' file, 'd' directory, 'l' symlink
	Mode fs.FileMode `json:"mode"` // permission bits only
	Size int64       `json:"size,omitempty"`
	Hash string      `json:"hash,omitempty"` // sha256 of a file's content
	Link string      `json:"link,omitempty"` // a symlink's text
	Big  bool        `json:"big,omitempty"`  // over the size cap: not synced
	// Origin is the side the last change came from ("guest" or "host"),
	// kept in the manifest for rewinds: the agent's changes go back, the
	// user's stay. A manifest entry of Type 'x' is a deletion.
	Origin string `json:"origin,omitempty"`
}

// Same reports whether two entries have the same content.
func (e *Entry) Same(o *Entry) bool {
	if e == nil || o == nil {
		return e == o
	}
	if e.Type != o.Type {
		return false
	}
	switch e.Type {
	case 'f':
		return e.Size == o.Size && e.Hash == o.Hash && e.Mode&0o111 == o.Mode&0o111
	case 'l':
		return e.Link == o.Link
	}
	return true
}

// Stat describes rel without following a symlink; nil, nil when absent.
// Special files (FIFOs, sockets, devices) are reported as errors: they are
// never synced.
func (r *Root) Stat(rel string) (*Entry, error) { return r.stat(rel, true) }

// Lstat is Stat without a file's hash: what is at rel, never following a
// link.
func (r *Root) Lstat(rel string) (*Entry, error) { return r.stat(rel, false) }

func (r *Root) stat(rel string, hash bool) (*Entry, error) {
	pfd, name, err := r.parent(rel)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil, nil
		}
		return nil, err
	}
	defer unix.Close(pfd)
	return r.statAt(pfd, name, rel, hash)
}

// statAt is stat of name in the open directory pfd (rel names it for the
// hash cache and errors).
func (r *Root) statAt(pfd int, name, rel string, hash bool) (*Entry, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil, nil
		}
		return nil, &fs.PathError{Op: "stat", Path: rel, Err: err}
	}
	e := &Entry{Path: rel, Mode: fs.FileMode(st.Mode & 0o777)}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type, e.Size = 'f', st.Size
		if st.Size > r.MaxFile {
			e.Big = true
			break
		}
		if !hash {
			break
		}
		h, err := r.hashFile(pfd, name, rel, &st)
		if err != nil {
			return nil, err
		}
		e.Hash = h
	case unix.S_IFDIR:
		e.Type = 'd'
	case unix.S_IFLNK:
		e.Type = 'l'
		buf := make([]byte, MaxPathLen+1)
		n, err := unix.Readlinkat(pfd, name, buf)
		if err != nil {
			return nil, &fs.PathError{Op: "readlink", Path: rel, Err: err}
		}
		e.Link = string(buf[:n])
	default:
		return nil, fmt.Errorf("%s: special file (FIFO, socket or device): not synced", rel)
	}
	return e, nil
}

// hashFile hashes name in the open directory pfd, st its Fstatat, never
// through a link and only a regular file.
func (r *Root) hashFile(pfd int, name, rel string, st *unix.Stat_t) (string, error) {
	key := keyOf(st)
	if h, ok := r.hash.get(rel, key); ok {
		return h, nil
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", &fs.PathError{Op: "open", Path: rel, Err: err}
	}
	f, err := regularFile(fd, rel, rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	r.hash.put(rel, key, sum)
	return sum, nil
}

// Open opens a regular file for reading. A symlink anywhere on the way, or
// anything but a regular file at the end, is refused: the guest cannot make
// the host read what a link it planted points to.
func (r *Root) Open(rel string) (*os.File, error) {
	fd, err := r.openat(rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	return regularFile(fd, rel, path.Join(r.dir, rel))
}

// regularFile makes fd, opened O_NONBLOCK (a FIFO must not block the
// open), a blocking *os.File named name, if it is a regular file; else it
// closes fd.
func regularFile(fd int, rel, name string) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: not a regular file", rel)
	}
	_ = unix.SetNonblock(fd, false)
	return os.NewFile(uintptr(fd), name), nil
}

// List returns the names in directory rel ("." for the root).
func (r *Root) List(rel string) ([]string, error) {
	fd, err := r.openat(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	return f.Readdirnames(-1)
}

// MkdirAll creates rel and its parents (permission bits only; no set-id
// or sticky bits).
func (r *Root) MkdirAll(rel string, mode fs.FileMode) error {
	if _, err := CleanRel(rel); err != nil {
		return err
	}
	parts := strings.Split(rel, "/")
	cur := ""
	for i, p := range parts {
		if i > 0 {
			cur += "/"
		}
		cur += p
		pfd, name, err := r.parent(cur)
		if err != nil {
			return err
		}
		m := uint32(0o755)
		if i == len(parts)-1 {
			m = uint32(mode.Perm())
		}
		err = unix.Mkdirat(pfd, name, m)
		unix.Close(pfd)
		if err != nil && err != unix.EEXIST {
			return &fs.PathError{Op: "mkdir", Path: cur, Err: err}
		}
		if err == nil {
			r.touched(cur, parentOf(cur))
		}
		if err == unix.EEXIST {
			e, serr := r.Stat(cur)
			if serr != nil {
				return serr
			}
			if e == nil || e.Type != 'd' {
				return fmt.Errorf("%s exists and is not a directory", cur)
			}
		}
	}
	return nil
}

// WriteFile writes rel from src through a temporary file in the same
// directory, renamed into place: never through a link, never leaving the
// root, never with set-id or sticky bits. It returns the content's hash.
// More than max bytes is an error (the file is not written); so is, when
// want is not empty, content whose SHA-256 (hex) is not want: errChanged,
// and rel stays as it was. The file replaces rel only if rel still is was
// (nil: nothing there; Anything: no check), looked at once the content is
// in place to land; else ErrStale and rel stays as it was.
func (r *Root) WriteFile(rel string, mode fs.FileMode, src io.Reader, max int64, want string, was *Entry) (string, error) {
	return r.writeFile(rel, mode, src, max, want, was, false)
}

// Anything, as the was of a change, lets it replace whatever is there.
var Anything = &Entry{Type: '*'}

// ErrStale: the path changed on the side being written after the pass
// looked at it (the user saved the file just then). Nothing is changed;
// the change itself brings another pass, which decides again.
var ErrStale = errors.New("changed there since the sync looked")

// still returns ErrStale unless name in the open directory pfd (rel) is
// was (see WriteFile): the directory the change lands in, not whatever
// rel's parent is by now.
func (r *Root) still(pfd int, name, rel string, was *Entry) error {
	if was == Anything {
		return nil
	}
	// Size first: a file that grew is stale without being read.
	var st unix.Stat_t
	err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == unix.ENOENT:
		if was == nil {
			return nil
		}
		return ErrStale
	case err != nil:
		return &fs.PathError{Op: "stat", Path: rel, Err: err}
	case was == nil || (was.Type == 'f' && (st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != was.Size)):
		return ErrStale
	}
	cur, err := r.statAt(pfd, name, rel, was.Type == 'f' && !was.Big)
	if err != nil {
		return err
	}
	if !cur.Same(was) {
		return ErrStale
	}
	return nil
}

// ErrLocked: the file's lock file exists; whoever holds it (git on the
// host) is changing the file. Try again later.
var ErrLocked = errors.New("locked")

// WriteFileLocked is WriteFile under git's lock protocol: the temporary
// file is rel + ".lock", created exclusively, so a git process at work on
// the same file is never overwritten (ErrLocked) and never sees it
// half-written.
func (r *Root) WriteFileLocked(rel string, mode fs.FileMode, src io.Reader, max int64, want string, was *Entry) (string, error) {
	return r.writeFile(rel, mode, src, max, want, was, true)
}

func (r *Root) writeFile(rel string, mode fs.FileMode, src io.Reader, max int64, want string, was *Entry, locked bool) (string, error) {
	pfd, name, err := r.parent(rel)
	if err != nil {
		return "", err
	}
	defer unix.Close(pfd)
	var fd int
	var tmp string
	if locked {
		if fd, tmp, err = takeLock(pfd, rel, name, uint32(mode.Perm())); err != nil {
			return "", err
		}
	} else {
		tmp = fmt.Sprintf(".%s.kosa8-%d", name, time.Now().UnixNano())
		if len(tmp) > MaxNameLen {
			tmp = fmt.Sprintf(".kosa8-%d", time.Now().UnixNano())
		}
		fd, err = unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
		if err != nil {
			return "", &fs.PathError{Op: "create", Path: rel, Err: err}
		}
	}
	f := os.NewFile(uintptr(fd), tmp)
	ok := false
	defer func() {
		if !ok {
			f.Close()
			_ = unix.Unlinkat(pfd, tmp, 0)
		}
	}()
	h := sha256.New()
	n, err := copySparse(f, h, src, max+1)
	if err != nil {
		return "", err
	}
	if n > max {
		return "", fmt.Errorf("%s is larger than the %d-byte limit", rel, max)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want != "" && sum != want {
		return "", errChanged
	}
	if err := f.Chmod(mode.Perm()); err != nil { // umask-independent, no special bits
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := r.still(pfd, name, rel, was); err != nil {
		return "", err
	}
	if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
		return "", &fs.PathError{Op: "rename", Path: rel, Err: err}
	}
	ok = true
	r.touched(rel, parentOf(rel))
	return sum, nil
}

// Symlink creates rel as a link to target, replacing what is there if it
// still is was (see WriteFile). Only relative links that stay inside the
// root are made.
func (r *Root) Symlink(rel, target string, was *Entry) error {
	if !LinkStaysInside(rel, target) {
		return fmt.Errorf("%w: link %s -> %s leaves the folder", ErrBadPath, rel, target)
	}
	pfd, name, err := r.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	tmp := fmt.Sprintf(".kosa8-link-%d", time.Now().UnixNano())
	if err := unix.Symlinkat(target, pfd, tmp); err != nil {
		return &fs.PathError{Op: "symlink", Path: rel, Err: err}
	}
	if err := r.still(pfd, name, rel, was); err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return err
	}
	if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return &fs.PathError{Op: "rename", Path: rel, Err: err}
	}
	r.touched(parentOf(rel))
	return nil
}

// takeLock creates name's lock file in the directory pfd, exclusively, as
// git does.
func takeLock(pfd int, rel, name string, mode uint32) (int, string, error) {
	lock := name + ".lock"
	if len(lock) > MaxNameLen {
		return -1, "", fmt.Errorf("%w: %s: no room for a lock file name", ErrBadPath, rel)
	}
	fd, err := unix.Openat(pfd, lock, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err == unix.EEXIST {
		return -1, "", fmt.Errorf("%s: %w (%s exists: git is at work in this repository on the host; retried on the next pass)", rel, ErrLocked, lock)
	}
	if err != nil {
		return -1, "", &fs.PathError{Op: "lock", Path: rel, Err: err}
	}
	return fd, lock, nil
}

// RemoveLocked deletes a file under git's lock protocol (see
// WriteFileLocked): holding rel + ".lock" while it unlinks rel, if rel
// still is was.
func (r *Root) RemoveLocked(rel string, was *Entry) error {
	pfd, name, err := r.parent(rel)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer unix.Close(pfd)
	fd, lock, err := takeLock(pfd, rel, name, 0o600)
	if err != nil {
		return err
	}
	unix.Close(fd)
	defer unix.Unlinkat(pfd, lock, 0)
	if err := r.still(pfd, name, rel, was); err != nil {
		return err
	}
	if err := unix.Unlinkat(pfd, name, 0); err != nil && err != unix.ENOENT {
		return &fs.PathError{Op: "remove", Path: rel, Err: err}
	}
	r.touched(parentOf(rel))
	return nil
}

// Remove deletes a file, link or empty directory, if rel still is was
// (see WriteFile; a directory is itself whatever it holds).
func (r *Root) Remove(rel string, was *Entry) error {
	pfd, name, err := r.parent(rel)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer unix.Close(pfd)
	if err := r.still(pfd, name, rel, was); err != nil {
		return err
	}
	err = unix.Unlinkat(pfd, name, 0)
	if err == unix.EISDIR || err == unix.EPERM {
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
	}
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return &fs.PathError{Op: "remove", Path: rel, Err: err}
	}
	r.touched(parentOf(rel))
	return nil
}

// Chmod sets permission bits (never set-id or sticky) on a file or
// directory, without following a link.
func (r *Root) Chmod(rel string, mode fs.FileMode) error {
	e, err := r.Stat(rel)
	if err != nil || e == nil || e.Type == 'l' {
		return err
	}
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK
	if e.Type == 'd' {
		flags |= unix.O_DIRECTORY
	}
	fd, err := r.openat(rel, flags, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, uint32(mode.Perm()))
}

// sparseBlock is the unit of hole detection: a file system block.
const sparseBlock = 4096

// copySparse copies up to max bytes of src to dst (a new, empty file),
// feeding every byte to h, and leaves holes where the content is zeros:
// a guest's "truncate -s 1000M f" costs the host no disk. From a file it
// jumps over src's holes with SEEK_DATA/SEEK_HOLE without reading them; from
// a stream (the guest's) it skips blocks of zeros. It returns the bytes
// copied.
func copySparse(dst *os.File, h io.Writer, src io.Reader, max int64) (int64, error) {
	var n int64
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	if f, ok := src.(*os.File); ok {
		return copySparseFile(dst, h, f, max, buf)
	}
	for n < max {
		want := int64(len(buf))
		if max-n < want {
			want = max - n
		}
		k, rerr := io.ReadFull(src, buf[:want])
		if k > 0 {
			if err := writeSparse(dst, h, buf[:k], n); err != nil {
				return n, err
			}
			n += int64(k)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return n, rerr
		}
	}
	// The file ends where the content does, holes at its end included.
	return n, dst.Truncate(n)
}

// writeSparse writes b at off, block by block, leaving out all-zero
// blocks (the file is new: what is not written reads as zeros).
func writeSparse(dst *os.File, h io.Writer, b []byte, off int64) error {
	h.Write(b)
	for i := 0; i < len(b); i += sparseBlock {
		end := min(i+sparseBlock, len(b))
		if allZero(b[i:end]) {
			continue
		}
		if _, err := dst.WriteAt(b[i:end], off+int64(i)); err != nil {
			return err
		}
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

var zeroBuf = make([]byte, 256<<10)

// copySparseFile copies the data extents of src, hashing the holes as the
// zeros they read as.
func copySparseFile(dst *os.File, h io.Writer, src *os.File, max int64, buf []byte) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return 0, err
	}
	size := min(st.Size, max)
	var off int64
	for off < size {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			data = size // only a hole left
		} else if err != nil {
			// No SEEK_DATA here: all of it is data.
			data = off
		}
		data = min(data, size)
		for z := data - off; z > 0; {
			k := min(z, int64(len(zeroBuf)))
			h.Write(zeroBuf[:k])
			z -= k
		}
		off = data
		if off >= size {
			break
		}
		hole, err := unix.Seek(int(src.Fd()), off, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		hole = min(hole, size)
		for off < hole {
			k, err := src.ReadAt(buf[:min(int64(len(buf)), hole-off)], off)
			if k > 0 {
				if werr := writeSparse(dst, h, buf[:k], off); werr != nil {
					return off, werr
				}
				off += int64(k)
			}
			if err != nil {
				if err == io.EOF {
					size = off
					break
				}
				return off, err
			}
		}
	}
	return off, dst.Truncate(off)
}
