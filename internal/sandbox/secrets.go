package sandbox

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/kosa8/kosa8/internal/egress"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/secrets"
)

// placeholdersFile maps each bound secret to the sandbox's placeholder for
// it. Placeholders are worthless outside the broker, so they may live here.
const placeholdersFile = "placeholders.json"

// GuestCAPath is where the sandbox CA's certificate goes in the guest, for
// update-ca-certificates to add it to the system roots.
const GuestCAPath = "/usr/local/share/ca-certificates/kosa8-sandbox.crt"

// GuestHostCAPath holds the host's roots the guest's distribution lacks
// (a TLS-inspecting proxy's CA), for update-ca-certificates to keep them.
const GuestHostCAPath = "/usr/local/share/ca-certificates/kosa8-host.crt"

// GuestCABundle is the guest's system bundle: the distribution's roots and,
// after update-ca-certificates, the sandbox CA.
const GuestCABundle = "/etc/ssl/certs/ca-certificates.crt"

// caEnv names the combined bundle for the tools that do not read the
// system store by themselves.
var caEnv = []string{
	"SSL_CERT_FILE=" + GuestCABundle,
	"NODE_EXTRA_CA_CERTS=" + GuestCABundle,
	"REQUESTS_CA_BUNDLE=" + GuestCABundle,
	"CURL_CA_BUNDLE=" + GuestCABundle,
	"GIT_SSL_CAINFO=" + GuestCABundle,
	"PIP_CERT=" + GuestCABundle,
	"DENO_TLS_CA_STORE=system",
}

// Placeholders returns the sandbox's placeholder for each bound secret.
func (s *Sandbox) Placeholders() (map[string]string, error) {
	m := map[string]string{}
	err := readJSON(s.Path(placeholdersFile), &m)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	return m, err
}

// GuestEnv is what every process in the guest gets besides its own
// environment: --env entries, the secrets' placeholders, the CA bundle.
func (s *Sandbox) GuestEnv() ([]string, error) {
	ph, err := s.Placeholders()
	if err != nil {
		return nil, err
	}
	env := append([]string(nil), caEnv...)
	env = append(env, s.Config.Env...)
	for _, name := range s.Config.Secrets {
		if p, ok := ph[name]; ok {
			env = append(env, name+"="+p)
		}
	}
	return env, nil
}

// credentials loads the values of the sandbox's secrets from the host store.
func (s *Sandbox) credentials(configDir string) ([]egress.Credential, error) {
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
