package egress

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// CA is a sandbox's own certificate authority. The broker signs a leaf for
// each host it terminates with it. Its certificate is installed in the
// guest's trust store; its key stays in the sandbox's state directory on
// the host and never enters the guest.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// CA files in a directory.
const (
	CACertFile = "ca.crt"
	caKeyFile  = "ca.key"
)

// LoadOrCreateCA reads the CA in dir, creating it on first use.
func LoadOrCreateCA(dir, name string) (*CA, error) {
	certPEM, err1 := os.ReadFile(filepath.Join(dir, CACertFile))
	keyPEM, err2 := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err1 == nil && err2 == nil {
		return parseCA(certPEM, keyPEM)
	}
	if !errors.Is(err1, os.ErrNotExist) && err1 != nil {
		return nil, err1
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kosa8 sandbox " + name + " CA", Organization: []string{"kosa8"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	if err := os.WriteFile(filepath.Join(dir, caKeyFile), keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, CACertFile), certPEM, 0o644); err != nil {
		return nil, err
	}
	return parseCA(certPEM, keyPEM)
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("sandbox CA files are damaged")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("sandbox CA key is not a signing key")
	}
	return &CA{cert: cert, key: signer, certPEM: certPEM, leaves: map[string]*tls.Certificate{}}, nil
}

// CertPEM is the CA certificate for the guest's trust store.
func (c *CA) CertPEM() []byte { return c.certPEM }

// maxLeaves bounds the certificates the CA keeps made.
const maxLeaves = 1024

// Leaf returns a certificate for host, signed by the CA, made once per host.
func (c *CA) Leaf(host string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[host]; ok && time.Until(l.Leaf.NotAfter) > 24*time.Hour {
		return l, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(0, 0, 30),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %s: %w", host, err)
	}
	leaf, _ := x509.ParseCertificate(der)
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: key, Leaf: leaf}
	if len(c.leaves) >= maxLeaves {
		// The guest chooses the names (a refusal page answers any), so
		// the cache is bounded: start it again.
		c.leaves = map[string]*tls.Certificate{}
	}
	c.leaves[host] = l
	return l, nil
}

// Host roots: many users sit behind a TLS-inspecting proxy whose CA their
// host trusts; a sandbox whose guest lacks it cannot reach anything that
// passes through untouched. The guest's bundle gets the CAs the host trusts
// beyond the distribution's defaults. Only certificates cross, never keys.

// hostRootFiles are the Linux places an administrator's roots end up.
var hostRootFiles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu: every trusted root, added ones included
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
}

// hostRootDirs hold roots an administrator added, one per file.
var hostRootDirs = []string{"/usr/local/share/ca-certificates"}

// maxRootsPEM bounds what is read from one file.
const maxRootsPEM = 8 << 20

// HostRootsPEM returns the certificate authorities the host trusts, as PEM.
func HostRootsPEM() []byte {
	var out []byte
	read := func(p string) {
		f, err := os.Open(p)
		if err != nil {
			return
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxRootsPEM))
		if err == nil {
			out = append(out, b...)
			out = append(out, '\n')
		}
	}
	if runtime.GOOS == "darwin" {
		// The roots an administrator added live in the System keychain;
		// Apple's own are in the system roots keychain, which the guest's
		// distribution covers.
		if b, err := exec.Command("security", "find-certificate", "-a", "-p", "/Library/Keychains/System.keychain").Output(); err == nil {
			out = append(out, b...)
		}
		return out
	}
	for _, p := range hostRootFiles {
		read(p)
	}
	for _, d := range hostRootDirs {
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() && strings.HasSuffix(p, ".crt") {
				read(p)
			}
			return nil
		})
	}
	return out
}

// ExtraRoots returns, as PEM, the CA certificates in host that guest does
// not hold. Anything but a certificate that parses as a CA is dropped: a
// private key in a host file never reaches the guest.
func ExtraRoots(host, guest []byte) []byte {
	have := map[[32]byte]bool{}
	for _, c := range pemCerts(guest) {
		have[sha256.Sum256(c.Raw)] = true
	}
	var out []byte
	for _, c := range pemCerts(host) {
		sum := sha256.Sum256(c.Raw)
		if have[sum] || !c.IsCA {
			continue
		}
		have[sum] = true
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

func pemCerts(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for len(b) > 0 {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(blk.Bytes); err == nil {
			out = append(out, c)
		}
	}
	return out
}
