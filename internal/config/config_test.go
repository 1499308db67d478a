package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/folder"
)

func TestParse(t *testing.T) {
	p, err := Parse([]byte("[sandbox]\ncpus = 4\nmemory = \"2G\"\nenv = [\"A=b\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Sandbox.CPUs != 4 || p.Sandbox.Memory != "2G" || len(p.Sandbox.Env) != 1 {
		t.Fatalf("parsed %+v", p)
	}
}

func TestParseErrors(t *testing.T) {
	cases := map[string]struct{ in, want string }{
		"unknown key":   {"[sandbox]\ncpus = 2\nmemroy = \"1G\"\n", `line 3: unknown key "sandbox.memroy"`},
		"unknown table": {"\n[sandbx]\ncpus = 2\n", `line 2: unknown key "sandbx"`},
		"wrong type":    {"[sandbox]\ncpus = \"two\"\n", "line 2"},
		"syntax":        {"[sandbox\n", "line 1"},
		"too large":     {strings.Repeat("#", maxFile+1), "larger than"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestTrust(t *testing.T) {
	dir := mustFolder(t, t.TempDir())
	ts := NewTrustStore(filepath.Join(t.TempDir(), "cfg"))
	file := filepath.Join(dir.String(), FileName)

	l, err := Load(dir, ts)
	if err != nil || l.Path != "" || l.Project != nil {
		t.Fatalf("no file: %+v %v", l, err)
	}
	content := []byte("[sandbox]\ncpus = 3\n")
	if err := os.WriteFile(file, content, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = Load(dir, ts)
	if err != nil || l.Project != nil || len(l.Untrusted) != 1 || l.Untrusted[0] != "sandbox.cpus = 3" {
		t.Fatalf("untrusted file applied or not reported: %+v %v", l, err)
	}
	if err := ts.Trust(file, content); err != nil {
		t.Fatal(err)
	}
	l, err = Load(dir, ts)
	if err != nil || l.Project == nil || l.Project.Sandbox.CPUs != 3 {
		t.Fatalf("trusted file not applied: %+v %v", l, err)
	}
	// One changed byte: ignored again until trusted again.
	if err := os.WriteFile(file, []byte("[sandbox]\ncpus = 8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = Load(dir, ts)
	if err != nil || l.Project != nil || l.Untrusted[0] != "sandbox.cpus = 8" {
		t.Fatalf("changed file applied: %+v %v", l, err)
	}
	if fi, err := os.Stat(ts.Path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("trust record mode: %v %v", fi.Mode(), err)
	}
}

func TestLoadRejectsNonRegular(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, FileName), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(mustFolder(t, dir), NewTrustStore(t.TempDir())); err == nil {
		t.Fatal("a directory named kosa8.toml was accepted")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("[sandbox]\ncpus = 2\n"))
	f.Add([]byte("[sandbox]\nenv = [\"A=1\", \"B=2\"]\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		_, _ = Parse(in) // must not panic or hang
	})
}

func TestParseImageAndAgent(t *testing.T) {
	p, err := Parse([]byte(`[image]
packages = ["golang", "build-essential"]
setup = ["npm install -g pnpm"]
[agent]
preset = "claude"
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Image.Packages) != 2 || p.Image.Setup[0] != "npm install -g pnpm" || p.Agent.Preset != "claude" {
		t.Fatalf("parsed %+v", p)
	}
	s := strings.Join(p.Settings(), "\n")
	for _, want := range []string{"image.packages: golang", "image.setup: npm install -g pnpm", "agent.preset = claude"} {
		if !strings.Contains(s, want) {
			t.Errorf("settings lack %q:\n%s", want, s)
		}
	}
	if _, err := Parse([]byte("[agent]\npreset = \"claude\"\nshell = true\n")); err == nil || !strings.Contains(err.Error(), `"agent.shell"`) {
		t.Errorf("unknown agent key: %v", err)
	}
}

func mustFolder(t *testing.T, name string) folder.Path {
	t.Helper()
	p, err := folder.Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseDocker(t *testing.T) {
	p, err := Parse([]byte("[sandbox]\ndocker = true\ndocker_disk = \"40G\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Sandbox.Docker || p.Sandbox.DockerDisk != "40G" {
		t.Fatalf("%+v", p.Sandbox)
	}
	s := strings.Join(p.Settings(), "\n")
	if !strings.Contains(s, "sandbox.docker = true") || !strings.Contains(s, "sandbox.docker_disk = 40G") {
		t.Fatalf("settings: %s", s)
	}
}
