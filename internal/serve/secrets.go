package serve

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/secrets"
)

// SecretSpec is a secret the broker injects: its value is a file (a key
// of a Kubernetes Secret mounted as a volume), its hosts and header are
// settings (KOSA8_SECRET_<NAME>_HOSTS, _HEADER, _FORMAT). The guest sees
// only its placeholder, as on a laptop.
type SecretSpec struct {
	Name   string
	File   string
	Hosts  []string
	Header string // default Authorization
	Format string // default "Bearer {value}"
}

// SecretsFromEnv reads the specs of the secrets whose values are files in
// dir: each file NAME needs KOSA8_SECRET_NAME_HOSTS in env (comma-separated
// hosts); _HEADER and _FORMAT are optional. Kubernetes' own entries of a
// mounted Secret (..data and the like) are skipped. A missing dir is no
// secrets.
func SecretsFromEnv(dir string, getenv func(string) string) ([]SecretSpec, error) {
	if dir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the secrets folder: %w", err)
	}
	var out []SecretSpec
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue // ..data, ..2026_12_03...: the Secret volume's own links
		}
		pre := "KOSA8_SECRET_" + name + "_"
		hosts := getenv(pre + "HOSTS")
		if hosts == "" {
			return nil, fmt.Errorf("secret %s is mounted in %s but %sHOSTS is not set: set it to the hosts it may be sent to", name, dir, pre)
		}
		s := SecretSpec{Name: name, File: filepath.Join(dir, name), Header: getenv(pre + "HEADER"), Format: getenv(pre + "FORMAT")}
		for _, h := range strings.Split(hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				s.Hosts = append(s.Hosts, h)
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ImportSecrets puts the mounted values into the secret store of
// configDir (a file store: configDir must be memory-backed, an emptyDir
// of medium Memory, never the checkpoint volume), replacing what is there:
// a rotated Secret is taken at the pod's next start.
func ImportSecrets(configDir string, specs []SecretSpec) error {
	if len(specs) == 0 {
		return nil
	}
	store, err := secrets.Open(configDir)
	if err != nil {
		return fmt.Errorf("open the secret store in %s: %w", configDir, err)
	}
	for _, s := range specs {
		v, err := os.ReadFile(s.File)
		if err != nil {
			return fmt.Errorf("read secret %s: %w", s.Name, err)
		}
		v = []byte(strings.TrimRight(string(v), "\r\n"))
		for _, h := range s.Hosts {
			// As 'kosa8 secret add': a key goes only to hosts named narrowly.
			if _, err := netpolicy.ParseRule(h, netpolicy.ParseOptions{}); errors.Is(err, netpolicy.ErrBroad) {
				return fmt.Errorf("secret %s: host %s matches a whole public suffix or everything: name the hosts the key is for", s.Name, h)
			}
		}
		sec := secrets.Secret{Name: s.Name, Hosts: s.Hosts, Header: s.Header, Format: s.Format}
		if sec.Header == "" {
			sec.Header = "Authorization"
		}
		if sec.Format == "" {
			sec.Format = "Bearer {value}"
		}
		if err := store.Add(sec, v, true); err != nil {
			return fmt.Errorf("secret %s: %w", s.Name, err)
		}
	}
	return nil
}
