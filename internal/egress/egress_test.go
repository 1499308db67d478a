package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/netstack"
)

type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func newGateway(t testing.TB, rules []string, res fakeResolver, overrides map[string]netip.Addr) (*Gateway, string) {
	t.Helper()
	pol, err := netpolicy.Parse(rules, netpolicy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names, err := OpenNameMap(filepath.Join(dir, "names"), 0)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "audit.log")
	al, err := audit.Open(logPath, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close(); names.Close() })
	return New(Config{Policy: pol, Names: names, Audit: al, Resolver: res, Overrides: overrides, DialTimeout: 2 * time.Second}), logPath
}

func query(t *testing.T, g *Gateway, name string, qtype uint16) *dns.Msg {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	b, _ := q.Pack()
	reply := g.AnswerDNS(b)
	if reply == nil {
		t.Fatalf("no reply for %s", name)
	}
	var r dns.Msg
	if err := r.Unpack(reply); err != nil {
		t.Fatal(err)
	}
	return &r
}

func TestDNS(t *testing.T) {
	g, logPath := newGateway(t, []string{"allowed.test", "*.wild.test"}, nil, nil)
	r := query(t, g, "allowed.test.", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("A for an allowed name: %v", r)
	}
	a := r.Answer[0].(*dns.A).A
	ip, _ := netip.AddrFromSlice(a.To4())
	if !SyntheticNet.Contains(ip) {
		t.Fatalf("answer %s is not synthetic", ip)
	}
	if r2 := query(t, g, "ALLOWED.test.", dns.TypeA); r2.Answer[0].(*dns.A).A.String() != a.String() {
		t.Fatal("the same name (other case) got another address")
	}
	if n, _ := g.names.Lookup(ip); n != "allowed.test" {
		t.Fatalf("address bound to %q", n)
	}
	for _, qt := range []uint16{dns.TypeAAAA, dns.TypeTXT, dns.TypeHTTPS, dns.TypeMX} {
		if r := query(t, g, "allowed.test.", qt); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
			t.Errorf("%s for an allowed name: rcode %d, %d answers", dns.TypeToString[qt], r.Rcode, len(r.Answer))
		}
	}
	// A refused name points at the refusal page: one fixed address for
	// every such name, briefly, bound to none of them.
	for _, name := range []string{"denied.test.", "wild.test.", "evil-wild.test.", "x.wild.test.evil.", "exfil-c2VjcmV0.attacker.example."} {
		r := query(t, g, name, dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Errorf("%s: rcode %d, %d answers", name, r.Rcode, len(r.Answer))
			continue
		}
		a := r.Answer[0].(*dns.A)
		if ip, _ := netip.AddrFromSlice(a.A.To4()); ip != RefusedAddr || a.Hdr.Ttl != refusedTTL {
			t.Errorf("%s: answered %s ttl %d, want the refusal page %s", name, ip, a.Hdr.Ttl, RefusedAddr)
		}
		if r := query(t, g, name, dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
			t.Errorf("%s AAAA: rcode %d, %d answers", name, r.Rcode, len(r.Answer))
		}
	}
	if n := g.names.Len(); n != 1 {
		t.Errorf("refused names were bound: %d names in the map", n)
	}
	// No host name at all: NXDOMAIN.
	if r := query(t, g, "allowed.test\\000.evil.", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("a malformed name: rcode %d", r.Rcode)
	}
	if r := query(t, g, "a.wild.test.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("wildcard subdomain: %v", r)
	}
	if g.AnswerDNS([]byte("garbage")) != nil {
		t.Error("reply to garbage")
	}
	evs, _ := audit.Read(logPath)
	denied := 0
	for _, e := range evs {
		if e.Kind == "dns" && e.Decision == "deny" {
			denied++
		}
	}
	if denied < 5 {
		t.Errorf("audit log has %d DNS denials, want at least 5", denied)
	}
}

func TestNameMapPersistsAndNeverReuses(t *testing.T) {
	p := filepath.Join(t.TempDir(), "names")
	m, err := OpenNameMap(p, 3)
	if err != nil {
		t.Fatal(err)
	}
	a1, _ := m.Assign("one.test")
	a2, _ := m.Assign("two.test")
	m.Close()
	m2, err := OpenNameMap(p, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if n, ok := m2.Lookup(a1); !ok || n != "one.test" {
		t.Fatalf("after reopen: %q %v", n, ok)
	}
	a3, _ := m2.Assign("three.test")
	if a3 == a1 || a3 == a2 || !a2.Less(a3) {
		t.Fatalf("address reused or not increasing: %s %s %s", a1, a2, a3)
	}
	if _, err := m2.Assign("four.test"); !errors.Is(err, ErrMapFull) {
		t.Fatalf("cap not enforced: %v", err)
	}
}

// tcpPair returns two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		ch <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c, <-ch
}

// guestDial runs the gateway for a guest connection to dst and returns the
// guest's end, or the refusal.
func guestDial(t *testing.T, g *Gateway, dst netip.AddrPort) (net.Conn, error) {
	guestEnd, gwEnd := tcpPair(t)
	accepted, handled := make(chan bool, 1), make(chan bool)
	go func() {
		g.HandleTCP(flowTo(dst), func() (net.Conn, error) {
			accepted <- true
			return gwEnd, nil
		})
		close(handled)
	}()
	// Refused: the gateway returns without accepting. The deadline is
	// for a gateway that does neither, generous for a loaded machine (an
	// allowed dial under load took more than 5 s once).
	select {
	case <-accepted:
		return guestEnd, nil
	case <-handled:
		select {
		case <-accepted:
			return guestEnd, nil
		default:
		}
	case <-time.After(30 * time.Second):
	}
	guestEnd.Close()
	gwEnd.Close()
	return nil, errors.New("refused")
}

func syntheticFor(t *testing.T, g *Gateway, name string) netip.Addr {
	r := query(t, g, name+".", dns.TypeA)
	if len(r.Answer) != 1 {
		t.Fatalf("%s does not resolve", name)
	}
	ip, _ := netip.AddrFromSlice(r.Answer[0].(*dns.A).A.To4())
	return ip
}

func TestConnectDecisions(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from ", r.Host) }))
	defer srv.Close()
	port := netip.MustParseAddrPort(srv.Listener.Addr().String()).Port()
	lo := netip.MustParseAddr("127.0.0.1")
	res := fakeResolver{
		"rebind.test":  {netip.MustParseAddr("127.0.0.1")},
		"private.test": {netip.MustParseAddr("10.9.9.9")},
		"meta.test":    {netip.MustParseAddr("169.254.169.254")},
	}
	rules := []string{fmt.Sprintf("allowed.test:%d", port), fmt.Sprintf("rebind.test:%d", port), "private.test", "meta.test:80"}
	g, logPath := newGateway(t, rules, res, map[string]netip.Addr{"allowed.test": lo})

	// Allowed: the request reaches the local server.
	c, err := guestDial(t, g, netip.AddrPortFrom(syntheticFor(t, g, "allowed.test"), port))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: allowed.test:%d\r\nConnection: close\r\n\r\n", port)
	body, _ := io.ReadAll(c)
	c.Close()
	if !strings.Contains(string(body), "200 OK") || !strings.Contains(string(body), "hello from allowed.test") {
		t.Fatalf("allowed request: %q", body)
	}

	cases := []struct {
		name string
		dst  netip.AddrPort
		why  string
	}{
		{"port not allowed", netip.AddrPortFrom(syntheticFor(t, g, "allowed.test"), 443), "port 443"},
		{"raw address", netip.AddrPortFrom(lo, port), "no rule allows the address"},
		{"unbound synthetic", netip.MustParseAddrPort("198.19.255.1:80"), "no name is bound"},
		{"rebinding to loopback", netip.AddrPortFrom(syntheticFor(t, g, "rebind.test"), port), "127.0.0.1 (in 127.0.0.0/8), which no name may reach"},
		{"private address", netip.AddrPortFrom(syntheticFor(t, g, "private.test"), 443), "private.test resolved to 10.9.9.9 (a private address); a name may reach such an address only when the user pins it: kosa8 net allow NAME pin:private.test"},
		{"metadata service", netip.AddrPortFrom(syntheticFor(t, g, "meta.test"), 80), "169.254.169.254 (in 169.254.0.0/16), which no name may reach"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up, ev := g.connect(context.Background(), tc.dst)
			if up != nil {
				up.conn.Close()
				t.Fatalf("allowed: %+v", ev)
			}
			if ev.Decision != "deny" || !strings.Contains(ev.Reason, tc.why) {
				t.Fatalf("event %+v, want a denial mentioning %q", ev, tc.why)
			}
			// Only an address a pin may hold is offered to be pinned.
			if pinnable := tc.name == "private address"; (ev.Refused != "") != pinnable || strings.Contains(ev.Reason, "pin:") != pinnable {
				t.Fatalf("event %+v: refused address and pin offered should be %v", ev, pinnable)
			}
		})
	}

	// A CIDR rule that names the private address lets it through.
	pol := g.Policy().Clone()
	r, _ := netpolicy.ParseRule("10.9.9.0/24", netpolicy.ParseOptions{})
	pol.Add(r)
	g.SetPolicy(pol)
	_, ev := g.connect(context.Background(), netip.AddrPortFrom(syntheticFor(t, g, "private.test"), 443))
	if strings.Contains(ev.Reason, "resolved to") {
		t.Fatalf("CIDR rule did not name the private address: %+v", ev)
	}

	evs, _ := audit.Read(logPath)
	var tcp int
	for _, e := range evs {
		if e.Kind == "tcp" {
			tcp++
		}
	}
	if tcp < 1 {
		t.Fatalf("no tcp events in the audit log: %+v", evs)
	}
}

func TestHTTPHostMustMatch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "served ", r.Host) }))
	defer srv.Close()
	port := netip.MustParseAddrPort(srv.Listener.Addr().String()).Port()
	g, _ := newGateway(t, []string{fmt.Sprintf("good.test:%d", port)}, nil, map[string]netip.Addr{"good.test": netip.MustParseAddr("127.0.0.1")})
	c, err := guestDial(t, g, netip.AddrPortFrom(syntheticFor(t, g, "good.test"), port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	// First request fine, second (same connection) fronts another host.
	fmt.Fprintf(c, "GET /1 HTTP/1.1\r\nHost: good.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	fmt.Fprintf(c, "GET /2 HTTP/1.1\r\nHost: other.test\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("fronted request: %v %v", resp, err)
	}
}

func TestTLSServerNameMustMatch(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "tls ok") }))
	defer srv.Close()
	port := netip.MustParseAddrPort(srv.Listener.Addr().String()).Port()
	lo := netip.MustParseAddr("127.0.0.1")
	g, _ := newGateway(t, []string{fmt.Sprintf("tls.test:%d", port)}, nil, map[string]netip.Addr{"tls.test": lo})
	dst := netip.AddrPortFrom(syntheticFor(t, g, "tls.test"), port)
	for _, tc := range []struct {
		sni string
		ok  bool
	}{{"tls.test", true}, {"TLS.Test.", true}, {"other.test", false}, {"", false}} {
		c, err := guestDial(t, g, dst)
		if err != nil {
			t.Fatal(err)
		}
		tc2 := tls.Client(c, &tls.Config{ServerName: tc.sni, InsecureSkipVerify: true})
		tc2.SetDeadline(time.Now().Add(5 * time.Second))
		err = tc2.Handshake()
		c.Close()
		if (err == nil) != tc.ok {
			t.Errorf("SNI %q: handshake err %v, want ok=%v", tc.sni, err, tc.ok)
		}
	}
}

func TestRawProtocolPassesThrough(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("SSH-2.0-test\r\n")) // the server speaks first
		io.Copy(c, c)
		c.Close()
	}()
	port := netip.MustParseAddrPort(l.Addr().String()).Port()
	g, _ := newGateway(t, []string{fmt.Sprintf("git.test:%d", port)}, nil, map[string]netip.Addr{"git.test": netip.MustParseAddr("127.0.0.1")})
	c, err := guestDial(t, g, netip.AddrPortFrom(syntheticFor(t, g, "git.test"), port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	line, _ := br.ReadString('\n')
	if line != "SSH-2.0-test\r\n" {
		t.Fatalf("server banner: %q", line)
	}
	c.Write([]byte("SSH-2.0-client\r\n"))
	line, _ = br.ReadString('\n')
	if line != "SSH-2.0-client\r\n" {
		t.Fatalf("echo: %q", line)
	}
}

func flowTo(dst netip.AddrPort) netstack.Flow {
	return netstack.Flow{Src: netip.MustParseAddrPort("192.168.127.2:40000"), Dst: dst}
}

func FuzzAnswerDNS(f *testing.F) {
	for _, name := range []string{"allowed.test.", "x.wild.test.", "denied.test.", "allowed.test\\000.evil."} {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		b, _ := q.Pack()
		f.Add(b)
	}
	pol, _ := netpolicy.Parse([]string{"allowed.test", "*.wild.test"}, netpolicy.ParseOptions{})
	names, _ := OpenNameMap("", 0)
	g := New(Config{Policy: pol, Names: names})
	f.Fuzz(func(t *testing.T, in []byte) {
		reply := g.AnswerDNS(in)
		if reply == nil {
			return
		}
		var r dns.Msg
		if err := r.Unpack(reply); err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		for _, rr := range r.Answer {
			a, ok := rr.(*dns.A)
			if !ok {
				t.Fatalf("non-A answer %v", rr)
			}
			name := strings.ToLower(strings.TrimSuffix(a.Hdr.Name, "."))
			ip, _ := netip.AddrFromSlice(a.A.To4())
			if !pol.AllowsName(name).Allow && ip != RefusedAddr {
				t.Fatalf("answered a name the policy does not allow with %s: %q", ip, a.Hdr.Name)
			}
			if !SyntheticNet.Contains(ip) {
				t.Fatalf("answered a real address %s", ip)
			}
		}
	})
}

func TestDNSOverTCP(t *testing.T) {
	g, _ := newGateway(t, []string{"tcp.test"}, nil, nil)
	a, b := net.Pipe()
	go g.ServeDNSStream(b)
	defer a.Close()
	for _, name := range []string{"tcp.test.", "nope.test."} {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		p, _ := q.Pack()
		a.SetDeadline(time.Now().Add(5 * time.Second))
		a.Write(append([]byte{byte(len(p) >> 8), byte(len(p))}, p...))
		hdr := make([]byte, 2)
		if _, err := io.ReadFull(a, hdr); err != nil {
			t.Fatal(err)
		}
		body := make([]byte, int(hdr[0])<<8|int(hdr[1]))
		if _, err := io.ReadFull(a, body); err != nil {
			t.Fatal(err)
		}
		var r dns.Msg
		if err := r.Unpack(body); err != nil {
			t.Fatal(err)
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("%s over TCP: rcode %d, %d answers", name, r.Rcode, len(r.Answer))
		}
		if ip, _ := netip.AddrFromSlice(r.Answer[0].(*dns.A).A.To4()); (ip == RefusedAddr) != (name == "nope.test.") {
			t.Fatalf("%s over TCP: answered %s", name, ip)
		}
	}
}

// Dropped packets are logged, at most once per kind and destination per
// window, so that a flood cannot rotate the audit log away.
func TestDroppedPacketsLoggedBounded(t *testing.T) {
	g, logPath := newGateway(t, nil, fakeResolver{}, nil)
	ping := netip.MustParseAddr("1.1.1.1")
	for i := 0; i < 1000; i++ {
		g.HandleDropped("icmp", ping)
	}
	g.HandleDropped("ipv6", netip.MustParseAddr("2606:4700::1111"))
	g.HandleUDP(netstackFlow("10.0.2.15:5353", "8.8.8.8:53"))
	// A window later the next one is logged with the count it stood for.
	g.dropMu.Lock()
	g.drops[repeatKey(audit.Event{Kind: "icmp", Decision: "deny", Dest: "1.1.1.1"})].logged = time.Now().Add(-2 * dropWindow)
	g.dropMu.Unlock()
	g.HandleDropped("icmp", ping)

	evs, err := audit.Read(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range evs {
		if e.Decision != "deny" {
			t.Errorf("a dropped packet logged as %q", e.Decision)
		}
		kinds = append(kinds, e.Kind+" "+e.Dest)
	}
	want := []string{"icmp 1.1.1.1", "ipv6 2606:4700::1111", "udp 8.8.8.8:53", "icmp 1.1.1.1"}
	if strings.Join(kinds, ",") != strings.Join(want, ",") {
		t.Fatalf("logged %v, want %v", kinds, want)
	}
	if !strings.Contains(evs[3].Reason, "999 more") {
		t.Fatalf("the entry after the window does not count the suppressed ones: %q", evs[3].Reason)
	}
}

func netstackFlow(src, dst string) netstack.Flow {
	return netstack.Flow{Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst)}
}

// A DNS flood is summed up like dropped packets: the same query in a loop
// costs one record per window, and an exfiltration record logged before
// the flood is still in the security log after it.
func TestDNSFloodSummarized(t *testing.T) {
	g, logPath := newGateway(t, []string{"allowed.test"}, nil, nil)
	g.cfg.Credentials = []Credential{{Name: "K", Hosts: mustPolicyT(t, "api.test"), Placeholder: "kosa8-ph-abcdef0123456789"}}
	if r := query(t, g, "kosa8-ph-abcdef0123456789.evil.test.", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Fatalf("placeholder query answered: %v", r)
	}
	for i := 0; i < 3000; i++ {
		query(t, g, "allowed.test.", dns.TypeA)
		query(t, g, "denied.test.", dns.TypeA)
		query(t, g, fmt.Sprintf("n%d.random.test.", i), dns.TypeA)
	}
	g.cfg.Audit.Close()
	evs, err := audit.Read(logPath)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, e := range evs {
		counts[e.Name]++
	}
	if counts["allowed.test"] != 1 || counts["denied.test"] != 1 {
		t.Fatalf("repeated queries logged %d and %d times, want once each in the window", counts["allowed.test"], counts["denied.test"])
	}
	sec, err := audit.ReadSecurity(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(sec) == 0 || sec[0].Kind != "exfiltration" {
		t.Fatalf("the exfiltration record is not first in the security log: %+v", sec[:min(3, len(sec))])
	}
}

func mustPolicyT(t *testing.T, rules ...string) *netpolicy.Policy {
	t.Helper()
	p, err := netpolicy.Parse(rules, netpolicy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The guest's open connections are capped: past MaxConns a new one is
// refused (a RST), logged once with a count, and one closing makes room.
func TestConnectionCap(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	port := netip.MustParseAddrPort(l.Addr().String()).Port()
	g, logPath := newGateway(t, []string{fmt.Sprintf("cap.test:%d", port)}, nil, map[string]netip.Addr{"cap.test": netip.MustParseAddr("127.0.0.1")})
	g.cfg.MaxConns = 5
	dst := netip.AddrPortFrom(syntheticFor(t, g, "cap.test"), port)
	var open []net.Conn
	for i := 0; i < 5; i++ {
		c, err := guestDial(t, g, dst)
		if err != nil {
			t.Fatalf("connection %d under the cap: %v", i, err)
		}
		open = append(open, c)
	}
	for i := 0; i < 3; i++ {
		accepted := false
		g.HandleTCP(flowTo(dst), func() (net.Conn, error) { // returns at once when refused
			accepted = true
			return nil, errors.New("test: not accepting")
		})
		if accepted {
			t.Fatal("a connection over the cap was accepted")
		}
	}
	open[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for g.conns.Load() >= 5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	c, err := guestDial(t, g, dst)
	if err != nil {
		t.Fatalf("no room after one closed: %v", err)
	}
	c.Close()
	for _, c := range open[1:] {
		c.Close()
	}
	sec, _ := audit.ReadSecurity(logPath)
	capped := 0
	for _, e := range sec {
		if strings.Contains(e.Reason, "its limit") {
			capped++
		}
	}
	if capped != 1 {
		t.Fatalf("%d records of refusals at the cap, want 1 (with a count)", capped)
	}
}

// A plain-HTTP request the allow-list refuses gets a 403 that says why
// and how the user allows the host; other refused ports are reset.
func TestPlainHTTPRefusalExplains(t *testing.T) {
	g, _ := newGateway(t, []string{"allowed.test:8080"}, nil, nil)
	g.cfg.Sandbox = "dev"
	ip := syntheticFor(t, g, "allowed.test")
	c, err := guestDial(t, g, netip.AddrPortFrom(ip, 80))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	c.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "kosa8 net allow dev allowed.test") ||
		!strings.Contains(string(body), "kosa8 net blocked dev") || !strings.Contains(string(body), "allow-listed") {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	// A raw address: the guest's Host is repeated only if it is a name.
	c, err = guestDial(t, g, netip.MustParseAddrPort("203.0.113.9:80"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x..evil\r\n\r\n")
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.Contains(string(b), "403") || strings.Contains(string(b), "x..evil") || !strings.Contains(string(b), "203.0.113.9 was refused") ||
		!strings.Contains(string(b), "kosa8 net allow dev 203.0.113.9/32\n") {
		t.Fatalf("raw address: %q", b)
	}
	// Another port of a raw address: reset.
	if c, err := guestDial(t, g, netip.MustParseAddrPort("203.0.113.9:5432")); err == nil {
		c.Close()
		t.Fatal("a refused connection to port 5432 was accepted")
	}
}
