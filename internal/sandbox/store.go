// Package sandbox keeps sandboxes on the host: each has a state directory
// ($KOSA8_HOME/sandboxes/NAME) with its settings, disks, logs and the
// socket of its supervisor, the one process that owns its VM. This package
// is the directory alone: the supervisor is internal/supervisor, its API
// internal/api.
//
// # State directory
//
//	sandbox.json     Config, written at create
//	state.json       api.Status, written by the supervisor on every transition
//	supervisor.lock  flock held by the running supervisor (liveness)
//	api.sock         the supervisor's HTTP+JSON API (directory is 0700)
//	root.qcow2       root disk: a qcow2 overlay on the image's rootfs.ext4
//	workspace.img    the workspace's disk (ext4, raw), with a workspace
//	docker.img       the container engine's disk (ext4, raw), with --docker
//	disks/           layers over those made by checkpoints and starts
//	console.log      the guest's serial console (this boot)
//	supervisor.log   the supervisor's log (this boot)
//	fork.json        a fork's record (fork.go), with fork-output.log
//
// A sandbox appears under its name only once complete: it is assembled in a
// staging directory and renamed into place without replacing anything.
package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/secrets"
	"github.com/kosa8/kosa8/internal/vmm"
)

var (
	ErrExists   = errors.New("sandbox already exists")
	ErrNotFound = errors.New("no such sandbox")
	ErrRunning  = errors.New("sandbox is running")
)

// Manager finds, creates and removes sandboxes.
type Manager struct {
	Paths Paths
	// Disks makes the sandboxes' disk layers: the VMM's format, handed in
	// by the caller (qemu.Layers) as the supervisor's driver is.
	Disks vmm.DiskLayers
}

// Sandbox is one sandbox's directory and settings.
type Sandbox struct {
	Dir    string
	Config Config
	// Disks makes its disk layers (the Manager's); nil fails what needs
	// them (a checkpoint, a rewind, deleting a checkpoint) with a clear error.
	Disks vmm.DiskLayers
}

// DiskLayers is sb.Disks, or the error that says none were given.
func (sb *Sandbox) DiskLayers() (vmm.DiskLayers, error) {
	if sb.Disks == nil {
		return nil, errors.New("internal error: this sandbox was opened without a disk layer driver (sandbox.Manager.Disks)")
	}
	return sb.Disks, nil
}

func (m *Manager) dir(name string) string { return filepath.Join(m.Paths.SandboxesDir(), name) }

// Create makes a new, stopped sandbox on img.
func (m *Manager) Create(ctx context.Context, cfg Config, img *image.Image) (*Sandbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// A pin is resolved when it is given: at creation for the sandbox's
	// first rules.
	rules, err := ResolveRules(ctx, cfg.Network.Rules, cfg.Network.AllowBroad, nil)
	if err != nil {
		return nil, err
	}
	cfg.Network.Rules = rules
	root := m.Paths.SandboxesDir()
	if err := EnsureWritable(root); err != nil {
		return nil, err
	}
	final := m.dir(cfg.Name)
	if _, err := os.Lstat(final); err == nil {
		return nil, fmt.Errorf("%w: %s (pick another --name, or 'kosa8 rm %s')", ErrExists, cfg.Name, cfg.Name)
	}
	if m.Disks == nil {
		return nil, errors.New("internal error: sandbox.Manager has no disk layer driver (Disks)")
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
	cfg.ID = randomHex(16) // never the caller's: each sandbox is a new one
	cfg.Created = time.Now().UTC()
	cfg.ImageDir = img.Dir
	disk := filepath.Join(stage, RootDisk)
	if err := m.Disks.Create(ctx, disk, img.RootFS(), "raw", int64(cfg.DiskGiB)<<30); err != nil {
		return nil, fmt.Errorf("create root disk: %w", err)
	}
	if cfg.Workspace != nil {
		if err := createWorkspaceDisk(ctx, filepath.Join(stage, WorkspaceDisk), cfg.DiskGiB, cfg.UID, cfg.GID); err != nil {
			return nil, err
		}
	}
	if cfg.Docker != nil {
		if err := createDockerDisk(ctx, filepath.Join(stage, DockerDisk), cfg.Docker.DiskGiB); err != nil {
			return nil, err
		}
	}
	if err := WriteJSONAtomic(filepath.Join(stage, configFile), &cfg); err != nil {
		return nil, err
	}
	ph := map[string]string{}
	for _, name := range cfg.Secrets {
		ph[name] = secrets.NewPlaceholder()
	}
	if err := WriteJSONAtomic(filepath.Join(stage, placeholdersFile), ph); err != nil {
		return nil, err
	}
	if err := WriteJSONAtomic(filepath.Join(stage, stateFile), &api.Status{State: api.Created}); err != nil {
		return nil, err
	}
	if err := renameNoReplace(stage, final); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%w: %s (pick another --name, or 'kosa8 rm %s')", ErrExists, cfg.Name, cfg.Name)
		}
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	ok = true
	return &Sandbox{Dir: final, Config: cfg, Disks: m.Disks}, nil
}

// newStage makes the folder (0700) a new sandbox called name is built in,
// beside the others in root, after sweeping old ones a kill -9 left; the
// caller renames it into place (renameNoReplace) or removes it.
func newStage(root, name string) (string, error) {
	sweepStaging(root)
	stage, err := os.MkdirTemp(root, ".staging-"+name+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(stage, 0o700); err != nil {
		os.RemoveAll(stage)
		return "", err
	}
	return stage, nil
}

// sweepStaging removes staging and trash directories left by a kill -9,
// once they are old enough that no create or rm can still be using them.
func sweepStaging(root string) {
	for _, pat := range []string{".staging-*", ".trash-*"} {
		dirs, _ := filepath.Glob(filepath.Join(root, pat))
		for _, d := range dirs {
			if fi, err := os.Lstat(d); err == nil && time.Since(fi.ModTime()) > 10*time.Minute {
				os.RemoveAll(d)
			}
		}
	}
}

// Open finds a sandbox by name.
func (m *Manager) Open(name string) (*Sandbox, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	d := m.dir(name)
	var cfg Config
	if err := readJSON(filepath.Join(d, configFile), &cfg); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w named %q: 'kosa8 ls' lists them", ErrNotFound, name)
		}
		return nil, err
	}
	return &Sandbox{Dir: d, Config: cfg, Disks: m.Disks}, nil
}

// List returns every sandbox, by name.
func (m *Manager) List() ([]*Sandbox, error) {
	sbs, _, err := m.ListAll()
	return sbs, err
}

// ListAll returns every sandbox, by name, and the folders of the sandboxes
// folder that do not open as one (List skips those).
func (m *Manager) ListAll() ([]*Sandbox, []Broken, error) {
	entries, err := os.ReadDir(m.Paths.SandboxesDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var out []*Sandbox
	var broken []Broken
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		sb, err := m.Open(e.Name())
		if err != nil {
			broken = append(broken, Broken{Name: e.Name(), Dir: m.dir(e.Name()), Err: err})
			continue
		}
		out = append(out, sb)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Config.Name < out[j].Config.Name })
	return out, broken, nil
}

// Broken is a folder in the sandboxes folder that does not open as a
// sandbox (no readable sandbox.json): left by a crash in the middle of a
// removal, or by hand.
type Broken struct {
	Name string
	Dir  string
	Err  error
}

// RemoveBroken deletes a broken folder of ListAll's (renamed aside first, as
// Remove does); it refuses a sandbox that opens.
func (m *Manager) RemoveBroken(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if _, err := m.Open(name); err == nil {
		return fmt.Errorf("%s opens as a sandbox: 'kosa8 rm %s' removes it", name, name)
	}
	d := m.dir(name)
	if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
		return fmt.Errorf("%w named %q: 'kosa8 ls' lists them", ErrNotFound, name)
	}
	if supervisorAlive(d) {
		return fmt.Errorf("%w: %s (a supervisor still holds its folder)", ErrRunning, name)
	}
	trash := filepath.Join(m.Paths.SandboxesDir(), ".trash-"+name+"-"+randomHex(4))
	if err := os.Rename(d, trash); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return os.RemoveAll(trash)
}

// Status reads the sandbox's recorded state and checks it against its
// supervisor's lock: a sandbox recorded as up whose supervisor is gone has
// crashed, whatever the file says.
func (s *Sandbox) Status() api.Status {
	var st api.Status
	if err := readJSON(filepath.Join(s.Dir, stateFile), &st); err != nil {
		return api.Status{State: api.Crashed, Error: err.Error()}
	}
	alive := supervisorAlive(s.Dir)
	switch st.State {
	case api.Starting, api.Running, api.Stopping:
		if !alive {
			if st.Error == "" {
				st.Error = fmt.Sprintf("the supervisor (pid %d) exited without stopping the sandbox", st.SupervisorPID)
			}
			st.State = api.Crashed
		}
	default:
		if alive && st.State != api.Crashed {
			st.State = api.Running
		}
	}
	return st
}

// NeverStarted reports whether the sandbox's record says it was never
// started (as Create left it), whoever holds its supervisor's lock now:
// Status, asked by the supervisor that holds it, says running.
func (s *Sandbox) NeverStarted() bool {
	var st api.Status
	return readJSON(filepath.Join(s.Dir, stateFile), &st) == nil && st.State == api.Created
}

// Alive reports whether a supervisor runs for the sandbox.
func (s *Sandbox) Alive() bool { return supervisorAlive(s.Dir) }

// Path names a file in the sandbox's directory.
func (s *Sandbox) Path(name string) string { return filepath.Join(s.Dir, name) }

// Client returns a client for the API of the sandbox's supervisor.
// Its requests name the sandbox's identity (Identity, so one made before
// IDs were given is named too): a supervisor of another sandbox under the
// same name refuses them.
func (s *Sandbox) Client() *api.Client { return api.NewClient(s.Path(APISocket)).For(s.Identity()) }

// MachineID is the guest's /etc/machine-id: 32 hex digits made from the
// sandbox's identity (not the identity itself, which names it to the
// host's API), the same across its stops, starts and rewinds.
func (s *Sandbox) MachineID() string {
	sum := sha256.Sum256([]byte("kosa8 machine-id\x00" + s.Identity()))
	return hex.EncodeToString(sum[:16])
}

// Identity tells this sandbox from any other that had or will have its
// name: its ID, or for a sandbox made before IDs were given, the instant
// it was created.
func (s *Sandbox) Identity() string {
	if s.Config.ID != "" {
		return s.Config.ID
	}
	return "created-" + s.Config.Created.UTC().Format(time.RFC3339Nano)
}

// WriteStatus records st.
func (s *Sandbox) WriteStatus(st api.Status) error {
	return WriteJSONAtomic(filepath.Join(s.Dir, stateFile), &st)
}

// Remove deletes a stopped sandbox. The directory leaves its name at once
// (renamed aside), then is deleted.
func (m *Manager) Remove(name string) error {
	sb, err := m.Open(name)
	if err != nil {
		return err
	}
	if sb.Alive() {
		return fmt.Errorf("%w: %s (stop it first, or use 'kosa8 rm -f')", ErrRunning, name)
	}
	if err := m.CheckNoForks(name); err != nil {
		return err
	}
	trash := filepath.Join(m.Paths.SandboxesDir(), ".trash-"+name+"-"+randomHex(4))
	if err := os.Rename(sb.Dir, trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w named %q: removed meanwhile", ErrNotFound, name)
		}
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return os.RemoveAll(trash)
}

// CheckNoForks fails (ErrHasForks) when forks of the sandbox called
// name exist: their disks build on its layers, so it must stay.
func (m *Manager) CheckNoForks(name string) error {
	forks, err := m.ForksOf(name)
	if err != nil || len(forks) == 0 {
		return err
	}
	var names []string
	for _, f := range forks {
		names = append(names, f.Config.Name)
	}
	return fmt.Errorf("%s: %w (%s): remove them first ('kosa8 rm -f %s')", name, ErrHasForks, strings.Join(names, ", "), strings.Join(names, " "))
}

// WaitStopped waits for the supervisor to let go of the sandbox.
func (s *Sandbox) WaitStopped(ctx context.Context) error {
	for s.Alive() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s did not stop: %w", s.Config.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Kill ends the sandbox's supervisor (and with it QEMU) without a clean
// shutdown of the guest.
func (s *Sandbox) Kill() error {
	st := s.Status()
	if !s.Alive() || st.SupervisorPID <= 0 {
		return nil
	}
	if err := syscall.Kill(st.SupervisorPID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// SaveConfig records a changed Config of an existing sandbox.
func (s *Sandbox) SaveConfig() error {
	if err := s.Config.Validate(); err != nil {
		return err
	}
	return WriteJSONAtomic(filepath.Join(s.Dir, configFile), &s.Config)
}

// FailedDir holds the logs of sandboxes removed after a failure.
func (p Paths) FailedDir() string { return filepath.Join(p.Home, "failed") }

// KeepLogs moves a sandbox's console and supervisor logs to a directory of
// their own under FailedDir, before the sandbox is removed, and returns it:
// a failed boot of an ephemeral sandbox must keep its evidence.
func (m *Manager) KeepLogs(name string) (string, error) {
	sb, err := m.Open(name)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(m.Paths.FailedDir(), name+"-"+time.Now().UTC().Format("20060102T150405"))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("keep logs: %w", err)
	}
	kept := 0
	for _, f := range []string{ConsoleLog + ".1", ConsoleLog, SupervisorLog, stateFile, configFile} {
		src := sb.Path(f)
		if f == configFile || f == stateFile {
			// Small, and still needed by the sandbox until it is removed.
			b, err := os.ReadFile(src)
			if err == nil && os.WriteFile(filepath.Join(dir, f), b, 0o600) == nil {
				kept++
			}
			continue
		}
		if err := os.Rename(src, filepath.Join(dir, f)); err == nil {
			kept++
		} else if !errors.Is(err, os.ErrNotExist) {
			return dir, fmt.Errorf("keep %s: %w", f, err)
		}
	}
	if kept == 0 {
		os.Remove(dir)
		return "", nil
	}
	return dir, nil
}

// WorkspaceOverlap finds another sandbox whose workspace is folder, or a
// folder above or below it, and that syncs it now (running, starting, or
// paused to resume). Two syncs of one folder would fight over its files.
// Forks do not count, and find none: their sync writes nothing to the
// host folder (review mode, always), so any number of them may read a
// folder beside the one sandbox that syncs it both ways; what they write
// is an 'apply', one at a time (the folder's apply lock).
func (m *Manager) WorkspaceOverlap(self, folder string) (*Sandbox, error) {
	if me, err := m.Open(self); err == nil && me.Config.Fork != nil {
		return nil, nil
	}
	list, err := m.List()
	if err != nil {
		return nil, err
	}
	for _, sb := range list {
		if sb.Config.Name == self || sb.Config.Workspace == nil || sb.Config.Fork != nil {
			continue
		}
		if !Overlaps(sb.Config.Workspace.Path, folder) {
			continue
		}
		if sb.Alive() || sb.Status().State == api.Paused {
			return sb, nil
		}
	}
	return nil, nil
}

// CheckFolderFree fails when another sandbox syncs folder, a folder above
// it or one inside it (WorkspaceOverlap), saying which and what to do.
// Every face's create asks it before anything is made.
func (m *Manager) CheckFolderFree(self, folder string) error {
	other, err := m.WorkspaceOverlap(self, folder)
	if err != nil || other == nil {
		return err
	}
	how := "is"
	if other.Config.Workspace.Path != folder {
		how = "overlaps " + other.Config.Workspace.Path + ", which is"
	}
	return fmt.Errorf("%s %s synced by sandbox %s (%s): stop it first ('kosa8 stop %s') or use another folder",
		folder, how, other.Config.Name, other.Status().State, other.Config.Name)
}

// Overlaps reports whether folders a and b are the same or one holds the
// other (both absolute and clean).
func Overlaps(a, b string) bool {
	a, b = filepath.Clean(a), filepath.Clean(b)
	if a == b {
		return true
	}
	within := func(in, out string) bool {
		return strings.HasPrefix(in, strings.TrimSuffix(out, string(filepath.Separator))+string(filepath.Separator))
	}
	return within(a, b) || within(b, a)
}
