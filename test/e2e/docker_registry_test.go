package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/kosa8/kosa8/internal/egress"
)

// testRegistry is Debian's docker-registry (the CNCF distribution
// registry) on a loopback address of its own, port 443, over TLS with a
// certificate of a test CA, behind a Basic-auth login. The guest reaches
// it as registry.test through the host-side override.
type testRegistry struct {
	ip     string // 127.x.y.z
	caFile string
	caPEM  []byte
	user   string
	pass   string
	client *http.Client
}

const registryName = "registry.test"

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Fatal("docker-registry not found: install Debian's docker-registry package (apt-get install docker-registry); .ci/run does")
	}
	dir := t.TempDir()
	ca, err := egress.LoadOrCreateCA(dir, "e2e-registry")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf(registryName)
	if err != nil {
		t.Fatal(err)
	}
	var certPEM bytes.Buffer
	for _, der := range leaf.Certificate {
		pem.Encode(&certPEM, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	r := &testRegistry{caFile: filepath.Join(dir, egress.CACertFile), caPEM: ca.CertPEM(), user: "tester",
		pass: fmt.Sprintf("reg-REAL-pass-%08x", rand.Uint32())}
	hash, err := bcrypt.GenerateFromPassword([]byte(r.pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"cert.pem": certPEM.Bytes(), "key.pem": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"htpasswd": []byte(r.user + ":" + string(hash) + "\n"),
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A loopback address of its own: port 443 (a secret's host is bound
	// to HTTPS's port) without taking the machine's 127.0.0.1:443.
	for try := 0; ; try++ {
		r.ip = fmt.Sprintf("127.%d.%d.%d", 31+rand.IntN(200), rand.IntN(250)+1, rand.IntN(250)+1)
		if l, err := net.Listen("tcp4", r.ip+":443"); err == nil {
			l.Close()
			break
		} else if try > 20 {
			t.Fatalf("no free loopback address for the registry: %v", err)
		}
	}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
http:
  addr: %s:443
  tls:
    certificate: %s
    key: %s
auth:
  htpasswd:
    realm: kosa8-e2e
    path: %s
`, filepath.Join(dir, "data"), r.ip, filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "htpasswd"))
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("registry log:\n%s", b)
		}
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(r.caPEM)
	r.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: registryName},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, r.ip+":443")
		},
	}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := r.client.Get("https://" + registryName + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				return r
			}
			err = fmt.Errorf("GET /v2/ without a login: %s", resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the test registry did not come up: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// do sends one request with the registry's login.
func (r *testRegistry) do(t *testing.T, method, url, ctype string, body []byte) *http.Response {
	t.Helper()
	if strings.HasPrefix(url, "/") {
		url = "https://" + registryName + url
	}
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(r.user, r.pass)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// pushBlob uploads b in one piece (POST, then PUT with its digest).
func (r *testRegistry) pushBlob(t *testing.T, repo string, b []byte) string {
	t.Helper()
	resp := r.do(t, "POST", "/v2/"+repo+"/blobs/uploads/", "", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("start an upload: %s", resp.Status)
	}
	loc := resp.Header.Get("Location")
	if strings.HasPrefix(loc, "/") {
		loc = "https://" + registryName + loc
	}
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	d := digestOf(b)
	resp = r.do(t, "PUT", loc+sep+"digest="+d, "application/octet-stream", b)
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload %s: %s %s", d, resp.Status, msg)
	}
	return d
}

// pushImage builds an OCI image of one layer holding app as /app (its
// entrypoint, on scratch) and pushes it as repo:tag, without a Docker
// daemon on the host: the layer's tar and the config and manifest JSON
// are written here.
func (r *testRegistry) pushImage(t *testing.T, repo, tag string, app []byte) {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "app", Mode: 0o755, Size: int64(len(app)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	tw.Write(app)
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(layer.Bytes())
	zw.Close()
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/app"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digestOf(layer.Bytes())}},
	})
	cd := r.pushBlob(t, repo, config)
	ld := r.pushBlob(t, repo, gz.Bytes())
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": len(config)},
		"layers": []map[string]any{{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": ld, "size": gz.Len()}},
	})
	resp := r.do(t, "PUT", "/v2/"+repo+"/manifests/"+tag, "application/vnd.oci.image.manifest.v1+json", manifest)
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("push the manifest: %s %s", resp.Status, msg)
	}
}

// buildDockerApp builds testdata/dockerapp static, for the guest.
func buildDockerApp(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "dockerapp")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./testdata/dockerapp")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build dockerapp: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
