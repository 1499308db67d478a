package project

import (
	"slices"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/secrets"
)

// Single values: the caller's over kosa8.toml's over the defaults; lists:
// the preset's, kosa8.toml's, then the caller's.
func TestResolveOrder(t *testing.T) {
	dir := t.TempDir()
	store, err := secrets.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"FROM_TOML", "FROM_CALLER"} {
		if err := store.Add(secrets.Secret{Name: n, Hosts: []string{"api.example.com"}, Header: "Authorization", Format: "Bearer {value}"}, []byte("v"), false); err != nil {
			t.Fatal(err)
		}
	}
	proj := &config.Project{}
	proj.Sandbox.CPUs, proj.Sandbox.Memory, proj.Sandbox.Disk = 3, "1G", "20G"
	proj.Sandbox.Env = []string{"A=toml", "B=toml"}
	proj.Network.Preset = "dev"
	proj.Network.Allow = []string{"toml.example.com"}
	proj.Network.Ports = []string{"3000"}
	proj.Secrets.Use = []string{"FROM_TOML"}
	proj.Workspace.Exclude = []string{"node_modules"}
	proj.Workspace.Hold = []string{"Makefile"}
	proj.Workspace.Review = true

	ws, err := folder.Resolve(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Resolve(Options{
		Name: "ordered", Workspace: ws, Memory: "2G",
		PresetAllow: []string{"preset.example.com"}, Allow: []string{"caller.example.com"}, Ports: []string{"8080:80"},
		Secrets: []string{"FROM_CALLER", "FROM_TOML"}, Exclude: []string{"target"},
		PresetEnv: []string{"A=preset"}, Env: []string{"B=caller"},
	}, proj, dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.CPUs != 3 || c.MemoryMiB != 2048 || c.DiskGiB != 20 {
		t.Errorf("sizes %d CPUs, %d MiB, %d GiB: want the toml's CPUs and disk, the caller's memory", c.CPUs, c.MemoryMiB, c.DiskGiB)
	}
	if got := strings.Join(c.Env, " "); got != "A=preset A=toml B=toml B=caller" {
		t.Errorf("env %q: the preset's, the toml's, the caller's (later wins)", got)
	}
	rules := c.Network.Rules
	pi, ti, ci := slices.Index(rules, "preset.example.com"), slices.Index(rules, "toml.example.com"), slices.Index(rules, "caller.example.com")
	if pi < 1 || ti != pi+1 || ci != ti+1 || ci != len(rules)-1 {
		t.Errorf("rules %v: the dev preset's, the agent preset's, the toml's, then the caller's", rules)
	}
	if len(c.Network.Ports) != 2 || c.Network.Ports[0].HostPort != 3000 || c.Network.Ports[1].GuestPort != 80 {
		t.Errorf("ports %v", c.Network.Ports)
	}
	if !slices.Equal(c.Secrets, []string{"FROM_TOML", "FROM_CALLER"}) {
		t.Errorf("secrets %v: each once, the toml's first", c.Secrets)
	}
	w := c.Workspace
	if w == nil || w.Path != ws.String() || !w.Review || !slices.Equal(w.Exclude, []string{"node_modules", "target"}) || !slices.Equal(w.Hold, []string{"Makefile"}) {
		t.Errorf("workspace %+v", w)
	}
}

func TestResolveDefaultsAndErrors(t *testing.T) {
	dir := t.TempDir()
	c, err := Resolve(Options{NameFrom: "/home/me/project"}, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.CPUs != sandbox.DefaultCPUs || c.MemoryMiB != sandbox.DefaultMemoryMiB || c.DiskGiB != sandbox.DefaultDiskGiB || c.Workspace != nil {
		t.Errorf("defaults: %+v", c)
	}
	if !strings.HasPrefix(c.Name, "project") {
		t.Errorf("default name %q, want one made from the folder", c.Name)
	}
	bad := &config.Project{}
	bad.Sandbox.Memory = "lots"
	for what, tc := range map[string]struct {
		o    Options
		proj *config.Project
		want string
	}{
		"a bad accel":           {Options{Accel: "xen"}, nil, "use kvm, hvf or tcg"},
		"a bad toml size":       {Options{}, bad, "kosa8.toml sandbox.memory"},
		"an unknown preset":     {Options{NetPreset: "everything"}, nil, "everything"},
		"a bad rule":            {Options{Allow: []string{"*"}}, nil, "*"},
		"a secret never stored": {Options{Secrets: []string{"NOT_STORED"}}, nil, "NOT_STORED"},
		"a port out of range":   {Options{Ports: []string{"70000"}}, nil, "70000"},
		"an invalid name":       {Options{Name: "no/slashes"}, nil, "name"},
	} {
		if _, err := Resolve(tc.o, tc.proj, dir); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", what, err, tc.want)
		}
	}
}

// TestResolveDocker: --docker (or kosa8.toml's docker = true) gives the
// sandbox an engine with its disk, and the registries' read-only rules
// ahead of the user's own (which can deny one of them); a disk size
// without the engine is an error, not ignored.
func TestResolveDocker(t *testing.T) {
	dir := t.TempDir()
	c, err := Resolve(Options{Name: "d", Docker: true, Allow: []string{"deny:quay.io"}}, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Docker == nil || c.Docker.DiskGiB != sandbox.DefaultDockerDiskGiB {
		t.Fatalf("docker: %+v", c.Docker)
	}
	for _, want := range []string{"read:registry-1.docker.io", "read:auth.docker.io", "read:ghcr.io", "read:quay.io"} {
		if !slices.Contains(c.Network.Rules, want) {
			t.Errorf("rule %s missing: %v", want, c.Network.Rules)
		}
	}
	if c.Network.Rules[len(c.Network.Rules)-1] != "deny:quay.io" {
		t.Errorf("the user's rule is not last: %v", c.Network.Rules)
	}
	proj := &config.Project{}
	proj.Sandbox.Docker, proj.Sandbox.DockerDisk = true, "8G"
	c, err = Resolve(Options{Name: "d"}, proj, dir)
	if err != nil || c.Docker == nil || c.Docker.DiskGiB != 8 {
		t.Fatalf("kosa8.toml docker: %+v %v", c.Docker, err)
	}
	c, err = Resolve(Options{Name: "d", DockerDisk: "20G"}, proj, dir)
	if err != nil || c.Docker.DiskGiB != 20 {
		t.Fatalf("--docker-disk over kosa8.toml: %+v %v", c.Docker, err)
	}
	c, err = Resolve(Options{Name: "d"}, nil, dir)
	if err != nil || c.Docker != nil || slices.Contains(c.Network.Rules, "read:ghcr.io") {
		t.Fatalf("without --docker: %+v %v %v", c.Docker, c.Network.Rules, err)
	}
	if _, err := Resolve(Options{Name: "d", DockerDisk: "20G"}, nil, dir); err == nil {
		t.Fatal("a docker disk size without docker was accepted")
	}
}
