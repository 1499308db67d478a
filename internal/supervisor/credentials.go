package supervisor

import (
	"crypto/x509"
	"fmt"
	"os"

	"github.com/kosa8/kosa8/internal/egress"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/secrets"
)

// credentials loads the values of the sandbox's secrets from the host store.
func credentials(s *sandbox.Sandbox, configDir string) ([]egress.Credential, error) {
	if len(s.Config.Secrets) == 0 {
		return nil, nil
	}
	store, err := secrets.Open(configDir)
	if err != nil {
		return nil, err
	}
	ph, err := s.Placeholders()
	if err != nil {
		return nil, err
	}
	var out []egress.Credential
	for _, name := range s.Config.Secrets {
		sec, v, err := store.Get(name)
		if err != nil {
			return nil, err
		}
		hosts, err := netpolicy.Parse(sec.Hosts, netpolicy.ParseOptions{})
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", name, err)
		}
		p, ok := ph[name]
		if !ok {
			return nil, fmt.Errorf("secret %s has no placeholder in this sandbox: recreate it", name)
		}
		out = append(out, egress.Credential{
			Name: name, Hosts: hosts, Header: sec.Header, HeaderValue: sec.HeaderValue(v),
			Value: v.Bytes(), Placeholder: p,
			OverBasic: isRegistry(sec),
		})
	}
	return out, nil
}

// EnvUpstreamCA names a PEM file of extra roots the broker trusts for the
// real hosts: a host-side test setting, like EnvNetOverrides.
const EnvUpstreamCA = "KOSA8_UPSTREAM_CA"

func upstreamRoots() (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if p := os.Getenv(EnvUpstreamCA); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvUpstreamCA, err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s: no certificate in %s", EnvUpstreamCA, p)
		}
	}
	return pool, nil
}

func isRegistry(s *secrets.Secret) bool {
	_, ok := s.Registry()
	return ok
}
