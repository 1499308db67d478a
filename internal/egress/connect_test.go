package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// proxyListener serves g's CONNECT proxy on a loopback port (the stack's
// gateway address in a sandbox).
func proxyListener(t *testing.T, g *Gateway) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go g.serveProxyConn(c)
		}
	}()
	return l.Addr().String()
}

// TestProxyRefusalExplainsToGoClients: a host the allow-list refuses is
// answered with a 403 whose status line says why and how to allow it, and
// Go's HTTP client (dockerd's) puts that line in its error; an allowed
// host is reached through the same checks as a direct connection.
func TestProxyRefusalExplainsToGoClients(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go http.Serve(up, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.Host)
	}))
	port := up.Addr().(*net.TCPAddr).Port
	g, logPath := newGateway(t, []string{fmt.Sprintf("allowed.test:%d", port)}, nil,
		map[string]netip.Addr{"allowed.test": netip.MustParseAddr("127.0.0.1"), "refused.test": netip.MustParseAddr("127.0.0.1")})
	g.cfg.Sandbox = "dev"
	proxy := proxyListener(t, g)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxy}),
	}}

	_, err = client.Get("https://refused.test/v2/")
	if err == nil || !strings.Contains(err.Error(), "kosa8: refused.test was refused") || !strings.Contains(err.Error(), "kosa8 net allow dev refused.test") {
		t.Fatalf("refused host: the client's error does not say why: %v", err)
	}
	// Plain HTTP through a CONNECT tunnel (what a client does for an
	// http:// URL only when told to tunnel): the tunnel to an allowed
	// host and port carries it, with the Host check of a direct one.
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", port, port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT to an allowed host: %v %v", resp, err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: allowed.test:%d\r\nConnection: close\r\n\r\n", port)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	c.Close()
	if !strings.Contains(string(body), "hello allowed.test") {
		t.Fatalf("through the tunnel: %q", body)
	}
	// The port is the allow-list's too; a raw address with no CIDR rule
	// and a request that is not CONNECT are refused.
	for _, target := range []string{"allowed.test:443", "127.0.0.1:" + fmt.Sprint(port)} {
		r := connectStatus(t, proxy, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
		if !strings.HasPrefix(r, "HTTP/1.1 403 kosa8: ") {
			t.Errorf("CONNECT %s: %q", target, r)
		}
	}
	if r := connectStatus(t, proxy, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"); !strings.HasPrefix(r, "HTTP/1.1 405") {
		t.Errorf("a proxied GET: %q", r)
	}
	// A refusal is recorded like a refused lookup.
	b, _ := os.ReadFile(logPath)
	if !strings.Contains(string(b), `"refused.test"`) {
		t.Errorf("the audit log does not record the refusal:\n%s", b)
	}
}

func connectStatus(t *testing.T, proxy, req string) string {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, req)
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// FuzzProxyRequest: whatever a guest sends the proxy is answered or
// closed, never followed into a panic, and a status line it writes never
// carries a control character the guest gave.
func FuzzProxyRequest(f *testing.F) {
	for _, s := range []string{
		"CONNECT allowed.test:443 HTTP/1.1\r\nHost: x\r\n\r\n",
		"CONNECT refused.test\x1b[2J:443 HTTP/1.1\r\n\r\n",
		"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
		"CONNECT :0 HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"\x16\x03\x01",
	} {
		f.Add(s)
	}
	g, _ := newGateway(f, []string{"allowed.test:443"}, fakeResolver{}, nil)
	f.Fuzz(func(t *testing.T, req string) {
		a, b := tcpPair(t)
		done := make(chan struct{})
		go func() { g.serveProxyConn(b); close(done) }()
		_ = a.SetDeadline(time.Now().Add(15 * time.Second))
		_, _ = io.WriteString(a, req)
		a.(*net.TCPConn).CloseWrite() // a request cut short ends here
		line, _ := bufio.NewReader(a).ReadString('\n')
		a.Close()
		<-done
		if i := strings.IndexFunc(strings.TrimRight(line, "\r\n"), func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }); i >= 0 {
			t.Fatalf("control character in the status line: %q", line)
		}
	})
}
