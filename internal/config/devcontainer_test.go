package config

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestParseDevContainer(t *testing.T) {
	d, err := ParseDevContainer([]byte(`// a dev container
{
  "name": "app // not a comment",
  /* the image */
  "image": "mcr.microsoft.com/devcontainers/typescript-node:22", // trailing
  "features": { "a": {}, },
  "forwardPorts": [3000, 8080,],
}`))
	if err != nil || d.Image != "mcr.microsoft.com/devcontainers/typescript-node:22" {
		t.Fatalf("%+v %v", d, err)
	}
	d, err = ParseDevContainer([]byte(`{"build": {"dockerfile": "Dockerfile"}}`))
	if err != nil || d.Dockerfile != "Dockerfile" || d.Image != "" || d.Context != "" {
		t.Fatalf("%+v %v", d, err)
	}
	d, err = ParseDevContainer([]byte(`{"build": {"dockerfile": "Dockerfile.dev", "context": "..", "args": {"NODE": "22"}, "target": "dev",},}`))
	if err != nil || d.Dockerfile != "Dockerfile.dev" || d.Context != ".." || d.Args["NODE"] != "22" || d.Target != "dev" {
		t.Fatalf("build with context, args and target: %+v %v", d, err)
	}
	if _, err := ParseDevContainer([]byte(`{"image": `)); err == nil {
		t.Error("a truncated file parsed")
	}
	dir := t.TempDir()
	if d, err := LoadDevContainer(dir); d != nil || err != nil {
		t.Errorf("no file: %+v %v", d, err)
	}
	os.MkdirAll(filepath.Join(dir, ".devcontainer"), 0o755)
	os.WriteFile(filepath.Join(dir, ".devcontainer", "devcontainer.json"), []byte(`{"image":"debian:13"}`), 0o644)
	if d, err := LoadDevContainer(dir); err != nil || d.Image != "debian:13" {
		t.Errorf("%+v %v", d, err)
	}
}

func FuzzParseDevContainer(f *testing.F) {
	f.Add([]byte(`{"image": "x", /* c */ "a": [1,], // d
}`))
	f.Add([]byte(`"\\"/*`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseDevContainer(b)
	})
}

// TestLoadDevContainerIsBounded: the file is the repository's; a link out
// of the project, a device, a FIFO and a huge file are refused without
// being read whole (or blocking on the FIFO).
func TestLoadDevContainerIsBounded(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(outside, []byte(`{"image":"from-outside"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(p string) error{
		"link out of the project": func(p string) error { return os.Symlink(outside, p) },
		"link to a device":        func(p string) error { return os.Symlink("/dev/zero", p) },
		"FIFO":                    func(p string) error { return syscall.Mkfifo(p, 0o600) },
		"2 MiB file": func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return f.Truncate(2 << 20)
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := mk(filepath.Join(dir, ".devcontainer.json")); err != nil {
				t.Fatal(err)
			}
			d, err := LoadDevContainer(dir)
			if err == nil {
				t.Fatalf("loaded %+v, want an error", d)
			}
		})
	}
	// A link inside the project is followed.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "dc.json"), []byte(`{"image":"debian:12", // c
	}`), 0o600)
	os.Symlink("dc.json", filepath.Join(dir, ".devcontainer.json"))
	d, err := LoadDevContainer(dir)
	if err != nil || d == nil || d.Image != "debian:12" {
		t.Fatalf("a link inside the project: %+v, %v", d, err)
	}
}
