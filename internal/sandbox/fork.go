package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
)

// Forks. A fork is a sandbox made of another's checkpoint: its machine
// starts as the checkpoint's (RAM, processes, devices), its disks are
// empty layers of its own over the checkpoint's frozen ones, which stay
// in the source's directory (they never change once frozen), and its
// workspace is in review mode whatever the source's is. It keeps of the
// source what the guest already holds: the secrets' placeholders, the
// sandbox CA (in the guest's roots, and in its running programs), the
// allow-list in force and the DNS names the guest may have cached. It has
// a name, an audit log, a network stack and a supervisor of its own.
//
// Because its disks build on the source's layers, the source cannot be
// removed while a fork of it exists, nor the checkpoint a fork started
// from deleted (ForksOf, HeldBy).
//
// Files of a fork, besides a sandbox's:
//
//	fork.json          ForkRecord: the forked command, its exit, the changes when it stopped
//	fork-output.log    the forked command's output (the guest's bytes: shown through termsafe)

// ForkOrigin is where a fork comes from (Config.Fork), fixed at its
// creation.
type ForkOrigin struct {
	Source     string    `json:"source"`     // the sandbox forked
	Checkpoint string    `json:"checkpoint"` // the source's checkpoint the fork started from
	Index      int       `json:"index"`      // its number among the source's forks: NAME is SOURCE.INDEX
	Created    time.Time `json:"created"`
}

// ForkRecord is what happened to a fork (fork.json): the command it was
// made to run and how it ended, and its changes as last seen.
type ForkRecord struct {
	Command []string `json:"command,omitempty"`
	// Restored is when its machine was first brought up from the
	// source's checkpoint; zero until then (its next start does it).
	Restored time.Time `json:"restored,omitzero"`
	// The command's run: started, ended with ExitCode, or Error when it
	// could not be run or followed to its end.
	Started  time.Time `json:"command_started,omitzero"`
	Ended    time.Time `json:"command_ended,omitzero"`
	ExitCode *int      `json:"exit_code,omitempty"`
	Error    string    `json:"command_error,omitempty"`
	// Changes is the fork's changes waiting for review, as last
	// summed up (when its command ended, and when it stopped).
	Changes *api.ChangeSummary `json:"changes,omitempty"`
}

// Files of a fork.
const (
	forkFile       = "fork.json"
	ForkOutputFile = "fork-output.log"
)

// The sandbox CA's files (internal/egress writes them; a fork copies
// them: its guest trusts that CA already).
var caFiles = []string{"ca.crt", "ca.key"}

// ForkName is the name of a sandbox's fork number index.
func ForkName(source string, index int) string { return fmt.Sprintf("%s.%d", source, index) }

// ForkRecord reads the sandbox's fork record (the zero record if none).
func (s *Sandbox) ForkRecord() (ForkRecord, error) {
	var r ForkRecord
	err := readJSON(s.Path(forkFile), &r)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return r, err
}

// UpdateForkRecord changes the fork record with f, under the edit lock
// (the supervisor and a CLI may both write it).
func (s *Sandbox) UpdateForkRecord(f func(*ForkRecord)) error {
	ef, err := openLock(s.Dir, editLockFile)
	if err != nil {
		return err
	}
	defer ef.Close()
	deadline := time.Now().Add(maxEditWait)
	if err := flockPolling(ef, syscall.LOCK_EX, func(int) bool { return time.Now().Before(deadline) }); err != nil {
		return err
	}
	r, err := s.ForkRecord()
	if err != nil {
		return err
	}
	f(&r)
	return WriteJSONAtomic(s.Path(forkFile), &r)
}

// SourceDir is the directory of a fork's source (its disks' lower layers
// live there); "" for a sandbox that is no fork.
func (s *Sandbox) SourceDir() string {
	if s.Config.Fork == nil {
		return ""
	}
	return filepath.Join(filepath.Dir(s.Dir), s.Config.Fork.Source)
}

// ForkCheckpoint is the source's checkpoint a fork starts from, with its
// files' directory.
func (s *Sandbox) ForkCheckpoint() (*checkpoint.Meta, string, error) {
	o := s.Config.Fork
	if o == nil {
		return nil, "", errors.New("not a fork")
	}
	store := checkpoint.Store{Dir: filepath.Join(s.SourceDir(), checkpointsDir)}
	m, err := store.Load(o.Checkpoint)
	if err != nil {
		return nil, "", fmt.Errorf("checkpoint %s of %s, which %s was forked from: %w", o.Checkpoint, o.Source, s.Config.Name, err)
	}
	return m, store.Path(m.ID), nil
}

// SourceLayers are a fork's checkpoint's frozen disk layers, by absolute
// path (in the source's directory).
func (s *Sandbox) SourceLayers(m *checkpoint.Meta) map[string]checkpoint.Disk {
	out := map[string]checkpoint.Disk{}
	for id, d := range m.Disks {
		out[id] = checkpoint.Disk{Path: filepath.Join(s.SourceDir(), d.Path), Format: d.Format}
	}
	return out
}

// ForkOptions describe one fork to make.
type ForkOptions struct {
	Name    string   // default: ForkName(source, Index)
	Index   int      // its number among the source's forks
	Command []string // run in it once it is up (the supervisor does)
}

// CreateFork makes a stopped fork of src from its checkpoint cp, all or
// nothing: it is assembled in a staging directory and renamed into place,
// so a fork that was not finished (a kill -9) is never listed. Its first
// start brings up cp's machine.
func (m *Manager) CreateFork(ctx context.Context, src *Sandbox, cp *checkpoint.Meta, o ForkOptions) (*Sandbox, error) {
	if cp.DisksOnly {
		return nil, fmt.Errorf("checkpoint %s holds disks only, no machine to fork", cp.ID)
	}
	if o.Name == "" {
		o.Name = ForkName(src.Config.Name, o.Index)
	}
	cfg := src.Config
	cfg.Name = o.Name
	cfg.Ephemeral = false
	cfg.Env = slices.Clone(src.Config.Env)
	cfg.Secrets = slices.Clone(src.Config.Secrets)
	cfg.Network.Rules = slices.Clone(src.Config.Network.Rules)
	cfg.Network.Ports = nil // the host ports are the source's
	if src.Config.Workspace != nil {
		ws := *src.Config.Workspace
		ws.Review = true // nothing reaches the host folder until applied
		ws.Exclude, ws.Hold = slices.Clone(ws.Exclude), slices.Clone(ws.Hold)
		cfg.Workspace = &ws
	}
	cfg.Fork = &ForkOrigin{Source: src.Config.Name, Checkpoint: cp.ID, Index: o.Index, Created: time.Now().UTC()}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m.Disks == nil {
		return nil, errors.New("internal error: sandbox.Manager has no disk layer driver (Disks)")
	}
	root := m.Paths.SandboxesDir()
	final := m.dir(cfg.Name)
	if _, err := os.Lstat(final); err == nil {
		return nil, fmt.Errorf("%w: %s (pick another name, or 'kosa8 rm %s')", ErrExists, cfg.Name, cfg.Name)
	}
	stage, err := newStage(root, cfg.Name)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(stage)
		}
	}()
	cfg.Version = configVersion
	cfg.Created = time.Now().UTC()
	cfg.ID = randomHex(16) // a sandbox of its own: its own machine-id, its own API identity
	fork := &Sandbox{Dir: stage, Config: cfg, Disks: m.Disks}
	// What the guest holds of the source already: its placeholders, the
	// CA it trusts, the names it may have cached, the rules in force.
	for _, f := range append([]string{placeholdersFile, policyFile, NamesFile}, caFiles...) {
		if err := copyStateFile(src.Path(f), fork.Path(f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("copy %s of %s: %w", f, src.Config.Name, err)
		}
	}
	layers, err := fork.NewOverlays(forkLayers(src, cp), checkpoint.NewID())
	if err != nil {
		return nil, fmt.Errorf("disk layers over checkpoint %s: %w", cp.ID, err)
	}
	if err := fork.SaveActiveDisks(layers); err != nil {
		return nil, err
	}
	if err := WriteJSONAtomic(fork.Path(configFile), &cfg); err != nil {
		return nil, err
	}
	if err := WriteJSONAtomic(fork.Path(forkFile), &ForkRecord{Command: o.Command}); err != nil {
		return nil, err
	}
	if err := WriteJSONAtomic(fork.Path(stateFile), &api.Status{State: api.Created}); err != nil {
		return nil, err
	}
	if err := renameNoReplace(stage, final); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%w: %s (pick another name, or 'kosa8 rm %s')", ErrExists, cfg.Name, cfg.Name)
		}
		return nil, fmt.Errorf("create fork: %w", err)
	}
	ok = true
	fork.Dir = final
	return fork, nil
}

// forkLayers are cp's frozen layers by absolute path in src's directory.
func forkLayers(src *Sandbox, cp *checkpoint.Meta) map[string]checkpoint.Disk {
	out := map[string]checkpoint.Disk{}
	for id, d := range cp.Disks {
		out[id] = checkpoint.Disk{Path: src.Path(d.Path), Format: d.Format}
	}
	return out
}

// copyStateFile copies a state file from src to a new file dst (at most
// 64 MiB: the largest is the DNS name map, which is capped), never through
// a link at either end, keeping its permission bits (0644 at most).
func copyStateFile(src, dst string) error {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, fi.Mode().Perm()&0o644)
	if err != nil {
		return err
	}
	// Bounded: the largest of these is the DNS name map (capped).
	if _, err := io.Copy(out, io.LimitReader(in, 64<<20)); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ForksOf lists the forks of the sandbox called name (by name): the
// sandboxes whose disks build on its layers.
func (m *Manager) ForksOf(name string) ([]*Sandbox, error) {
	return forksIn(m.Paths.SandboxesDir(), name, "")
}

// forksIn lists the sandboxes in dir forked from source (from its
// checkpoint cp, when cp is set).
func forksIn(dir, source, cp string) ([]*Sandbox, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Sandbox
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || !strings.HasPrefix(e.Name(), source+".") {
			continue // forks are named SOURCE.N, or chosen names: those are read below
		}
		if sb, ok := forkOf(dir, e.Name(), source, cp); ok {
			out = append(out, sb)
		}
	}
	// Forks under names of their own (ForkOptions.Name): read every other
	// sandbox's settings too. Few sandboxes exist; correctness first.
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || strings.HasPrefix(e.Name(), source+".") || e.Name() == source {
			continue
		}
		if sb, ok := forkOf(dir, e.Name(), source, cp); ok {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b *Sandbox) int {
		if d := a.Config.Fork.Index - b.Config.Fork.Index; d != 0 {
			return d
		}
		return strings.Compare(a.Config.Name, b.Config.Name)
	})
	return out, nil
}

func forkOf(dir, name, source, cp string) (*Sandbox, bool) {
	var cfg Config
	if err := readJSON(filepath.Join(dir, name, configFile), &cfg); err != nil || cfg.Fork == nil || cfg.Fork.Source != source {
		return nil, false
	}
	if cp != "" && cfg.Fork.Checkpoint != cp {
		return nil, false
	}
	return &Sandbox{Dir: filepath.Join(dir, name), Config: cfg}, true
}

// HeldBy lists the forks started from the sandbox's checkpoint id: their
// disks build on its layers, so it must stay.
func (s *Sandbox) HeldBy(id string) []string {
	forks, _ := forksIn(filepath.Dir(s.Dir), s.Config.Name, id)
	var names []string
	for _, f := range forks {
		names = append(names, f.Config.Name)
	}
	return names
}

// ErrHasForks: the sandbox, or its checkpoint, is what forks build on.
var ErrHasForks = errors.New("forks build on it")

// checkNotHeld fails when forks started from checkpoint id.
func (s *Sandbox) checkNotHeld(id string) error {
	if held := s.HeldBy(id); len(held) > 0 {
		return fmt.Errorf("checkpoint %s of %s: %w (%s): remove them first ('kosa8 rm %s')", id, s.Config.Name, ErrHasForks,
			strings.Join(held, ", "), strings.Join(held, " "))
	}
	return nil
}

// NextForkIndex is the first fork number of name that no sandbox (fork or
// not) uses yet, nor any number above it.
func (m *Manager) NextForkIndex(name string) (int, error) {
	entries, err := os.ReadDir(m.Paths.SandboxesDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	next := 1
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), name+".")
		if !ok {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(rest, "%d", &n); err == nil && fmt.Sprint(n) == rest && n >= next {
			next = n + 1
		}
	}
	return next, nil
}

// What a fork is counted at when deciding how many fit: at its start it
// holds a copy of the RAM its source had in use (in shared memory), plus
// QEMU's own memory, its translation cache under TCG and its supervisor
// (about 150 MiB measured, see docs/forks.md); its disk layers start
// empty and it is given forkDisk to write before the disk counts as full.
const (
	forkOverhead = 192 << 20
	forkDisk     = 256 << 20
	forkKeepDisk = 1 << 30 // kept free on the disk, whatever the forks
)

// hostRoom and diskFree measure the host (tests replace them).
var (
	hostRoom = checkpoint.HostRoom
	diskFree = checkpoint.FreeBytes
)

// ErrForkRoom: the forks asked for do not fit in the host's memory or disk.
var ErrForkRoom = errors.New("not enough room")

// CheckForkRoom fails, saying how many fit, when count forks of a machine
// with ramInUse bytes of RAM in use do not fit on this host beside what
// it must keep free; withCheckpoint counts the checkpoint they start from
// (not taken yet) on the disk of dir.
func CheckForkRoom(dir string, count int, ramInUse int64, withCheckpoint bool) error {
	room, err := hostRoom()
	if err != nil {
		return err
	}
	free, err := diskFree(dir)
	if err != nil {
		return err
	}
	var fixed checkpoint.Need
	if withCheckpoint {
		fixed.Disk = ramInUse
	}
	each := checkpoint.Need{Mem: ramInUse + forkOverhead, Shm: ramInUse, Disk: forkDisk}
	n, why := checkpoint.Fit(room, fixed, each, free, forkKeepDisk)
	if count <= n {
		return nil
	}
	fits := fmt.Sprintf("%d fit", n)
	switch n {
	case 0:
		fits = "none fits"
	case 1:
		fits = "1 fits"
	}
	return fmt.Errorf("%w for %d forks on this host: %s (%s); fork fewer, or free memory or disk", ErrForkRoom, count, fits, why)
}
