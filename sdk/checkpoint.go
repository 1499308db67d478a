package sdk

import (
	"context"
	"time"

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
)

// Checkpoint is a saved machine: memory, devices, disks and the
// workspace's sync state.
type Checkpoint struct {
	ID      string    `json:"id"`
	Parent  string    `json:"parent,omitempty"` // checkpoints form a tree
	Created time.Time `json:"created"`
	Message string    `json:"message,omitempty"`
	// Kind is manual, auto, pre-rewind (the state a rewind left), pause or
	// disks (a stopped machine's disks only).
	Kind      string `json:"kind"`
	DisksOnly bool   `json:"disks_only,omitempty"`
	// Current marks the checkpoint the machine now descends from.
	Current bool `json:"current,omitempty"`
	// RAMBytes is the guest memory stored; DiskBytes the host disk space
	// the checkpoint holds (its files and the disk layers it froze).
	RAMBytes  int64 `json:"ram_bytes"`
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// PauseMillis is how long the guest was paused; TotalMillis the whole
	// checkpoint.
	PauseMillis float64 `json:"pause_ms"`
	TotalMillis float64 `json:"total_ms"`
}

func fromMeta(m *checkpoint.Meta) Checkpoint {
	return Checkpoint{
		ID: m.ID, Parent: m.Parent, Created: m.Created, Message: m.Message, Kind: m.Kind, DisksOnly: m.DisksOnly,
		RAMBytes: m.RAMBytes, PauseMillis: m.PauseMillis, TotalMillis: m.TotalMillis,
	}
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

// RewindResult says what a rewind did.
type RewindResult struct {
	To string `json:"to"`
	// Saved is the state just before the rewind, kept as a checkpoint, so
	// the rewind can be undone by rewinding to it.
	Saved  *Checkpoint `json:"saved,omitempty"`
	Millis float64     `json:"ms"` // until the restored machine ran
	// Conflicts are host-folder paths you changed since the checkpoint:
	// your version was kept.
	Conflicts []string `json:"conflicts,omitempty"`
	// ColdBoot: the checkpoint was saved by another QEMU build, so the
	// machine was booted from its disks (processes were not restored).
	ColdBoot bool   `json:"cold_boot,omitempty"`
	Warning  string `json:"warning,omitempty"`
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
	out := &RewindResult{To: r.To, Millis: r.Millis, ColdBoot: r.ColdBoot, Warning: r.Warning}
	if r.Saved != nil {
		saved := fromMeta(r.Saved)
		out.Saved = &saved
	}
	for _, c := range r.Conflicts {
		out.Conflicts = append(out.Conflicts, c.Path)
	}
	return out, nil
}
