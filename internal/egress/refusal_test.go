package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/kosa8/kosa8/internal/audit"
)

// countingResolver answers from a map and counts the questions per name.
type countingResolver struct {
	mu    sync.Mutex
	addrs map[string][]netip.Addr
	asked map[string]int
}

func (r *countingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asked == nil {
		r.asked = map[string]int{}
	}
	r.asked[host]++
	if a, ok := r.addrs[host]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

func (r *countingResolver) set(host, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs[host] = []netip.Addr{netip.MustParseAddr(addr)}
}

// A pin reaches its name at exactly the pinned address, however the name
// resolves later (rebinding); a name that merely resolves to a pinned
// address gets nothing from the pin; and an allowed name that resolves to
// a private or documentation address is refused with the pin that fixes
// it, on its page as in the audit log.
func TestPinnedNamesAndRebinding(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "served ", r.Host) }))
	defer srv.Close()
	res := &countingResolver{addrs: map[string][]netip.Addr{}}
	res.set("corp.test", "203.0.113.80")
	res.set("other.test", "203.0.113.80")
	g, logPath := newGateway(t, []string{"pin:corp.test=203.0.113.80", "other.test"}, nil, nil)
	g.cfg.Resolver, g.cfg.Sandbox = res, "dev"
	var dialled []string
	var mu sync.Mutex
	g.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialled = append(dialled, addr)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, srv.Listener.Addr().String())
	}
	get := func(name string) string {
		t.Helper()
		c, err := guestDial(t, g, netip.AddrPortFrom(syntheticFor(t, g, name), 80))
		if err != nil {
			return "refused"
		}
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", name)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	if b := get("corp.test"); !strings.Contains(b, "served corp.test") {
		t.Fatalf("the pinned name: %q", b)
	}
	// Rebinding: corp.test now resolves to the host itself. The pin holds.
	res.set("corp.test", "127.0.0.1")
	if b := get("corp.test"); !strings.Contains(b, "served corp.test") {
		t.Fatalf("the pinned name after its DNS changed: %q", b)
	}
	if res.asked["corp.test"] != 0 {
		t.Fatalf("a pinned name was resolved %d times", res.asked["corp.test"])
	}
	mu.Lock()
	for _, d := range dialled {
		if d != "203.0.113.80:80" {
			t.Fatalf("dialled %s for the pinned name", d)
		}
	}
	mu.Unlock()
	// Another name resolving to the pinned address: refused, with its page.
	b := get("other.test")
	if !strings.Contains(b, "403 Forbidden") || !strings.Contains(b, "203.0.113.80 (a documentation address)") ||
		!strings.Contains(b, "kosa8 net allow dev pin:other.test\n") || strings.Contains(b, "served") {
		t.Fatalf("a name that merely resolves to a pinned address: %q", b)
	}
	evs, _ := audit.Read(logPath)
	found := false
	for _, e := range evs {
		if e.Name == "other.test" && e.Decision == "deny" && e.Refused == "203.0.113.80" && strings.Contains(e.Reason, "kosa8 net allow dev pin:other.test") {
			found = true
		}
	}
	if !found {
		t.Fatalf("the audit log does not name the refused address and the pin: %+v", evs)
	}
}

// tlsGet speaks HTTPS as the guest would, trusting only the sandbox CA.
func tlsGet(t *testing.T, c net.Conn, ca *CA, name string) (*http.Response, string, error) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: name})
	if err := tc.Handshake(); err != nil {
		return nil, "", err
	}
	fmt.Fprintf(tc, "GET /pkg HTTP/1.1\r\nHost: %s\r\n\r\n", name)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return nil, "", err
	}
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body), nil
}

// A name the allow-list refuses resolves to the refusal page, whose
// answer on port 80 and 443 says why and the exact command that allows
// it; an allowed name refused for its address gets the page on 443 too.
func TestRefusalPages(t *testing.T) {
	res := fakeResolver{"corp.test": {netip.MustParseAddr("10.1.2.3")}}
	g, logPath := newGateway(t, []string{"corp.test", "later.test:8080", "*.wild.test", "deny:bad.wild.test"}, res, nil)
	ca, err := LoadOrCreateCA(t.TempDir(), "dev")
	if err != nil {
		t.Fatal(err)
	}
	g.cfg.CA, g.cfg.Sandbox = ca, "dev"
	page := func(dst netip.AddrPort, name string) (int, string) {
		t.Helper()
		c, err := guestDial(t, g, dst)
		if err != nil {
			return 0, "refused"
		}
		defer c.Close()
		if dst.Port() == 443 {
			resp, body, err := tlsGet(t, c, ca, name)
			if err != nil {
				t.Fatalf("%s over TLS: %v", name, err)
			}
			return resp.StatusCode, body
		}
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", name)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	refused := syntheticFor(t, g, "denied.test")
	if refused != RefusedAddr {
		t.Fatalf("a refused name answered %s", refused)
	}
	for _, port := range []uint16{80, 443} {
		code, body := page(netip.AddrPortFrom(RefusedAddr, port), "denied.test")
		if code != http.StatusForbidden || !strings.Contains(body, "denied.test was refused: no rule allows denied.test") ||
			!strings.Contains(body, "  kosa8 net allow dev denied.test\n") || !strings.Contains(body, "kosa8 net blocked dev") {
			t.Errorf("refused name on port %d: %d %q", port, code, body)
		}
	}
	// A deny rule: the page names it, and the command that lifts it.
	if code, body := page(netip.AddrPortFrom(RefusedAddr, 443), "bad.wild.test"); code != http.StatusForbidden || !strings.Contains(body, "kosa8 net rm dev deny:bad.wild.test") {
		t.Errorf("denied name: %d %q", code, body)
	}
	// Allowed since it was looked up: look it up again.
	if code, body := page(netip.AddrPortFrom(RefusedAddr, 80), "a.wild.test"); code != http.StatusForbidden || !strings.Contains(body, "look it up again") {
		t.Errorf("allowed since: %d %q", code, body)
	}
	// Allowed, but resolved to a private address: the pin.
	if code, body := page(netip.AddrPortFrom(syntheticFor(t, g, "corp.test"), 443), "corp.test"); code != http.StatusForbidden ||
		!strings.Contains(body, "10.1.2.3 (a private address)") || !strings.Contains(body, "  kosa8 net allow dev pin:corp.test\n") {
		t.Errorf("private address over TLS: %d %q", code, body)
	}
	// Allowed on another port: the port.
	if code, body := page(netip.AddrPortFrom(syntheticFor(t, g, "later.test"), 443), "later.test"); code != http.StatusForbidden || !strings.Contains(body, "kosa8 net allow dev later.test\n") {
		t.Errorf("another port over TLS: %d %q", code, body)
	}
	// The TLS server name must be the name behind the address.
	c, err := guestDial(t, g, netip.AddrPortFrom(syntheticFor(t, g, "corp.test"), 443))
	if err == nil {
		if _, _, err := tlsGet(t, c, ca, "other.test"); err == nil {
			t.Error("a refusal page answered another server name")
		}
		c.Close()
	}
	// Other ports of the refusal page: reset.
	if c, err := guestDial(t, g, netip.AddrPortFrom(RefusedAddr, 22)); err == nil {
		c.Close()
		t.Error("port 22 of the refusal page was accepted")
	}
	evs, _ := audit.Read(logPath)
	seen := false
	for _, e := range evs {
		if e.Kind == "tcp" && e.Name == "denied.test" && e.Decision == "deny" {
			seen = true
		}
	}
	if !seen {
		t.Errorf("the refused name's connection is not in the audit log: %+v", evs)
	}
}

// The refusal page never binds names: a guest asking for a million names
// costs one address, and the certificates it asks for are bounded.
func TestRefusedNamesBindNothing(t *testing.T) {
	g, _ := newGateway(t, []string{"allowed.test"}, nil, nil)
	for i := 0; i < 2000; i++ {
		if ip := syntheticFor(t, g, fmt.Sprintf("n%d.exfil.test", i)); ip != RefusedAddr {
			t.Fatalf("answered %s", ip)
		}
	}
	if g.names.Len() != 0 {
		t.Fatalf("%d names bound", g.names.Len())
	}
	ca, err := LoadOrCreateCA(t.TempDir(), "dev")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < maxLeaves+10; i++ {
		if _, err := ca.Leaf(fmt.Sprintf("n%d.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(ca.leaves); n > maxLeaves {
		t.Fatalf("%d certificates kept", n)
	}
}
