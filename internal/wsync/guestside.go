package wsync

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
)

// GuestSide is the guest's workspace as a sync Side, through the agent.
type GuestSide struct {
	C       *guest.Client
	Root    string // the workspace's path in the guest
	MaxFile int64
	// MaxEntries bounds the paths a scan takes (0: DefaultMaxEntries): the
	// guest answers a scan, and a hostile one could name paths without
	// end, each held in the host's memory.
	MaxEntries int
	// Progress, when set, is told of each batch of entries a scan
	// receives: a scan that hashes a big tree (a cold boot's, under
	// emulation) moves while it lasts.
	Progress func()
}

// DefaultMaxEntries is the most paths a workspace scan takes: far above a
// real project's (a monorepo with its node_modules holds some 500,000),
// and at most about 1 GiB of the supervisor's memory.
const DefaultMaxEntries = 4_000_000

func (g *GuestSide) full(p string) (string, error) {
	if _, err := CleanRel(p); err != nil {
		return "", err
	}
	return path.Join(g.Root, p), nil
}

// Scan implements Side.
func (g *GuestSide) Scan(ctx context.Context, paths []string) (map[string]*Entry, error) {
	for _, p := range paths {
		if _, err := CleanRel(p); err != nil {
			return nil, err
		}
	}
	s, _, err := g.C.Open(ctx, &guest.Request{Op: guest.OpWSScan, Path: g.Root, Paths: paths, MaxFile: g.MaxFile})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { guest.Abort(s) })
	defer stop()
	out := map[string]*Entry{}
	max := g.MaxEntries
	if max <= 0 {
		max = DefaultMaxEntries
	}
	for {
		f, err := guest.ReadFrame(s)
		if err != nil {
			return nil, fmt.Errorf("guest scan: %w", err)
		}
		switch f.Kind {
		case guest.FrameEOF:
			return out, nil
		case guest.FrameData:
			var batch []guest.WSEntry
			if err := json.Unmarshal(f.Payload, &batch); err != nil {
				return nil, fmt.Errorf("guest scan: %w", err)
			}
			if len(batch) > 0 && g.Progress != nil {
				g.Progress()
			}
			for _, e := range batch {
				if len(out) >= max {
					return nil, fmt.Errorf("guest scan: the sandbox's workspace holds more than %d paths, the most kosa8 syncs: exclude some (kosa8.toml's [workspace] exclude, or --exclude)", max)
				}
				// The guest names the paths: check them like any input.
				if _, err := CleanRel(e.Path); err != nil {
					continue
				}
				if e.Type != 'f' && e.Type != 'd' && e.Type != 'l' {
					continue
				}
				// Sizes feed the quota: one out of range is a lie.
				if e.Size < 0 || g.MaxFile > 0 && e.Size > g.MaxFile && !e.Big {
					continue
				}
				out[e.Path] = &Entry{Path: e.Path, Type: e.Type, Mode: e.Mode.Perm(), Size: e.Size, Hash: e.Hash, Link: e.Link, Big: e.Big}
			}
		default:
			return nil, fmt.Errorf("guest scan: unexpected frame kind %d", f.Kind)
		}
	}
}

// Read implements Side.
func (g *GuestSide) Read(ctx context.Context, p string) (io.ReadCloser, error) {
	full, err := g.full(p)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := g.C.ReadFile(ctx, full, pw)
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// Write implements Side.
func (g *GuestSide) Write(ctx context.Context, p string, mode fs.FileMode, r io.Reader, hash string, was *Entry) (string, error) {
	full, err := g.full(p)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	req := &guest.Request{Path: full, Mode: mode.Perm(), Hash: hash, Root: g.Root, Was: wasOf(was)}
	if err := g.C.Write(ctx, req, io.TeeReader(r, h)); err != nil {
		return "", staleOf(err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// wasOf is a change's was (see Side.Write) as the agent takes it.
func wasOf(e *Entry) *guest.WSEntry {
	switch e {
	case Anything:
		return nil
	case nil:
		return &guest.WSEntry{Type: 'x'}
	}
	return &guest.WSEntry{Path: e.Path, Type: e.Type, Mode: e.Mode, Size: e.Size, Hash: e.Hash, Link: e.Link, Big: e.Big}
}

// staleOf makes the agent's refusal under Was ErrStale.
func staleOf(err error) error {
	if err != nil && strings.Contains(err.Error(), guest.Stale) {
		return fmt.Errorf("%w: %v", ErrStale, err)
	}
	return err
}

func (g *GuestSide) op(ctx context.Context, op *guest.WSOp) error {
	if _, err := CleanRel(op.Path); err != nil {
		return err
	}
	s, _, err := g.C.Open(ctx, &guest.Request{Op: guest.OpWSOp, Path: g.Root, WS: op})
	if err != nil {
		return staleOf(err)
	}
	return s.Close()
}

// guestSyncTimeout bounds a sync of the guest's workspace filesystem: a
// guest that wrote gigabytes may take long under emulation, one that
// never answers must not hold the sync forever.
const guestSyncTimeout = 2 * time.Minute

// Sync implements Syncer: the guest's agent syncs the filesystem holding
// the workspace (syncfs), which flushes it through QEMU to the host's
// disk. An agent of an older build (a checkpoint's, restored) does not
// know the operation: ErrNoSync.
func (g *GuestSide) Sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, guestSyncTimeout)
	defer cancel()
	// The path is unused, but an older agent checks it before the kind:
	// one it accepts gets the answer "unknown kind".
	s, _, err := g.C.Open(ctx, &guest.Request{Op: guest.OpWSOp, Path: g.Root, WS: &guest.WSOp{Kind: guest.WSSync, Path: ".kosa8-sync"}})
	if err != nil {
		if strings.Contains(err.Error(), "unknown kind") {
			return fmt.Errorf("%w: %v", ErrNoSync, err)
		}
		return fmt.Errorf("sync the guest's workspace: %w", err)
	}
	return s.Close()
}

func (g *GuestSide) Mkdir(ctx context.Context, p string, mode fs.FileMode) error {
	return g.op(ctx, &guest.WSOp{Kind: "mkdir", Path: p, Mode: mode.Perm()})
}

func (g *GuestSide) Symlink(ctx context.Context, p, target string, was *Entry) error {
	return g.op(ctx, &guest.WSOp{Kind: "symlink", Path: p, Link: target, Was: wasOf(was)})
}

func (g *GuestSide) Remove(ctx context.Context, p string, was *Entry) error {
	return g.op(ctx, &guest.WSOp{Kind: "remove", Path: p, Was: wasOf(was)})
}

// Watch reports batches of changed guest paths until ctx ends or the
// stream breaks; all=true means events were lost.
func (g *GuestSide) Watch(ctx context.Context, fn func(paths []string, all bool)) error {
	s, _, err := g.C.Open(ctx, &guest.Request{Op: guest.OpWSWatch, Path: g.Root})
	if err != nil {
		return err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { guest.Abort(s) })
	defer stop()
	for {
		f, err := guest.ReadFrame(s)
		if err != nil {
			return err
		}
		var b guest.WSWatchBatch
		if f.Kind != guest.FrameData || json.Unmarshal(f.Payload, &b) != nil {
			continue
		}
		var ok []string
		for _, p := range b.Paths {
			if _, err := CleanRel(p); err == nil {
				ok = append(ok, p)
			}
		}
		fn(ok, b.All)
	}
}

// Mount asks the agent to mount the workspace disk at Root.
func (g *GuestSide) Mount(ctx context.Context) error {
	s, _, err := g.C.Open(ctx, &guest.Request{Op: guest.OpWSMount, Path: g.Root})
	if err != nil {
		return err
	}
	return s.Close()
}

// Put implements BatchSide: all entries on one stream.
func (g *GuestSide) Put(ctx context.Context, items []PutItem) (map[string]error, error) {
	s, _, err := g.C.Open(ctx, &guest.Request{Op: guest.OpWSPut, Path: g.Root})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { guest.Abort(s) })
	defer stop()
	failed := map[string]error{}
	buf := make([]byte, 256<<10)
	for _, it := range items {
		e := it.Entry
		if _, err := CleanRel(e.Path); err != nil {
			failed[e.Path] = err
			continue
		}
		var r io.ReadCloser
		if e.Type == 'f' {
			if r, err = it.Open(); err != nil {
				failed[e.Path] = err
				continue
			}
		}
		if err := guest.WriteJSON(s, guest.FrameRequest, guest.WSPutItem{Path: e.Path, Type: e.Type, Mode: e.Mode.Perm(), Link: e.Link, Hash: e.Hash, Was: wasOf(it.Was)}); err != nil {
			if r != nil {
				r.Close()
			}
			return nil, err
		}
		if r == nil {
			continue
		}
		h := sha256.New()
		for {
			n, rerr := r.Read(buf)
			if n > 0 {
				h.Write(buf[:n])
				if err := guest.WriteFrame(s, guest.FrameData, buf[:n]); err != nil {
					r.Close()
					return nil, err
				}
			}
			if rerr != nil {
				break
			}
		}
		r.Close()
		if err := guest.WriteFrame(s, guest.FrameEOF, nil); err != nil {
			return nil, err
		}
		if hex.EncodeToString(h.Sum(nil)) != e.Hash {
			failed[e.Path] = errChanged // the next sync sends the new version
		}
	}
	if err := guest.WriteJSON(s, guest.FrameRequest, guest.WSPutItem{End: true}); err != nil {
		return nil, err
	}
	resp, err := guest.ReadResponse(s)
	if err != nil {
		return nil, err
	}
	for p, msg := range resp.Failed {
		if failed[p] == nil { // errChanged: the agent refused what it got, as it should
			failed[p] = staleOf(errors.New(msg))
		}
	}
	return failed, nil
}
