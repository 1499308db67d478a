package sdk

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// State is where a sandbox is in its life.
type State string

const (
	Created  State = "created"  // never started
	Starting State = "starting" // booting
	Running  State = "running"
	Stopping State = "stopping"
	Stopped  State = "stopped"
	Crashed  State = "crashed" // its supervisor died without a clean stop; Start brings it back
	Paused   State = "paused"  // written out to a checkpoint; Resume continues it
)

// Info describes a sandbox.
type Info struct {
	Name string `json:"name"`
	// ID tells this sandbox from any other that had or will have its
	// name (one removed and made again under it is another sandbox).
	ID        string    `json:"id"`
	State     State     `json:"state"`
	Dir       string    `json:"dir"`                 // its state directory on the host
	Workspace string    `json:"workspace,omitempty"` // the host folder, if any
	CPUs      int       `json:"cpus"`
	MemoryMiB int       `json:"memory_mib"`
	DiskGiB   int       `json:"disk_gib"`
	Ephemeral bool      `json:"ephemeral,omitempty"`
	Created   time.Time `json:"created"`
	// Accel is the acceleration it runs (or last ran) under: kvm, hvf or
	// tcg. Under tcg it is slow and QEMU's emulator is a weaker boundary.
	Accel   string    `json:"accel,omitempty"`
	Started time.Time `json:"started,omitzero"`
	// Checkpoint is the checkpoint the machine descends from; for a paused
	// sandbox, the one Resume continues.
	Checkpoint string `json:"checkpoint,omitempty"`
	// Error says why it crashed or failed to start.
	Error string `json:"error,omitempty"`
	// Fork says where the sandbox was forked from (Sandbox.Fork); nil
	// when it is no fork.
	Fork *ForkOrigin `json:"fork,omitempty"`
}

func describe(sb *sandbox.Sandbox) Info {
	st := sb.Status()
	i := Info{
		Name: sb.Config.Name, ID: sb.Identity(), State: State(st.State), Dir: sb.Dir,
		CPUs: sb.Config.CPUs, MemoryMiB: sb.Config.MemoryMiB, DiskGiB: sb.Config.DiskGiB,
		Ephemeral: sb.Config.Ephemeral, Created: sb.Config.Created,
		Accel: st.Accel, Started: st.Started, Checkpoint: st.Checkpoint, Error: st.Error,
	}
	if sb.Config.Workspace != nil {
		i.Workspace = sb.Config.Workspace.Path
	}
	if o := sb.Config.Fork; o != nil {
		i.Fork = &ForkOrigin{Source: o.Source, Checkpoint: o.Checkpoint, Index: o.Index, Created: o.Created}
	}
	return i
}

// Sandbox is the handle of one sandbox. Its methods are safe to call from
// several goroutines; each asks the sandbox (or its state directory) anew.
type Sandbox struct {
	c  *Client
	sb *sandbox.Sandbox
}

// Name is the sandbox's name.
func (s *Sandbox) Name() string { return s.sb.Config.Name }

// Info describes the sandbox as it is now.
func (s *Sandbox) Info() Info { return describe(s.sb) }

// client is the supervisor's client, or ErrNotRunning.
func (s *Sandbox) client() (*api.Client, error) {
	if !s.sb.Alive() {
		st := s.sb.Status()
		msg := fmt.Sprintf("%s is %s: start it first", s.Name(), st.State)
		if st.State == api.Crashed && st.Error != "" {
			msg += " (" + st.Error + ")"
		}
		return nil, fmt.Errorf("%w: %s", ErrNotRunning, msg)
	}
	return s.sb.Client(), nil
}

// Start boots the sandbox and returns once its guest answers. A paused
// sandbox continues where it was, processes included. It fails with
// ErrRunning if the sandbox runs already.
func (s *Sandbox) Start(ctx context.Context) error {
	restore := ""
	if st := s.sb.Status(); st.State == api.Paused {
		restore = st.Checkpoint
	}
	return s.launch(ctx, restore, false)
}

// StartFrom boots the machine saved in a checkpoint (processes and memory
// included) in a stopped sandbox; its disks as they were are kept as a
// checkpoint first. This is how a sandbox comes back after a host reboot.
func (s *Sandbox) StartFrom(ctx context.Context, checkpointID string) error {
	if _, err := s.sb.Checkpoints().Load(checkpointID); err != nil {
		return fmt.Errorf("%w %q of %s", err, checkpointID, s.Name())
	}
	if s.sb.Alive() {
		return fmt.Errorf("%w: %s", ErrRunning, s.Name())
	}
	st := s.sb.Status()
	rewind := false
	if st.State != api.Paused || checkpointID != st.Checkpoint {
		if _, err := sandbox.SaveDisks(s.sb, "disks before start --from "+checkpointID); err != nil {
			return fmt.Errorf("keep %s's disks before starting it from %s: %w", s.Name(), checkpointID, err)
		}
		rewind = true
	}
	return s.launch(ctx, checkpointID, rewind)
}

func (s *Sandbox) launch(ctx context.Context, restore string, rewind bool) error {
	if ws := s.sb.Config.Workspace; ws != nil {
		// As the CLI's start: a sandbox whose folder another running one
		// syncs (above or below) would make a second sync of its files.
		if err := s.c.m.CheckFolderFree(s.sb.Config.Name, ws.Path); err != nil {
			return err
		}
	}
	bin, err := s.c.Binary()
	if err != nil {
		return err
	}
	agent, err := launch.AgentPath(bin, vmspec.Arch(s.sb.Config.Arch))
	if err != nil {
		return err
	}
	_, err = launch.Launch(ctx, s.sb, launch.LaunchOptions{Binary: bin, Agent: agent, Restore: restore, Rewind: rewind, Env: s.c.env()})
	if err != nil {
		return fmt.Errorf("start %s: %w", s.Name(), err)
	}
	return nil
}

// Stop powers the guest off cleanly and returns once the sandbox has
// stopped. Stopping a sandbox that is not running does nothing.
func (s *Sandbox) Stop(ctx context.Context) error { return s.stop(ctx, false) }

// Kill ends the sandbox's VM at once, without a clean poweroff.
func (s *Sandbox) Kill(ctx context.Context) error { return s.stop(ctx, true) }

func (s *Sandbox) stop(ctx context.Context, kill bool) error {
	if !s.sb.Alive() {
		return nil
	}
	err := s.sb.Client().Stop(ctx, kill)
	if err != nil && s.sb.Alive() {
		// The API may be gone with a wedged supervisor: end it.
		_ = s.sb.Kill()
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return s.sb.WaitStopped(wctx)
}

// Pause writes the running machine out to a checkpoint and frees its
// memory; Resume (or Start) continues it where it was.
func (s *Sandbox) Pause(ctx context.Context) error {
	client, err := s.client()
	if err != nil {
		return err
	}
	if err := client.Pause(ctx); err != nil {
		return &OpError{Op: "pause " + s.Name(), Err: err}
	}
	return s.sb.WaitStopped(ctx)
}

// Resume continues a paused sandbox (it is Start).
func (s *Sandbox) Resume(ctx context.Context) error { return s.Start(ctx) }

// GuestInfo is what a running guest reports about itself.
type GuestInfo struct {
	Kernel   string  `json:"kernel"` // uname -r
	Machine  string  `json:"machine"`
	Hostname string  `json:"hostname"`
	User     string  `json:"user"` // the sandbox's user
	UID      int     `json:"uid"`
	GID      int     `json:"gid"`
	Uptime   float64 `json:"uptime_seconds"`
	// AgentStartMillis is how long kosa8's agent took to start in the
	// guest.
	AgentStartMillis float64 `json:"agent_start_ms"`
}

// GuestInfo asks the running guest about itself.
func (s *Sandbox) GuestInfo(ctx context.Context) (*GuestInfo, error) {
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	i, err := client.Info(ctx)
	if err != nil {
		return nil, err
	}
	return &GuestInfo{Kernel: i.Kernel, Machine: i.Machine, Hostname: i.Hostname, User: i.User, UID: i.UID, GID: i.GID,
		Uptime: i.Uptime, AgentStartMillis: i.AgentStartMillis}, nil
}

// DumpMemory writes the running guest's RAM, as raw bytes, to w; the
// machine is paused while it is read, for a consistent image. It is for
// inspecting what the guest holds (it never holds a secret's value, only
// its placeholder) and is as large as the sandbox's memory.
func (s *Sandbox) DumpMemory(ctx context.Context, w io.Writer) error {
	client, err := s.client()
	if err != nil {
		return err
	}
	return client.Memory(ctx, w)
}
