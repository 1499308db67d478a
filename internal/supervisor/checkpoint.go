package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/wsync"
)

// setClient replaces the agent client and wakes those waiting for it.
func (s *supervisor) setClient(c *guest.Client) {
	s.clientMu.Lock()
	s.client = c
	close(s.clientCh)
	s.clientCh = make(chan struct{})
	s.clientMu.Unlock()
}

// nextClient waits for the client after old (a rewind in progress).
func (s *supervisor) nextClient(ctx context.Context, old *guest.Client) (*guest.Client, error) {
	for {
		s.clientMu.Lock()
		c, ch := s.client, s.clientCh
		s.clientMu.Unlock()
		if c != old {
			return c, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *supervisor) currentMachine() vmm.Machine {
	s.clientMu.Lock()
	defer s.clientMu.Unlock()
	return s.machine
}

// snapshotter is m's checkpoint capability, or an error that says the
// VMM has none (vmm.ErrNotSupported).
func snapshotter(m vmm.Machine) (vmm.Snapshotter, error) {
	if m == nil {
		return nil, errors.New("no machine running")
	}
	snap, ok := m.(vmm.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("checkpoints: %w", vmm.ErrNotSupported)
	}
	return snap, nil
}

func (s *supervisor) currentClient() *guest.Client {
	s.clientMu.Lock()
	defer s.clientMu.Unlock()
	return s.client
}

// prepareRestore branches new disk layers off a checkpoint for a start
// that resumes it. It returns nil when the checkpoint's device state cannot
// be loaded by this QEMU: then the start is a cold boot from its disks.
func (s *supervisor) prepareRestore(id string) (*checkpoint.Meta, error) {
	target, err := s.sb.Checkpoints().Load(id)
	if err != nil {
		return nil, err
	}
	if err := s.branchDisks(target, checkpoint.NewID()); err != nil {
		return nil, err
	}
	s.setStatus(func(st *api.Status) { st.Checkpoint = id })
	if ok, why := target.Loadable(s.qemuVersion, s.qemuFirmware); !ok {
		if !target.DisksOnly {
			s.log.Warn("checkpoint saved by another QEMU build: cold boot from its disks", "why", why)
			s.setStatus(func(st *api.Status) { st.ColdBoot = why })
		}
		return nil, nil
	}
	return target, nil
}

// branchAhead starts making new overlays on a checkpoint's frozen disk
// layers, for a rewind to it, and returns a wait for them.
func (s *supervisor) branchAhead(target *checkpoint.Meta) func() (map[string]checkpoint.Disk, error) {
	done := make(chan struct{})
	var next map[string]checkpoint.Disk
	var err error
	go func() {
		defer close(done)
		next, err = s.sb.NewOverlays(target.Disks, checkpoint.NewID())
	}()
	return func() (map[string]checkpoint.Disk, error) {
		<-done
		return next, err
	}
}

// branchDisks puts new overlays on a checkpoint's frozen disk layers and
// makes them the active disks.
func (s *supervisor) branchDisks(target *checkpoint.Meta, id string) error {
	next, err := s.sb.NewOverlays(target.Disks, id)
	if err != nil {
		return err
	}
	return s.sb.SaveActiveDisks(next)
}

// Deadlines of a checkpoint's steps. A guest or QEMU that does not answer
// in time fails the checkpoint, which then resumes and thaws the machine
// and says so, instead of hanging the supervisor (and with it stop and
// rm, which wait for the checkpoint's locks).
const (
	guestCallTimeout  = 15 * time.Second // one agent call: ping, freeze, thaw
	vmCallTimeout     = 15 * time.Second // one QMP command: pause, resume, a disk snapshot
	preSyncTimeout    = 60 * time.Second // the sync pass before the freeze
	layerFlushTimeout = 10 * time.Second // flushing the disk layers before the pause (then QEMU flushes them)
	checkpointTimeout = 5 * time.Minute  // the whole checkpoint, its RAM copy included
	rewindTimeout     = 5 * time.Minute  // a rewind, a cold boot from disks included
)

// withTimeout is ctx bounded by d.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

// responsive checks, each within a short deadline, that QEMU answers, the
// VM runs and the agent answers: a checkpoint of a machine that does not
// would wait on it.
func (s *supervisor) responsive(ctx context.Context) error {
	rs, ok := s.currentMachine().(vmm.RunStater)
	if !ok {
		return s.agentAnswers(ctx) // the VMM cannot tell: the agent's answer must do
	}
	qctx, cancel := withTimeout(ctx, vmCallTimeout)
	state, running, err := rs.RunState(qctx)
	cancel()
	if err != nil {
		return fmt.Errorf("QEMU does not answer (%w): 'kosa8 stop --kill %s' ends it", err, s.sb.Config.Name)
	}
	if !running {
		return fmt.Errorf("the VM is not running (QEMU's state: %s): 'kosa8 stop --kill %s' ends it", state, s.sb.Config.Name)
	}
	return s.agentAnswers(ctx)
}

// answers checks that QEMU and the guest agent answer, as a clean stop
// needs; the VM may be paused for a moment (a checkpoint's pause).
func (s *supervisor) answers(ctx context.Context) error {
	if rs, ok := s.currentMachine().(vmm.RunStater); ok {
		qctx, cancel := withTimeout(ctx, vmCallTimeout)
		_, _, err := rs.RunState(qctx)
		cancel()
		if err != nil {
			return fmt.Errorf("QEMU does not answer: %w", err)
		}
	}
	return s.agentAnswers(ctx)
}

func (s *supervisor) agentAnswers(ctx context.Context) error {
	gctx, cancel := withTimeout(ctx, guestCallTimeout)
	defer cancel()
	if err := within(gctx, s.currentClient().Ping); err != nil {
		return fmt.Errorf("the guest agent does not answer (%w): 'kosa8 stop --kill %s' ends it", err, s.sb.Config.Name)
	}
	return nil
}

// checkpoint saves the whole running machine: the workloads are frozen and
// the sync quiesced; the VM pauses while each disk's layer is frozen (new
// writes go to a new overlay), the device state is saved and the RAM file
// is copied; then it runs again. The checkpoint becomes visible only once
// all of it is on disk.
func (s *supervisor) checkpoint(ctx context.Context, message, kind string) (*checkpoint.Meta, error) {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	return s.checkpointLocked(ctx, message, kind)
}

// checkpointLocked takes a checkpoint; on failure it removes only its own
// files and the machine runs on as before. A full disk says so, with what
// to do.
func (s *supervisor) checkpointLocked(ctx context.Context, message, kind string) (*checkpoint.Meta, error) {
	meta, _, err := s.checkpointFinal(ctx, message, kind, false)
	return meta, err
}

// checkpointFinal is checkpointLocked, and with final set, a checkpoint of a
// machine about to be replaced (see takeCheckpoint).
func (s *supervisor) checkpointFinal(ctx context.Context, message, kind string, final bool) (*checkpoint.Meta, func() error, error) {
	meta, finish, err := s.takeCheckpoint(ctx, message, kind, final)
	if err != nil {
		s.log.Warn("checkpoint failed", "err", err)
		if diskFull(err, s.sb.Checkpoints().Dir) {
			err = fmt.Errorf("not enough disk space for a checkpoint in %s (%w): delete old checkpoints ('kosa8 checkpoints %s', 'kosa8 checkpoint rm %s ID') or free space; the sandbox runs on unchanged",
				s.sb.Dir, err, s.sb.Config.Name, s.sb.Config.Name)
		}
		s.net.audit.Add(audit.Event{Kind: "checkpoint", Decision: "failed", Name: kind, Reason: err.Error()})
	}
	return meta, finish, err
}

// canWriteOutLater tells whether a rewind may leave the outgoing machine's
// RAM for later: the new machine's RAM fits on tmpfs beside it, and the
// write-out cannot run out of disk (every ready spare holds blocks for all
// of guest RAM already, or the disk has room for the RAM in use and more).
// A ready spare alone is not enough: on a filesystem where preallocation
// reserves nothing (OpenZFS) it holds no blocks.
func (s *supervisor) canWriteOutLater() bool {
	m, err := snapshotter(s.currentMachine())
	if err != nil || m.RAM() == nil {
		return false
	}
	size := int64(s.sb.Config.MemoryMiB) << 20
	var st syscall.Statfs_t
	if syscall.Fstatfs(int(m.RAM().Fd()), &st) != nil || int64(st.Bavail)*int64(st.Bsize) < size+64<<20 {
		return false
	}
	if r := s.ramSaver().Spares.Reserved(); r > 0 && r >= size {
		return true
	}
	free, err := checkpoint.FreeBytes(s.sb.Checkpoints().Dir)
	return err == nil && free > checkpoint.Allocated(m.RAM())+256<<20
}

// diskFull tells whether err came from a full disk: ENOSPC or EDQUOT, or
// an error from QEMU (which loses the errno) while dir's filesystem has
// almost no space left.
func diskFull(err error, dir string) bool {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	free, ferr := checkpoint.FreeBytes(dir)
	return ferr == nil && free < 16<<20
}

// dupFile opens a second descriptor of f, close-on-exec.
func dupFile(f *os.File) (*os.File, error) {
	syscall.ForkLock.RLock()
	fd, err := syscall.Dup(int(f.Fd()))
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// rewind returns the machine to a checkpoint: the state just before is
// saved as a checkpoint first; QEMU restarts on new disk layers over the
// checkpoint's, with its RAM and devices; the agent reseeds the RNG and
// steps the clock before the workloads run; the host folder is merged back
// (Engine.Rewind). The network policy and secrets stay as they are now.
func (s *supervisor) rewind(ctx context.Context, id string) (*api.RewindResult, error) {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	ctx, cancel := withTimeout(ctx, rewindTimeout)
	defer cancel()
	target, err := s.sb.Checkpoints().Load(id)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	// The new layers over the checkpoint's are made while the state before
	// is saved: neither waits for the other (each is qemu-img runs and
	// fsyncs, about 70-90 ms under TCG here). They are recorded once the
	// old machine is gone; until then nothing uses them, and a rewind that
	// stops short removes them.
	waitBranch := s.branchAhead(target)
	recorded := false
	defer func() {
		if next, _ := waitBranch(); !recorded {
			s.sb.RemoveLayers(next)
		}
	}()
	restore := target
	cold := false
	if ok, why := target.Loadable(s.qemuVersion, s.qemuFirmware); !ok {
		if !target.DisksOnly {
			s.log.Warn("checkpoint saved by another QEMU build: cold boot from its disks", "why", why)
		}
		restore, cold = nil, true
	}
	// The QEMU that restores the target starts on those layers as soon as
	// they are made, also while the state before is saved: it waits for
	// the target's device state, its guest not running, until the old
	// machine is gone. A cold boot starts after, as its guest would run.
	var waitAhead func() (*startedVMM, error)
	if restore != nil {
		waitAhead = s.startAhead(ctx, restore, waitBranch)
		defer func() {
			if waitAhead != nil { // not brought up: never the sandbox's
				if v, err := waitAhead(); err == nil {
					v.discard()
				}
			}
		}()
	}
	// The state before is saved without copying its RAM during the rewind:
	// that RAM is written out once the restored machine runs.
	pre, writeOut, err := s.checkpointFinal(ctx, "before rewind to "+id, "pre-rewind", s.canWriteOutLater())
	if err != nil {
		return nil, fmt.Errorf("save the state before the rewind: %w", err)
	}
	// Written out once the restored machine runs, and before the answer:
	// what the answer names exists. On a failed rewind too.
	flush := func() error {
		if writeOut == nil {
			return nil
		}
		w := writeOut
		writeOut = nil
		return w()
	}
	defer flush()
	var manifest map[string]*wsync.Entry
	if s.ws != nil {
		// The sync stops first: a pass that began after the checkpoint
		// waits on a machine that stays paused, holding the engine (and
		// Manifest with it) until it is cancelled.
		s.ws.detach()
		manifest = s.ws.engine.Manifest()
	}
	old := s.currentMachine()
	s.expectExit(old)
	// If no machine replaces it, the sandbox ends as crashed ('kosa8 start'
	// boots it again; 'start --from' restores a checkpoint), rather than
	// waiting for a machine that never comes.
	defer func() {
		if s.currentMachine() == old {
			s.replacing.CompareAndSwap(old, nil)
		}
	}()
	_ = old.Kill()
	s.currentClient().Close()
	// Its layers, the state before's, are taken back from its QEMU's uid
	// now, before any other QEMU starts: one started after a failed early
	// start may get that uid again (free once the old QEMU exited), and
	// its guest runs before the state before is written out. Still the
	// sandbox's until the new layers are
	// recorded, they are handed again to whatever starts on them.
	for diskID, d := range pre.Disks {
		if err := s.sb.TakeBack(d); err != nil {
			s.log.Warn("take the old machine's disk layer back from QEMU", "disk", diskID, "err", err)
		}
	}
	tSaved := time.Now()
	next, err := waitBranch()
	if err == nil {
		err = s.sb.SaveActiveDisks(next)
	}
	if err != nil {
		return nil, fmt.Errorf("new disk layers over %s: %w", id, err)
	}
	recorded = true
	tBranched := time.Now()
	ahead := waitAhead
	waitAhead = nil // launchRewound's now: it kills a machine that does not come up
	if err := s.launchRewound(ctx, restore, ahead); err != nil {
		return nil, fmt.Errorf("restore %s: %w", id, err)
	}
	tLaunched := time.Now()
	res := &api.RewindResult{To: id, Saved: pre, ColdBoot: cold}
	if s.ws != nil {
		if err := s.ws.attach(ctx, s.currentClient(), syncState{manifest: manifest}, rewindPass); err != nil {
			return nil, fmt.Errorf("workspace after the rewind: %w", err)
		}
		res.Conflicts = s.ws.engine.Status().Conflicts
	}
	s.log.Info("rewind phases", "save_before_ms", msBetween(start, tSaved), "disks_ms", msBetween(tSaved, tBranched),
		"restore_ms", msBetween(tBranched, tLaunched), "workspace_ms", msBetween(tLaunched, time.Now()))
	s.setStatus(func(st *api.Status) { st.Checkpoint = id; st.QEMUPID = s.currentMachine().Pid() })
	res.Millis = msSince(start)
	if restore != nil && !restore.RAMInStream {
		// Once the state before is out: the likeliest next rewind is
		// to the same checkpoint again.
		defer s.prepareRewind(id)
	}
	if err := flush(); err != nil {
		res.Saved = nil
		res.Warning = "the state before the rewind could not be saved: " + err.Error()
		s.net.audit.Add(audit.Event{Kind: "rewind", Decision: "restored", Name: id, Reason: res.Warning})
		s.log.Warn("rewind", "to", id, "ms", res.Millis, "err", res.Warning)
		return res, nil
	}
	res.SavedMillis = msSince(start)
	s.net.audit.Add(audit.Event{Kind: "rewind", Decision: "restored", Name: id, Reason: "state before kept as " + pre.ID})
	s.log.Info("rewind", "to", id, "ms", res.Millis, "saved", pre.ID, "saved_ms", res.SavedMillis)
	return res, nil
}

// startAhead starts, in the background, the QEMU that restores target,
// on the layers waitBranch makes over its disks, and returns a wait for
// it (nil and the error if it did not start).
func (s *supervisor) startAhead(ctx context.Context, target *checkpoint.Meta, waitBranch func() (map[string]checkpoint.Disk, error)) func() (*startedVMM, error) {
	done := make(chan struct{})
	var v *startedVMM
	var err error
	go func() {
		defer close(done)
		t := time.Now()
		var next map[string]checkpoint.Disk
		if next, err = waitBranch(); err == nil {
			tBranch := time.Now()
			v, err = s.startVMM(ctx, target, specDisks(s.sb, next))
			s.log.Info("qemu started ahead", "layers_ms", msBetween(t, tBranch), "ready_ms", msSince(t), "err", err)
		}
	}()
	return func() (*startedVMM, error) {
		<-done
		return v, err
	}
}

// launchRewound brings up the machine of a rewind: the QEMU started ahead
// when there is one (else, or if it failed to start, one started now).
func (s *supervisor) launchRewound(ctx context.Context, restore *checkpoint.Meta, waitAhead func() (*startedVMM, error)) error {
	if waitAhead == nil {
		return s.launch(ctx, restore)
	}
	v, err := waitAhead()
	if err != nil {
		s.log.Warn("the QEMU started ahead of the rewind failed: starting another", "err", err)
		return s.launch(ctx, restore)
	}
	return s.bringUp(ctx, v, restore)
}

// expectExit marks a machine as being replaced: its exit is not the end of
// the sandbox.
func (s *supervisor) expectExit(m vmm.Machine) {
	s.replacing.Store(m)
}

// enforceRetention deletes the oldest checkpoints beyond the sandbox's
// maximum, never the one the machine descends from.
func (s *supervisor) enforceRetention() {
	max := s.sb.Config.MaxCheckpoints
	if max <= 0 {
		max = sandbox.DefaultMaxCheckpoints
	}
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	list, err := s.sb.Checkpoints().List()
	if err != nil {
		return
	}
	cur := s.getStatus().Checkpoint
	for i := 0; len(list)-i > max && i < len(list); i++ {
		if list[i].ID == cur || len(s.sb.HeldBy(list[i].ID)) > 0 {
			continue // forks' disks build on its layers
		}
		if err := s.sb.Checkpoints().Delete(list[i].ID); err == nil {
			s.dropRewindRAM(list[i].ID)
			s.log.Info("checkpoint removed (retention)", "id", list[i].ID)
		}
	}
	_ = sandbox.GCDisks(s.sb)
}

// autoCheckpoints takes a checkpoint every interval until ctx ends.
func (s *supervisor) autoCheckpoints(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := s.checkpoint(ctx, "every "+every.String(), "auto"); err != nil && ctx.Err() == nil {
				s.log.Warn("automatic checkpoint", "err", err)
			}
			s.enforceRetention()
		}
	}
}

// The spares: files the size of guest RAM, their pages in the page cache,
// waiting in the checkpoint directory. A checkpoint takes one over and
// writes only the guest's data into it: overwriting cached pages is many
// times faster than filling new ones, and that copy is nearly all of the
// pause. Several are kept and refilled in the background (checkpoint.Spares,
// checkpoint_undo.go); when the last checkpoint's RAM is known to differ
// from the guest's only by the pages it wrote since, a spare holds a copy
// of it instead of zeros.
func (s *supervisor) prepareSpare() {
	if s.hasPrivateRAM() {
		return // its checkpoints copy no RAM file
	}
	s.ramSaver().Spares.Refill()
}

// hasPrivateRAM tells whether the machine's RAM is private to its VMM
// (mapped copy-on-write: a fork's start).
func (s *supervisor) hasPrivateRAM() bool {
	s.clientMu.Lock()
	defer s.clientMu.Unlock()
	return s.privateRAM
}

// takeSpare moves a spare to dst, if there is one, and tells what it holds
// (see checkpoint.Spares.Take).
func (s *supervisor) takeSpare(dst string) (bool, string) {
	r := s.ramSaver()
	base, ok := r.Spares.Take(dst, r.Want())
	return ok, base
}

// msBetween is b-a in milliseconds, for the log and reports.
func msBetween(a, b time.Time) float64 { return float64(b.Sub(a).Microseconds()) / 1000 }

// msSince is the time since t in milliseconds.
func msSince(t time.Time) float64 { return msBetween(t, time.Now()) }
