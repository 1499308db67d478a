package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Paths are the host directories kosa8 uses.
type Paths struct {
	Home   string // sandboxes' state: $KOSA8_HOME, else $XDG_DATA_HOME/kosa8
	Cache  string // guest images: $KOSA8_CACHE, else $XDG_CACHE_HOME/kosa8
	Config string // trust records, secrets: $KOSA8_CONFIG, else $XDG_CONFIG_HOME/kosa8
}

// DefaultPaths resolves the directories from the environment.
func DefaultPaths() (Paths, error) {
	home, err := os.UserHomeDir()
	if err != nil && (os.Getenv("KOSA8_HOME") == "" || os.Getenv("KOSA8_CACHE") == "" || os.Getenv("KOSA8_CONFIG") == "") {
		return Paths{}, fmt.Errorf("no home directory: set KOSA8_HOME, KOSA8_CACHE and KOSA8_CONFIG: %w", err)
	}
	pick := func(env, xdg, fallback string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		if v := os.Getenv(xdg); v != "" && filepath.IsAbs(v) {
			return filepath.Join(v, "kosa8")
		}
		return filepath.Join(home, fallback, "kosa8")
	}
	p := Paths{
		Home:   pick("KOSA8_HOME", "XDG_DATA_HOME", ".local/share"),
		Cache:  pick("KOSA8_CACHE", "XDG_CACHE_HOME", ".cache"),
		Config: pick("KOSA8_CONFIG", "XDG_CONFIG_HOME", ".config"),
	}
	for _, d := range []string{p.Home, p.Cache, p.Config} {
		if !filepath.IsAbs(d) {
			return Paths{}, fmt.Errorf("kosa8 directory %q is not absolute", d)
		}
	}
	return p, nil
}

// SandboxesDir holds one directory per sandbox.
func (p Paths) SandboxesDir() string { return filepath.Join(p.Home, "sandboxes") }

// EnsureWritable creates dir (0700) and checks that files can be made in it.
func EnsureWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state directory %s: %w: set KOSA8_HOME to a writable directory", dir, err)
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("state directory %s is not writable: fix its permissions or set KOSA8_HOME", dir)
		}
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}
