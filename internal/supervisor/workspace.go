package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/folder"
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
	// readGuest reads a file of the guest's workspace (the sync's guest
	// side), for summaries of the changes.
	readGuest func(ctx context.Context, p string) (io.ReadCloser, error)
	lock      *os.File
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
	// passMu guards cancelPass, the loop's pass running (or about to),
	// and takers, how many others wait for quiet (take).
	passMu     sync.Mutex
	cancelPass context.CancelFunc
	takers     int

	lastSave time.Time
	unsaved  bool // a manifest was not saved (saved at most once a second)
}

// saveManifest saves m now.
func (w *workspace) saveManifest(m map[string]*wsync.Entry) {
	w.lastSave, w.unsaved = time.Now(), false
	if err := w.sb.SaveManifest(m); err != nil {
		w.log.Warn("save workspace manifest", "err", err)
	}
}

// openWorkspace takes the folder's lock and opens it on the host. A fork
// takes no lock: its sync never writes to the host folder (review mode,
// always), so it may read a folder that another sandbox syncs; its
// applies take the folder's apply lock (lockApply).
func openWorkspace(sb *sandbox.Sandbox, home string, log *slog.Logger) (*workspace, error) {
	cfg := sb.Config.Workspace
	// The folder was resolved when the sandbox was made (folder.Resolve);
	// a link put into its path since then would take the sync, and every
	// check made on that path, to another folder.
	if f, err := folder.Resolve(cfg.Path); err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	} else if f.String() != cfg.Path {
		return nil, fmt.Errorf("workspace %s now leads to %s through a link: a sandbox syncs only the folder it was made for; put the folder back, or make a new sandbox for %s", cfg.Path, f.String(), f.String())
	}
	var lock *os.File
	if sb.Config.Fork == nil || !cfg.Review {
		var err error
		if lock, err = lockFolder(home, cfg.Path, sb.Config.Name); err != nil {
			return nil, err
		}
	}
	root, err := wsync.OpenRoot(cfg.Path)
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	return &workspace{sb: sb, log: log, root: root, lock: lock, dirty: map[string]bool{}, kick: make(chan struct{}, 1)}, nil
}

// firstPass is how a start brings the two sides in step.
type firstPass int

const (
	// continuePass: the manifest describes the guest exactly (the last
	// run stopped cleanly, or paused at the checkpoint restored): an
	// ordinary pass, deletions inferred as ever.
	continuePass firstPass = iota
	// recoverPass: the guest may hold less than the manifest says (a
	// crash, a start from a checkpoint or from disks): a merge that
	// infers no deletion (wsync.Engine.Recover).
	recoverPass
	// rewindPass: the machine was just rewound; the host goes back to the
	// checkpoint where the agent made the change (wsync.Engine.Rewind).
	rewindPass
)

func (f firstPass) String() string {
	return [...]string{"continue", "recover", "rewind"}[f]
}

// syncState is what a start finds of the sync's last run: the manifest,
// the guest versions awaiting review or approval, and the journal of host
// deletions begun.
type syncState struct {
	manifest, guest, journal map[string]*wsync.Entry
}

// attach mounts the workspace in the guest (client's), brings both sides
// in step from st by first (the first time: copies the folder in) and
// keeps them so.
func (w *workspace) attach(ctx context.Context, client *guest.Client, st syncState, first firstPass) error {
	cfg := w.sb.Config.Workspace
	// Not the boot's time limit (startJob.run): the first pass lasts as
	// long as it makes progress.
	what, hint := "the workspace's first copy", "'kosa8 logs "+w.sb.Config.Name+"' shows the last steps; start it again to retry"
	if first == rewindPass {
		what, hint = "the workspace's sync after the rewind", "'kosa8 logs "+w.sb.Config.Name+"' shows the last steps"
	}
	ctx, moved, stop := watchStall(ctx, what, hint, firstCopyStall, firstCopyMax)
	defer stop()
	stalled := func(err error) error {
		if cause := context.Cause(ctx); errors.As(cause, new(errStalled)) {
			return cause
		}
		return err
	}
	w.guest = &wsync.GuestSide{C: client, Root: cfg.Path, MaxFile: w.root.MaxFile}
	w.readGuest = w.guest.Read
	counted := newCountingGuest(w.guest, w.progress, moved)
	if err := w.guest.Mount(ctx); err != nil {
		return stalled(err)
	}
	opts := wsync.Options{Review: cfg.Review, Exclude: cfg.Exclude, Hold: wsync.HoldRules{Extra: cfg.Hold},
		QuotaBytes: cfg.QuotaBytes, QuotaFiles: cfg.QuotaFiles,
		Journal: w.sb.SaveJournal,
		SaveGuest: func(m map[string]*wsync.Entry) {
			if err := w.sb.SaveWorkspaceGuest(m); err != nil {
				w.log.Warn("save the guest versions awaiting review", "err", err)
			}
		},
	}
	// The engine calls save only with a manifest both sides hold durably
	// (wsync.Engine.persist). A big tree's is saved at most once a
	// second: one saved less often is older but still true; stop saves
	// the last one (saveNow).
	save := func(m map[string]*wsync.Entry) {
		if time.Since(w.lastSave) < time.Second && len(m) > 5000 {
			w.unsaved = true
			return
		}
		w.saveManifest(m)
	}
	host := &wsync.HostSide{Root: w.root, OnSkip: func(p string, err error) { w.log.Info("not synced", "path", p, "err", err) }}
	w.engine = wsync.NewEngine(host, counted, st.manifest, opts, save)
	// The host's scan hashes each file (every start: its cache lives in
	// this process): each path it visits is progress of the first pass.
	host.Skip = func(p string) bool { counted.touch(); return w.engine.Excluded(p) }
	t := time.Now()
	var err error
	switch first {
	case rewindPass:
		err = w.engine.Rewind(ctx)
	case recoverPass:
		err = w.engine.Recover(ctx, st.guest, st.journal)
	default:
		err = w.engine.Sync(ctx, nil)
	}
	if err != nil {
		return fmt.Errorf("workspace sync: %w", stalled(err))
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
			// The last try cut short by the guard (a stall, or the
			// ceiling) is no reason to go on with half a workspace.
			if err := stalled(nil); err != nil {
				return fmt.Errorf("workspace sync: %w", err)
			}
			w.log.Error("workspace sync: paths not in step", "failed", n, "first", strings.Join(why, "; "))
			break
		}
		w.log.Warn("workspace sync: paths failed; trying again", "failed", n, "first", why)
		if err := w.engine.Sync(ctx, nil); err != nil {
			return fmt.Errorf("workspace sync: %w", stalled(err))
		}
	}
	counted.done()
	w.log.Info("workspace in step", "path", cfg.Path, "files", w.engine.Status().Files, "ms", time.Since(t).Milliseconds(), "first_pass", first.String())
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
			w.loopPass(ctx, nil)
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
			w.loopPass(ctx, paths)
		}
	}
}

// loopPass runs one of the loop's passes. Its wait on the guest has no end
// of its own (a guest whose agent never answers holds it until the stop
// cancels the loop), so whoever else needs the sync cancels it (take): a
// checkpoint, and a rewind with it, must not wait on a guest that stalls.
// The paths of a pass so cancelled are marked again for the next.
func (w *workspace) loopPass(ctx context.Context, paths []string) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.passMu.Lock()
	w.cancelPass = cancel
	if w.takers > 0 {
		cancel() // one waits for the sync: its turn first
	}
	w.passMu.Unlock()
	w.quiet.Lock()
	ok := w.runPass(pctx, paths)
	w.quiet.Unlock()
	w.passMu.Lock()
	w.cancelPass = nil
	w.passMu.Unlock()
	if !ok && pctx.Err() != nil && ctx.Err() == nil {
		w.mark(paths, paths == nil)
	}
}

// take holds the sync (quiet) for a caller other than the loop: the loop's
// pass is cancelled first, and any it starts until take returns.
func (w *workspace) take() {
	w.passMu.Lock()
	w.takers++
	if w.cancelPass != nil {
		w.cancelPass()
	}
	w.passMu.Unlock()
	w.quiet.Lock()
	w.passMu.Lock()
	w.takers--
	w.passMu.Unlock()
}

// syncNow runs a pass now (the loop's, if one runs, is cancelled: take);
// it reports whether the pass ran to its end.
func (w *workspace) syncNow(ctx context.Context, paths []string) bool {
	w.take()
	defer w.quiet.Unlock()
	return w.runPass(ctx, paths)
}

// runPass runs a pass, quiet held; it reports whether it ran to its end.
func (w *workspace) runPass(ctx context.Context, paths []string) (ok bool) {
	defer func() {
		// A bug in one pass must not take the sandbox down with it.
		if r := recover(); r != nil {
			w.log.Error("workspace sync panicked", "panic", r)
			ok = false
		}
	}()
	if err := w.engine.Sync(ctx, paths); err != nil {
		if ctx.Err() == nil {
			w.log.Warn("workspace sync", "err", err)
		}
		return false
	}
	return true
}

// Pause stops syncing until the returned function is called.
func (w *workspace) Pause() func() {
	w.take()
	return w.quiet.Unlock
}

func (w *workspace) closeFiles() {
	w.root.Close()
	if w.lock != nil {
		w.lock.Close()
	}
}

// stop ends the sync after a last pass, so nothing the guest just wrote is
// left behind. It reports whether that pass brought both sides in step and
// saved it: only then may the run count as stopped cleanly.
// The running pass is cancelled first: a pass streaming a guest's huge
// file must not keep stop (or rm -f) waiting beyond ctx.
func (w *workspace) stop(ctx context.Context) bool {
	w.detach()
	clean := false
	if w.engine != nil {
		clean = w.syncNow(ctx, nil)
		if clean {
			if n, _ := w.engine.PassFailures(); n > 0 || !w.engine.Saved() {
				clean = false
			}
		}
		if w.unsaved && w.engine.Saved() {
			w.saveManifest(w.engine.Manifest())
		}
	}
	w.closeFiles()
	return clean
}
