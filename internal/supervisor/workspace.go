package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// lockFolder takes the host folder's sync lock: one sandbox at a time may
// sync a folder.
func lockFolder(home, folder, name string) (*os.File, error) {
	dir := filepath.Join(home, "locks")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(folder))
	p := filepath.Join(dir, hex.EncodeToString(sum[:16])+".lock")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(p)
		f.Close()
		return nil, fmt.Errorf("%s is already synced by sandbox %s: stop it first", folder, strings.TrimSpace(string(holder)))
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(name+"\n"), 0)
	return f, nil
}

// fullSyncEvery repairs whatever a watcher missed.
const fullSyncEvery = 30 * time.Second

// workspace runs the sync of one sandbox.
type workspace struct {
	sb     *sandbox.Sandbox
	log    *slog.Logger
	root   *wsync.Root
	guest  *wsync.GuestSide
	engine *wsync.Engine
	lock   *os.File
	// progress hears how far the first copy has come (progress.go).
	progress func(launch.CopyProgress)
	cancel   context.CancelFunc
	done     chan struct{}

	mu    sync.Mutex
	dirty map[string]bool
	all   bool
	kick  chan struct{}
	// quiet pauses syncing (a checkpoint in progress).
	quiet sync.Mutex
}

// openWorkspace takes the folder's lock and opens it on the host.
func openWorkspace(sb *sandbox.Sandbox, home string, log *slog.Logger) (*workspace, error) {
	cfg := sb.Config.Workspace
	lock, err := lockFolder(home, cfg.Path, sb.Config.Name)
	if err != nil {
		return nil, err
	}
	root, err := wsync.OpenRoot(cfg.Path)
	if err != nil {
		lock.Close()
		return nil, err
	}
	return &workspace{sb: sb, log: log, root: root, lock: lock, dirty: map[string]bool{}, kick: make(chan struct{}, 1)}, nil
}

// attach mounts the workspace in the guest (client's), brings both sides
// in step from manifest (the first time: copies the folder in; after a
// rewind: the three-way merge of Engine.Rewind) and keeps them so.
func (w *workspace) attach(ctx context.Context, client *guest.Client, manifest map[string]*wsync.Entry, rewind bool) error {
	cfg := w.sb.Config.Workspace
	w.guest = &wsync.GuestSide{C: client, Root: cfg.Path, MaxFile: w.root.MaxFile}
	if err := w.guest.Mount(ctx); err != nil {
		return err
	}
	opts := wsync.Options{Review: cfg.Review, Exclude: cfg.Exclude, Hold: wsync.HoldRules{Extra: cfg.Hold},
		QuotaBytes: cfg.QuotaBytes, QuotaFiles: cfg.QuotaFiles}
	var lastSave time.Time
	save := func(m map[string]*wsync.Entry) {
		if time.Since(lastSave) < time.Second && len(m) > 5000 {
			return // a big tree: at most once a second; a stale manifest only costs rescans
		}
		lastSave = time.Now()
		if err := w.sb.SaveManifest(m); err != nil {
			w.log.Warn("save workspace manifest", "err", err)
		}
	}
	host := &wsync.HostSide{Root: w.root, OnSkip: func(p string, err error) { w.log.Info("not synced", "path", p, "err", err) }}
	counted := &countingGuest{GuestSide: w.guest, tell: w.progress}
	w.engine = wsync.NewEngine(host, counted, manifest, opts, save)
	host.Skip = w.engine.Excluded
	t := time.Now()
	sync := w.engine.Sync
	if rewind {
		sync = func(ctx context.Context, _ []string) error { return w.engine.Rewind(ctx) }
	}
	if err := sync(ctx, nil); err != nil {
		return fmt.Errorf("workspace sync: %w", err)
	}
	// A sandbox must not start on half a workspace: paths the first pass
	// failed to copy (a stream cut on a loaded host) are tried again
	// before the guest runs anything. What still fails then (a host file
	// this user cannot read, say) is in 'kosa8 sync status'.
	for try := 0; ; try++ {
		n, why := w.engine.PassFailures()
		if n == 0 {
			break
		}
		if try == 2 {
			w.log.Error("workspace sync: paths not in step", "failed", n, "first", strings.Join(why, "; "))
			break
		}
		w.log.Warn("workspace sync: paths failed; trying again", "failed", n, "first", why)
		if err := w.engine.Sync(ctx, nil); err != nil {
			return fmt.Errorf("workspace sync: %w", err)
		}
	}
	counted.done()
	w.log.Info("workspace in step", "path", cfg.Path, "files", w.engine.Status().Files, "ms", time.Since(t).Milliseconds(), "rewind", rewind)
	wctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		if err := wsync.WatchHost(wctx, w.root, w.engine.Excluded, w.mark); err != nil {
			w.log.Warn("host watcher", "err", err)
		}
	}()
	go func() {
		for wctx.Err() == nil {
			err := w.guest.Watch(wctx, w.mark)
			if wctx.Err() != nil {
				return
			}
			w.log.Warn("guest watcher ended; restarting", "err", err)
			w.mark(nil, true)
			time.Sleep(time.Second)
		}
	}()
	go w.loop(wctx)
	return nil
}

// detach stops syncing (watchers and loop) without a last pass: the guest
// is about to be replaced.
func (w *workspace) detach() {
	if w.cancel != nil {
		w.cancel()
		<-w.done
		w.cancel = nil
	}
}

func (w *workspace) mark(paths []string, all bool) {
	w.mu.Lock()
	if all {
		w.all = true
	}
	for _, p := range paths {
		if !w.engine.Excluded(p) {
			w.dirty[p] = true
		}
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// A pass starts once changes have paused for burstQuiet, or burstMax after
// the first change at the latest.
const (
	burstQuiet = 50 * time.Millisecond
	burstMax   = 600 * time.Millisecond
)

// loop syncs dirty paths shortly after they change (batching bursts), and
// everything now and then.
func (w *workspace) loop(ctx context.Context) {
	defer close(w.done)
	full := time.NewTicker(fullSyncEvery)
	defer full.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-full.C:
			w.syncNow(ctx, nil)
		case <-w.kick:
			// Let a burst finish: wait for a quiet moment, but not for
			// long, so edits still arrive within a second. Fewer, larger
			// passes cost the guest less of its (emulated, under TCG) CPU
			// while a build or an untar writes.
			quiet := time.NewTimer(burstQuiet)
			limit := time.NewTimer(burstMax)
		burst:
			for {
				select {
				case <-ctx.Done():
					quiet.Stop()
					limit.Stop()
					return
				case <-w.kick:
					quiet.Reset(burstQuiet)
				case <-quiet.C:
					break burst
				case <-limit.C:
					break burst
				}
			}
			quiet.Stop()
			limit.Stop()
			w.mu.Lock()
			all := w.all
			var paths []string
			for p := range w.dirty {
				paths = append(paths, p)
			}
			w.dirty, w.all = map[string]bool{}, false
			w.mu.Unlock()
			if all {
				paths = nil
			} else if len(paths) == 0 {
				continue
			}
			w.syncNow(ctx, paths)
		}
	}
}

func (w *workspace) syncNow(ctx context.Context, paths []string) {
	w.quiet.Lock()
	defer w.quiet.Unlock()
	defer func() {
		// A bug in one pass must not take the sandbox down with it.
		if r := recover(); r != nil {
			w.log.Error("workspace sync panicked", "panic", r)
		}
	}()
	if err := w.engine.Sync(ctx, paths); err != nil && ctx.Err() == nil {
		w.log.Warn("workspace sync", "err", err)
	}
}

// Pause stops syncing until the returned function is called.
func (w *workspace) Pause() func() {
	w.quiet.Lock()
	return w.quiet.Unlock
}

func (w *workspace) closeFiles() {
	w.root.Close()
	w.lock.Close()
}

// stop ends the sync after a last pass, so nothing the guest just wrote is
// left behind.
// The running pass is cancelled first: a pass streaming a guest's huge
// file must not keep stop (or rm -f) waiting beyond ctx.
func (w *workspace) stop(ctx context.Context) {
	w.detach()
	if w.engine != nil {
		w.syncNow(ctx, nil)
	}
	w.closeFiles()
}
