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

// dial connects to the first acceptable address. Addresses are checked
// here, and the connection goes to exactly the address checked, never to a
// name that could resolve again to something else.
func (g *Gateway) dial(ctx context.Context, ev audit.Event, name string, addrs []netip.Addr, port uint16, trusted bool) (*upstream, audit.Event) {
	var reasons []string
	tried := 0
	for _, a := range addrs {
		a = a.Unmap()
		if d := g.policy().DecideIP(a, port); d.Denied {
			reasons = append(reasons, d.Reason)
			continue
		}
		if !trusted {
			if why := g.special(a); why != "" && !g.policy().NamesIP(a) {
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
	if len(reasons) == 0 {
		ev.Reason = "no address for " + name
	} else {
		ev.Reason = fmt.Sprint(reasons)
	}
	return nil, ev
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
	up, ev := g.connect(context.Background(), flow.Dst)
	if up == nil {
		g.audit(ev)
		if flow.Dst.Port() == 80 && policyRefusal(ev.Reason) {
			// Plain HTTP: an agent reads a 403 that says why, where a
			// reset would only say it could not connect.
			if c, err := accept(); err == nil {
				g.refuseHTTP(c, ev)
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

// RefusalText is what a plain-HTTP request to a host the sandbox may not
// reach gets back, with a 403: what happened and how the user allows it.
func RefusalText(host, sandbox, reason string) string {
	if sandbox == "" {
		sandbox = "NAME"
	}
	return fmt.Sprintf("kosa8: %s is not allowed (%s).\n"+
		"This sandbox's network is allow-listed: only the hosts its user allowed can be reached.\n"+
		"Ask the user to allow it; they can list what was refused with\n"+
		"  kosa8 net blocked %s\n"+
		"and allow a host with\n"+
		"  kosa8 net allow %s %s\n", host, reason, sandbox, sandbox, host)
}

// policyRefusal tells a refusal by the allow-list from a failure to reach
// an allowed host (which the guest sees as a failure to connect).
func policyRefusal(reason string) bool {
	return strings.HasPrefix(reason, "no rule allows") || strings.HasPrefix(reason, "port ") || strings.HasPrefix(reason, "denied by rule")
}

// refuseHTTP answers one plain-HTTP request on a refused connection with a
// 403 and RefusalText, then closes it. Anything that is not an HTTP
// request within a few seconds is just closed.
func (g *Gateway) refuseHTTP(c net.Conn, ev audit.Event) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(c, 64<<10)))
	if err != nil {
		return
	}
	host := ev.Name
	if host == "" {
		h := req.Host
		if hh, _, err := net.SplitHostPort(h); err == nil {
			h = hh
		}
		// The Host is the guest's text: only a name that normalises is
		// repeated back, else the address it connected to.
		if norm, err := netpolicy.NormalizeHost(h); err == nil {
			host = norm
		} else {
			host, _, _ = strings.Cut(ev.Dest, ":")
		}
	}
	body := RefusalText(host, g.cfg.Sandbox, ev.Reason)
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Kosa8-Refused: %s\r\n\r\n%s", len(body), host, body)
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
