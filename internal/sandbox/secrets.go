package sandbox

import (
	"errors"
	"os"
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
