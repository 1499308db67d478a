package config

import (
	"os"
	"path/filepath"
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
