package serve

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// TokenHeader carries the token where Authorization cannot: agent-sandbox's
// sandbox-router consumes Authorization (its own TokenReview check) and
// strips it before forwarding, and passes every other header on.
const TokenHeader = "X-Kosa8-Token"

// minToken is the shortest token taken: 128 bits as hex.
const minToken = 32

// Auth is how callers prove they may use this sandbox: a token (from a
// mounted Kubernetes Secret) in "Authorization: Bearer" or TokenHeader, or
// a client certificate the listener verified against ClientCA (mTLS), or
// either when both are set.
type Auth struct {
	token    [sha256.Size]byte // the token's hash: compared in constant time
	hasToken bool
	mTLS     bool
}

// NewAuth makes the check from a token (may be "") and whether the
// listener verifies client certificates. It refuses to check nothing.
func NewAuth(token string, mTLS bool) (*Auth, error) {
	token = strings.TrimSpace(token)
	if token == "" && !mTLS {
		return nil, errors.New("no credential configured: mount a token (--token-file, a Kubernetes Secret) or a client CA for mTLS (--client-ca)")
	}
	a := &Auth{mTLS: mTLS}
	if token != "" {
		if len(token) < minToken {
			return nil, fmt.Errorf("the token is %d characters: use at least %d (e.g. 'openssl rand -hex 32')", len(token), minToken)
		}
		a.token, a.hasToken = sha256.Sum256([]byte(token)), true
	}
	return a, nil
}

// ReadToken reads a token file (a Secret's key mounted as a file).
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the token file: %w", err)
	}
	if len(b) > 4096 {
		return "", fmt.Errorf("token file %s is larger than 4 KiB: is it the token?", path)
	}
	return strings.TrimSpace(string(b)), nil
}

// Check says whether r carries a valid credential.
func (a *Auth) Check(r *http.Request) error {
	if a.mTLS && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return nil
	}
	if a.hasToken {
		got := r.Header.Get(TokenHeader)
		if got == "" {
			if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
				got = strings.TrimSpace(h[7:])
			}
		}
		if got == "" {
			return errors.New("no token: send it as 'Authorization: Bearer TOKEN' or " + TokenHeader)
		}
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], a.token[:]) != 1 {
			return errors.New("wrong token")
		}
		return nil
	}
	return errors.New("no verified client certificate")
}

// TLSConfig is the listener's TLS from mounted files: its certificate and
// key, and, when clientCA is given, the CA whose client certificates are
// accepted (mTLS; a client without one may still pass with the token).
func TLSConfig(certFile, keyFile, clientCA string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load the TLS certificate and key: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("read the client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s holds no PEM certificate", clientCA)
		}
		c.ClientCAs = pool
		c.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return c, nil
}
