package sdk

import (
	"context"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
)

// Checkpoint is a saved machine: memory, devices, disks and the
// workspace's sync state. Its JSON is what `kosa8 checkpoint --json`
// prints.
type Checkpoint struct {
	// Version is the version of the checkpoint's on-disk format.
	Version int       `json:"version"`
	ID      string    `json:"id"`
	Parent  string    `json:"parent,omitempty"` // checkpoints form a tree
	Created time.Time `json:"created"`
	Message string    `json:"message,omitempty"`
	// Kind is manual, auto, pre-rewind (the state a rewind left), pause or
	// disks (a stopped machine's disks only).
	Kind string `json:"kind"`
	// DisksOnly: the disks without memory or device state; restoring it
	// boots from its disks.
	DisksOnly bool `json:"disks_only,omitempty"`
	// Current marks the checkpoint the machine now descends from.
	Current bool `json:"current,omitempty"`
	// QEMU is the version line of the QEMU build that saved it, and
	// Firmware the microvm firmware file it ran with (empty for QEMU's
	// own): another build or firmware cannot load its device state, so a
	// rewind to it boots from its disks (RewindResult.ColdBoot).
	QEMU     string `json:"qemu"`
	Firmware string `json:"qemu_firmware,omitempty"`
	// Arch is the guest's architecture (amd64, arm64) and MemoryMiB its
	// memory size.
	Arch      string `json:"arch"`
	MemoryMiB int    `json:"memory_mib"`
	// Disks maps a disk's id (root; ws, the workspace's) to the layer
	// frozen for it.
	Disks map[string]CheckpointDisk `json:"disks"`
	// RAMBytes is the guest memory stored and DeviceBytes the device
	// state; DiskBytes the host disk space the checkpoint holds (its files
	// and the disk layers it froze).
	RAMBytes    int64 `json:"ram_bytes"`
	DeviceBytes int64 `json:"device_bytes"`
	DiskBytes   int64 `json:"disk_bytes,omitempty"`
	// PauseMillis is how long the guest was paused; TotalMillis the whole
	// checkpoint. PauseSteps is where the pause went, in ms: stop, disks
	// (their snapshots), devices (their state), ram (its copy), resume.
	PauseMillis float64            `json:"pause_ms"`
	TotalMillis float64            `json:"total_ms"`
	PauseSteps  map[string]float64 `json:"pause_steps_ms,omitempty"`
	// Incremental: only the pages the guest wrote since the parent
	// (RAMCopiedBytes of them) were copied, over a copy of the parent's
	// memory; FullCopyReason says why a copy was full instead. Verify is
	// the verifier's finding ("ok", or the first page that differed) when
	// the sandbox was started with KOSA8_CHECKPOINT_VERIFY=1.
	Incremental    bool   `json:"incremental,omitempty"`
	RAMCopiedBytes int64  `json:"ram_copied_bytes,omitempty"`
	FullCopyReason string `json:"full_copy_reason,omitempty"`
	Verify         string `json:"verify,omitempty"`
	// RAMInStream: the RAM is in the device state (a checkpoint of a fork
	// whose memory is mapped copy-on-write from its source's checkpoint:
	// saved by QEMU's own migration, at its speed), not a file of its own.
	RAMInStream bool `json:"ram_in_stream,omitempty"`
}

// CheckpointDisk is one disk layer a checkpoint froze.
type CheckpointDisk struct {
	Path   string `json:"path"`   // relative to the sandbox's directory (Info.Dir)
	Format string `json:"format"` // qcow2 or raw
}

func fromMeta(m *checkpoint.Meta) Checkpoint {
	cp := Checkpoint{
		Version: m.Version, ID: m.ID, Parent: m.Parent, Created: m.Created, Message: m.Message, Kind: m.Kind, DisksOnly: m.DisksOnly,
		QEMU: m.QEMU, Firmware: m.Firmware, Arch: m.Arch, MemoryMiB: m.MemoryMiB,
		RAMBytes: m.RAMBytes, DeviceBytes: m.DeviceBytes, PauseMillis: m.PauseMillis, TotalMillis: m.TotalMillis,
		PauseSteps: m.PauseSteps, Incremental: m.Incremental, RAMCopiedBytes: m.RAMCopiedBytes, FullCopyReason: m.FullCopyReason, Verify: m.Verify,
		RAMInStream: m.RAMInStream,
	}
	// Never null: JSON Schema (the MCP tools' output) has an object here.
	cp.Disks = make(map[string]CheckpointDisk, len(m.Disks))
	for id, d := range m.Disks {
		cp.Disks[id] = CheckpointDisk{Path: d.Path, Format: d.Format}
	}
	return cp
}

// Checkpoint saves the running machine; message says what it is.
func (s *Sandbox) Checkpoint(ctx context.Context, message string) (*Checkpoint, error) {
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	m, err := client.Checkpoint(ctx, message)
	if err != nil {
		return nil, &OpError{Op: "checkpoint " + s.Name(), Err: err}
	}
	cp := fromMeta(m)
	cp.Current = true
	if u, err := s.sb.Usage(); err == nil {
		cp.DiskBytes = u.PerCheckpoint[cp.ID]
	}
	return &cp, nil
}

// Checkpoints lists the sandbox's checkpoints, oldest first (running or
// not).
func (s *Sandbox) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	list, err := s.sb.Checkpoints().List()
	if err != nil {
		return nil, err
	}
	u, err := s.sb.Usage()
	if err != nil {
		return nil, err
	}
	cur := s.sb.Status().Checkpoint
	out := make([]Checkpoint, 0, len(list))
	for _, m := range list {
		cp := fromMeta(m)
		cp.DiskBytes = u.PerCheckpoint[m.ID]
		cp.Current = m.ID == cur
		out = append(out, cp)
	}
	return out, nil
}

// DeleteCheckpoint removes a checkpoint (running or not).
func (s *Sandbox) DeleteCheckpoint(ctx context.Context, id string) error {
	if s.sb.Alive() {
		return s.sb.Client().DeleteCheckpoint(ctx, id)
	}
	return sandbox.DeleteCheckpoint(s.sb, id)
}

// RewindResult says what a rewind did. Its JSON is what `kosa8 rewind
// --json` prints.
type RewindResult struct {
	To string `json:"to"`
	// Saved is the state just before the rewind, kept as a checkpoint, so
	// the rewind can be undone by rewinding to it; nil (null) when it could
	// not be saved (Warning says why).
	Saved  *Checkpoint `json:"saved"`
	Millis float64     `json:"ms"` // until the restored machine ran
	// SavedMillis is until the state before was on disk too: its memory is
	// written out while the restored machine already runs.
	SavedMillis float64 `json:"saved_ms,omitempty"`
	Warning     string  `json:"warning,omitempty"`
	// ColdBoot: the checkpoint was saved by another QEMU build, so the
	// machine was booted from its disks (processes were not restored).
	ColdBoot bool `json:"cold_boot,omitempty"`
	// Conflicts are host-folder paths you changed since the checkpoint:
	// your version was kept, the sandbox's went to Copy.
	Conflicts []SyncConflict `json:"conflicts,omitempty"`
}

func fromRewind(r *api.RewindResult) *RewindResult {
	out := &RewindResult{To: r.To, Millis: r.Millis, SavedMillis: r.SavedMillis, Warning: r.Warning, ColdBoot: r.ColdBoot}
	if r.Saved != nil {
		saved := fromMeta(r.Saved)
		out.Saved = &saved
	}
	for _, c := range r.Conflicts {
		out.Conflicts = append(out.Conflicts, SyncConflict{Path: c.Path, Copy: c.Copy, Time: c.Time})
	}
	return out
}

// Rewind returns the running machine and its workspace to a checkpoint.
// Running commands come back as they were at the checkpoint; the network
// rules and secret bindings stay as they are now.
func (s *Sandbox) Rewind(ctx context.Context, id string) (*RewindResult, error) {
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	r, err := client.Rewind(ctx, id)
	if err != nil {
		return nil, &OpError{Op: "rewind " + s.Name() + " to " + id, Err: err}
	}
	return fromRewind(r), nil
}
