package wsync

import (
	"context"
	"io"
	"io/fs"
	"path"
)

// HostSide is the host folder as a sync Side, every access through Root.
type HostSide struct {
	Root *Root
	// Skip leaves paths out of scans (excluded trees are not walked).
	Skip func(p string) bool
	// OnSkip is told of paths that cannot be synced (special files).
	OnSkip func(p string, err error)
}

func (h *HostSide) skip(p string) bool { return h.Skip != nil && h.Skip(p) }

// Scan implements Side.
func (h *HostSide) Scan(ctx context.Context, paths []string) (map[string]*Entry, error) {
	out := map[string]*Entry{}
	if paths == nil {
		return out, h.walk(ctx, ".", out)
	}
	for _, p := range paths {
		if err := h.visit(ctx, p, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// visit records p (unless skipped, gone or unreadable: reported) and,
// for a directory, what is below it.
func (h *HostSide) visit(ctx context.Context, p string, out map[string]*Entry) error {
	if h.skip(p) {
		return nil
	}
	e, err := h.Root.Stat(p)
	if err != nil {
		h.report(p, err)
		return nil
	}
	if e == nil {
		return nil
	}
	out[p] = e
	if e.Type == 'd' {
		return h.walk(ctx, p, out)
	}
	return nil
}

func (h *HostSide) report(p string, err error) {
	if h.OnSkip != nil {
		h.OnSkip(p, err)
	}
}

func (h *HostSide) walk(ctx context.Context, dir string, out map[string]*Entry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	names, err := h.Root.List(dir)
	if err != nil {
		h.report(dir, err)
		return nil
	}
	for _, n := range names {
		p := n
		if dir != "." {
			p = path.Join(dir, n)
		}
		if err := h.visit(ctx, p, out); err != nil {
			return err
		}
	}
	return nil
}

// Stat describes p alone, never following a link (no hash: the gate only
// needs what is there).
func (h *HostSide) Stat(_ context.Context, p string) (*Entry, error) { return h.Root.Lstat(p) }

// List returns the names in directory p, nothing described or hashed.
func (h *HostSide) List(_ context.Context, p string) ([]string, error) { return h.Root.List(p) }

// Dir is the host folder's path.
func (h *HostSide) Dir() string { return h.Root.Dir() }

func (h *HostSide) Read(_ context.Context, p string) (io.ReadCloser, error) { return h.Root.Open(p) }

func (h *HostSide) Write(_ context.Context, p string, mode fs.FileMode, r io.Reader, hash string, was *Entry) (string, error) {
	if dir := path.Dir(p); dir != "." {
		if err := h.Root.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
	}
	// Content that is not what the engine decided on (its source changed
	// during the copy) never lands: p stays as it was.
	if hash == "" {
		return "", errChanged // no content hashes to nothing
	}
	if gitLocked(p) {
		return h.Root.WriteFileLocked(p, mode, r, h.Root.MaxFile, hash, was)
	}
	return h.Root.WriteFile(p, mode, r, h.Root.MaxFile, hash, was)
}

// Sync implements Syncer: what this side wrote is fsynced.
func (h *HostSide) Sync(context.Context) error { return h.Root.Sync() }

func (h *HostSide) Mkdir(_ context.Context, p string, mode fs.FileMode) error {
	return h.Root.MkdirAll(p, mode)
}

func (h *HostSide) Symlink(_ context.Context, p, target string, was *Entry) error {
	if dir := path.Dir(p); dir != "." {
		if err := h.Root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return h.Root.Symlink(p, target, was)
}

func (h *HostSide) Remove(_ context.Context, p string, was *Entry) error {
	if gitLocked(p) {
		return h.Root.RemoveLocked(p, was)
	}
	return h.Root.Remove(p, was)
}
