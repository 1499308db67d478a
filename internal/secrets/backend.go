package secrets

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/zalando/go-keyring"
)

const keyringService = "kosa8"

// keyringLikely reports whether probing the keyring is worth it: on Linux
// the Secret Service needs a session bus, and without one D-Bus would try
// to launch a daemon.
func keyringLikely() bool {
	return runtime.GOOS == "darwin" || runtime.GOOS == "windows" || os.Getenv("DBUS_SESSION_BUS_ADDRESS") != ""
}

type keyringBackend struct{}

func (keyringBackend) kind() string { return "OS keyring" }

func (keyringBackend) probe() error {
	const probe = "kosa8-probe"
	if err := keyring.Set(keyringService, probe, "x"); err != nil {
		return err
	}
	defer keyring.Delete(keyringService, probe)
	v, err := keyring.Get(keyringService, probe)
	if err != nil {
		return err
	}
	if v != "x" {
		return errors.New("keyring returned a different value")
	}
	return nil
}

func (keyringBackend) get(name string) ([]byte, error) {
	v, err := keyring.Get(keyringService, name)
	return []byte(v), err
}

func (keyringBackend) set(name string, v []byte) error {
	return keyring.Set(keyringService, name, string(v))
}

func (keyringBackend) del(name string) error {
	err := keyring.Delete(keyringService, name)
	if errors.Is(err, keyring.ErrNotFound) {
		return nil
	}
	return err
}

// fileBackend keeps values in one 0600 file in the 0700 config directory.
type fileBackend struct {
	path string
	mu   sync.Mutex
}

func (f *fileBackend) kind() string { return "file " + f.path }

func (f *fileBackend) load() (map[string][]byte, error) {
	m := map[string][]byte{}
	fi, err := os.Lstat(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s must be a regular file only you can read (chmod 600 it)", f.path)
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s is damaged", f.path)
	}
	return m, nil
}

func (f *fileBackend) get(name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.load()
	if err != nil {
		return nil, err
	}
	v, ok := m[name]
	if !ok {
		return nil, errors.New("value missing")
	}
	return v, nil
}

func (f *fileBackend) set(name string, v []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.load()
	if err != nil {
		return err
	}
	m[name] = v
	b, _ := json.Marshal(m)
	return writePrivate(f.path, b)
}

func (f *fileBackend) del(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.load()
	if err != nil {
		return err
	}
	delete(m, name)
	b, _ := json.Marshal(m)
	return writePrivate(f.path, b)
}
