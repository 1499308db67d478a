package sdk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/project"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// Errors to test with errors.Is.
var (
	ErrNotFound   = sandbox.ErrNotFound // no sandbox of that name
	ErrExists     = sandbox.ErrExists   // the name is taken
	ErrRunning    = sandbox.ErrRunning  // it must be stopped first
	ErrNotRunning = errors.New("sandbox is not running")
	ErrHasForks   = sandbox.ErrHasForks // forks build on it: remove them first
)

// OpError is a call on a running sandbox that its supervisor refused or
// failed: Op names the call and the sandbox ("checkpoint dev", "rewind dev
// to 1a2b3c4d", "exec in dev"), Err is the reason as the supervisor (or
// for Exec the guest, or the broken stream) gave it, which errors.Is and
// errors.As see through to. Checkpoint, Rewind, Pause and Exec return it.
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

// Client finds, creates and starts sandboxes in one state directory.
type Client struct {
	paths  sandbox.Paths
	m      *sandbox.Manager
	binary string
}

// Option configures a Client.
type Option func(*Client)

// WithHome keeps sandboxes in dir instead of $KOSA8_HOME (and, for
// secrets and trust records, dir/config instead of $KOSA8_CONFIG).
func WithHome(dir string) Option {
	return func(c *Client) {
		c.paths.Home = dir
		c.paths.Config = filepath.Join(dir, "config")
	}
}

// WithBinary names the kosa8 executable that starts supervisors.
func WithBinary(path string) Option {
	return func(c *Client) { c.binary = path }
}

// New returns a client for the state directories the kosa8 command uses.
func New(opts ...Option) (*Client, error) {
	p, err := sandbox.DefaultPaths()
	if err != nil {
		return nil, err
	}
	c := &Client{paths: p}
	for _, o := range opts {
		o(c)
	}
	for _, d := range []string{c.paths.Home, c.paths.Cache, c.paths.Config} {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("kosa8 directory %q is not absolute", d)
		}
	}
	c.m = &sandbox.Manager{Paths: c.paths, Disks: qemu.Layers{}}
	return c, nil
}

// Home is the state directory the client keeps sandboxes in.
func (c *Client) Home() string { return c.paths.Home }

// Binary finds the kosa8 executable: the one given with WithBinary, else
// kosa8 next to the running program, else kosa8 on $PATH.
func (c *Client) Binary() (string, error) {
	if c.binary != "" {
		if _, err := os.Stat(c.binary); err != nil {
			return "", fmt.Errorf("kosa8 binary %s: %w", c.binary, err)
		}
		return c.binary, nil
	}
	if self, err := os.Executable(); err == nil {
		if self, err = filepath.EvalSymlinks(self); err == nil {
			p := filepath.Join(filepath.Dir(self), "kosa8")
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				return p, nil
			}
		}
	}
	p, err := exec.LookPath("kosa8")
	if err != nil {
		return "", errors.New("kosa8 not found next to this program nor on PATH: install it ('make build' puts it in bin/) or use sdk.WithBinary")
	}
	return filepath.Abs(p)
}

// env is the supervisor's environment: the caller's, with the client's
// directories, so that a supervisor finds the sandbox this client made.
func (c *Client) env() []string {
	env := slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, "KOSA8_HOME=") || strings.HasPrefix(e, "KOSA8_CACHE=") || strings.HasPrefix(e, "KOSA8_CONFIG=")
	})
	return append(env, "KOSA8_HOME="+c.paths.Home, "KOSA8_CACHE="+c.paths.Cache, "KOSA8_CONFIG="+c.paths.Config)
}

// Open returns the sandbox called name.
func (c *Client) Open(name string) (*Sandbox, error) {
	sb, err := c.m.Open(name)
	if err != nil {
		return nil, err
	}
	return &Sandbox{c: c, sb: sb}, nil
}

// List describes every sandbox, by name.
func (c *Client) List(ctx context.Context) ([]Info, error) {
	list, err := c.m.List()
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(list))
	for _, sb := range list {
		out = append(out, describe(sb))
	}
	return out, nil
}

// ForFolder lists the sandboxes whose workspace is the folder name
// (running ones first). Links in name are resolved before its "..", as
// the file system reads it.
func (c *Client) ForFolder(ctx context.Context, name string) ([]Info, error) {
	f, err := folder.Resolve(name)
	if err != nil {
		return nil, err
	}
	abs := f.String()
	all, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, i := range all {
		if i.Workspace == abs {
			out = append(out, i)
		}
	}
	slices.SortStableFunc(out, func(a, b Info) int {
		ra, rb := a.State == Running, b.State == Running
		switch {
		case ra && !rb:
			return -1
		case rb && !ra:
			return 1
		}
		return 0
	})
	return out, nil
}

// Remove deletes a sandbox and everything it holds. A running sandbox is
// refused (ErrRunning) unless force, which ends it first.
func (c *Client) Remove(ctx context.Context, name string, force bool) error {
	sb, err := c.Open(name)
	if err != nil {
		return err
	}
	if err := c.m.CheckNoForks(name); err != nil {
		return err // before anything stops: its forks' disks build on it
	}
	if sb.sb.Alive() {
		if !force {
			return fmt.Errorf("%w: %s (stop it first, or remove with force)", ErrRunning, name)
		}
		if err := sb.stop(ctx, true); err != nil {
			return err
		}
	}
	err = c.m.Remove(name)
	if errors.Is(err, sandbox.ErrNotFound) && sb.sb.Config.Ephemeral {
		return nil // an ephemeral sandbox removes itself when it stops
	}
	return err
}

// CreateOptions describe a new sandbox. The zero value is a sandbox with
// the defaults (2 CPUs, 1 GiB of memory, a 16 GiB disk, no workspace, no
// network). A trusted kosa8.toml in the workspace folder (see `kosa8
// trust`) supplies defaults under these options, as for `kosa8 create`.
type CreateOptions struct {
	// Name is the sandbox's name: letters, digits, '.', '_' and '-'.
	// Default: the workspace folder's name and a random suffix.
	Name string
	// Workspace is the host folder the sandbox works in, copied in and
	// synced both ways while it runs; empty for none. Your home directory
	// or / is refused unless Force.
	Workspace string
	Force     bool
	// Review holds the sandbox's changes until they are applied (`kosa8
	// apply`); Exclude names paths (names or globs) that stay inside.
	Review  bool
	Exclude []string

	CPUs   int    // virtual CPUs (default 2)
	Memory string // guest memory, e.g. "4G" (default 1G)
	Disk   string // root disk size, e.g. "32G" (default 16G)

	// Allow lists network rules (see the package doc); Preset names a
	// preset ("dev": package registries and code hosts, read-only);
	// AllowBroad accepts rules matching a whole public suffix or all.
	Allow      []string
	Preset     string
	AllowBroad bool
	// Ports forwards host ports: "3000" or "8080:80" (HOST:GUEST), on
	// 127.0.0.1.
	Ports []string
	// Secrets binds host secrets by name (`kosa8 secret add`): the guest
	// sees NAME=<placeholder>, the broker adds the value on the way out.
	Secrets []string
	// Env is KEY=VALUE entries set for every command in the guest.
	Env []string

	// Ephemeral removes the sandbox when it stops.
	Ephemeral bool
	// Accel forces "kvm", "hvf" or "tcg" (default: $KOSA8_ACCEL, else the
	// best that works).
	Accel string
	// Arch is the guest's architecture, "amd64" or "arm64" (default:
	// $KOSA8_ARCH, else the host's); another than the host's is emulated
	// and needs its image ('kosa8 setup --arch arm64').
	Arch string
	// CheckpointEvery takes a checkpoint at this interval while running;
	// MaxCheckpoints keeps at most this many (default 20).
	CheckpointEvery time.Duration
	MaxCheckpoints  int
}

// config turns o, over a trusted kosa8.toml in the workspace, into a
// sandbox's settings.
func (c *Client) config(o CreateOptions) (sandbox.Config, error) {
	if o.Arch == "" {
		o.Arch = os.Getenv("KOSA8_ARCH")
	}
	arch, err := vmspec.ParseArch(o.Arch)
	if err != nil {
		return sandbox.Config{}, fmt.Errorf("Arch: %w", err)
	}
	if o.Accel == "" {
		o.Accel = os.Getenv("KOSA8_ACCEL")
	}
	po := project.Options{
		Name: o.Name, Arch: arch, Accel: o.Accel,
		CPUs: o.CPUs, Memory: o.Memory, Disk: o.Disk, Ephemeral: o.Ephemeral,
		Review: o.Review, Exclude: o.Exclude,
		NetPreset: o.Preset, Allow: o.Allow, AllowBroad: o.AllowBroad, Ports: o.Ports,
		Secrets: o.Secrets, Env: o.Env,
		CheckpointEvery: o.CheckpointEvery, MaxCheckpoints: o.MaxCheckpoints,
	}
	var proj *config.Project
	if o.Workspace != "" {
		if po.Workspace, err = sandbox.CheckWorkspace(o.Workspace, o.Force); err != nil {
			return sandbox.Config{}, err
		}
		po.NameFrom = po.Workspace.String()
		l, err := config.Load(po.Workspace, config.NewTrustStore(c.paths.Config))
		if err != nil {
			return sandbox.Config{}, err
		}
		proj = l.Project // nil when untrusted: then it sets nothing
	}
	return project.Resolve(po, proj, c.paths.Config)
}

// Create makes a stopped sandbox with the guest image that `kosa8 setup`
// built. The workspace folder is copied in at its first start.
func (c *Client) Create(ctx context.Context, o CreateOptions) (*Sandbox, error) {
	cfg, err := c.config(o)
	if err != nil {
		return nil, err
	}
	if cfg.Docker != nil {
		// Its engine comes in a derived image, which only the CLI builds
		// so far: a sandbox of the base image would fail at its start.
		return nil, errors.New("this folder's kosa8.toml asks for a container engine (docker = true), whose image only the CLI builds: create the sandbox with 'kosa8 create --docker', then open it by name")
	}
	if cfg.Workspace != nil {
		// As the CLI: two syncs of one folder would fight over its files.
		if err := c.m.CheckFolderFree(cfg.Name, cfg.Workspace.Path); err != nil {
			return nil, err
		}
	}
	img, err := image.Store{Dir: c.paths.Cache}.Lookup(image.DefaultRecipe(vmspec.Arch(cfg.Arch)))
	if err != nil {
		return nil, err
	}
	sb, err := c.m.Create(ctx, cfg, img)
	if err != nil {
		return nil, err
	}
	return &Sandbox{c: c, sb: sb}, nil
}
