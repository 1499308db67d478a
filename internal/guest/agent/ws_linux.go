package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/guest"
)

// The guest half of the workspace sync: describe the tree (with hashes),
// apply the host's changes, and report what changes inside.

// wsHashes caches content hashes by inode, size and times.
type wsHashes struct {
	mu sync.Mutex
	m  map[string]wsHash
}

type wsHash struct {
	ino          uint64
	size         int64
	mtime, ctime int64
	hash         string
}

// remember records hash as the content of the workspace's rel, the file
// full the host just wrote, as it stands now.
func (c *wsHashes) remember(rel, full, hash string) {
	var st unix.Stat_t
	if unix.Lstat(full, &st) != nil {
		return
	}
	c.mu.Lock()
	c.m[rel] = wsHash{ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), hash: hash}
	c.mu.Unlock()
}

func (a *Agent) wsCache() *wsHashes {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hashes == nil {
		a.hashes = &wsHashes{m: map[string]wsHash{}}
	}
	return a.hashes
}

func wsRel(root, rel string) (string, error) {
	if rel == "" || strings.HasPrefix(rel, "/") || strings.ContainsRune(rel, 0) {
		return "", fmt.Errorf("bad workspace path %q", rel)
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			return "", fmt.Errorf("bad workspace path %q", rel)
		}
	}
	return filepath.Join(root, rel), nil
}

func (a *Agent) wsEntry(root, rel string, maxFile int64) (*guest.WSEntry, error) {
	full, err := wsRel(root, rel)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil, nil
		}
		return nil, err
	}
	e := &guest.WSEntry{Path: rel, Mode: fs.FileMode(st.Mode & 0o777)}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type, e.Size = 'f', st.Size
		if st.Size > maxFile {
			e.Big = true
			break
		}
		c := a.wsCache()
		k := wsHash{ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
		c.mu.Lock()
		cached, ok := c.m[rel]
		c.mu.Unlock()
		if ok && cached.ino == k.ino && cached.size == k.size && cached.mtime == k.mtime && cached.ctime == k.ctime {
			e.Hash = cached.hash
			break
		}
		f, err := os.Open(full)
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		e.Hash = hex.EncodeToString(h.Sum(nil))
		k.hash = e.Hash
		c.mu.Lock()
		c.m[rel] = k
		c.mu.Unlock()
	case unix.S_IFDIR:
		e.Type = 'd'
	case unix.S_IFLNK:
		e.Type = 'l'
		e.Link, _ = os.Readlink(full)
	default:
		return nil, nil // FIFOs, sockets, devices stay inside
	}
	return e, nil
}

// errStale refuses a workspace change under guest.Request.Was.
var errStale = errors.New(guest.Stale)

// wsStill returns errStale unless the workspace's rel (under root) is
// was, what the host saw there (Type 'x': nothing); nil checks nothing.
func (a *Agent) wsStill(root, rel string, was *guest.WSEntry) error {
	if was == nil {
		return nil
	}
	// Hashed only at was's size: a file grown meanwhile (a sparse 4 GiB
	// one, say) is stale without being read.
	limit := was.Size
	if was.Big || was.Type != 'f' {
		limit = -1 // size and type only, as the host compares one
	}
	cur, err := a.wsEntry(root, rel, limit)
	if err != nil {
		return err
	}
	same := false
	switch {
	case was.Type == 'x' || cur == nil:
		same = was.Type == 'x' && cur == nil
	case cur.Type != was.Type:
	case cur.Type == 'f':
		same = cur.Size == was.Size && cur.Mode&0o111 == was.Mode&0o111 && (was.Big || cur.Hash == was.Hash)
	case cur.Type == 'l':
		same = cur.Link == was.Link
	default:
		same = true
	}
	if !same {
		return fmt.Errorf("%s: %w", rel, errStale)
	}
	return nil
}

func (a *Agent) handleWSScan(s net.Conn, req *guest.Request) {
	root := req.Path
	if !filepath.IsAbs(root) {
		a.respondError(s, errors.New("ws_scan: root not absolute"))
		return
	}
	max := req.MaxFile
	if max <= 0 {
		max = 1 << 30
	}
	a.respond(s, guest.Response{})
	var batch []*guest.WSEntry
	flush := func() bool {
		if len(batch) == 0 {
			return true
		}
		err := guest.WriteJSON(s, guest.FrameData, batch)
		batch = batch[:0]
		return err == nil
	}
	var walk func(rel string) bool
	add := func(rel string) bool {
		e, err := a.wsEntry(root, rel, max)
		if err != nil || e == nil {
			return true
		}
		batch = append(batch, e)
		if len(batch) >= 500 && !flush() {
			return false
		}
		if e.Type == 'd' {
			return walk(rel)
		}
		return true
	}
	walk = func(rel string) bool {
		dir := root
		if rel != "" {
			dir = filepath.Join(root, rel)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return true
		}
		for _, d := range entries {
			if d.Name() == "lost+found" && rel == "" {
				continue
			}
			if !add(path.Join(rel, d.Name())) {
				return false
			}
		}
		return true
	}
	if req.Paths == nil {
		walk("")
	} else {
		for _, p := range req.Paths {
			if !add(p) {
				return
			}
		}
	}
	if flush() {
		_ = guest.WriteFrame(s, guest.FrameEOF, nil)
	}
}

func (a *Agent) handleWSOp(s net.Conn, req *guest.Request) {
	op := req.WS
	if op == nil {
		a.respondError(s, errors.New("ws_op: missing operation"))
		return
	}
	if op.Kind == guest.WSSync {
		if err := syncWorkspace(req.Path); err != nil {
			a.respondError(s, err)
			return
		}
		a.respond(s, guest.Response{})
		return
	}
	full, err := wsRel(req.Path, op.Path)
	if err != nil {
		a.respondError(s, err)
		return
	}
	u, err := a.users.lookup("", a.defaultUser)
	if err != nil {
		a.respondError(s, err)
		return
	}
	if err := a.ensureParents(req.Path, full, u); err != nil {
		a.respondError(s, err)
		return
	}
	switch op.Kind {
	case "mkdir":
		err = os.Mkdir(full, op.Mode.Perm()|0o700)
		if errors.Is(err, os.ErrExist) {
			err = nil
		}
		if err == nil {
			_ = os.Chown(full, u.uid, u.gid)
			err = os.Chmod(full, op.Mode.Perm())
		}
	case "symlink":
		if err = a.wsStill(req.Path, op.Path, op.Was); err == nil {
			err = replaceSymlink(full, op.Link, u)
		}
	case "remove":
		if err = a.wsStill(req.Path, op.Path, op.Was); err == nil {
			err = os.Remove(full)
		}
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
	default:
		err = fmt.Errorf("ws_op: unknown kind %q", op.Kind)
	}
	if err != nil {
		a.respondError(s, err)
		return
	}
	a.respond(s, guest.Response{})
}

// syncWorkspace syncs the filesystem holding the workspace root: every
// change to it so far, the sync's own writes and the agent's, is on the
// disk (through QEMU, on the host's) when it returns.
func syncWorkspace(root string) error {
	if !filepath.IsAbs(root) {
		return errors.New("ws sync: root not absolute")
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ws sync: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("ws sync: syncfs: %w", err)
	}
	return nil
}

// replaceSymlink makes full a link to target, owned by u, replacing what
// is there in one rename.
func replaceSymlink(full, target string, u *user) error {
	tmp := full + ".kosa8-link"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	_ = os.Lchown(tmp, u.uid, u.gid)
	return os.Rename(tmp, full)
}

// ensureParents creates the directories between root and full's parent,
// owned by the default user.
func (a *Agent) ensureParents(root, full string, u *user) error {
	dir := filepath.Dir(full)
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == "." {
		return nil
	}
	cur := root
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		cur = filepath.Join(cur, c)
		if err := os.Mkdir(cur, 0o755); err == nil {
			_ = os.Chown(cur, u.uid, u.gid)
		} else if !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}

// handleWSMount mounts the workspace disk (serial number ws) at the path the host uses,
// creating the path, owned by the default user.
func (a *Agent) handleWSMount(s net.Conn, req *guest.Request) {
	root := filepath.Clean(req.Path)
	if !filepath.IsAbs(root) || root == "/" {
		a.respondError(s, fmt.Errorf("ws_mount: bad path %q", req.Path))
		return
	}
	u, err := a.users.lookup("", a.defaultUser)
	if err != nil {
		a.respondError(s, err)
		return
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		a.respondError(s, err)
		return
	}
	if err := traversable(filepath.Dir(root)); err != nil {
		a.respondError(s, fmt.Errorf("ws_mount: %w", err))
		return
	}
	dev, err := findDisk("/sys/block", WorkspaceSerial, "vdb", 10*time.Second)
	if err != nil {
		a.respondError(s, fmt.Errorf("workspace disk: %w", err))
		return
	}
	// The workspace disk of a sandbox started from a template is a copy
	// of the template's: its UUID becomes the sandbox's own.
	// (A disk mounted already, after a restore, is refused by its
	// exclusive open and left alone.)
	if err := ensureCsumSeed(dev); err != nil && !errors.Is(err, unix.EBUSY) {
		a.log.Warn("workspace filesystem: its UUID stays the one it was made with", "err", err)
	}
	if err := unix.Mount(dev, root, "ext4", unix.MS_NOATIME|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		a.respondError(s, fmt.Errorf("mount the workspace: %w", err))
		return
	}
	a.mu.Lock()
	id := a.machineID
	a.mu.Unlock()
	if id != "" {
		if err := setFSUUID(root, fsUUID(id, "ws")); err != nil {
			a.log.Warn("workspace filesystem UUID", "err", err)
		}
	}
	_ = os.Chown(root, u.uid, u.gid)
	// mkfs's lost+found is the guest filesystem's, not the project's: the
	// agent would trip over it (ls, git status, globbing). An empty one
	// goes; e2fsck makes a new one if it ever needs it.
	_ = unix.Rmdir(filepath.Join(root, "lost+found"))
	a.respond(s, guest.Response{})
}

// traversable lets every user enter each folder from / down to dir: the
// workspace sits at the host's path (/root/project, say), whose parents in
// the guest image may be closed to the unprivileged guest user (/root is
// 0700). Only the search bit is added: the folders stay unlistable.
func traversable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001|fi.Mode()&(os.ModeSticky|os.ModeSetgid)); err != nil {
				return fmt.Errorf("let the guest user enter %s: %w", d, err)
			}
		}
		if d == "/" {
			return nil
		}
	}
}

// handleWSWatch reports changed paths under the root until the stream
// closes. Directories are watched as they appear.
func (a *Agent) handleWSWatch(ctx context.Context, s net.Conn, req *guest.Request) {
	root := req.Path
	w, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		a.respondError(s, err)
		return
	}
	defer w.Close()
	var addTree func(dir string)
	addTree = func(dir string) {
		_ = w.Add(dir)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				addTree(filepath.Join(dir, e.Name()))
			}
		}
	}
	addTree(root)
	a.respond(s, guest.Response{})
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, s) // the host closes the stream to stop
		close(closed)
	}()
	dirty := map[string]bool{}
	all := false
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-closed:
			return
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			rel, err := filepath.Rel(root, ev.Name)
			if err != nil || rel == "." || outside(rel) {
				continue
			}
			dirty[filepath.ToSlash(rel)] = true
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					addTree(ev.Name)
				}
			}
		case err := <-w.Errors:
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				all = true
			}
		case <-tick.C:
			if len(dirty) == 0 && !all {
				continue
			}
			b := guest.WSWatchBatch{All: all}
			if len(dirty) > 1000 {
				b.All = true
			} else if !all {
				for p := range dirty {
					b.Paths = append(b.Paths, p)
				}
			}
			dirty, all = map[string]bool{}, false
			if err := guest.WriteJSON(s, guest.FrameData, b); err != nil {
				return
			}
		}
	}
}

// errChangedInTransit: a file's content did not hash to what the host
// announced (it changed on the host while being sent); the old file stays.
var errChangedInTransit = errors.New("changed while being copied")

// handleWSPut writes many entries sent on one stream: the bulk path of the
// first sync of a large folder, without a round trip per file.
func (a *Agent) handleWSPut(s net.Conn, req *guest.Request) {
	root := req.Path
	u, err := a.users.lookup("", a.defaultUser)
	if err != nil {
		a.respondError(s, err)
		return
	}
	a.respond(s, guest.Response{}) // ready; the final response lists failures
	failed := map[string]string{}
	cache := a.wsCache()
	for {
		f, err := guest.ReadFrame(s)
		if err != nil {
			return
		}
		if f.Kind != guest.FrameRequest {
			a.respondError(s, fmt.Errorf("ws_put: unexpected frame kind %d", f.Kind))
			return
		}
		var it guest.WSPutItem
		if err := json.Unmarshal(f.Payload, &it); err != nil {
			a.respondError(s, err)
			return
		}
		if it.End {
			break
		}
		full, perr := wsRel(root, it.Path)
		if perr == nil {
			perr = a.ensureParents(root, full, u)
		}
		switch it.Type {
		case 'd':
			if perr == nil {
				if err := os.Mkdir(full, it.Mode.Perm()|0o700); err != nil && !errors.Is(err, os.ErrExist) {
					perr = err
				} else {
					_ = os.Chown(full, u.uid, u.gid)
					perr = os.Chmod(full, it.Mode.Perm())
				}
			}
		case 'l':
			if perr == nil {
				perr = a.wsStill(root, it.Path, it.Was)
			}
			if perr == nil {
				perr = replaceSymlink(full, it.Link, u)
			}
		case 'f':
			// The content follows in any case; read it all even after an error.
			var out *os.File
			tmp := full + ".kosa8-put"
			if perr == nil {
				out, perr = os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, it.Mode.Perm())
			}
			sum := sha256.New()
			for {
				d, err := guest.ReadFrame(s)
				if err != nil {
					return
				}
				if d.Kind == guest.FrameEOF {
					break
				}
				sum.Write(d.Payload)
				if out != nil && perr == nil {
					if _, err := out.Write(d.Payload); err != nil {
						perr = err
					}
				}
			}
			if perr == nil && it.Hash != "" && hex.EncodeToString(sum.Sum(nil)) != it.Hash {
				// The host file changed while it was sent: what came is
				// neither the old version nor the one the host scanned.
				// Kept, it would look like a change made in here.
				perr = errChangedInTransit
			}
			if out != nil {
				if perr == nil {
					// The agent's umask is 0 (boot sets it), so the mode
					// given at creation stands; only the owner changes.
					perr = out.Chown(u.uid, u.gid)
				}
				if err := out.Close(); perr == nil {
					perr = err
				}
				if perr == nil {
					perr = a.wsStill(root, it.Path, it.Was)
				}
				if perr == nil {
					perr = os.Rename(tmp, full)
				} else {
					os.Remove(tmp)
				}
			}
			if perr == nil && it.Hash != "" {
				cache.remember(it.Path, full, it.Hash)
			}
		default:
			perr = fmt.Errorf("unknown entry type %q", it.Type)
		}
		if perr != nil {
			failed[it.Path] = perr.Error()
		}
	}
	a.respond(s, guest.Response{Failed: failed})
}
