package serve

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return testCA{c, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue makes a leaf certificate of ca: a server's for 127.0.0.1, or a
// client's.
func (ca testCA) issue(t *testing.T, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tpl.ExtKeyUsage, tpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// With mTLS (and no token), a client certificate of the client CA is the
// credential; none, or one of another CA, is not.
func TestMTLS(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	serverCA, clientCA, otherCA := newCA(t, "server"), newCA(t, "clients"), newCA(t, "other")
	sc, sk := serverCA.issue(t, true)
	conf, err := TLSConfig(write("tls.crt", sc), write("tls.key", sk), write("ca.crt", clientCA.pem))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newServer(t)
	if s.Auth, err = NewAuth("", true); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(s.Handler())
	hs.TLS = conf
	hs.StartTLS()
	defer hs.Close()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.pem)
	client := func(ca *testCA) *http.Client {
		tc := &tls.Config{RootCAs: roots}
		if ca != nil {
			c, k := ca.issue(t, false)
			pair, err := tls.X509KeyPair(c, k)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	}
	run := func(c *http.Client) (int, error) {
		resp, err := c.Post(hs.URL+"/execute", "application/json", strings.NewReader(`{"command":"echo hi"}`))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := run(client(&clientCA)); err != nil || code != http.StatusOK {
		t.Fatalf("with a client certificate: %d, %v", code, err)
	}
	if code, err := run(client(nil)); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("without one: %d, %v", code, err)
	}
	if code, err := run(client(&otherCA)); err == nil && code == http.StatusOK {
		t.Fatal("a certificate of another CA was taken")
	}
	if _, err := TLSConfig(write("a", sc), write("b", sk), write("c", []byte("not pem"))); err == nil {
		t.Fatal("a client CA file without a certificate was taken")
	}
}
