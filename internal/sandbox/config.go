package sandbox

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/netpolicy"
)

// Config is a sandbox's settings, fixed at create (sandbox.json).
type Config struct {
	Version int `json:"version"`
	// ID is the sandbox's identity, random, given at create: a sandbox
	// removed and made again under the same name has another ("" in
	// sandboxes made before kosa8 gave them: see Sandbox.Identity).
	ID        string    `json:"id,omitempty"`
	Name      string    `json:"name"`
	Created   time.Time `json:"created"`
	Arch      string    `json:"arch"`
	CPUs      int       `json:"cpus"`
	MemoryMiB int       `json:"memory_mib"`
	DiskGiB   int       `json:"disk_gib"`
	// ImageDir is the image build the root disk's overlay sits on.
	ImageDir string `json:"image_dir"`
	// The guest's default user mirrors the host user's ids.
	User string `json:"user"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	// Accel forces an acceleration; empty picks the best available.
	Accel string `json:"accel,omitempty"`
	// Ephemeral sandboxes are removed when they stop (--rm).
	Ephemeral bool `json:"ephemeral,omitempty"`
	// Env is passed to every process in the guest (only what --env named).
	Env []string `json:"env,omitempty"`
	// Network is the allow-list and port forwards it was created with;
	// later changes live in network.json and ports.json.
	Network NetworkConfig `json:"network"`
	// NoHostCA keeps the host's own trusted roots out of the guest's
	// bundle (--no-host-ca).
	NoHostCA bool `json:"no_host_ca,omitempty"`
	// Secrets names the host secrets bound to the sandbox: the guest sees
	// placeholders, the broker injects the values.
	Secrets []string `json:"secrets,omitempty"`
	// Workspace is the synced host folder (nil: none).
	Workspace *WorkspaceConfig `json:"workspace,omitempty"`
	// Docker runs a container engine inside (nil: none; docker.go).
	Docker *DockerConfig `json:"docker,omitempty"`
	// CheckpointEvery takes a checkpoint at this interval while running.
	CheckpointEvery Duration `json:"checkpoint_every,omitempty"`
	// MaxCheckpoints bounds how many are kept (0: DefaultMaxCheckpoints).
	MaxCheckpoints int `json:"max_checkpoints,omitempty"`
	// Fork, when set, says this sandbox is a fork: it started from a
	// checkpoint of another sandbox, whose frozen disk layers its own
	// build on (fork.go).
	Fork *ForkOrigin `json:"fork,omitempty"`
	// WorkDir is where commands start when no workspace is attached (an
	// OCI image's WorkingDir; empty: the user's home).
	WorkDir string `json:"work_dir,omitempty"`
	// Shell is the login shell (empty: /bin/bash; NoShell: the image has
	// none).
	Shell string `json:"shell,omitempty"`
}

// NoShell as Config.Shell: the image has no shell.
const NoShell = "none"

// LoginShell is the command of an interactive login shell in the guest.
func (c *Config) LoginShell() ([]string, error) {
	switch c.Shell {
	case "":
		return []string{"/bin/bash", "-l"}, nil
	case NoShell:
		return nil, fmt.Errorf("the sandbox's image has no shell: give the command to run ('-- /path/to/program ARGS')")
	}
	return []string{c.Shell, "-l"}, nil
}

// Duration is a time.Duration that reads and writes as "10m".
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Duration(d).String() + `"`), nil
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "" || s == "0" {
		*d = 0
		return nil
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

const configVersion = 1

// Defaults for a new sandbox.
const (
	DefaultCPUs      = 2
	DefaultMemoryMiB = 1024
	DefaultDiskGiB   = 16
)

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// ValidateName checks a sandbox name: it names a directory and, lowered,
// the guest's hostname.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("invalid sandbox name %q: use 1–63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Hostname derives the guest's hostname from a sandbox name.
func Hostname(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	h := strings.Trim(b.String(), "-")
	if h == "" {
		h = "kosa8"
	}
	return h
}

// Validate checks the resource settings.
func (c *Config) Validate() error {
	if err := ValidateName(c.Name); err != nil {
		return err
	}
	if c.CPUs < 1 || c.CPUs > 64 {
		return fmt.Errorf("--cpus %d is out of range: use 1 to 64", c.CPUs)
	}
	if c.MemoryMiB < 256 || c.MemoryMiB > 256<<10 {
		return fmt.Errorf("--memory %dM is out of range: use 256M to 256G", c.MemoryMiB)
	}
	if c.DiskGiB < 2 || c.DiskGiB > 4096 {
		return fmt.Errorf("--disk %dG is out of range: use 2G to 4T", c.DiskGiB)
	}
	if c.Docker != nil && (c.Docker.DiskGiB < 2 || c.Docker.DiskGiB > 4096) {
		return fmt.Errorf("--docker-disk %dG is out of range: use 2G to 4T", c.Docker.DiskGiB)
	}
	if _, err := netpolicy.Parse(c.Network.Rules, netpolicy.ParseOptions{AllowBroad: c.Network.AllowBroad}); err != nil {
		return err
	}
	seen := map[uint16]bool{}
	for _, p := range c.Network.Ports {
		if p.HostPort == 0 || p.GuestPort == 0 || seen[p.HostPort] {
			return fmt.Errorf("port forward %s: host ports must be set and distinct", p)
		}
		seen[p.HostPort] = true
	}
	for _, e := range c.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsAny(e, "\x00") {
			return fmt.Errorf("--env %q: use KEY=VALUE", e)
		}
	}
	if c.WorkDir != "" && (!strings.HasPrefix(c.WorkDir, "/") || strings.ContainsRune(c.WorkDir, 0)) {
		return fmt.Errorf("working directory %q is not an absolute path", c.WorkDir)
	}
	if c.Shell != "" && c.Shell != NoShell && !strings.HasPrefix(c.Shell, "/") {
		return fmt.Errorf("shell %q is not an absolute path", c.Shell)
	}
	return nil
}

// ParseSize reads sizes like 512M, 2G, 1.5G, 2048 (MiB when bare) into MiB.
func ParseSize(s string) (int, error) {
	orig := s
	s = strings.TrimSpace(strings.ToUpper(s))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "B"), "I")
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "T"):
		mult, s = 1<<20, strings.TrimSuffix(s, "T")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<10, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		s = strings.TrimSuffix(s, "M")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) || v*mult > 1<<40 {
		return 0, fmt.Errorf("invalid size %q: use a number with M, G or T, like 2G", orig)
	}
	return int(v * mult), nil
}
