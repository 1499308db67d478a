package sdk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
)

// ForkOption tunes Sandbox.Fork.
type ForkOption func(*forkOptions)

type forkOptions struct {
	command    []string
	checkpoint string
	message    string
	progress   func(ForkEvent)
}

// ForkCommand runs args in each fork once it is up, as Exec would (the
// sandbox's user, in the workspace folder), detached from the caller: the
// fork's supervisor runs it, keeps its output and records its exit status
// (ForkStatus).
func ForkCommand(args ...string) ForkOption {
	return func(o *forkOptions) { o.command = slices.Clone(args) }
}

// ForkFrom forks the machine saved in one of the sandbox's checkpoints
// (an id) instead of its running machine; the sandbox may then be stopped.
func ForkFrom(checkpointID string) ForkOption {
	return func(o *forkOptions) { o.checkpoint = checkpointID }
}

// ForkMessage is the message of the checkpoint the forks start from.
func ForkMessage(m string) ForkOption {
	return func(o *forkOptions) { o.message = m }
}

// ForkProgress is told how the fork goes: the checkpoint, then each fork
// made and running.
func ForkProgress(f func(ForkEvent)) ForkOption {
	return func(o *forkOptions) { o.progress = f }
}

// ForkEvent is a step of a fork: Step is "checkpoint" (Checkpoint set),
// "created" or "running" (Sandbox set, Millis since the fork began), or
// "failed" (Sandbox and Err set).
type ForkEvent struct {
	Step       string
	Sandbox    string
	Checkpoint *Checkpoint
	Millis     float64
	Err        error
}

// Fork makes n sandboxes from the running sandbox's machine, named
// NAME.1, NAME.2, … (numbers past those in use), and starts them: one
// checkpoint of the sandbox, whose pause is all the sandbox pays, then n
// starts from it, each with RAM, processes and disks as they were at the
// checkpoint. Each fork is a sandbox of its own: disk layers over the
// checkpoint's (which stay in the source's directory: the source cannot be
// removed, nor that checkpoint deleted, while a fork of it exists), its
// own name, network stack and audit log, a new machine id and boot id,
// the RNG reseeded; it keeps the source's allow-list, secret bindings
// (the same placeholders, injected by its own broker) and sandbox CA. Its
// workspace is in review mode whatever the source's is: nothing reaches
// the host folder until ApplyChanges, so forks of one folder are compared
// (ForkStatus, Changes) and one is applied. The source keeps running.
//
// How many fit is checked first, against the host's free memory and
// disk: asking for more fails with the number that fits, before anything
// is made. Forks that were made but failed to start are removed (their
// logs kept, named in the error); the others are returned with the error.
func (s *Sandbox) Fork(ctx context.Context, n int, opts ...ForkOption) ([]*Sandbox, error) {
	var o forkOptions
	for _, f := range opts {
		f(&o)
	}
	tell := func(e ForkEvent) {
		if o.progress != nil {
			o.progress(e)
		}
	}
	if n < 1 || n > 64 {
		return nil, fmt.Errorf("fork %s into %d: use 1 to 64", s.Name(), n)
	}
	t0 := time.Now()
	m := s.c.m
	first, err := m.NextForkIndex(s.Name())
	if err != nil {
		return nil, err
	}
	names := make([]string, n)
	for i := range names {
		names[i] = sandbox.ForkName(s.Name(), first+i)
		if err := sandbox.ValidateName(names[i]); err != nil {
			return nil, fmt.Errorf("fork %s: its forks' names would be too long (%w)", s.Name(), err)
		}
	}
	var cp *checkpoint.Meta
	if o.checkpoint != "" {
		if cp, err = s.sb.Checkpoints().Load(o.checkpoint); err != nil {
			return nil, fmt.Errorf("%w %q of %s", err, o.checkpoint, s.Name())
		}
		if cp.DisksOnly {
			return nil, fmt.Errorf("checkpoint %s of %s holds disks only: no machine to fork", cp.ID, s.Name())
		}
		if err := sandbox.CheckForkRoom(s.sb.Dir, n, cp.RAMBytes, false); err != nil {
			return nil, fmt.Errorf("fork %s: %w", s.Name(), err)
		}
	} else {
		client, err := s.client()
		if err != nil {
			return nil, fmt.Errorf("fork %s: %w (or fork one of its checkpoints: ForkFrom)", s.Name(), err)
		}
		if cp, err = client.Fork(ctx, n, o.message); err != nil {
			return nil, &OpError{Op: "fork " + s.Name(), Err: err}
		}
	}
	c := fromMeta(cp)
	tell(ForkEvent{Step: "checkpoint", Checkpoint: &c, Millis: msSince(t0)})
	var forks []*Sandbox
	for i, name := range names {
		sb, err := m.CreateFork(ctx, s.sb, cp, sandbox.ForkOptions{Name: name, Index: first + i, Command: o.command})
		if err != nil {
			// Those made are complete sandboxes: removed, as nothing runs in them.
			for _, f := range forks {
				_ = m.Remove(f.Name())
			}
			return nil, fmt.Errorf("fork %s: %w", s.Name(), err)
		}
		forks = append(forks, &Sandbox{c: s.c, sb: sb})
		tell(ForkEvent{Step: "created", Sandbox: name, Millis: msSince(t0)})
	}
	// All started at once: each restores the same checkpoint.
	errs := make([]error, len(forks))
	var wg sync.WaitGroup
	for i, f := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.Start(ctx); err != nil {
				errs[i] = err
				tell(ForkEvent{Step: "failed", Sandbox: f.Name(), Err: err, Millis: msSince(t0)})
				return
			}
			tell(ForkEvent{Step: "running", Sandbox: f.Name(), Millis: msSince(t0)})
		}()
	}
	wg.Wait()
	var started []*Sandbox
	var failed []error
	for i, f := range forks {
		if errs[i] == nil {
			started = append(started, f)
			continue
		}
		// Nothing of it is worth keeping but its logs.
		msg := errs[i].Error()
		if dir, kerr := m.KeepLogs(f.Name()); kerr == nil && dir != "" {
			msg += " (its logs are kept in " + dir + ")"
		}
		if f.sb.Alive() {
			_ = f.Kill(context.WithoutCancel(ctx))
		}
		_ = m.Remove(f.Name())
		failed = append(failed, fmt.Errorf("%s removed: %s", f.Name(), msg))
	}
	if len(failed) > 0 {
		return started, fmt.Errorf("fork %s: %d of %d forks failed to start: %w", s.Name(), len(failed), n, errors.Join(failed...))
	}
	return started, nil
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// ForkOrigin says which sandbox, and which of its checkpoints, a fork was
// made from.
type ForkOrigin struct {
	Source     string    `json:"source"`
	Checkpoint string    `json:"checkpoint"`
	Index      int       `json:"index"` // the fork is SOURCE.INDEX
	Created    time.Time `json:"created"`
}

// ForkStatus is one fork as ForkStatus and Client.Forks report it: where it
// came from, its state, the command it was made to run and how that
// ended, and what it changed.
type ForkStatus struct {
	Name   string     `json:"name"`
	Origin ForkOrigin `json:"fork"`
	State  State      `json:"state"`
	// Command is what it was made to run (none: empty); Started and
	// Ended its run, ExitCode its exit status once it ended, or Error why
	// it could not be run or followed to its end.
	Command  []string  `json:"command,omitempty"`
	Started  time.Time `json:"command_started,omitzero"`
	Ended    time.Time `json:"command_ended,omitzero"`
	ExitCode *int      `json:"exit_code,omitempty"`
	Error    string    `json:"command_error,omitempty"`
	// Output is the file on the host with the command's output (the
	// guest's bytes, as they came: not for a terminal unfiltered).
	Output string `json:"output,omitempty"`
	// Changes are its changes waiting for review: asked of a running
	// fork now (Live), else as recorded when its command ended or it
	// last stopped (nil if never).
	Changes *ChangeSummary `json:"changes,omitempty"`
	// Pending counts the changes a stopped fork left for review.
	Pending int `json:"pending,omitempty"`
	// RAMShared: its memory is mapped copy-on-write from the checkpoint
	// it was forked from, shared with the other forks until each writes
	// its pages (QEMU 8.2 and later); its own checkpoints then save its
	// RAM in their device state, at QEMU's migration speed.
	RAMShared bool `json:"ram_shared,omitempty"`
}

// ChangeSummary sums up a sandbox's changes waiting for review or
// approval: per path, the lines added and removed against the host
// folder's version (text files up to 1 MiB).
type ChangeSummary struct {
	Files   []FileChange `json:"files"`
	Added   int          `json:"added"`
	Removed int          `json:"removed"`
	Taken   time.Time    `json:"taken"`
	Live    bool         `json:"live"` // asked of the running sandbox now, not a record
}

// FileChange is one changed path of a ChangeSummary.
type FileChange struct {
	Path    string `json:"path"`
	Kind    string `json:"kind"`           // added, modified, deleted
	Held    string `json:"held,omitempty"` // held for approval: why
	Added   int    `json:"added"`
	Removed int    `json:"removed"`
	Note    string `json:"note,omitempty"` // why lines were not counted (binary, too large, a link), or counted as sets
}

func fromSummary(s *api.ChangeSummary, live bool) *ChangeSummary {
	if s == nil {
		return nil
	}
	out := &ChangeSummary{Files: []FileChange{}, Added: s.Added, Removed: s.Removed, Taken: s.Taken, Live: live}
	for _, f := range s.Files {
		out.Files = append(out.Files, FileChange(f))
	}
	return out
}

// Changes sums up the running sandbox's changes waiting for review or
// approval, with the lines each adds and removes.
func (s *Sandbox) Changes(ctx context.Context) (*ChangeSummary, error) {
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	sum, err := client.ChangeSummary(ctx)
	if err != nil {
		return nil, &OpError{Op: "changes of " + s.Name(), Err: err}
	}
	return fromSummary(sum, true), nil
}

// Origin says where the sandbox was forked from; nil when it is no fork.
func (s *Sandbox) Origin() *ForkOrigin {
	o := s.sb.Config.Fork
	if o == nil {
		return nil
	}
	return &ForkOrigin{Source: o.Source, Checkpoint: o.Checkpoint, Index: o.Index, Created: o.Created}
}

// ForkStatus reports the fork: its command and changes (asked of it now
// when it runs). It fails for a sandbox that is no fork.
func (s *Sandbox) ForkStatus(ctx context.Context) (*ForkStatus, error) {
	origin := s.Origin()
	if origin == nil {
		return nil, fmt.Errorf("%s is not a fork", s.Name())
	}
	rec, err := s.sb.ForkRecord()
	if err != nil {
		return nil, err
	}
	st := s.sb.Status()
	fs := &ForkStatus{Name: s.Name(), Origin: *origin, State: State(st.State), Command: rec.Command,
		Started: rec.Started, Ended: rec.Ended, ExitCode: rec.ExitCode, Error: rec.Error, Pending: st.Pending}
	if st.State == api.Running {
		fs.RAMShared = st.RAMShared
	}
	if _, err := os.Lstat(s.sb.Path(sandbox.ForkOutputFile)); err == nil {
		fs.Output = s.sb.Path(sandbox.ForkOutputFile)
	}
	fs.Changes = fromSummary(rec.Changes, false)
	if s.sb.Alive() && s.sb.Config.Workspace != nil {
		if live, err := s.Changes(ctx); err == nil {
			fs.Changes = live
		}
	}
	return fs, nil
}

// Forks reports the forks of the sandbox called source, by number.
func (c *Client) Forks(ctx context.Context, source string) ([]ForkStatus, error) {
	list, err := c.m.ForksOf(source)
	if err != nil {
		return nil, err
	}
	out := []ForkStatus{}
	for _, sb := range list {
		f, err := c.Open(sb.Config.Name)
		if err != nil {
			continue // removed meanwhile
		}
		st, err := f.ForkStatus(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, *st)
	}
	return out, nil
}
