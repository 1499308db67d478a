// Package secrets keeps API keys on the host. A secret has a name, the
// hosts it may be sent to, and the header (and format) it goes in; its
// value lives in the OS keyring where one is reachable, else in a file
// only the user can read. Values never appear in logs, argv, the audit log,
// a sandbox's state directory or a checkpoint: the Value type redacts
// itself wherever it is printed or logged.
package secrets

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/netpolicy"
)

// Value is a secret's value. It prints and logs as [REDACTED]; only Bytes
// gives the real thing.
type Value struct{ b []byte }

// NewValue wraps b.
func NewValue(b []byte) Value { return Value{b: slices.Clone(b)} }

// Bytes returns the real value.
func (v Value) Bytes() []byte { return v.b }

func (v Value) String() string               { return "[REDACTED]" }
func (v Value) GoString() string             { return "secrets.Value{[REDACTED]}" }
func (v Value) LogValue() slog.Value         { return slog.StringValue("[REDACTED]") }
func (v Value) MarshalJSON() ([]byte, error) { return []byte(`"[REDACTED]"`), nil }

// Secret describes a stored secret (not its value).
type Secret struct {
	Name    string    `json:"name"`
	Hosts   []string  `json:"hosts"`
	Header  string    `json:"header"`
	Format  string    `json:"format"` // "{value}", "Bearer {value}", "basic:USER", "registry:USER"
	Created time.Time `json:"created"`
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	headerRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")

	ErrExists   = errors.New("secret already exists")
	ErrNotFound = errors.New("no such secret")
)

// Validate checks a secret's description.
func (s *Secret) Validate() error {
	if !nameRE.MatchString(s.Name) {
		return fmt.Errorf("invalid secret name %q: use letters, digits and _ (it becomes an environment variable)", s.Name)
	}
	if len(s.Hosts) == 0 {
		return fmt.Errorf("secret %s has no --host: name the hosts it may be sent to", s.Name)
	}
	for i, h := range s.Hosts {
		r, err := netpolicy.ParseRule(h, netpolicy.ParseOptions{})
		if err != nil {
			return fmt.Errorf("secret %s: %w", s.Name, err)
		}
		if r.Prefix.IsValid() || !slices.Equal(r.Ports, netpolicy.DefaultPorts) {
			return fmt.Errorf("secret %s: --host %q must be a host name or *.domain, without a port", s.Name, h)
		}
		s.Hosts[i] = r.Text
	}
	if s.Header == "" {
		s.Header = "Authorization"
	}
	if !headerRE.MatchString(s.Header) {
		return fmt.Errorf("secret %s: %q is not a valid header name", s.Name, s.Header)
	}
	if s.Format == "" {
		s.Format = "{value}"
	}
	if user, ok := basicUser(s.Format); ok {
		if user == "" || strings.ContainsAny(user, ":\r\n\x00") || strings.ContainsFunc(user, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("secret %s: --format %s needs a user without ':' or control characters", s.Name, s.Format)
		}
		if !strings.EqualFold(s.Header, "Authorization") {
			return fmt.Errorf("secret %s: basic auth goes in the Authorization header", s.Name)
		}
	} else if strings.Count(s.Format, "{value}") != 1 {
		return fmt.Errorf("secret %s: --format must contain {value} once (or be basic:USER or registry:USER)", s.Name)
	} else if strings.ContainsAny(s.Format, "\r\n\x00") {
		return fmt.Errorf("secret %s: --format has a line break", s.Name)
	}
	return nil
}

// basicUser is the user of a basic:USER or registry:USER format.
func basicUser(format string) (string, bool) {
	if u, ok := strings.CutPrefix(format, "basic:"); ok {
		return u, true
	}
	return strings.CutPrefix(format, "registry:")
}

// Registry reports a container registry's login (registry:USER): the
// broker sets it only where the client itself sends HTTP Basic auth (a
// registry's token endpoint, or a registry that takes Basic auth), never
// over the bearer tokens the client got from that exchange; the guest's
// Docker settings hold USER and the placeholder.
func (s *Secret) Registry() (user string, ok bool) {
	return strings.CutPrefix(s.Format, "registry:")
}

// HeaderValue is the whole header value carrying v.
func (s *Secret) HeaderValue(v Value) string {
	if user, ok := basicUser(s.Format); ok {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+string(v.b)))
	}
	return strings.Replace(s.Format, "{value}", string(v.b), 1)
}

// ValidateValue refuses values a header cannot carry.
func ValidateValue(name string, v []byte) error {
	if len(v) == 0 {
		return fmt.Errorf("secret %s: empty value", name)
	}
	if len(v) > 16<<10 {
		return fmt.Errorf("secret %s: value longer than 16 KiB", name)
	}
	for _, c := range v {
		if c == '\r' || c == '\n' || c == 0 || c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("secret %s: the value has a line break or control character, which a header cannot carry", name)
		}
	}
	return nil
}

// backend holds values.
type backend interface {
	kind() string
	get(name string) ([]byte, error)
	set(name string, v []byte) error
	del(name string) error
}

// Store is the host's secret store.
type Store struct {
	dir     string
	backend backend
}

// Backend names where values are kept ("keyring" or "file").
func (s *Store) Backend() string { return s.backend.kind() }

// Open opens the store in the kosa8 config directory. KOSA8_SECRET_BACKEND
// (keyring or file) forces a backend; otherwise the keyring is used when a
// probe write and read succeed.
func Open(configDir string) (*Store, error) {
	if err := os.MkdirAll(configDir, 0o700); err != nil {
		return nil, err
	}
	_ = os.Chmod(configDir, 0o700)
	fb := &fileBackend{path: filepath.Join(configDir, "secret-values.json")}
	s := &Store{dir: configDir, backend: fb}
	switch os.Getenv("KOSA8_SECRET_BACKEND") {
	case "file":
	case "keyring":
		kb := keyringBackend{}
		if err := kb.probe(); err != nil {
			return nil, fmt.Errorf("OS keyring not reachable: %w", err)
		}
		s.backend = kb
	case "":
		if kb := (keyringBackend{}); keyringLikely() && kb.probe() == nil {
			s.backend = kb
		}
	default:
		return nil, errors.New("KOSA8_SECRET_BACKEND must be keyring or file")
	}
	return s, nil
}

func (s *Store) metaPath() string { return filepath.Join(s.dir, "secrets.json") }

func (s *Store) load() ([]Secret, error) {
	b, err := os.ReadFile(s.metaPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Secret
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s is damaged: %w", s.metaPath(), err)
	}
	return out, nil
}

func (s *Store) save(list []Secret) error {
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	return writePrivate(s.metaPath(), b)
}

// writePrivate writes a 0600 file atomically.
func writePrivate(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// List returns the secrets (without values).
func (s *Store) List() ([]Secret, error) { return s.load() }

// Add stores a new secret.
func (s *Store) Add(sec Secret, v []byte, replace bool) error {
	if err := sec.Validate(); err != nil {
		return err
	}
	if err := ValidateValue(sec.Name, v); err != nil {
		return err
	}
	list, err := s.load()
	if err != nil {
		return err
	}
	i := slices.IndexFunc(list, func(e Secret) bool { return e.Name == sec.Name })
	if i >= 0 && !replace {
		return fmt.Errorf("%w: %s (use --replace to change it, or 'kosa8 secret rm %s')", ErrExists, sec.Name, sec.Name)
	}
	if err := s.backend.set(sec.Name, v); err != nil {
		return fmt.Errorf("store secret %s in the %s: %w", sec.Name, s.backend.kind(), err)
	}
	sec.Created = time.Now().UTC()
	if i >= 0 {
		list[i] = sec
	} else {
		list = append(list, sec)
	}
	slices.SortFunc(list, func(a, b Secret) int { return strings.Compare(a.Name, b.Name) })
	return s.save(list)
}

// Get returns a secret and its value.
func (s *Store) Get(name string) (*Secret, Value, error) {
	list, err := s.load()
	if err != nil {
		return nil, Value{}, err
	}
	i := slices.IndexFunc(list, func(e Secret) bool { return e.Name == name })
	if i < 0 {
		return nil, Value{}, fmt.Errorf("%w named %q: 'kosa8 secret ls' lists them, 'kosa8 secret add %s --host …' adds it", ErrNotFound, name, name)
	}
	v, err := s.backend.get(name)
	if err != nil {
		return nil, Value{}, fmt.Errorf("read secret %s from the %s: %w", name, s.backend.kind(), err)
	}
	return &list[i], Value{b: v}, nil
}

// Describe returns a secret without its value.
func (s *Store) Describe(name string) (*Secret, error) {
	list, err := s.load()
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(list, func(e Secret) bool { return e.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("%w named %q: 'kosa8 secret ls' lists them", ErrNotFound, name)
	}
	return &list[i], nil
}

// Remove deletes a secret.
func (s *Store) Remove(name string) error {
	list, err := s.load()
	if err != nil {
		return err
	}
	i := slices.IndexFunc(list, func(e Secret) bool { return e.Name == name })
	if i < 0 {
		return fmt.Errorf("%w named %q", ErrNotFound, name)
	}
	if err := s.backend.del(name); err != nil {
		return err
	}
	return s.save(slices.Delete(list, i, i+1))
}

// PlaceholderPrefix starts every placeholder, so one is recognisable in a
// log or a leaked file for what it is: worthless outside its sandbox.
const PlaceholderPrefix = "kosa8-ph-"

// NewPlaceholder returns a fresh random placeholder.
func NewPlaceholder() string {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	return PlaceholderPrefix + hex.EncodeToString(b)
}
