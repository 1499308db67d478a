package agent

import (
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/netpolicy"
)

func TestEmbeddedPresets(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{ // name → the secret and header the issue names
		"claude":   "ANTHROPIC_API_KEY x-api-key api.anthropic.com",
		"codex":    "OPENAI_API_KEY Authorization api.openai.com",
		"gemini":   "GEMINI_API_KEY x-goog-api-key generativelanguage.googleapis.com",
		"opencode": "ANTHROPIC_API_KEY x-api-key api.anthropic.com",
		"aider":    "ANTHROPIC_API_KEY x-api-key api.anthropic.com",
	}
	if len(all) != len(want) {
		t.Fatalf("%d presets, want %d", len(all), len(want))
	}
	for _, p := range all {
		w, ok := want[p.Name]
		if !ok {
			t.Errorf("unexpected preset %s", p.Name)
			continue
		}
		s := p.Secrets[0]
		if got := s.Name + " " + s.Header + " " + s.Hosts[0]; got != w {
			t.Errorf("%s: first secret %q, want %q", p.Name, got, w)
		}
		for _, r := range p.Rules() {
			if _, err := netpolicy.ParseRule(r, netpolicy.ParseOptions{}); err != nil {
				t.Errorf("%s: rule %q: %v", p.Name, r, err)
			}
		}
		for _, c := range p.Home.Credentials {
			if !p.IsCredential(c) || !p.Keeps(c) {
				t.Errorf("%s: credential %s", p.Name, c)
			}
		}
	}
	c, err := Get("claude")
	if err != nil {
		t.Fatal(err)
	}
	if c.Secrets[1].Name != "CLAUDE_CODE_OAUTH_TOKEN" || c.Secrets[1].Format != "Bearer {value}" {
		t.Errorf("claude's OAuth secret: %+v", c.Secrets[1])
	}
	// Claude Code asks for Node 22 (engines.node), Debian 13 has 20: the
	// install brings Node 22 first.
	if got := c.InstallLine(); got != nodeInstall(22)+" && npm install -g --no-fund --no-audit @anthropic-ai/claude-code@latest" {
		t.Errorf("install line %q", got)
	}
	if _, err := Get("nope"); err == nil || !strings.Contains(err.Error(), "claude") {
		t.Errorf("unknown preset: %v", err)
	}
}

func TestAddCommand(t *testing.T) {
	for _, tc := range []struct {
		s    Secret
		want string
	}{
		{Secret{Name: "ANTHROPIC_API_KEY", Hosts: []string{"api.anthropic.com"}, Header: "x-api-key"},
			"kosa8 secret add ANTHROPIC_API_KEY --host api.anthropic.com --header x-api-key"},
		{Secret{Name: "OPENAI_API_KEY", Hosts: []string{"api.openai.com"}, Header: "Authorization", Format: "Bearer {value}"},
			"kosa8 secret add OPENAI_API_KEY --host api.openai.com --format 'Bearer {value}'"},
		{Secret{Name: "X", Hosts: []string{"a.test"}, Header: "x-key", Format: "Key {value}"},
			"kosa8 secret add X --host a.test --header x-key --format 'Key {value}'"},
	} {
		if got := tc.s.AddCommand(); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
}

const good = `
name = "x"
command = ["x"]
[install]
npm = "@scope/x"
version = "1.2.3"
[network]
api = ["api.x.test"]
[[secret]]
name = "X_KEY"
hosts = ["api.x.test"]
header = "x-api-key"
[home]
keep = [".x"]
credentials = [".x/auth.json"]
memory = ".x/AGENTS.md"
`

func TestParseRejects(t *testing.T) {
	if _, err := Parse([]byte(good)); err != nil {
		t.Fatalf("good preset: %v", err)
	}
	for name, tc := range map[string]struct{ old, new, want string }{
		"unknown key":          {`name = "x"`, "name = \"x\"\nshell = true", "unknown key"},
		"bad name":             {`name = "x"`, `name = "X Y"`, "preset name"},
		"no command":           {`command = ["x"]`, `command = []`, "command is empty"},
		"both installers":      {`npm = "@scope/x"`, "npm = \"@scope/x\"\npip = \"x\"", "both"},
		"shell in package":     {`npm = "@scope/x"`, `npm = "x; curl evil"`, "not a package name"},
		"shell in version":     {`version = "1.2.3"`, `version = "1 && rm -rf /"`, "install.version"},
		"wildcard api":         {`api = ["api.x.test"]`, `api = ["*.x.test"]`, "exact"},
		"secret off its api":   {`hosts = ["api.x.test"]`, `hosts = ["evil.test"]`, "network.api does not list"},
		"bad header":           {`header = "x-api-key"`, `header = "x api key"`, "not a header name"},
		"escaping home":        {`keep = [".x"]`, `keep = ["../.ssh"]`, "inside the home"},
		"absolute home":        {`memory = ".x/AGENTS.md"`, `memory = "/etc/passwd"`, "inside the home"},
		"credential unkept":    {`credentials = [".x/auth.json"]`, `credentials = [".y/auth.json"]`, "not under a home.keep"},
		"format without value": {`header = "x-api-key"`, "header = \"x-api-key\"\nformat = \"Bearer\"", "{value}"},
	} {
		t.Run(name, func(t *testing.T) {
			src := strings.Replace(good, tc.old, tc.new, 1)
			if src == good {
				t.Fatalf("case does not change the preset")
			}
			_, err := Parse([]byte(src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	all, _ := All()
	for _, p := range all {
		data, _ := presetFiles.ReadFile("presets/" + p.Name + ".toml")
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			return
		}
		// Whatever parses must be safe to put in a shell line and a policy.
		// (The Node install before it is kosa8's own text around a
		// validated number.)
		line := strings.TrimPrefix(p.InstallLine(), nodeInstall(p.Runtime.NodeMajor())+" && ")
		if strings.ContainsAny(line, ";|&`$\n") && p.Install.Pip == "" {
			t.Fatalf("install line %q", line)
		}
		for _, r := range p.Rules() {
			if _, err := netpolicy.ParseRule(r, netpolicy.ParseOptions{}); err != nil {
				t.Fatalf("rule %q: %v", r, err)
			}
		}
	})
}

// TestPresetRuntimes: each npm preset states its package's engines.node,
// and one asking for a newer Node than Debian's gets it installed first;
// a range kosa8 cannot read is refused.
func TestPresetRuntimes(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"claude": 22, "codex": 16, "gemini": 20}
	for _, p := range all {
		if n, ok := want[p.Name]; ok && p.Runtime.NodeMajor() != n {
			t.Errorf("%s: runtime node %q, want >=%d", p.Name, p.Runtime.Node, n)
		}
		line := p.InstallLine()
		if got := strings.Contains(line, "node-linux-$a@"); got != (p.Runtime.NodeMajor() > DebianNodeMajor) {
			t.Errorf("%s (node %q): Node installed: %v: %s", p.Name, p.Runtime.Node, got, line)
		}
	}
	for _, bad := range []string{"^22", ">=x", "22", ">=22 <24"} {
		p := strings.Replace(good, "[network]", "[runtime]\nnode = \""+bad+"\"\n\n[network]", 1)
		if _, err := Parse([]byte(p)); err == nil || !strings.Contains(err.Error(), "runtime node") {
			t.Errorf("runtime node %q: %v", bad, err)
		}
	}
}
