// Package project makes a new sandbox's settings from what its caller asks
// (the CLI's flags, the SDK's CreateOptions), the project's kosa8.toml and
// kosa8's defaults, in one place: later wins for single values (defaults,
// then kosa8.toml, then the caller), lists add up in the same order.
package project

import (
	"fmt"
	"slices"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/secrets"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// Options are what the caller asks of a new sandbox. Empty values leave
// kosa8.toml's or the default.
type Options struct {
	Name      string // "": sandbox.DefaultName of NameFrom
	NameFrom  string // the folder a default name is made from
	Arch      vmspec.Arch
	Accel     string // kvm, hvf or tcg; "": the best the host has
	CPUs      int
	Memory    string // "2G"; a bare number is MiB
	Disk      string
	Ephemeral bool

	// Workspace is the host folder, resolved and checked
	// (sandbox.CheckWorkspace, the only maker of a folder.Path that
	// checks it); the zero Path: none.
	Workspace folder.Path
	Review    bool
	Exclude   []string

	NetPreset string // a network preset: netpolicy.PresetNames
	// PresetAllow are an agent preset's rules, after the network preset's
	// and before kosa8.toml's: a deny in kosa8.toml must win over them
	// (an allow rule after a deny for the same target replaces it).
	PresetAllow []string
	Allow       []string // the caller's rules, after kosa8.toml's
	AllowBroad  bool
	Ports       []string // HOSTPORT[:GUESTPORT]
	PublishAll  bool     // ports listen on all host interfaces
	Secrets     []string // secret names, after kosa8.toml's; each must exist

	// PresetEnv is an agent preset's environment (before kosa8.toml's),
	// Env the caller's own KEY=VALUE entries (after it).
	PresetEnv []string
	Env       []string

	CheckpointEvery time.Duration
	MaxCheckpoints  int
	NoHostCA        bool

	// Docker runs a container engine inside, its disk DockerDisk large
	// ("": sandbox.DefaultDockerDiskGiB); kosa8.toml's docker = true too.
	Docker     bool
	DockerDisk string
}

// Resolve makes the settings of a new sandbox from o over proj (nil: no
// kosa8.toml, or an untrusted one) over the defaults. Secret names are
// checked against the store in configDir. The result is validated.
func Resolve(o Options, proj *config.Project, configDir string) (sandbox.Config, error) {
	if proj == nil {
		proj = &config.Project{}
	}
	c := sandbox.Config{
		Name: o.Name, Arch: string(o.Arch),
		CPUs: sandbox.DefaultCPUs, MemoryMiB: sandbox.DefaultMemoryMiB, DiskGiB: sandbox.DefaultDiskGiB,
		Ephemeral: o.Ephemeral, Accel: o.Accel, NoHostCA: o.NoHostCA,
	}
	if c.Arch == "" {
		c.Arch = string(vmspec.HostArch())
	}
	c.User, c.UID, c.GID = sandbox.GuestUser()
	switch vmm.Accel(c.Accel) {
	case "", vmm.KVM, vmm.HVF, vmm.TCG:
	default:
		return c, fmt.Errorf("accel %q: use kvm, hvf or tcg", c.Accel)
	}

	// Sizes: kosa8.toml's, then the caller's.
	for _, s := range []struct {
		what string
		cpus int
		mem  string
		disk string
	}{
		{"kosa8.toml sandbox.", proj.Sandbox.CPUs, proj.Sandbox.Memory, proj.Sandbox.Disk},
		{"", o.CPUs, o.Memory, o.Disk},
	} {
		if s.cpus != 0 {
			c.CPUs = s.cpus
		}
		if s.mem != "" {
			mib, err := sandbox.ParseSize(s.mem)
			if err != nil {
				return c, fmt.Errorf("%smemory: %w", s.what, err)
			}
			c.MemoryMiB = mib
		}
		if s.disk != "" {
			mib, err := sandbox.ParseSize(s.disk)
			if err != nil {
				return c, fmt.Errorf("%sdisk: %w", s.what, err)
			}
			c.DiskGiB = (mib + 1023) >> 10
		}
	}

	if o.Docker || proj.Sandbox.Docker {
		c.Docker = &sandbox.DockerConfig{DiskGiB: sandbox.DefaultDockerDiskGiB}
		for _, s := range []struct{ what, size string }{
			{"kosa8.toml sandbox.docker_disk", proj.Sandbox.DockerDisk}, {"--docker-disk", o.DockerDisk},
		} {
			if s.size == "" {
				continue
			}
			mib, err := sandbox.ParseSize(s.size)
			if err != nil {
				return c, fmt.Errorf("%s: %w", s.what, err)
			}
			c.Docker.DiskGiB = (mib + 1023) >> 10
		}
	} else if o.DockerDisk != "" || proj.Sandbox.DockerDisk != "" {
		return c, fmt.Errorf("a docker disk size needs --docker (or docker = true in kosa8.toml's [sandbox])")
	}

	if !o.Workspace.IsZero() {
		c.Workspace = &sandbox.WorkspaceConfig{
			Path:    o.Workspace.String(),
			Review:  o.Review || proj.Workspace.Review,
			Exclude: concat(proj.Workspace.Exclude, o.Exclude),
			Hold:    slices.Clone(proj.Workspace.Hold),
		}
	}

	preset := o.NetPreset
	if preset == "" {
		preset = proj.Network.Preset
	}
	if preset != "" {
		p, err := netpolicy.Preset(preset)
		if err != nil {
			return c, err
		}
		for _, r := range p.Rules {
			c.Network.Rules = append(c.Network.Rules, r.Text)
		}
	}
	if c.Docker != nil {
		// The registries, read-only, before the user's rules (which may
		// deny one of them).
		p, err := netpolicy.Preset("docker")
		if err != nil {
			return c, err
		}
		for _, r := range p.Rules {
			if !slices.Contains(c.Network.Rules, r.Text) {
				c.Network.Rules = append(c.Network.Rules, r.Text)
			}
		}
	}
	for _, a := range concat(concat(o.PresetAllow, proj.Network.Allow), o.Allow) {
		r, err := netpolicy.ParseRule(a, netpolicy.ParseOptions{AllowBroad: o.AllowBroad})
		if err != nil {
			return c, err
		}
		c.Network.Rules = append(c.Network.Rules, r.Text)
	}
	c.Network.AllowBroad = o.AllowBroad
	for _, p := range concat(proj.Network.Ports, o.Ports) {
		pf, err := api.ParsePortForward(p, o.PublishAll)
		if err != nil {
			return c, err
		}
		c.Network.Ports = append(c.Network.Ports, pf)
	}

	if names := concat(proj.Secrets.Use, o.Secrets); len(names) > 0 {
		store, err := secrets.Open(configDir)
		if err != nil {
			return c, err
		}
		for _, name := range names {
			if _, err := store.Describe(name); err != nil {
				return c, err
			}
			if !slices.Contains(c.Secrets, name) {
				c.Secrets = append(c.Secrets, name)
			}
		}
	}

	c.Env = concat(concat(o.PresetEnv, proj.Sandbox.Env), o.Env)
	c.CheckpointEvery, c.MaxCheckpoints = sandbox.Duration(o.CheckpointEvery), o.MaxCheckpoints
	if c.Name == "" {
		c.Name = sandbox.DefaultName(o.NameFrom)
	}
	return c, c.Validate()
}

// concat is a then b, in a new slice.
func concat(a, b []string) []string {
	return append(slices.Clone(a), b...)
}
