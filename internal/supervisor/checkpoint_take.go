package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
)

// takeCheckpoint saves the machine. With final set the machine is not
// resumed (a rewind replaces it): the RAM is not copied during the pause;
// the returned finish writes it out and commits the checkpoint, and must
// be called once QEMU is gone (it holds its own descriptor of the RAM).
//
// It runs named steps (cpJob's methods, in order below); each step that
// takes something (a directory, the guest's frozen workloads, the paused
// VM) pushes what gives it back on the job's undo stack, which runs, last
// in first out, whatever the outcome, as the job ends.
func (s *supervisor) takeCheckpoint(ctx context.Context, message, kind string, final bool) (meta *checkpoint.Meta, finish func() error, err error) {
	ctx, cancel := withTimeout(ctx, checkpointTimeout)
	defer cancel()
	j := &cpJob{s: s, message: message, kind: kind, final: final, start: time.Now()}
	defer func() { err = j.undo.run(err) }()
	steps := []step{
		{"begin", j.begin},
		{"prepare disks", j.prepareDisks},
		{"quiesce", j.quiesce},
		{"open files", j.openFiles},
		{"pause", j.pause},
		{"snapshot disks", j.snapshotDisks},
		{"save devices", j.saveDevices},
	}
	if final {
		steps = append(steps, step{"hand over", j.handOver})
	} else {
		steps = append(steps,
			step{"save RAM", j.saveRAM},
			step{"resume", j.resume},
			step{"free holes", j.freeHoles},
			step{"commit", j.commitStep},
		)
	}
	if err := runSteps(ctx, s.log, "checkpoint", steps, j.stepDone); err != nil {
		return nil, nil, err
	}
	return j.meta, j.finish, nil
}

// step is one named step of a job (a checkpoint, a start).
type step struct {
	name string
	run  func(context.Context) error
}

// runSteps runs steps in order until one fails; done, if set, is told
// each step's time once it has run.
func runSteps(ctx context.Context, log *slog.Logger, job string, steps []step, done func(name string, ms float64)) error {
	for _, st := range steps {
		t := time.Now()
		if err := st.run(ctx); err != nil {
			log.Debug(job+" step failed", "step", st.name, "err", err)
			return err
		}
		if done != nil {
			done(st.name, msSince(t))
		}
	}
	return nil
}

// undoStack holds what gives back what a job took. Each function gets the
// job's error and returns it, joined with its own where it failed too.
type undoStack []func(err error) error

func (u *undoStack) push(f func(err error) error) { *u = append(*u, f) }

// run empties the stack, last pushed first.
func (u *undoStack) run(err error) error {
	for i := len(*u) - 1; i >= 0; i-- {
		err = (*u)[i](err)
	}
	*u = nil
	return err
}

// cpJob is one checkpoint under way.
type cpJob struct {
	s             *supervisor
	message, kind string
	final         bool
	undo          undoStack
	start, paused time.Time
	// When each step of the pause ended: the stop, the disk snapshots,
	// the device state, the RAM.
	tStopped, tDisks, tSaved, tRAM time.Time
	// steps: each step's time, in order, for the log ("begin=1.2 …").
	steps strings.Builder

	id    string
	store checkpoint.Store
	tmp   string // the checkpoint's directory until it is committed
	// handedOver: finish owns tmp, ram and the RAM copy; the machine
	// (final) ends paused and frozen.
	handedOver bool

	// frozen: the disk layers the machine wrote to; next: the empty
	// layers made over them, which it switches to in the pause; asked: the
	// disks whose switch was asked for (QEMU may have made one it answered
	// with an error, a deadline say).
	frozen, next map[string]checkpoint.Disk
	asked        map[string]bool

	client    *guest.Client
	dev, ram  *os.File
	spare     bool   // ram is a spare: preallocated, maybe holding base's RAM
	spareBase string // the checkpoint whose RAM the spare holds, if any
	mach      vmm.Machine
	m         vmm.Snapshotter
	resumed   bool
	// private: the machine's RAM is its VMM's own (a fork mapping its
	// source's checkpoint): saved in the device stream, no RAM file.
	private bool

	meta   *checkpoint.Meta
	saved  *checkpoint.SaveResult // by saveRAM, for the next checkpoint
	finish func() error           // final: writes the RAM out and commits
}

// stepDone notes a step's time for the checkpoint's log line.
func (j *cpJob) stepDone(name string, ms float64) {
	if j.steps.Len() > 0 {
		j.steps.WriteByte(' ')
	}
	fmt.Fprintf(&j.steps, "%s=%.1f", strings.ReplaceAll(name, " ", "_"), ms)
}

// begin checks that the machine answers and opens the checkpoint's
// directory, removed again unless the checkpoint is committed or handed
// over.
func (j *cpJob) begin(ctx context.Context) error {
	if err := j.s.responsive(ctx); err != nil {
		return fmt.Errorf("no checkpoint taken: %w", err)
	}
	j.store = j.s.sb.Checkpoints()
	j.store.Sweep()
	j.id = checkpoint.NewID()
	tmp, err := j.store.Begin(j.id)
	if err != nil {
		return err
	}
	j.tmp = tmp
	j.undo.push(func(err error) error {
		if !j.handedOver {
			j.store.Abort(tmp)
		}
		return err
	})
	return nil
}

// quiesce sends out everything the guest wrote so far and holds the sync
// still, then freezes the guest's workloads (thawed as the job ends,
// unless the machine ends here).
func (j *cpJob) quiesce(ctx context.Context) error {
	s := j.s
	if s.ws != nil && s.ws.engine != nil {
		sctx, cancel := withTimeout(ctx, preSyncTimeout)
		s.ws.syncNow(sctx, nil)
		cancel()
		resume := s.ws.Pause()
		j.undo.push(func(err error) error { resume(); return err })
	}
	j.client = s.currentClient()
	fctx, cancel := withTimeout(ctx, guestCallTimeout)
	if err := within(fctx, j.client.Freeze); err != nil {
		s.log.Warn("freeze workloads", "err", err)
	}
	cancel()
	j.undo.push(j.thaw)
	return nil
}

// thaw lets the guest's workloads run again. Its failure fails a
// checkpoint that failed anyway; one that succeeded stands, and the audit
// log says the guest stayed frozen.
func (j *cpJob) thaw(err error) error {
	if j.final && j.handedOver {
		return err // the machine ends frozen: a rewind replaces it
	}
	// Its own deadline: ctx may be over (that may be why we are here).
	tctx, cancel := withTimeout(context.Background(), guestCallTimeout)
	defer cancel()
	terr := within(tctx, j.client.Thaw)
	if terr == nil {
		return err
	}
	s := j.s
	s.log.Error("thaw workloads", "err", terr)
	terr = fmt.Errorf("the guest did not thaw its workloads (%w): processes in the sandbox stay stopped; 'kosa8 stop %s' and start it again", terr, s.sb.Config.Name)
	if err != nil {
		return errors.Join(err, terr)
	}
	s.net.audit.Add(audit.Event{Kind: "checkpoint", Decision: "thaw-failed", Name: j.meta.ID, Reason: terr.Error()})
	return nil
}

// openFiles creates the device state and RAM files in the checkpoint's
// directory; the RAM file is a spare when one is ready.
func (j *cpJob) openFiles(context.Context) error {
	dev, err := os.OpenFile(filepath.Join(j.tmp, checkpoint.DevicesFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	j.dev = dev
	j.undo.push(func(err error) error { dev.Close(); return err })
	if j.private = j.s.hasPrivateRAM(); j.private {
		return nil // no RAM file: the stream carries it
	}
	ramPath := filepath.Join(j.tmp, checkpoint.RAMFile)
	j.spare, j.spareBase = j.s.takeSpare(ramPath)
	ram, err := os.OpenFile(ramPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	j.ram = ram
	j.undo.push(func(err error) error {
		if !j.handedOver {
			ram.Close()
		}
		return err
	})
	return nil
}

// pause stops the VM; the job ends with it running again, unless the
// machine ends here. One that does not resume stays paused and the error
// says how to end it.
func (j *cpJob) pause(ctx context.Context) error {
	j.mach = j.s.currentMachine()
	m, err := snapshotter(j.mach)
	if err != nil {
		return err
	}
	j.m = m
	j.paused = time.Now()
	pctx, cancel := withTimeout(ctx, vmCallTimeout)
	err = m.Pause(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("pause the VM: %w", err)
	}
	j.tStopped = time.Now()
	j.undo.push(func(err error) error {
		// On failure, final or not, the machine runs on.
		if rerr := j.resume(context.Background()); rerr != nil {
			j.s.log.Error("resume after a failed checkpoint", "err", rerr)
			return errors.Join(err, rerr)
		}
		return err
	})
	return nil
}

// resume runs the paused VM again (once; never a final one handed over).
func (j *cpJob) resume(context.Context) error {
	if j.resumed || j.final && j.handedOver {
		return nil
	}
	j.resumed = true
	// Its own deadline: ctx may be over (that may be why we are here).
	rctx, cancel := withTimeout(context.Background(), vmCallTimeout)
	defer cancel()
	if err := j.m.Resume(rctx); err != nil {
		return fmt.Errorf("the VM did not resume (%w): 'kosa8 stop --kill %s' ends it", err, j.s.sb.Config.Name)
	}
	if j.meta != nil {
		j.setPause(time.Now())
	}
	// The spare taken for this checkpoint is replaced now, not during the
	// pause (see checkpoint.Spares.Take).
	j.s.prepareSpare()
	return nil
}

// setPause records the pause, ended at end, and where its time went, in
// ms, by step (those that ran).
func (j *cpJob) setPause(end time.Time) {
	steps := map[string]float64{}
	last := j.paused
	for _, st := range []struct {
		name string
		end  time.Time
	}{{"stop", j.tStopped}, {"disks", j.tDisks}, {"devices", j.tSaved}, {"ram", j.tRAM}} {
		if st.end.IsZero() {
			continue
		}
		steps[st.name] = msBetween(last, st.end)
		last = st.end
	}
	if !j.final { // else the machine stays paused: a rewind replaces it
		steps["resume"] = msBetween(last, end)
	}
	j.meta.PauseMillis = msBetween(j.paused, end)
	j.meta.PauseSteps = steps
}

// prepareDisks makes each disk's next layer, an empty overlay on the one
// the machine writes to, and records them as the layers new writes go to,
// all before the pause: the pause only switches to them. An empty overlay
// reads as the layer below it, so the record holds whether or not the
// switch happens: a crash from here on restarts on the new layers and
// loses nothing. The current layers are flushed to the host's disk here
// too, so that QEMU's flush of them in the pause finds little to write.
//
// Nothing in the pause writes a host file and waits for it: a file
// creation or an fsync there waited on all the host had to write (the
// last checkpoint's RAM file among it), 37 to 900 ms.
//
// A final checkpoint (a rewind's) makes no new layers: its machine never
// runs again, so the layers it wrote to become the checkpoint's as they
// are, flushed by QEMU's stop. They stay recorded as the sandbox's until
// the rewind records its own, and finish commits only then
// (freezeLayers).
func (j *cpJob) prepareDisks(ctx context.Context) error {
	sb := j.s.sb
	j.frozen = sb.ActiveDisks()
	j.next, j.asked = map[string]checkpoint.Disk{}, map[string]bool{}
	if j.final {
		return nil
	}
	fctx, cancel := withTimeout(ctx, layerFlushTimeout)
	if err := sb.FlushLayers(fctx, j.frozen); err != nil {
		j.s.log.Debug("flush disk layers before a checkpoint", "err", err) // QEMU flushes them in the pause anyway
	}
	cancel()
	next, err := sb.NewOverlays(j.frozen, j.id)
	if err == nil {
		err = sb.SaveActiveDisks(next)
	}
	if err != nil {
		sb.RemoveLayers(next)
		return fmt.Errorf("new disk layers: %w", err)
	}
	j.next = next
	j.undo.push(j.unprepareDisks)
	return nil
}

// unprepareDisks, after a checkpoint that failed before every disk's
// switch was asked for, records the old layers of those not asked and
// removes their unused new ones. A disk whose switch was asked for keeps
// its new layer, switched or not: QEMU may have switched it and answered
// with an error, and either way the record naming the layer is true (see
// prepareDisks). Should the record fail, every layer stays, as true.
func (j *cpJob) unprepareDisks(err error) error {
	if err == nil || len(j.asked) == len(j.next) {
		return err
	}
	sb := j.s.sb
	cur := maps.Clone(j.frozen)
	for diskID := range j.asked {
		cur[diskID] = j.next[diskID]
	}
	if rerr := sb.SaveActiveDisks(cur); rerr != nil {
		j.s.log.Warn("record the disk layers after a failed checkpoint", "err", rerr)
		return err
	}
	for diskID, d := range j.next {
		if !j.asked[diskID] {
			os.Remove(sb.Path(d.Path))
		}
	}
	return err
}

// snapshotDisks freezes each disk's layer, in the pause: the checkpoint
// keeps it, and the machine switches to the layer prepareDisks made and
// recorded.
func (j *cpJob) snapshotDisks(ctx context.Context) error {
	sb := j.s.sb
	for diskID, d := range j.next {
		j.asked[diskID] = true
		sctx, cancel := withTimeout(ctx, vmCallTimeout)
		err := j.m.SnapshotDisk(sctx, diskID, sb.Path(d.Path))
		cancel()
		if err != nil {
			return fmt.Errorf("snapshot disk %s: %w", diskID, err)
		}
		// The frozen layer is the supervisor's again: QEMU holds it
		// read-only now, and one compromised later must not open it to
		// write a checkpoint's disk.
		if err := sb.TakeBack(j.frozen[diskID]); err != nil {
			j.s.log.Warn("take a frozen disk layer back from QEMU", "disk", diskID, "err", err)
		}
	}
	j.tDisks = time.Now()
	j.meta = &checkpoint.Meta{
		ID: j.id, Parent: j.s.getStatus().Checkpoint, Message: j.message, Kind: j.kind,
		QEMU: j.s.qemuVersion, Firmware: j.s.qemuFirmware, Arch: sb.Config.Arch, MemoryMiB: sb.Config.MemoryMiB,
		Disks: j.frozen,
	}
	return nil
}

// saveDevices writes the VM's device state, without its RAM: with it,
// for a machine whose RAM is private to its VMM (a fork's, mapped
// copy-on-write from its source's checkpoint), which the host cannot copy
// (QEMU's own migration, as slow as plain migrate: the price of the
// memory forks share).
func (j *cpJob) saveDevices(ctx context.Context) error {
	save := j.m.SaveDevices
	if j.private {
		full, ok := j.mach.(vmm.FullSaver)
		if !ok {
			return fmt.Errorf("a checkpoint of a machine with private RAM: %w", vmm.ErrNotSupported)
		}
		save = full.SaveAll
		j.meta.RAMInStream = true
		j.meta.FullCopyReason = "the machine's RAM is private (a fork mapping its source's checkpoint): saved in the device state"
	}
	if err := save(ctx, j.dev); err != nil {
		return fmt.Errorf("save device state: %w", err)
	}
	j.tSaved = time.Now()
	j.meta.Created = j.tSaved.UTC()
	if fi, err := j.dev.Stat(); err == nil {
		j.meta.DeviceBytes = fi.Size()
	}
	return nil
}

// handOver ends a final checkpoint's pause: the machine stays paused (a
// rewind replaces it) and finish, called once QEMU is gone, copies its RAM
// from a descriptor of our own and commits.
func (j *cpJob) handOver(context.Context) error {
	var src *os.File
	if !j.private {
		var err error
		if src, err = dupFile(j.m.RAM()); err != nil {
			return err
		}
	}
	if err := j.writeManifest(); err != nil {
		if src != nil {
			src.Close()
		}
		return err
	}
	j.setPause(time.Now())
	j.meta.TotalMillis = msSince(j.start)
	j.handedOver = true
	j.finish = func() error {
		err := j.freezeLayers()
		if err == nil && src != nil {
			err = j.copyRAM(src)
		}
		if src != nil {
			src.Close()
			j.ram.Close()
		}
		if err == nil {
			err = j.commit()
		}
		if err != nil {
			j.store.Abort(j.tmp)
			j.s.log.Error("write out checkpoint", "id", j.id, "err", err)
			j.s.net.audit.Add(audit.Event{Kind: "checkpoint", Decision: "failed", Name: j.id, Reason: err.Error()})
		}
		return err
	}
	return nil
}

// freezeLayers, once a final checkpoint's machine is gone, makes the
// layers it wrote to the checkpoint's: never while the record names one
// as a layer the sandbox writes to (a rewind that could not record its
// new layers: the next start boots from them, and the checkpoint is not
// kept). The rewind took them back from QEMU's uid as soon as it killed
// the machine.
func (j *cpJob) freezeLayers() error {
	active, err := j.s.sb.RecordedDisks()
	if err != nil {
		return fmt.Errorf("which layers the sandbox writes to: %w", err)
	}
	for diskID, d := range j.frozen {
		for _, a := range active {
			if a.Path == d.Path {
				return fmt.Errorf("disk %s: its layer %s is still the one the sandbox writes to", diskID, d.Path)
			}
		}
	}
	return nil
}

// copyRAM fills the checkpoint's RAM file from src, whole, and leaves it
// sparse.
func (j *cpJob) copyRAM(src *os.File) error {
	var extents []checkpoint.Extent
	var err error
	if j.spare {
		extents, j.meta.RAMBytes, err = checkpoint.CopyData(j.ram, src)
	} else {
		j.meta.RAMBytes, err = checkpoint.CopySparse(j.ram, src)
	}
	if err != nil {
		return fmt.Errorf("copy guest RAM: %w", err)
	}
	if j.spare {
		// Back to a sparse file: the spare was all zeros where the guest
		// had none, or (spareBase set) an older checkpoint's RAM, which
		// must go.
		if err := checkpoint.FreeSpareHoles(j.ram, extents, int64(j.s.sb.Config.MemoryMiB)<<20, j.spareBase == ""); err != nil {
			if j.spareBase != "" {
				return fmt.Errorf("clear the spare's older RAM: %w", err)
			}
			j.s.log.Warn("punch holes in the checkpoint's RAM", "err", err)
		}
	}
	return nil
}

// saveRAM copies the guest's RAM while the VM is paused: only what it wrote
// since the last checkpoint, when that is known for sure
// (checkpoint_undo.go).
func (j *cpJob) saveRAM(context.Context) error {
	if j.private {
		j.tRAM = time.Now() // saved with the devices
		return nil
	}
	saved, err := j.s.saveRAM(j.ram, j.mach, j.m, j.meta, j.spare, j.spareBase)
	if err != nil {
		return err
	}
	j.saved = saved
	j.tRAM = time.Now()
	j.s.log.Info("checkpoint pause", "stop_ms", msBetween(j.paused, j.tStopped), "disks_ms", msBetween(j.tStopped, j.tDisks),
		"devices_ms", msBetween(j.tDisks, j.tSaved), "ram_ms", msBetween(j.tSaved, j.tRAM), "spare", j.spare, "spare_base", j.spareBase)
	return nil
}

// freeHoles gives back the checkpoint RAM file's unused pages, after the
// pause.
func (j *cpJob) freeHoles(context.Context) error {
	if j.private {
		return nil
	}
	if err := j.s.ramSaver().FreeHoles(j.ram, j.saved); err != nil {
		return fmt.Errorf("free the checkpoint's unused RAM pages: %w", err)
	}
	return nil
}

// commitStep writes the sync's manifest beside the checkpoint, commits it
// and makes it the one the machine descends from.
func (j *cpJob) commitStep(context.Context) error {
	if err := j.writeManifest(); err != nil {
		return err
	}
	j.meta.TotalMillis = msSince(j.start)
	if err := j.commit(); err != nil {
		return err
	}
	j.s.setStatus(func(st *api.Status) { st.Checkpoint = j.id })
	// Not for a paused sandbox, which stops now, nor for the state before
	// a rewind (saved here when its RAM is copied during the pause): that
	// would take the RAM prepared for the rewind's likeliest target, and
	// the rewind prepares its own target's once it is done.
	// Nor for the checkpoint forks start from: the source rarely goes
	// back to it, and its RAM would be held twice for nothing.
	if j.kind != "pause" && j.kind != "pre-rewind" && j.kind != "fork" && !j.private {
		j.s.prepareRewind(j.id)
	}
	return nil
}

// writeManifest keeps the sync's manifest with the checkpoint: a rewind
// tells the agent's changes from the user's by it.
func (j *cpJob) writeManifest() error {
	s := j.s
	if s.ws == nil || s.ws.engine == nil {
		return nil
	}
	if err := sandbox.WriteManifest(filepath.Join(j.tmp, checkpoint.ManifestFile), s.ws.engine.Manifest()); err != nil {
		return err
	}
	// The guest versions awaiting review: a start that resumes this
	// machine tells them from what the guest lost (wsync.Engine.Recover).
	return sandbox.WriteManifest(filepath.Join(j.tmp, sandbox.WorkspaceGuestFile), s.ws.engine.GuestKnown())
}

// commit makes the checkpoint visible, complete.
func (j *cpJob) commit() error {
	s, meta := j.s, j.meta
	if err := j.store.Commit(j.tmp, meta); err != nil {
		return err
	}
	if !j.private { // no RAM file: nothing for the spares to build on
		s.ramCommitted(j.id, j.saved)
	}
	s.net.audit.Add(audit.Event{Kind: "checkpoint", Decision: "saved", Name: j.id, Reason: j.message})
	s.log.Info("checkpoint", "id", j.id, "kind", j.kind, "pause_ms", meta.PauseMillis, "total_ms", meta.TotalMillis, "ram_mib", meta.RAMBytes>>20,
		"incremental", meta.Incremental, "copied_mib", meta.RAMCopiedBytes>>20, "full_copy_reason", meta.FullCopyReason, "verify", meta.Verify, "steps_ms", j.steps.String())
	return nil
}
