package egress

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
)

const (
	apiKey      = "sk-real-key-DO-NOT-LEAK-42"
	placeholder = "kosa8-ph-00112233445566778899aabbccddeeff00112233"
)

// seen records what the upstream API received.
type seen struct {
	mu   sync.Mutex
	reqs []string
}

func (s *seen) add(r *http.Request, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, fmt.Sprintf("%s %s %s key=%s body=%s", r.Proto, r.Method, r.URL.RequestURI(), r.Header.Get("x-api-key"), body))
}

func (s *seen) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.reqs, "\n")
}

type brokerEnv struct {
	g       *Gateway
	ca      *CA
	port    uint16
	seen    *seen
	logs    *bytes.Buffer
	logPath string
}

func newBrokerEnv(t *testing.T, rules []string) *brokerEnv {
	t.Helper()
	s := &seen{}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.add(r, body)
		fmt.Fprintf(w, "proto=%s key=%s", r.Proto, r.Header.Get("x-api-key"))
	})
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, "token authorization="+r.Header.Get("Authorization"))
		s.mu.Unlock()
		io.WriteString(w, "ok")
	})
	mux.HandleFunc("/token-echo", func(w http.ResponseWriter, r *http.Request) {
		// A registry's token endpoint that reflects what it was sent (an
		// error page, a debug echo).
		s.mu.Lock()
		s.reqs = append(s.reqs, "token-echo query="+r.URL.RawQuery)
		s.mu.Unlock()
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "you sent %s and %s", r.Header.Get("Authorization"),
			strings.TrimRight(strings.TrimPrefix(r.Header.Get("Authorization"), "Basic "), "="))
	})
	mux.HandleFunc("/echo-gzip", func(w http.ResponseWriter, r *http.Request) {
		s.add(r, nil)
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprintf(zw, "echo %s end", apiKey)
		zw.Close()
	})
	mux.HandleFunc("/echo-chunks", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo", apiKey)
		f := w.(http.Flusher)
		for i := 0; i < len(apiKey); i += 5 {
			io.WriteString(w, apiKey[i:min(i+5, len(apiKey))])
			f.Flush()
		}
	})
	mux.HandleFunc("/echo-sse-split", func(w http.ResponseWriter, r *http.Request) {
		// The key cut across two events' data lines, each sent at once.
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		f := w.(http.Flusher)
		io.WriteString(w, "data: "+apiKey[:12]+"\n\n")
		f.Flush()
		io.WriteString(w, "event: delta\ndata: "+apiKey[12:]+"\n\n")
	})
	mux.HandleFunc("/echo-trailer", func(w http.ResponseWriter, r *http.Request) {
		// As gRPC reports an error: in a trailer, after the body.
		w.Header().Set("Trailer", "Grpc-Message")
		io.WriteString(w, "body ")
		w.(http.Flusher).Flush()
		w.Header().Set("Grpc-Message", "invalid key "+r.Header.Get("x-api-key"))
		w.Header().Set(http.TrailerPrefix+"X-Late", apiKey)
	})
	mux.HandleFunc("/echo-br", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "br")
		io.WriteString(w, "not really brotli "+apiKey)
	})
	mux.HandleFunc("/echo-deflate-raw", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "deflate")
		fw, _ := flate.NewWriter(w, 5)
		fmt.Fprintf(fw, "raw %s end", apiKey)
		fw.Close()
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		io.WriteString(w, "data: first\n\n")
		f.Flush()
		time.Sleep(1500 * time.Millisecond)
		io.WriteString(w, "data: second\n\n")
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		// A WebSocket-like upgrade: after 101 the upstream echoes bytes in
		// upper case, for as long as the tunnel stays open.
		s.add(r, nil)
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "upgrade expected", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		buf := make([]byte, 512)
		for {
			n, err := brw.Read(buf)
			if err != nil {
				return
			}
			if string(buf[:n]) == "leak" {
				// The key, split across two writes.
				conn.Write([]byte(apiKey[:10]))
				time.Sleep(50 * time.Millisecond)
				conn.Write([]byte(apiKey[10:]))
				continue
			}
			if _, err := conn.Write(bytes.ToUpper(buf[:n])); err != nil {
				return
			}
		}
	})
	// The upstream's certificates come from a CA of its own, which the
	// broker is told to trust (as KOSA8_UPSTREAM_CA does on the host).
	upCA, err := LoadOrCreateCA(t.TempDir(), "upstream")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(h.ServerName) }}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(upCA.CertPEM())

	pol, err := netpolicy.Parse(rules, netpolicy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hosts, _ := netpolicy.Parse([]string{"api.test"}, netpolicy.ParseOptions{})
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir, "t")
	if err != nil {
		t.Fatal(err)
	}
	names, _ := OpenNameMap("", 0)
	logPath := filepath.Join(dir, "audit.log")
	al, _ := audit.Open(logPath, 0)
	t.Cleanup(func() { al.Close() })
	logs := &bytes.Buffer{}
	lo := netip.MustParseAddr("127.0.0.1")
	// httptest's certificate names example.com: the broker dials the
	// upstream under the names the tests use, so a dialler maps them.
	g := New(Config{
		Policy: pol, Names: names, Audit: al, CA: ca, UpstreamRoots: roots,
		Log:       slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Overrides: map[string]netip.Addr{"api.test": lo, "other.test": lo, "ro.test": lo},
		Credentials: []Credential{{
			Name: "API_KEY", Hosts: hosts, Header: "x-api-key", HeaderValue: apiKey,
			Value: []byte(apiKey), Placeholder: placeholder,
		}},
	})
	return &brokerEnv{g: g, ca: ca, port: netip.MustParseAddrPort(srv.Listener.Addr().String()).Port(), seen: s, logs: logs, logPath: logPath}
}

// client returns an HTTP client that reaches name through the gateway
// as the guest would, trusting only the sandbox CA.
func (e *brokerEnv) client(t *testing.T, name string, h2 bool) *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.ca.CertPEM())
	ip := syntheticFor(t, e.g, name)
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return guestDial(t, e.g, netip.AddrPortFrom(ip, 443))
	}
	tcfg := &tls.Config{RootCAs: roots, ServerName: name}
	if h2 {
		tcfg.NextProtos = []string{"h2"}
		return &http.Client{Transport: &http2.Transport{TLSClientConfig: tcfg, DialTLSContext: func(ctx context.Context, n, a string, c *tls.Config) (net.Conn, error) {
			raw, err := dial(ctx, n, a)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, c)
			return tc, tc.HandshakeContext(ctx)
		}}, Timeout: 20 * time.Second}
	}
	return &http.Client{Transport: &http.Transport{DialContext: dial, TLSClientConfig: tcfg}, Timeout: 20 * time.Second}
}

func get(t *testing.T, c *http.Client, url string, hdr map[string]string) (int, string) {
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Echo") + string(b)
}

func TestBrokerInjectsAndMasks(t *testing.T) {
	e := newBrokerEnv(t, nil) // no rules: the secret's host is allowed implicitly
	c := e.client(t, "api.test", false)
	base := "https://api.test:443"
	_ = base
	url := func(p string) string { return "https://api.test" + p }
	// The upstream listens on another port: overrides keep the name, the
	// test points the synthetic address's port at it through the policy.
	e.g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", e.port))
	}
	code, body := get(t, c, url("/v1/messages"), map[string]string{"x-api-key": placeholder})
	if code != 200 || !strings.Contains(body, "key="+placeholder) {
		t.Fatalf("guest saw %d %q: the echoed key must come back as the placeholder", code, body)
	}
	if !strings.Contains(e.seen.all(), "key="+apiKey) {
		t.Fatalf("upstream did not receive the real key: %s", e.seen.all())
	}
	for _, p := range []string{"/echo-gzip", "/echo-chunks", "/echo-sse-split"} {
		code, body := get(t, c, url(p), nil)
		joined := strings.NewReplacer("data: ", "", "event: delta", "", "\n", "").Replace(body)
		if code != 200 || strings.Contains(joined, apiKey) || !strings.Contains(joined, placeholder) {
			t.Fatalf("%s: %d %q", p, code, body)
		}
	}
	// HTTP/2 to the same host, mirrored from the upstream.
	code, body = get(t, e.client(t, "api.test", true), url("/h2"), map[string]string{"x-api-key": placeholder})
	if code != 200 || !strings.Contains(body, "proto=HTTP/2.0") {
		t.Fatalf("h2: %d %q", code, body)
	}
	checkNoValue(t, e)
}

func TestBrokerRefusesExfiltration(t *testing.T) {
	e := newBrokerEnv(t, []string{"inspect:other.test"})
	e.g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", e.port))
	}
	cases := []struct {
		name string
		req  func(host string) *http.Request
	}{
		{"query", func(host string) *http.Request {
			r, _ := http.NewRequest("GET", "https://"+host+"/q?k="+placeholder, nil)
			return r
		}},
		{"body", func(host string) *http.Request {
			r, _ := http.NewRequest("POST", "https://"+host+"/issues", strings.NewReader(`{"text":"`+placeholder+`"}`))
			return r
		}},
		{"base64 body", func(host string) *http.Request {
			r, _ := http.NewRequest("POST", "https://"+host+"/issues", strings.NewReader(string(secretForms([]byte(placeholder))[1])))
			return r
		}},
		{"other header", func(host string) *http.Request {
			r, _ := http.NewRequest("GET", "https://"+host+"/", nil)
			r.Header.Set("X-Note", "key is "+placeholder)
			return r
		}},
	}
	// To the secret's own host the placeholder passes, unchanged, wherever
	// it is (an agent's history carries it back to its API).
	own := e.client(t, "api.test", false)
	for _, tc := range cases {
		before := e.seen.all()
		resp, err := own.Do(tc.req("api.test"))
		if err != nil {
			t.Fatalf("%s to its own host: %v", tc.name, err)
		}
		resp.Body.Close()
		got := e.seen.all()[len(before):]
		if resp.StatusCode != http.StatusOK || !strings.Contains(got, "key="+apiKey) {
			t.Errorf("%s to its own host: status %d, upstream saw %q", tc.name, resp.StatusCode, got)
		}
		if tc.name != "other header" && !strings.Contains(got, placeholder) && !strings.Contains(got, string(secretForms([]byte(placeholder))[1])) {
			t.Errorf("%s to its own host: the placeholder did not pass unchanged: %q", tc.name, got)
		}
	}
	// To any other host it is refused: the tripwire.
	other := e.client(t, "other.test", false)
	before := e.seen.all()
	for _, tc := range cases {
		resp, err := other.Do(tc.req("other.test"))
		if err == nil {
			resp.Body.Close()
		}
		if err == nil && resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s to another host: status %d", tc.name, resp.StatusCode)
		}
	}
	if after := e.seen.all(); after != before {
		t.Fatalf("a refused request reached the upstream:\n%s", after[len(before):])
	}
	// The placeholder in a DNS name.
	if r := query(t, e.g, placeholder+".other.test.", 1); r.Rcode == 0 && len(r.Answer) > 0 {
		t.Fatal("a DNS query carrying the placeholder was answered")
	}
	evs, _ := audit.ReadSecurity(e.logPath)
	n := 0
	for _, ev := range evs {
		if ev.Kind == "exfiltration" {
			n++
			if ev.Name == "api.test" {
				t.Errorf("a request to the secret's own host logged as exfiltration: %+v", ev)
			}
		}
	}
	if n < len(cases)+1 {
		t.Fatalf("%d exfiltration events logged, want %d", n, len(cases)+1)
	}
	checkNoValue(t, e)
}

// Everything a secret's host sends is masked: header names and values,
// trailers (gRPC's errors), and bodies in the encodings kosa8 decodes; a
// body it cannot decode is refused, and the log says why.
func TestBrokerMasksTrailersAndEncodings(t *testing.T) {
	e := newBrokerEnv(t, nil)
	e.g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", e.port))
	}
	for _, h2 := range []bool{false, true} {
		c := e.client(t, "api.test", h2)
		req, _ := http.NewRequest("GET", "https://api.test/echo-trailer", nil)
		req.Header.Set("x-api-key", placeholder)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		all := fmt.Sprint(resp.Header, resp.Trailer, string(body))
		if strings.Contains(all, apiKey) {
			t.Fatalf("h2=%v: the key reached the guest in a trailer: %s", h2, all)
		}
		if !strings.Contains(resp.Trailer.Get("Grpc-Message"), placeholder) || !strings.Contains(resp.Trailer.Get("X-Late"), placeholder) {
			t.Fatalf("h2=%v: trailers not masked to the placeholder: %v", h2, resp.Trailer)
		}
	}
	c := e.client(t, "api.test", false)
	if code, body := get(t, c, "https://api.test/echo-deflate-raw", nil); code != 200 || body != "raw "+placeholder+" end" {
		t.Fatalf("raw deflate: %d %q", code, body)
	}
	code, body := get(t, c, "https://api.test/echo-br", nil)
	if code != http.StatusForbidden || strings.Contains(body, apiKey) || !strings.Contains(body, "br encoding cannot be checked") {
		t.Fatalf("br: %d %q", code, body)
	}
	evs, _ := audit.ReadSecurity(e.logPath)
	found := false
	for _, ev := range evs {
		found = found || ev.Decision == "deny" && strings.Contains(ev.Reason, "br encoding cannot be checked")
	}
	if !found {
		t.Fatal("the refused br response is not in the security log")
	}
	checkNoValue(t, e)
}

func TestBrokerStreamsEvents(t *testing.T) {
	e := newBrokerEnv(t, nil)
	e.g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", e.port))
	}
	resp, err := e.client(t, "api.test", false).Get("https://api.test/sse")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: first\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the first event took %s: it was buffered behind the second", d)
	}
}

func TestReadOnlyRule(t *testing.T) {
	e := newBrokerEnv(t, []string{"read:ro.test"})
	e.g.cfg.Credentials = nil
	e.g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", e.port))
	}
	c := e.client(t, "ro.test", false)
	if code, _ := get(t, c, "https://ro.test/pkg", nil); code != 200 {
		t.Fatalf("GET on a read-only host: %d", code)
	}
	post := func(path string) int {
		resp, err := c.Post("https://ro.test"+path, "application/octet-stream", strings.NewReader("data"))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/repo.git/git-upload-pack"); code != 200 {
		t.Fatalf("git fetch on a read-only host: %d", code)
	}
	if code := post("/repo.git/git-receive-pack"); code != http.StatusForbidden {
		t.Fatalf("git push on a read-only host: %d", code)
	}
	req, _ := http.NewRequest("PUT", "https://ro.test/my-package", strings.NewReader("tarball"))
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("npm publish (PUT) on a read-only host: %d", resp.StatusCode)
		}
	}
}

func checkNoValue(t *testing.T, e *brokerEnv) {
	t.Helper()
	logFile, _ := os.ReadFile(e.logPath)
	for what, b := range map[string][]byte{"gateway log": e.logs.Bytes(), "audit log": logFile} {
		if bytes.Contains(b, []byte(apiKey)) {
			t.Fatalf("the real value appears in the %s", what)
		}
	}
	if len(logFile) == 0 {
		t.Fatal("empty audit log: the check above checks nothing")
	}
}

// A WebSocket upgrade through the broker: the key goes into the upgrade
// request, and the tunnel carries bytes both ways for as long as it lasts.
func TestBrokerWebSocketUpgrade(t *testing.T) {
	e := newBrokerEnv(t, nil)
	e.g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", e.port))
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.ca.CertPEM())
	raw, err := guestDial(t, e.g, netip.AddrPortFrom(syntheticFor(t, e.g, "api.test"), 443))
	if err != nil {
		t.Fatal(err)
	}
	conn := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: "api.test", NextProtos: []string{"http/1.1"}})
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-api-key: %s\r\n\r\n", placeholder)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %d\n%s", resp.StatusCode, e.logs)
	}
	if !strings.Contains(e.seen.all(), "key="+apiKey) {
		t.Fatalf("the upgrade request did not carry the real key upstream: %s", e.seen.all())
	}
	for i, msg := range []string{"hello", "still open"} {
		if i > 0 {
			time.Sleep(300 * time.Millisecond) // the tunnel outlives the request that made it
		}
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatalf("write %q: %v", msg, err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatalf("read the echo of %q: %v", msg, err)
		}
		if string(got) != strings.ToUpper(msg) {
			t.Fatalf("echo %q, want %q", got, strings.ToUpper(msg))
		}
	}
	// The upstream sends the real key down the tunnel: the tunnel ends
	// before the whole key reaches the guest, and the audit log says so.
	io.WriteString(conn, "leak")
	rest, _ := io.ReadAll(br)
	if bytes.Contains(rest, []byte(apiKey[:tripwireHold])) {
		t.Fatalf("the start of the real key came through the tunnel: %q", rest)
	}
	evs, _ := audit.Read(e.logPath)
	found := false
	for _, ev := range evs {
		found = found || strings.Contains(ev.Reason, "tunnel closed")
	}
	if !found {
		t.Fatalf("no audit entry for the closed tunnel: %+v", evs)
	}
}

// realPW is the registry login's real password in the broker's tests.
const realPW = "registry-REAL-password-31"

// registryLogin is user tester's HTTP Basic header value with password pw.
func registryLogin(pw string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("tester:"+pw))
}

// newRegistryLoginEnv is a broker whose one secret is a registry login
// (registry:tester) for api.test, and a client reaching api.test.
func newRegistryLoginEnv(t *testing.T) (*brokerEnv, *http.Client) {
	e := newBrokerEnv(t, nil)
	hosts, _ := netpolicy.Parse([]string{"api.test"}, netpolicy.ParseOptions{})
	e.g.cfg.Credentials = []Credential{{Name: "REG", Hosts: hosts, Header: "Authorization", HeaderValue: registryLogin(realPW),
		Value: []byte(realPW), Placeholder: placeholder, OverBasic: true}}
	e.g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", e.port))
	}
	return e, e.client(t, "api.test", false)
}

// TestBrokerRegistryLoginOverBasicOnly: a registry secret (registry:USER)
// replaces the guest's HTTP Basic login (user and placeholder) with the
// real one, and leaves a bearer token (what the token exchange handed the
// guest) and a request without a login as they are.
func TestBrokerRegistryLoginOverBasicOnly(t *testing.T) {
	e, c := newRegistryLoginEnv(t)
	real, guestBasic := registryLogin(realPW), registryLogin(placeholder)
	for _, h := range []map[string]string{{"Authorization": guestBasic}, {"Authorization": "Bearer abc.def"}, nil} {
		if code, body := get(t, c, "https://api.test/token", h); code != 200 {
			t.Fatalf("%v: %d %s", h, code, body)
		}
	}
	got := e.seen.all()
	want := "token authorization=" + real + "\ntoken authorization=Bearer abc.def\ntoken authorization="
	if got != want {
		t.Fatalf("the registry saw:\n%s\nwant:\n%s", got, want)
	}
}

// TestBrokerMasksABasicLoginAndAsksNoRefreshToken: a registry's token
// endpoint echoes the Authorization header the broker set (base64 of
// USER:REAL, which masking the bare value misses); the guest sees the
// base64 of USER:PLACEHOLDER instead. The broker also drops Docker's
// offline_token, so no lasting refresh token is issued into the guest.
func TestBrokerMasksABasicLoginAndAsksNoRefreshToken(t *testing.T) {
	e, c := newRegistryLoginEnv(t)
	real, guestBasic := registryLogin(realPW), registryLogin(placeholder)
	code, body := get(t, c, "https://api.test/token-echo?scope=repository%3Ax%3Apull&service=reg&offline_token=true&client_id=docker", map[string]string{"Authorization": guestBasic})
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	login := strings.TrimPrefix(real, "Basic ")
	if strings.Contains(body, login) || strings.Contains(body, strings.TrimRight(login, "=")) || strings.Contains(body, realPW) {
		t.Fatalf("the guest got the real login: %s", body)
	}
	want := guestBasic + "you sent " + guestBasic + " and " + strings.TrimRight(strings.TrimPrefix(guestBasic, "Basic "), "=")
	if body != want {
		t.Fatalf("body %q, want %q", body, want)
	}
	if got := e.seen.all(); strings.Contains(got, "offline_token") || !strings.Contains(got, "client_id=docker") {
		t.Fatalf("the registry saw %q: want offline_token dropped and the rest kept", got)
	}
}
