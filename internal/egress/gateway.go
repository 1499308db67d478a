// Package egress decides and carries a sandbox's traffic to the world. It
// answers the guest's DNS itself (dns.go), turns a connection to a
// synthetic address back into the name it stands for, asks the policy,
// resolves the name on the host, refuses special destinations, dials
// exactly the address it checked, and checks what the guest says on the
// connection (TLS SNI, HTTP Host) against that name. Every decision is one
// line in the audit log.
package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/netstack"
)

// Resolver resolves names on the host.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config wires a Gateway.
type Config struct {
	Policy   *netpolicy.Policy
	Names    *NameMap
	Audit    *audit.Log // nil: decisions are not recorded
	Log      *slog.Logger
	Resolver Resolver                                                          // default: the host's
	Dial     func(ctx context.Context, network, addr string) (net.Conn, error) // default: net.Dialer
	// Overrides map names to addresses on the host side only, for tests
	// against local servers: an overridden name resolves to its address,
	// which may be a loopback one. Nothing in the guest can set this.
	Overrides map[string]netip.Addr
	// DialTimeout bounds connecting upstream.
	DialTimeout time.Duration
	// Credentials are the secrets bound to the sandbox.
	Credentials []Credential
	// CA signs the certificates the broker presents to the guest.
	CA *CA
	// UpstreamRoots verify the real hosts behind the broker (nil: the
	// host's roots).
	UpstreamRoots *x509.CertPool
	// MaxConns caps the guest's open connections (0: DefaultMaxConns).
	MaxConns int
	// Sandbox names the sandbox in what the guest is told when refused.
	Sandbox string
}

// DefaultMaxConns is how many connections a guest may have open at once.
// Package managers open 10 to 50; each connection can make the host hold
// up to about 2 MiB (netstack.MaxBufferPerConn each way, and the kernel's
// socket buffers of UpstreamBuffer), so the cap bounds what a guest that
// opens connections and never reads them costs the host.
const DefaultMaxConns = 128

// UpstreamBuffer is the kernel socket buffer asked for on each upstream
// connection, each way. It bounds what the host's kernel holds for a
// guest that does not read (Linux's autotuning would grow it to several
// MiB) while still covering a window of about 10 MiB/s at 50 ms.
const UpstreamBuffer = 512 << 10

// Gateway is the egress side of one sandbox's network.
type Gateway struct {
	cfg   Config
	pol   atomic.Pointer[netpolicy.Policy]
	names *NameMap
	log   *slog.Logger
	own   atomic.Pointer[[]netip.Prefix] // the host's own addresses

	dropMu sync.Mutex
	drops  map[string]*dropCount // rate limit of dropped-packet entries

	conns    atomic.Int64 // open guest connections
	peak     atomic.Int64 // most open since memory was last given back
	lastFree atomic.Int64 // unix nanoseconds of the last FreeOSMemory
	capMu    sync.Mutex
	capLast  time.Time // last audit record of a refusal at the cap
	capCount int
}

// New returns a gateway.
func New(cfg Config) *Gateway {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.Policy == nil {
		cfg.Policy = &netpolicy.Policy{}
	}
	g := &Gateway{cfg: cfg, names: cfg.Names, log: cfg.Log}
	g.pol.Store(cfg.Policy)
	g.refreshOwnAddrs()
	return g
}

// SetPolicy replaces the policy; it applies to new DNS answers and new
// connections at once.
func (g *Gateway) SetPolicy(p *netpolicy.Policy) { g.pol.Store(p) }

func (g *Gateway) policy() *netpolicy.Policy { return g.pol.Load() }

// Policy returns the current policy.
func (g *Gateway) Policy() *netpolicy.Policy { return g.pol.Load() }

func (g *Gateway) audit(e audit.Event) {
	if g.cfg.Audit != nil {
		g.cfg.Audit.Add(e)
	}
}

// specialNets are destinations a name may not resolve to unless a CIDR
// rule names them: they reach the host, its network, or nothing real.
var specialNets = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
		"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
		"255.255.255.255/32",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// refreshOwnAddrs records the host's own addresses: a name resolving to
// one of them (DNS rebinding) would reach services on this machine.
func (g *Gateway) refreshOwnAddrs() {
	var own []netip.Prefix
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap().Is4() {
			own = append(own, netip.PrefixFrom(p.Addr().Unmap(), 32))
		}
	}
	g.own.Store(&own)
}

// special reports why ip may not be dialled for a name, or "".
func (g *Gateway) special(ip netip.Addr) string {
	if !ip.Is4() && !ip.Is4In6() {
		return "not an IPv4 address"
	}
	ip = ip.Unmap()
	for _, p := range specialNets {
		if p.Contains(ip) {
			return "special address " + ip.String() + " (in " + p.String() + ")"
		}
	}
	for _, p := range *g.own.Load() {
		if p.Contains(ip) {
			return "an address of this host (" + ip.String() + ")"
		}
	}
	return ""
}

// upstream is an allowed connection's other end.
type upstream struct {
	conn net.Conn
	name string // "" for a raw address allowed by a CIDR rule
	ev   audit.Event
	// inspect: TLS goes through the broker; readOnly: only reads pass;
	// creds: the secrets this host gets.
	inspect, readOnly bool
	creds             []*Credential
}

// connect decides a guest connection to dst and dials it. A nil upstream
// with the event says why it was refused.
func (g *Gateway) connect(ctx context.Context, dst netip.AddrPort) (*upstream, audit.Event) {
	ev := audit.Event{Kind: "tcp", Dest: dst.String()}
	port := dst.Port()
	deny := func(reason string) (*upstream, audit.Event) {
		ev.Decision, ev.Reason = "deny", reason
		return nil, ev
	}
	ip := dst.Addr().Unmap()
	if !SyntheticNet.Contains(ip) {
		d := g.policy().DecideIP(ip, port)
		if !d.Allow {
			return deny(d.Reason)
		}
		ev.Rule = d.Rule
		return g.dial(ctx, ev, "", []netip.Addr{ip}, port, true)
	}
	name, ok := g.names.Lookup(ip)
	if !ok {
		return deny("no name is bound to " + ip.String())
	}
	ev.Name = name
	d := g.policy().Decide(name, port)
	creds := g.credentialsFor(name)
	if !d.Allow && !d.Denied && len(creds) > 0 && port == 443 {
		// A secret's hosts are allowed implicitly, on HTTPS, inspected.
		d = netpolicy.Decision{Allow: true, Rule: "secret " + creds[0].Name, Inspect: true}
	}
	if !d.Allow {
		return deny(d.Reason)
	}
	ev.Rule = d.Rule
	var addrs []netip.Addr
	trusted := false
	if a, ok := g.cfg.Overrides[name]; ok {
		addrs, trusted = []netip.Addr{a}, true
	} else if d.Pinned {
		// Pinned: exactly the addresses the user saw it resolve to,
		// never resolved again (a later answer, rebinding included,
		// changes nothing).
		if len(d.Pin) == 0 {
			return deny("rule " + d.Rule + " has no addresses (a pin is resolved when it is added): allow it again")
		}
		addrs = d.Pin
		ev.Rule += " (pinned)"
		up, ev := g.dialPinned(ctx, ev, name, addrs, port)
		if up != nil {
			up.inspect = d.Inspect || len(creds) > 0
			up.creds = creds
		}
		return up, ev
	} else {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		addrs, err = g.cfg.Resolver.LookupNetIP(rctx, "ip4", name)
		cancel()
		if err != nil {
			return deny("resolve " + name + ": " + err.Error())
		}
	}
	up, ev := g.dial(ctx, ev, name, addrs, port, trusted)
	if up != nil {
		up.inspect = d.Inspect || len(creds) > 0
		up.readOnly = d.ReadOnly
		up.creds = creds
	}
	return up, ev
}

// dialPinned connects to the first of a pin's addresses that works. A
// pinned address may be private, shared, documentation or this host's own
// (the user pinned it, seeing it); the few no pin may hold are refused
// again here, whatever the policy file said.
func (g *Gateway) dialPinned(ctx context.Context, ev audit.Event, name string, addrs []netip.Addr, port uint16) (*upstream, audit.Event) {
	var ok []netip.Addr
	var reasons []string
	for _, a := range addrs {
		if err := netpolicy.Pinnable(a); err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		ok = append(ok, a)
	}
	if len(ok) == 0 {
		ev.Decision, ev.Reason = "deny", strings.Join(reasons, "; ")
		return nil, ev
	}
	return g.dial(ctx, ev, name, ok, port, true)
}

// dial connects to the first acceptable address. Addresses are checked
// here, and the connection goes to exactly the address checked, never to a
// name that could resolve again to something else.
func (g *Gateway) dial(ctx context.Context, ev audit.Event, name string, addrs []netip.Addr, port uint16, trusted bool) (*upstream, audit.Event) {
	var reasons, special []string
	tried := 0
	for _, a := range addrs {
		a = a.Unmap()
		if d := g.policy().DecideIP(a, port); d.Denied {
			reasons = append(reasons, d.Reason)
			continue
		}
		if !trusted {
			if why := g.special(a); why != "" && !g.policy().NamesIP(a) {
				if name != "" && netpolicy.Pinnable(a) == nil {
					special = append(special, a.String()) // the user may pin it
				} else if name != "" {
					why = name + " resolved to " + why + ", which no name may reach (a resolver that lies, or DNS rebinding)"
				}
				reasons = append(reasons, why)
				continue
			}
		}
		if tried == 3 {
			break
		}
		tried++
		target := netip.AddrPortFrom(a, port).String()
		dctx, cancel := context.WithTimeout(ctx, g.cfg.DialTimeout)
		c, err := g.dialUpstream(dctx, target)
		cancel()
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		ev.Decision, ev.Upstream = "allow", target
		return &upstream{conn: c, name: name, ev: ev}, ev
	}
	ev.Decision = "deny"
	switch {
	case len(reasons) == 0:
		ev.Reason = "no address for " + name
	case len(special) == len(reasons):
		// Every address was one a name reaches only when pinned: say
		// which, and how the user pins it.
		ev.Refused = strings.Join(special, ",")
		ev.Reason = fmt.Sprintf("%s resolved to %s; a name may reach such an address only when the user pins it: %s",
			name, netpolicy.DescribeAddrs(strings.Join(special, ",")), g.allowCommand(netpolicy.RuleFor(name, port, true)))
	default:
		ev.Reason = strings.Join(reasons, "; ")
	}
	return nil, ev
}

// sandboxName is the sandbox's name for the commands the guest is told.
func (g *Gateway) sandboxName() string {
	if g.cfg.Sandbox == "" {
		return "NAME"
	}
	return g.cfg.Sandbox
}

// allowCommand is the command the user runs to add rule.
func (g *Gateway) allowCommand(rule string) string {
	return "kosa8 net allow " + g.sandboxName() + " " + rule
}

// fixFor is the command that lets a refused connection through, or ""
// when the refusal is not the allow-list's (an upstream that did not
// answer): for a name the allow-list does not cover, 'net allow NAME';
// for one a deny rule covers, 'net rm' of that rule; for an allowed name
// that resolved to an address only a pin reaches, 'net allow pin:NAME';
// for a raw address, its /32.
func (g *Gateway) fixFor(ev audit.Event, port uint16) string {
	host := ev.Name
	if host == "" {
		host, _, _ = strings.Cut(ev.Dest, ":")
	}
	switch {
	case ev.Refused != "" && ev.Name != "":
		return g.allowCommand(netpolicy.RuleFor(ev.Name, port, true))
	case strings.HasPrefix(ev.Reason, "denied by rule "):
		rule, _, _ := strings.Cut(strings.TrimPrefix(ev.Reason, "denied by rule "), " ")
		return "kosa8 net rm " + g.sandboxName() + " " + rule
	case policyRefusal(ev.Reason):
		return g.allowCommand(netpolicy.RuleFor(host, port, false))
	}
	return ""
}

// dialUpstream connects to target (an address already checked), with the
// kernel's buffers for it bounded.
func (g *Gateway) dialUpstream(ctx context.Context, target string) (net.Conn, error) {
	c, err := g.cfg.Dial(ctx, "tcp4", target)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(UpstreamBuffer)
		_ = tc.SetWriteBuffer(UpstreamBuffer)
	}
	return c, nil
}

// HandleTCP implements netstack.Handler.
func (g *Gateway) HandleTCP(flow netstack.Flow, accept func() (net.Conn, error)) {
	if n := g.conns.Add(1); n > int64(g.cfg.MaxConns) {
		g.conns.Add(-1)
		g.auditCap(flow)
		return // RST
	}
	defer g.connDone()
	for {
		p := g.peak.Load()
		if n := g.conns.Load(); n <= p || g.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if flow.Dst.Addr().Unmap() == RefusedAddr {
		g.explainRefusedName(flow, accept)
		return
	}
	up, ev := g.connect(context.Background(), flow.Dst)
	if up == nil {
		g.audit(ev)
		port := flow.Dst.Port()
		if fix := g.fixFor(ev, port); fix != "" && (port == 80 || port == 443 && ev.Name != "") {
			// HTTP and HTTPS: an agent reads a 403 that says why and
			// what the user runs, where a reset would only say it could
			// not connect.
			if c, err := accept(); err == nil {
				g.refuseWithPage(c, port, ev.Name, refusalPage{host: ev.Name, addr: ev.Dest, reason: ev.Reason, fix: fix})
			}
		}
		return // refused: the stack answers the guest with a RST
	}
	guest, err := accept()
	if err != nil {
		up.conn.Close()
		ev.Decision, ev.Reason = "deny", err.Error()
		g.audit(ev)
		return
	}
	g.serve(guest, up)
}

// RefusedAddr is the DNS answer for a name the allow-list refuses: a
// connection to it on port 80 or 443 gets a page saying why and what the
// user runs to allow the name (RefusalText), any other port a reset. No
// name is ever bound to it (NameMap stops short of it), so it stands for
// every refused name at once: refused lookups bind nothing, and the
// answer carries nothing but this fixed address.
var RefusedAddr = netip.MustParseAddr("198.19.255.254")

// refusedTTL is how long the guest may cache a refused name's answer: the
// user may allow the name a moment later.
const refusedTTL = 5

// refusalPage is what a 403 page says.
type refusalPage struct {
	host   string // the name refused, or "" for a raw address
	addr   string // ip:port the guest connected to, for a raw address
	reason string
	fix    string // the command that lets it through ("" when none does)
}

// RefusalText is what a request to a host the sandbox may not reach gets
// back, with a 403: what happened and the command the user runs to let it
// through.
func RefusalText(host, sandbox, reason, fix string) string {
	if sandbox == "" {
		sandbox = "NAME"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "kosa8: %s was refused: %s.\n", host, strings.TrimSuffix(reason, "."))
	b.WriteString("This sandbox's network is allow-listed: only what its user allowed can be reached,\nand retrying will not help.")
	if fix != "" {
		fmt.Fprintf(&b, " Tell the user what you need it for; on their machine,\n  %s\nlets it through.", fix)
	}
	fmt.Fprintf(&b, " Everything refused so far:\n  kosa8 net blocked %s\n", sandbox)
	return b.String()
}

// policyRefusal tells a refusal by the allow-list from a failure to reach
// an allowed host (which the guest sees as a failure to connect).
func policyRefusal(reason string) bool {
	return strings.HasPrefix(reason, "no rule allows") || strings.HasPrefix(reason, "port ") || strings.HasPrefix(reason, "denied by rule")
}

// refusalTimeout bounds how long a refused connection may take to say
// what it wanted, TLS handshake included (a guest under TCG is slow).
const refusalTimeout = 10 * time.Second

// refuseWithPage answers one request on a refused connection (plain HTTP
// on port 80, HTTPS on 443) with a 403 and RefusalText, then closes it.
// On 443 the guest's TLS must name sni (a refused name; "" for any that
// normalises, the name then being the refusal's host) and is terminated
// with a certificate of the sandbox CA, which the guest trusts. Anything
// else (no request within refusalTimeout, another server name) is just
// closed.
func (g *Gateway) refuseWithPage(c net.Conn, port uint16, sni string, rf refusalPage) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refusalTimeout))
	var rw io.ReadWriter = c
	br := bufio.NewReaderSize(io.LimitReader(c, 64<<10), 32<<10)
	if port == 443 {
		tc, name, err := g.refusalTLS(c, br, sni)
		if err != nil {
			return
		}
		defer tc.Close()
		if rf.host == "" {
			rf.host = name
		}
		rw, br = tc, bufio.NewReader(io.LimitReader(tc, 64<<10))
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if rf.host == "" {
		// A raw address: the guest's Host is its own text, so only the
		// address is repeated back.
		rf.host, _, _ = strings.Cut(rf.addr, ":")
	}
	if req.Body != nil {
		_ = req.Body.Close()
	}
	body := RefusalText(rf.host, g.cfg.Sandbox, rf.reason, rf.fix)
	fmt.Fprintf(rw, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Kosa8-Refused: %s\r\n\r\n%s", len(body), rf.host, body)
}

// refusalTLS terminates a refused HTTPS connection: the ClientHello's
// server name must normalise (and be want, when want is set), and the
// guest gets a certificate for it from the sandbox CA.
func (g *Gateway) refusalTLS(c net.Conn, br *bufio.Reader, want string) (*tls.Conn, string, error) {
	if g.cfg.CA == nil {
		return nil, "", errors.New("no sandbox CA")
	}
	h, _, err := peekClientHello(br)
	if err != nil {
		return nil, "", err
	}
	name, err := netpolicy.NormalizeHost(h.ServerName)
	if err != nil || want != "" && name != want {
		return nil, "", fmt.Errorf("TLS server name %q", h.ServerName)
	}
	leaf, err := g.cfg.CA.Leaf(name)
	if err != nil {
		return nil, "", err
	}
	tc := tls.Server(&bufferedConn{Conn: c, r: br}, &tls.Config{Certificates: []tls.Certificate{*leaf}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		return nil, "", err
	}
	return tc, name, nil
}

// explainRefusedName answers a connection to RefusedAddr: the guest
// looked up a name the allow-list refuses and connected anyway. On port
// 80 and 443 the name comes from the request's Host or the TLS server
// name, and the page says why it is refused now (or that it has been
// allowed since: look it up again); other ports are reset.
func (g *Gateway) explainRefusedName(flow netstack.Flow, accept func() (net.Conn, error)) {
	port := flow.Dst.Port()
	ev := audit.Event{Kind: "tcp", Dest: flow.Dst.String(), Decision: "deny"}
	if port != 80 && port != 443 {
		ev.Reason = "the address DNS gives names the allow-list refuses: nothing but its refusal page on ports 80 and 443"
		g.auditRepeat(ev)
		return
	}
	c, err := accept()
	if err != nil {
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refusalTimeout))
	var rw io.ReadWriter = c
	br := bufio.NewReaderSize(io.LimitReader(c, 64<<10), 32<<10)
	name := ""
	if port == 443 {
		tc, n, err := g.refusalTLS(c, br, "")
		if err != nil {
			return
		}
		defer tc.Close()
		name, rw, br = n, tc, bufio.NewReader(io.LimitReader(tc, 64<<10))
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Body != nil {
		_ = req.Body.Close()
	}
	if name == "" {
		h := req.Host
		if hh, _, err := net.SplitHostPort(h); err == nil {
			h = hh
		}
		if name, err = netpolicy.NormalizeHost(h); err != nil {
			return
		}
	}
	if containsAny(name, g.placeholderForms()) {
		g.auditRepeat(audit.Event{Kind: "exfiltration", Dest: flow.Dst.String(), Decision: "deny", Reason: "a secret's placeholder in the name asked of a refusal page"})
		return
	}
	ev.Name = name
	d := g.policy().AllowsName(name)
	rf := refusalPage{host: name}
	if d.Allow || len(g.credentialsFor(name)) > 0 && !d.Denied {
		rf.reason = "it has been allowed since the guest looked it up; look it up again (the old answer lasts " + fmt.Sprint(refusedTTL) + " s)"
		ev.Reason = "a refused name's old address after it was allowed: " + rf.reason
	} else {
		ev.Reason = d.Reason
		rf.reason, rf.fix = d.Reason, g.fixFor(ev, port)
	}
	g.auditRepeat(ev)
	body := RefusalText(rf.host, g.cfg.Sandbox, rf.reason, rf.fix)
	fmt.Fprintf(rw, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Kosa8-Refused: %s\r\n\r\n%s", len(body), rf.host, body)
}

// connDone counts a guest connection closed. When the last of a burst
// closes, the memory the burst took goes back to the system at once (Go
// would keep it for minutes): the supervisor's footprint returns after
// load.
func (g *Gateway) connDone() {
	if g.conns.Add(-1) > 0 || g.peak.Load() < freeAfterPeak {
		return
	}
	now := time.Now().UnixNano()
	last := g.lastFree.Load()
	if now-last < int64(10*time.Second) || !g.lastFree.CompareAndSwap(last, now) {
		return
	}
	g.peak.Store(0)
	// The stack tears its endpoints down (and lets go of their buffers)
	// after the connection is closed here, and a heap that stopped
	// growing sees no collection for a long time: give the memory back a
	// little later, and again once stragglers (TIME_WAIT) have gone.
	for _, d := range []time.Duration{2 * time.Second, 15 * time.Second, time.Minute} {
		time.AfterFunc(d, debug.FreeOSMemory)
	}
}

// freeAfterPeak is the burst size after which memory is given back.
const freeAfterPeak = 16

// auditCap records connections refused at the cap, once per window with
// a count: a guest hammering the cap must not flood the log.
func (g *Gateway) auditCap(flow netstack.Flow) {
	g.capMu.Lock()
	g.capCount++
	if time.Since(g.capLast) < dropWindow {
		g.capMu.Unlock()
		return
	}
	n := g.capCount
	g.capLast, g.capCount = time.Now(), 0
	g.capMu.Unlock()
	g.audit(audit.Event{Kind: "tcp", Dest: flow.Dst.String(), Decision: "deny", Count: n,
		Reason: fmt.Sprintf("the sandbox has %d connections open, its limit: refused (%d refused since the last entry)", g.cfg.MaxConns, n)})
}

// HandleUDP implements netstack.Handler: UDP other than DNS is dropped.
func (g *Gateway) HandleUDP(flow netstack.Flow) {
	g.auditDrop(audit.Event{Kind: "udp", Dest: flow.Dst.String(), Decision: "deny", Reason: "UDP other than DNS to the gateway is dropped"})
}

// HandleDropped implements netstack.Handler: ICMP, IPv6 and other IP
// protocols are dropped.
func (g *Gateway) HandleDropped(proto string, dst netip.Addr) {
	reason := "only TCP and DNS leave the sandbox"
	switch proto {
	case "icmp":
		reason = "ICMP is not carried: " + reason
	case "ipv6":
		reason = "IPv6 is not carried: " + reason
	}
	dest := ""
	if dst.IsValid() {
		dest = dst.String()
	}
	g.auditDrop(audit.Event{Kind: proto, Dest: dest, Decision: "deny", Reason: reason})
}

// auditDrop logs a dropped packet, at most once per kind and destination
// per dropWindow: a guest flooding packets cannot flood the audit log (and
// rotate away what came before). The next entry counts what was not
// logged meanwhile.
func (g *Gateway) auditDrop(e audit.Event) { g.auditRepeat(e) }

// auditRepeat logs e at most once per dropWindow for each kind, decision,
// name, query type and destination; the next entry counts the repeats not
// logged meanwhile. (Distinct records of one kind are bounded by the audit
// log's own budget per kind.)
func (g *Gateway) auditRepeat(e audit.Event) {
	key := repeatKey(e)
	now := time.Now()
	g.dropMu.Lock()
	if g.drops == nil || len(g.drops) >= maxDropKeys {
		g.drops = map[string]*dropCount{}
	}
	d := g.drops[key]
	if d != nil && now.Sub(d.logged) < dropWindow {
		d.suppressed++
		g.dropMu.Unlock()
		return
	}
	if d == nil {
		d = &dropCount{}
		g.drops[key] = d
	}
	if d.suppressed > 0 {
		e.Reason += fmt.Sprintf(" (%d more since the last entry)", d.suppressed)
		e.Count = d.suppressed
	}
	d.logged, d.suppressed = now, 0
	g.dropMu.Unlock()
	g.audit(e)
}

func repeatKey(e audit.Event) string {
	return e.Kind + " " + e.Decision + " " + e.Name + " " + e.QType + " " + e.Dest
}

const (
	dropWindow  = 10 * time.Second
	maxDropKeys = 4096
)

type dropCount struct {
	logged     time.Time
	suppressed int
}

// serve carries an allowed connection. The upstream's bytes flow to the
// guest at once (some protocols speak first); the guest's first bytes
// decide how its side is checked: a TLS ClientHello must name the host, an
// HTTP request must carry it in Host (and is then proxied request by
// request), anything else passes as is.
func (g *Gateway) serve(conn net.Conn, up *upstream) {
	ev := up.ev
	guest := &countingConn{Conn: conn}
	defer func() {
		guest.Close()
		up.conn.Close()
		ev.BytesOut, ev.BytesIn = guest.read.Load(), guest.written.Load()
		g.audit(ev)
	}()
	var takenBack atomic.Bool
	downDone := make(chan struct{})
	go func() {
		defer close(downDone)
		_, _ = io.Copy(guest, up.conn)
		if !takenBack.Load() {
			closeWrite(guest) // the server finished: tell the guest
		}
	}()
	gr := bufio.NewReaderSize(guest, 32<<10)
	_, err := gr.Peek(1)
	start := startOther
	if err == nil && up.name != "" && peekByte(gr) != 22 {
		start = httpStart(gr, guest)
	}
	port := 0
	if ap, perr := netip.ParseAddrPort(ev.Dest); perr == nil {
		port = int(ap.Port())
	}
	switch {
	case err != nil:
		// The guest sent nothing before closing.
		err = nil
	case up.name == "":
		_, _ = io.Copy(up.conn, gr)
	case peekByte(gr) == 22:
		err = g.serveTLS(guest, gr, up, &takenBack, downDone)
	case start == startUndecided:
		err = errors.New("the first bytes begin an HTTP request that never came whole: refused rather than passed unchecked")
	case start == startOther && port == 80:
		// Port 80 speaks HTTP: what is not a request the proxy can check
		// (a leading CRLF, a lower-case method) does not pass unchecked.
		err = errors.New("not an HTTP request on port 80: refused rather than passed unchecked")
	case start == startHTTP:
		// Take the upstream back from the raw copy: the proxy parses
		// responses too. If the server already spoke, this is no HTTP.
		takenBack.Store(true)
		_ = up.conn.SetReadDeadline(time.Now())
		<-downDone
		_ = up.conn.SetReadDeadline(time.Time{})
		if guest.written.Load() > 0 {
			err = errors.New("HTTP request after the server spoke first")
			break
		}
		err = g.proxyHTTP(guest, gr, up, func(r *http.Request) error {
			// Plain HTTP never carries a credential; it is still checked.
			return g.checkRequest(r, up, false)
		})
	default:
		_, _ = io.Copy(up.conn, gr)
	}
	if err != nil {
		ev.Decision, ev.Reason = "deny", err.Error()
		guest.Close()
		up.conn.Close()
	}
	closeWrite(up.conn)
	select {
	case <-downDone:
	case <-time.After(5 * time.Minute):
	}
}

// countingConn counts the bytes the guest sent and received.
type countingConn struct {
	net.Conn
	read, written atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

func (c *countingConn) CloseWrite() error {
	closeWrite(c.Conn)
	return nil
}

func peekByte(r *bufio.Reader) byte {
	b, _ := r.Peek(1)
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// serveTLS requires the ClientHello's SNI to be the name behind the
// address. An inspected host goes to the broker; any other passes through
// untouched (pinning and client certificates keep working).
func (g *Gateway) serveTLS(guest net.Conn, gr *bufio.Reader, up *upstream, takenBack *atomic.Bool, downDone chan struct{}) error {
	type result struct {
		h   *ClientHello
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		h, n, err := peekClientHello(gr)
		res <- result{h, n, err}
	}()
	var r result
	select {
	case r = <-res:
	case <-time.After(10 * time.Second):
		return errors.New("no complete ClientHello within 10 s")
	}
	if r.err != nil {
		return fmt.Errorf("refused TLS: %v", r.err)
	}
	sni, err := netpolicy.NormalizeHost(r.h.ServerName)
	if r.h.ServerName == "" || err != nil || sni != up.name {
		return fmt.Errorf("TLS server name %q does not match %s", r.h.ServerName, up.name)
	}
	if r.h.HasECH {
		// With ECH the real server name is hidden: fail closed.
		return errors.New("refused TLS: encrypted ClientHello (ECH) hides the server name")
	}
	if up.inspect {
		// The broker speaks to the upstream itself: stop the raw copy.
		takenBack.Store(true)
		_ = up.conn.SetReadDeadline(time.Now())
		<-downDone
		_ = up.conn.SetReadDeadline(time.Time{})
		return g.broker(guest, gr, up, r.h)
	}
	_, _ = io.Copy(up.conn, gr)
	return nil
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		_ = c.Close()
	}
}

// ServeDNS serves DNS on the stack's gateway address, UDP and TCP, until
// ctx ends.
func (g *Gateway) ServeDNS(ctx context.Context, st *netstack.Stack) error {
	pc, err := st.ListenUDP(53)
	if err != nil {
		return fmt.Errorf("DNS over UDP: %w", err)
	}
	l, err := st.ListenTCP(53)
	if err != nil {
		pc.Close()
		return fmt.Errorf("DNS over TCP: %w", err)
	}
	go func() {
		<-ctx.Done()
		pc.Close()
		l.Close()
	}()
	go g.ServeDNSPacket(ctx, pc)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go g.ServeDNSStream(c)
		}
	}()
	return nil
}
