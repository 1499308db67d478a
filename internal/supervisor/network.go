package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/egress"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/netstack"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
)

// Host-side test settings, read by the supervisor from its environment
// (which the CLI that starts it passes on). Nothing in the guest can reach
// them.
const (
	// EnvNetOverrides maps names to host addresses: "a.test=127.0.0.1,b.test=127.0.0.1".
	EnvNetOverrides = "KOSA8_NET_OVERRIDES"
	// EnvNetResolver sends the host-side lookups to one DNS server: "127.0.0.1:5353".
	EnvNetResolver = sandbox.EnvNetResolver
)

func parseOverrides(s string) (map[string]netip.Addr, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]netip.Addr{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		name, err := netpolicy.NormalizeHost(k)
		a, aerr := netip.ParseAddr(v)
		if !ok || err != nil || aerr != nil {
			return nil, fmt.Errorf("%s: bad entry %q (want name=address)", EnvNetOverrides, kv)
		}
		m[name] = a
	}
	return m, nil
}

func resolverFor(addr string) (egress.Resolver, error) {
	if addr == "" {
		return nil, nil
	}
	if _, err := netip.ParseAddrPort(addr); err != nil {
		return nil, fmt.Errorf("%s=%q: want ip:port", EnvNetResolver, addr)
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}, nil
}

// network is the supervisor's side of a sandbox's network.
type network struct {
	sb    *sandbox.Sandbox
	ca    *egress.CA
	log   *slog.Logger
	audit *audit.Log
	names *egress.NameMap
	gw    *egress.Gateway
	stack *netstack.Stack // the current link's stack (guarded by mu)
	stop  context.CancelFunc
	// lookup resolves pins as the gateway resolves names.
	lookup sandbox.Lookup

	mu       sync.Mutex
	forwards map[uint16]*forward
}

type forward struct {
	pf api.PortForward
	l  net.Listener
}

// startNetwork assembles the gateway and the stack and returns the socket
// end QEMU's NIC uses.
func startNetwork(sb *sandbox.Sandbox, configDir string, log *slog.Logger) (*network, error) {
	pol, err := sb.LoadPolicy()
	if err != nil {
		return nil, fmt.Errorf("network policy: %w", err)
	}
	creds, err := credentials(sb, configDir)
	if err != nil {
		return nil, err
	}
	ca, err := egress.LoadOrCreateCA(sb.Dir, sb.Config.Name)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	roots, err := upstreamRoots()
	if err != nil {
		return nil, err
	}
	overrides, err := parseOverrides(os.Getenv(EnvNetOverrides))
	if err != nil {
		return nil, err
	}
	for name, a := range sb.Config.Network.Pins {
		if overrides == nil {
			overrides = map[string]netip.Addr{}
		}
		if _, ok := overrides[name]; !ok {
			overrides[name] = a
		}
	}
	res, err := resolverFor(os.Getenv(EnvNetResolver))
	if err != nil {
		return nil, err
	}
	al, err := audit.Open(sb.Path(sandbox.AuditLog), 0)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	names, err := egress.OpenNameMap(sb.Path(sandbox.NamesFile), 0)
	if err != nil {
		al.Close()
		return nil, fmt.Errorf("DNS name map: %w", err)
	}
	cfg := egress.Config{Policy: pol, Names: names, Audit: al, Log: log, Overrides: overrides,
		Credentials: creds, CA: ca, UpstreamRoots: roots, Sandbox: sb.Config.Name}
	if res != nil {
		cfg.Resolver = res
	}
	gw := egress.New(cfg)
	n := &network{sb: sb, ca: ca, log: log, audit: al, names: names, gw: gw, forwards: map[uint16]*forward{}, lookup: net.DefaultResolver.LookupNetIP}
	if res != nil {
		n.lookup = res.LookupNetIP
	}
	al.Add(audit.Event{Kind: "policy", Decision: "start", Reason: "rules: " + strings.Join(ruleTexts(pol), " ")})
	return n, nil
}

// newLink makes the socket pair of a new QEMU's network device: QEMU's
// end, and the host's, for attachLink once that QEMU is the sandbox's (a
// QEMU started ahead of a rewind sends nothing before its guest runs).
func (n *network) newLink() (qemuEnd, hostEnd *os.File, err error) {
	hostEnd, qemuEnd, err = vmm.SocketPair("net")
	return qemuEnd, hostEnd, err
}

// attachLink serves hostEnd (from newLink; it is closed either way) with a
// fresh stack, with DNS on the gateway, replacing the last one. The
// gateway, policy and name map carry over, so a restored guest's cached
// addresses still mean the same names.
func (n *network) attachLink(hostEnd *os.File) error {
	n.detachLink()
	conn, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		return err
	}
	st, err := netstack.New(conn, n.gw, n.log)
	if err != nil {
		conn.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := n.gw.ServeDNS(ctx, st); err != nil {
		cancel()
		st.Close()
		return err
	}
	if n.sb.Config.Docker != nil {
		// The guest's dockerd pulls through it: a refused registry is
		// then told why (egress.ProxyPort).
		if err := n.gw.ServeProxy(ctx, st); err != nil {
			cancel()
			st.Close()
			return err
		}
	}
	n.mu.Lock()
	n.stack, n.stop = st, cancel
	n.mu.Unlock()
	return nil
}

func (n *network) detachLink() {
	n.mu.Lock()
	st, stop := n.stack, n.stop
	n.stack, n.stop = nil, nil
	n.mu.Unlock()
	if stop != nil {
		stop()
	}
	if st != nil {
		st.Close()
	}
}

func ruleTexts(p *netpolicy.Policy) []string {
	out := []string{}
	for _, r := range p.Rules {
		out = append(out, r.Text)
	}
	return out
}

// close tears the network down.
func (n *network) close() {
	n.mu.Lock()
	for _, f := range n.forwards {
		f.l.Close()
	}
	n.mu.Unlock()
	n.detachLink()
	n.names.Close()
	n.audit.Close()
}

// allow adds rules and applies them to new connections at once. A pin
// is resolved first, with the gateway's resolver, outside the lock.
func (n *network) allow(ctx context.Context, rules []string, broad bool) (*netpolicy.Policy, error) {
	rules, err := sandbox.ResolveRules(ctx, rules, broad, n.lookup)
	if err != nil {
		return nil, err
	}
	return n.changePolicy("allow", rules, func(p *netpolicy.Policy) error { return sandbox.AddAllowRules(ctx, p, rules, broad, n.lookup) })
}

// deny adds deny rules for targets (hosts, wildcards, ranges, with ports
// or not): they win over every allow rule, at once.
func (n *network) deny(targets []string) (*netpolicy.Policy, error) {
	return n.changePolicy("deny", targets, func(p *netpolicy.Policy) error { return sandbox.AddDenyRules(p, targets) })
}

// remove takes the rules for targets out of the policy.
func (n *network) remove(targets []string) (*netpolicy.Policy, error) {
	return n.changePolicy("remove", targets, func(p *netpolicy.Policy) error { return sandbox.RemoveRules(p, targets) })
}

// changePolicy edits a copy of the policy in force, saves it, applies it
// to new connections and records the change in the audit log; a refused
// edit changes nothing.
func (n *network) changePolicy(decision string, rules []string, edit func(*netpolicy.Policy) error) (*netpolicy.Policy, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.gw.Policy().Clone()
	if err := edit(p); err != nil {
		return nil, err
	}
	if err := n.sb.SavePolicy(p); err != nil {
		return nil, err
	}
	n.gw.SetPolicy(p)
	n.audit.Add(audit.Event{Kind: audit.KindPolicy, Decision: decision, Rule: strings.Join(rules, " ")})
	return p, nil
}

// addForward starts forwarding pf. Only to the guest, from the host: the
// listener is on the host's loopback (all interfaces only when asked),
// and what connects to it reaches the guest's port through the stack.
// Nothing here opens a path from the guest to the host.
func (n *network) addForward(pf api.PortForward, persist bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.forwards[pf.HostPort]; dup {
		return fmt.Errorf("%w: %d is already forwarded", sandbox.ErrPortInUse, pf.HostPort)
	}
	host := "127.0.0.1"
	if pf.AllInterfaces {
		host = "0.0.0.0"
	}
	l, err := net.Listen("tcp4", net.JoinHostPort(host, strconv.Itoa(int(pf.HostPort))))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%w: %d (pick another, e.g. -p %d:%d)", sandbox.ErrPortInUse, pf.HostPort, pf.HostPort+1, pf.GuestPort)
		}
		return fmt.Errorf("forward port %d: %w", pf.HostPort, err)
	}
	n.forwards[pf.HostPort] = &forward{pf: pf, l: l}
	if persist {
		if err := n.sb.SavePorts(n.portsLocked()); err != nil {
			l.Close()
			delete(n.forwards, pf.HostPort)
			return err
		}
	}
	go n.serveForward(pf, l)
	return nil
}

func (n *network) serveForward(pf api.PortForward, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			n.mu.Lock()
			st := n.stack
			n.mu.Unlock()
			var g net.Conn
			err := errors.New("the sandbox is being restored")
			if st != nil {
				g, err = st.DialGuest(ctx, pf.GuestPort)
			}
			cancel()
			ev := audit.Event{Kind: "forward", Dest: fmt.Sprintf("guest:%d", pf.GuestPort), Upstream: c.RemoteAddr().String(), Decision: "allow"}
			if err != nil {
				ev.Decision, ev.Reason = "deny", "guest port: "+err.Error()
				n.audit.Add(ev)
				return
			}
			defer g.Close()
			done := make(chan int64, 1)
			go func() {
				m, _ := io.Copy(g, c)
				closeWrite(g)
				done <- m
			}()
			in, _ := io.Copy(c, g)
			closeWrite(c)
			ev.BytesOut, ev.BytesIn = in, <-done
			n.audit.Add(ev)
		}()
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

func (n *network) removeForward(hostPort uint16) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, ok := n.forwards[hostPort]
	if !ok {
		return fmt.Errorf("port %d is not forwarded", hostPort)
	}
	f.l.Close()
	delete(n.forwards, hostPort)
	return n.sb.SavePorts(n.portsLocked())
}

func (n *network) ports() []api.PortForward {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.portsLocked()
}

func (n *network) portsLocked() []api.PortForward {
	out := []api.PortForward{}
	for _, f := range n.forwards {
		out = append(out, f.pf)
	}
	return out
}

// NetCmdline is the kernel command line part that configures the guest NIC.
func NetCmdline() string {
	return fmt.Sprintf("kosa8.ip=%s/%d kosa8.gw=%s kosa8.mtu=%d", netstack.GuestIP, netstack.PrefixLen, netstack.GatewayIP, netstack.MTU)
}

// auditLog is the sandbox's audit log, or nil when the network is not up
// (audit.Log's methods accept nil). Workspace and checkpoint code records
// held writes, rewinds and checkpoints with auditLog().Security(…).
func (n *network) auditLog() *audit.Log {
	if n == nil {
		return nil
	}
	return n.audit
}

// streamRefused writes each host the guest is refused, as it happens, as
// one JSON object a line, until ctx ends.
func (n *network) streamRefused(ctx context.Context, w io.Writer, flush func()) error {
	events, cancel := n.audit.Subscribe()
	defer cancel()
	enc := json.NewEncoder(w)
	flush() // the client knows the stream is open
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-events:
			b, ok := sandbox.RefusedHost(e, n.gw.Policy())
			if !ok {
				continue
			}
			if err := enc.Encode(b); err != nil {
				return err
			}
			flush()
		}
	}
}
