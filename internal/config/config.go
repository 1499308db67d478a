// Package config reads kosa8.toml, a project's sandbox settings, and keeps
// the record of which exact files the user trusts. A cloned repository, or
// an agent inside a sandbox, can write kosa8.toml; it takes effect only
// after 'kosa8 trust' has approved its exact content.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/kosa8/kosa8/internal/folder"
)

// FileName is the project file kosa8 looks for in the current folder.
const FileName = "kosa8.toml"

// maxFile bounds kosa8.toml: it comes from a repository.
const maxFile = 256 << 10

// Project is kosa8.toml.
type Project struct {
	Sandbox   Sandbox   `toml:"sandbox"`
	Network   Network   `toml:"network"`
	Secrets   Secrets   `toml:"secrets"`
	Workspace Workspace `toml:"workspace"`
	Image     Image     `toml:"image"`
	Agent     Agent     `toml:"agent"`
}

// Image is the [image] table: what the project's derived image adds to the
// base image. It is built once per distinct recipe, inside a sandbox that
// reaches only the package sources.
type Image struct {
	// From is an OCI image the project's sandboxes boot: a registry
	// reference, or a path (relative to kosa8.toml's folder) of an OCI
	// layout or a docker/podman save tarball. Empty: kosa8's base.
	From     string   `toml:"from"`
	Packages []string `toml:"packages"` // Debian packages
	Setup    []string `toml:"setup"`    // shell lines run once, as root, while the image is built
}

// Agent is the [agent] table.
type Agent struct {
	Preset string `toml:"preset"` // an agent preset: 'kosa8 agents' lists them
}

// Workspace is the [workspace] table.
type Workspace struct {
	Exclude []string `toml:"exclude"` // names or globs that stay inside the sandbox
	Review  bool     `toml:"review"`  // nothing reaches the host until kosa8 apply
	Hold    []string `toml:"hold"`    // more files held for approval
}

// Secrets is the [secrets] table: host secrets the sandbox is bound to.
type Secrets struct {
	Use []string `toml:"use"`
}

// Network is the [network] table: what the sandbox may reach.
type Network struct {
	Preset string   `toml:"preset"`
	Allow  []string `toml:"allow"`
	Ports  []string `toml:"ports"`
}

// Sandbox is the [sandbox] table: defaults for create and run.
type Sandbox struct {
	CPUs   int      `toml:"cpus"`
	Memory string   `toml:"memory"`
	Disk   string   `toml:"disk"`
	Env    []string `toml:"env"`
	// Docker runs a container engine inside the sandbox (--docker);
	// DockerDisk sizes its disk (--docker-disk).
	Docker     bool   `toml:"docker"`
	DockerDisk string `toml:"docker_disk"`
}

// Parse decodes kosa8.toml strictly: an unknown key is an error that names
// the key and its line.
func Parse(data []byte) (*Project, error) {
	if len(data) > maxFile {
		return nil, fmt.Errorf("%s is larger than %d KiB", FileName, maxFile>>10)
	}
	var p Project
	d := toml.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			var msgs []string
			for _, e := range sm.Errors {
				row, _ := e.Position()
				msgs = append(msgs, fmt.Sprintf("%s line %d: unknown key %q", FileName, row, strings.Join(e.Key(), ".")))
			}
			return nil, errors.New(strings.Join(msgs, "\n"))
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, fmt.Errorf("%s line %d column %d: %s", FileName, row, col, de.Error())
		}
		return nil, fmt.Errorf("%s: %w", FileName, err)
	}
	return &p, nil
}

// Settings lists what p sets, one "key = value" per line, for messages.
func (p *Project) Settings() []string {
	var out []string
	s := p.Sandbox
	if s.CPUs != 0 {
		out = append(out, fmt.Sprintf("sandbox.cpus = %d", s.CPUs))
	}
	if s.Memory != "" {
		out = append(out, "sandbox.memory = "+s.Memory)
	}
	if s.Disk != "" {
		out = append(out, "sandbox.disk = "+s.Disk)
	}
	for _, e := range s.Env {
		k, _, _ := strings.Cut(e, "=")
		out = append(out, "sandbox.env: "+k)
	}
	if s.Docker {
		out = append(out, "sandbox.docker = true")
	}
	if s.DockerDisk != "" {
		out = append(out, "sandbox.docker_disk = "+s.DockerDisk)
	}
	if p.Network.Preset != "" {
		out = append(out, "network.preset = "+p.Network.Preset)
	}
	for _, a := range p.Network.Allow {
		out = append(out, "network.allow: "+a)
	}
	for _, a := range p.Network.Ports {
		out = append(out, "network.ports: "+a)
	}
	for _, a := range p.Secrets.Use {
		out = append(out, "secrets.use: "+a)
	}
	for _, a := range p.Workspace.Exclude {
		out = append(out, "workspace.exclude: "+a)
	}
	if p.Workspace.Review {
		out = append(out, "workspace.review = true")
	}
	for _, a := range p.Workspace.Hold {
		out = append(out, "workspace.hold: "+a)
	}
	if p.Image.From != "" {
		out = append(out, "image.from = "+p.Image.From)
	}
	for _, a := range p.Image.Packages {
		out = append(out, "image.packages: "+a)
	}
	for _, a := range p.Image.Setup {
		out = append(out, "image.setup: "+a)
	}
	if p.Agent.Preset != "" {
		out = append(out, "agent.preset = "+p.Agent.Preset)
	}
	return out
}

// Hash is the identity of a file's exact content.
func Hash(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// TrustStore records approved kosa8.toml contents by absolute path.
type TrustStore struct{ Path string }

// NewTrustStore keeps its record in the kosa8 config directory.
func NewTrustStore(configDir string) TrustStore {
	return TrustStore{Path: filepath.Join(configDir, "trusted.json")}
}

func (t TrustStore) load() (map[string]string, error) {
	m := map[string]string{}
	b, err := os.ReadFile(t.Path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("trust record %s is damaged (%v): remove it and run 'kosa8 trust' again", t.Path, err)
	}
	return m, nil
}

// Trust records data as the approved content of file.
func (t TrustStore) Trust(file string, data []byte) error {
	m, err := t.load()
	if err != nil {
		return err
	}
	m[file] = Hash(data)
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := os.MkdirAll(filepath.Dir(t.Path), 0o700); err != nil {
		return err
	}
	tmp := t.Path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, t.Path)
}

// Trusted reports whether data is the approved content of file.
func (t TrustStore) Trusted(file string, data []byte) (bool, error) {
	m, err := t.load()
	if err != nil {
		return false, err
	}
	return m[file] == Hash(data), nil
}

// Loaded is the outcome of looking for kosa8.toml.
type Loaded struct {
	Path    string   // where it was found, "" if none
	Project *Project // nil unless present, valid and trusted
	// Untrusted is set when the file exists but its content is not
	// approved; it lists what the file would set.
	Untrusted []string
}

// Load reads dir/kosa8.toml and applies the trust rule. A file that does
// not parse is an error even when untrusted: the user should hear about it.
// dir is resolved (folder.Resolve), so a file is trusted and read under
// one path only, whichever link or ".." named its folder.
func Load(dir folder.Path, trust TrustStore) (*Loaded, error) {
	p := filepath.Join(dir.String(), FileName)
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return &Loaded{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, err
	}
	proj, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir.String(), err)
	}
	ok, err := trust.Trusted(p, data)
	if err != nil {
		return nil, err
	}
	if !ok {
		s := proj.Settings()
		sort.Strings(s)
		return &Loaded{Path: p, Untrusted: s}, nil
	}
	return &Loaded{Path: p, Project: proj}, nil
}
