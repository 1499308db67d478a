package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/vmm"
)

// Files of the disk layers and checkpoints, in the sandbox's directory.
const (
	disksFile      = "disks.json" // the disk layers QEMU writes to now
	checkpointsDir = "checkpoints"
	DisksDir       = "disks" // the layers made since create: overlays and frozen layers
)

// Checkpoints is the sandbox's checkpoint store.
func (s *Sandbox) Checkpoints() checkpoint.Store {
	return checkpoint.Store{Dir: s.Path(checkpointsDir)}
}

// ActiveDisks are the layers new writes go to (paths relative to the
// sandbox directory).
func (s *Sandbox) ActiveDisks() map[string]checkpoint.Disk {
	m, _ := s.RecordedDisks()
	return m
}

// RecordedDisks is ActiveDisks and why its record could not be read: the
// first disks stand for a record that is missing (nothing switched them
// yet), and for one that is unreadable too, where the error says so
// (a decision that must not guess, as whether a layer is still written
// to, fails on it).
func (s *Sandbox) RecordedDisks() (map[string]checkpoint.Disk, error) {
	m := map[string]checkpoint.Disk{}
	err := readJSON(s.Path(disksFile), &m)
	if err == nil && len(m) > 0 {
		return m, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	} else if err == nil {
		err = fmt.Errorf("%s names no disk", s.Path(disksFile))
	}
	m = map[string]checkpoint.Disk{"root": {Path: RootDisk, Format: "qcow2"}}
	if s.Config.Workspace != nil {
		m["ws"] = checkpoint.Disk{Path: WorkspaceDisk, Format: "raw"}
	}
	if s.Config.Docker != nil {
		m["docker"] = checkpoint.Disk{Path: DockerDisk, Format: "raw"}
	}
	return m, err
}

// DisksUnused reports whether the sandbox's disks were never handed to a
// VM: they have no record yet (a start records them before its QEMU
// has them).
func (s *Sandbox) DisksUnused() bool {
	_, err := os.Lstat(s.Path(disksFile))
	return errors.Is(err, os.ErrNotExist)
}

// SaveActiveDisks records the layers new writes go to.
func (s *Sandbox) SaveActiveDisks(m map[string]checkpoint.Disk) error {
	return WriteJSONAtomic(s.Path(disksFile), m)
}

// Overlay is the disk layer, in dl's format, that id (a checkpoint, or a
// start from one) puts on top of disk diskID; its path is relative to the
// sandbox's directory.
func Overlay(dl vmm.DiskLayers, id, diskID string) checkpoint.Disk {
	return checkpoint.Disk{Path: filepath.Join(DisksDir, id+"-"+diskID+"."+dl.Format()), Format: dl.Format()}
}

// NewOverlays makes an empty layer over each of layers (in parallel),
// named for id, and returns them; when one fails, it removes the others
// and returns none. A layer's path is relative to the sandbox's
// directory, or absolute (a fork's layers build on its source's).
func (sb *Sandbox) NewOverlays(layers map[string]checkpoint.Disk, id string) (map[string]checkpoint.Disk, error) {
	dl, err := sb.DiskLayers()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(sb.Path(DisksDir), 0o700); err != nil {
		return nil, err
	}
	next := map[string]checkpoint.Disk{}
	errs := make(chan error, len(layers))
	for diskID, d := range layers {
		overlay := Overlay(dl, id, diskID)
		// Claimed first: a name taken (ids share their second and 16
		// random bits) fails here rather than overwriting a layer in use.
		f, err := os.OpenFile(sb.Path(overlay.Path), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			errs <- fmt.Errorf("new disk layer: %w", err)
			continue
		}
		f.Close()
		next[diskID] = overlay
		backing := d.Path
		if !filepath.IsAbs(backing) {
			backing = sb.Path(backing)
		}
		go func() {
			errs <- dl.Create(context.Background(), sb.Path(overlay.Path), backing, d.Format, 0)
		}()
	}
	var first error
	for range layers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		sb.RemoveLayers(next)
		return nil, first
	}
	return next, nil
}

// RemoveLayers removes disk layers nothing records (made for a checkpoint
// or a rewind that stopped short).
func (sb *Sandbox) RemoveLayers(layers map[string]checkpoint.Disk) {
	for _, d := range layers {
		os.Remove(sb.Path(d.Path))
	}
}

// FlushLayers writes what the host holds of layers (paths relative to the
// sandbox) to its disk, in parallel, and returns when done or when ctx
// ends, whichever is first (an fsync cannot be cancelled; one still
// running finishes on its own).
func (sb *Sandbox) FlushLayers(ctx context.Context, layers map[string]checkpoint.Disk) error {
	errs := make(chan error, len(layers))
	for _, d := range layers {
		go func() { errs <- syncFile(sb.Path(d.Path)) }()
	}
	var first error
	for range layers {
		select {
		case err := <-errs:
			if err != nil && first == nil {
				first = err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return first
}

// syncFile fsyncs the file at path, opened read-only and never through a
// symlink.
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// TakeBack makes a disk layer the supervisor's user's again (a driver
// that confines its VMM to a uid of its own hands it the layers it
// writes), never through a link.
func (sb *Sandbox) TakeBack(d checkpoint.Disk) error {
	return os.Lchown(sb.Path(d.Path), os.Geteuid(), os.Getegid())
}

// SaveDisks keeps a stopped sandbox's disks as a checkpoint (no RAM, no
// devices: restoring it boots from them), so that starting it from an
// older checkpoint loses nothing. Its layers are frozen; the next start
// writes to new ones on top.
func SaveDisks(sb *Sandbox, message string) (*checkpoint.Meta, error) {
	// No start can begin meanwhile.
	release, err := lockStopped(sb.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, sb.Config.Name)
	}
	defer release()
	store := sb.Checkpoints()
	store.Sweep()
	id := checkpoint.NewID()
	tmp, err := store.Begin(id)
	if err != nil {
		return nil, err
	}
	frozen := sb.ActiveDisks()
	next, err := sb.NewOverlays(frozen, id)
	if err != nil {
		store.Abort(tmp)
		return nil, err
	}
	// Taken back from the uid of the QEMU that last wrote them (nothing
	// did at its exit): a later QEMU of that uid could write them.
	for _, d := range frozen {
		if err := sb.TakeBack(d); err != nil {
			sb.RemoveLayers(next)
			store.Abort(tmp)
			return nil, fmt.Errorf("take a disk layer back from QEMU: %w", err)
		}
	}
	st := sb.Status()
	meta := &checkpoint.Meta{
		ID: id, Parent: st.Checkpoint, Created: time.Now().UTC(), Message: message, Kind: "disks", DisksOnly: true,
		Arch: sb.Config.Arch, MemoryMiB: sb.Config.MemoryMiB, Disks: frozen,
	}
	if err := store.Commit(tmp, meta); err != nil {
		store.Abort(tmp)
		return nil, err
	}
	// Only now: until the checkpoint exists, the old layers stay the live ones.
	if err := sb.SaveActiveDisks(next); err != nil {
		_ = store.Delete(id) // its layers must not be written to
		return nil, err
	}
	return meta, nil
}

// DeleteCheckpoint removes a stopped sandbox's checkpoint and the disk
// layers nothing uses any more, under the supervisor's lock: a start
// meanwhile could build on a layer being deleted. A running sandbox's
// supervisor does it (Client.DeleteCheckpoint); here that is ErrRunning.
func DeleteCheckpoint(sb *Sandbox, id string) error {
	release, err := lockStopped(sb.Dir)
	if err != nil {
		return fmt.Errorf("%w: %s started meanwhile: try again", err, sb.Config.Name)
	}
	defer release()
	return DeleteCheckpointLocked(sb, id)
}

// DeleteCheckpointLocked is DeleteCheckpoint by whoever holds the
// supervisor's lock (the running sandbox's supervisor). A checkpoint that
// forks started from stays (ErrHasForks): their disks build on its layers.
func DeleteCheckpointLocked(sb *Sandbox, id string) error {
	if err := sb.checkNotHeld(id); err != nil {
		return err
	}
	if err := sb.Checkpoints().Delete(id); err != nil {
		return err
	}
	return GCDisks(sb)
}

// GCDisks removes disk layers that no checkpoint and no active disk
// depends on.
func GCDisks(sb *Sandbox) error {
	keep := map[string]bool{}
	// Each layer is read in the format recorded for it: a raw one (the
	// workspace) holds the guest's bytes, which may look like any format.
	var roots []checkpoint.Disk
	for _, d := range sb.ActiveDisks() {
		roots = append(roots, d)
	}
	list, err := sb.Checkpoints().List()
	if err != nil {
		return err
	}
	for _, m := range list {
		for _, d := range m.Disks {
			roots = append(roots, d)
		}
	}
	dl, err := sb.DiskLayers()
	if err != nil {
		return err
	}
	for _, r := range roots {
		chain, err := dl.Chain(context.Background(), sb.Path(r.Path), r.Format)
		if err != nil {
			return err // unsure what is used: delete nothing
		}
		for _, p := range chain {
			keep[p] = true
		}
	}
	files, _ := filepath.Glob(sb.Path(filepath.Join(DisksDir, "*")))
	for _, f := range files {
		if !keep[f] {
			os.Remove(f)
		}
	}
	return nil
}

// DefaultMaxCheckpoints is how many checkpoints a sandbox keeps unless told.
const DefaultMaxCheckpoints = 20

// CheckpointUsage is the host disk space a sandbox's checkpoints take.
type CheckpointUsage struct {
	// PerCheckpoint: the checkpoint's own files (RAM, devices, manifest)
	// plus the disk layers it froze, in allocated bytes.
	PerCheckpoint map[string]int64 `json:"per_checkpoint"`
	Checkpoints   int64            `json:"checkpoints_bytes"` // all checkpoints
	Spare         int64            `json:"spare_bytes"`       // the spare RAM file waiting for the next one
	Active        int64            `json:"active_bytes"`      // the disk layers the machine writes to now
	Total         int64            `json:"total_bytes"`       // the whole sandbox directory
}

// Usage measures the space the sandbox's checkpoints take on the host.
// Sizes are allocated blocks, so sparse RAM and disk files count for what
// they hold, not their length.
func (s *Sandbox) Usage() (*CheckpointUsage, error) {
	list, err := s.Checkpoints().List()
	if err != nil {
		return nil, err
	}
	u := &CheckpointUsage{PerCheckpoint: map[string]int64{}}
	for _, m := range list {
		n := AllocatedTree(s.Checkpoints().Path(m.ID))
		for _, d := range m.Disks {
			n += allocated(s.Path(d.Path))
		}
		u.PerCheckpoint[m.ID] = n
		u.Checkpoints += n
	}
	for _, p := range s.spareFiles() {
		u.Spare += allocated(p)
	}
	for _, d := range s.ActiveDisks() {
		u.Active += allocated(s.Path(d.Path))
	}
	u.Total = AllocatedTree(s.Dir)
	return u, nil
}

// allocated is the space a file takes on disk (0 if it is not there).
func allocated(path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return 0
	}
	return int64(st.Blocks) * 512
}

// AllocatedTree sums allocated over a directory tree, never following links.
func AllocatedTree(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n += allocated(p)
		}
		return nil
	})
	return n
}

// spareFiles lists a sandbox's spare RAM files.
func (sb *Sandbox) spareFiles() []string {
	m, _ := filepath.Glob(filepath.Join(sb.Path(checkpointsDir), checkpoint.SpareName+"*"))
	return m
}
