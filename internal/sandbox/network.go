package sandbox

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
	"path/filepath"
	"slices"
	"sort"
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
	"github.com/kosa8/kosa8/internal/vmm"
)

// Files of the network, in the sandbox's directory.
const (
	policyFile = "network.json" // the allow-list in force (survives restarts)
	portsFile  = "ports.json"
	namesFile  = "dns-names" // name ↔ synthetic address bindings
	AuditLog   = "audit.log"
	// SecurityLog is the evidence kept apart from AuditLog (audit.SecurityFile).
	SecurityLog = audit.SecurityFile
)

// NetworkConfig is the network a sandbox is created with.
type NetworkConfig struct {
	Rules      []string          `json:"rules,omitempty"`
	AllowBroad bool              `json:"allow_broad,omitempty"`
	Ports      []api.PortForward `json:"ports,omitempty"`
	// Pins binds names to the addresses they resolved to on the host when
	// the sandbox was made (an image build's package sources): exactly
	// these names may reach exactly these addresses, even where the
	// special-address check would refuse them (a mirror behind a proxy in
	// a private or documentation range); no other name may.
	Pins map[string]netip.Addr `json:"pins,omitempty"`
}

// LoadPolicy returns the sandbox's current allow-list.
func (s *Sandbox) LoadPolicy() (*netpolicy.Policy, error) {
	var p netpolicy.Policy
	err := readJSON(s.Path(policyFile), &p)
	if errors.Is(err, os.ErrNotExist) {
		return netpolicy.Parse(s.Config.Network.Rules, netpolicy.ParseOptions{AllowBroad: s.Config.Network.AllowBroad})
	}
	if err != nil {
		return nil, err
	}
	// Re-parse what was stored: the file is trusted no more than a flag.
	var texts []string
	for _, r := range p.Rules {
		texts = append(texts, r.Text)
	}
	return netpolicy.Parse(texts, netpolicy.ParseOptions{AllowBroad: true})
}

// SavePolicy records the allow-list.
func (s *Sandbox) SavePolicy(p *netpolicy.Policy) error {
	return writeJSONAtomic(s.Path(policyFile), p)
}

// LoadPorts returns the port forwards.
func (s *Sandbox) LoadPorts() ([]api.PortForward, error) {
	var p []api.PortForward
	err := readJSON(s.Path(portsFile), &p)
	if errors.Is(err, os.ErrNotExist) {
		return s.Config.Network.Ports, nil
	}
	return p, err
}

// SavePorts records the port forwards.
func (s *Sandbox) SavePorts(p []api.PortForward) error {
	if p == nil {
		p = []api.PortForward{}
	}
	return writeJSONAtomic(s.Path(portsFile), p)
}

// Host-side test settings, read by the supervisor from its environment
// (which the CLI that starts it passes on). Nothing in the guest can reach
// them.
const (
	// EnvNetOverrides maps names to host addresses: "a.test=127.0.0.1,b.test=127.0.0.1".
	EnvNetOverrides = "KOSA8_NET_OVERRIDES"
	// EnvNetResolver sends the host-side lookups to one DNS server: "127.0.0.1:5353".
	EnvNetResolver = "KOSA8_NET_RESOLVER"
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
	sb    *Sandbox
	ca    *egress.CA
	log   *slog.Logger
	audit *audit.Log
	names *egress.NameMap
	gw    *egress.Gateway
	stack *netstack.Stack // the current link's stack (guarded by mu)
	stop  context.CancelFunc

	mu       sync.Mutex
	forwards map[uint16]*forward
}

type forward struct {
	pf api.PortForward
	l  net.Listener
}

// startNetwork assembles the gateway and the stack and returns the socket
// end QEMU's NIC uses.
func startNetwork(sb *Sandbox, configDir string, log *slog.Logger) (*network, error) {
	pol, err := sb.LoadPolicy()
	if err != nil {
		return nil, fmt.Errorf("network policy: %w", err)
	}
	creds, err := sb.credentials(configDir)
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
	al, err := audit.Open(sb.Path(AuditLog), 0)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	names, err := egress.OpenNameMap(sb.Path(namesFile), 0)
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
	n := &network{sb: sb, ca: ca, log: log, audit: al, names: names, gw: gw, forwards: map[uint16]*forward{}}
	al.Add(audit.Event{Kind: "policy", Decision: "start", Reason: "rules: " + strings.Join(ruleTexts(pol), " ")})
	return n, nil
}

// attachLink makes a new link for a new QEMU: a socket pair whose host end
// a fresh stack serves (with DNS on the gateway), replacing the last one.
// It returns QEMU's end. The gateway, policy and name map carry over, so a
// restored guest's cached addresses still mean the same names.
func (n *network) attachLink() (*os.File, error) {
	n.detachLink()
	hostEnd, qemuEnd, err := vmm.SocketPair("net")
	if err != nil {
		return nil, err
	}
	conn, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		qemuEnd.Close()
		return nil, err
	}
	st, err := netstack.New(conn, n.gw, n.log)
	if err != nil {
		conn.Close()
		qemuEnd.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := n.gw.ServeDNS(ctx, st); err != nil {
		cancel()
		st.Close()
		qemuEnd.Close()
		return nil, err
	}
	n.mu.Lock()
	n.stack, n.stop = st, cancel
	n.mu.Unlock()
	return qemuEnd, nil
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

// allow adds rules and applies them to new connections at once.
func (n *network) allow(rules []string, broad bool) (*netpolicy.Policy, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.gw.Policy().Clone()
	if err := AddAllowRules(p, rules, broad); err != nil {
		return nil, err
	}
	if err := n.sb.SavePolicy(p); err != nil {
		return nil, err
	}
	n.gw.SetPolicy(p)
	n.audit.Add(audit.Event{Kind: audit.KindPolicy, Decision: "allow", Rule: strings.Join(rules, " ")})
	return p, nil
}

// deny adds deny rules for targets (hosts, wildcards, ranges, with ports
// or not): they win over every allow rule, at once.
func (n *network) deny(targets []string) (*netpolicy.Policy, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.gw.Policy().Clone()
	if err := AddDenyRules(p, targets); err != nil {
		return nil, err
	}
	if err := n.sb.SavePolicy(p); err != nil {
		return nil, err
	}
	n.gw.SetPolicy(p)
	n.audit.Add(audit.Event{Kind: audit.KindPolicy, Decision: "deny", Rule: strings.Join(targets, " ")})
	return p, nil
}

// remove takes the rules for targets out of the policy.
func (n *network) remove(targets []string) (*netpolicy.Policy, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.gw.Policy().Clone()
	if err := RemoveRules(p, targets); err != nil {
		return nil, err
	}
	if err := n.sb.SavePolicy(p); err != nil {
		return nil, err
	}
	n.gw.SetPolicy(p)
	n.audit.Add(audit.Event{Kind: audit.KindPolicy, Decision: "remove", Rule: strings.Join(targets, " ")})
	return p, nil
}

// AddAllowRules adds an allow rule for each of rules; broad accepts rules
// that match a whole public suffix or everything.
func AddAllowRules(p *netpolicy.Policy, rules []string, broad bool) error {
	for _, s := range rules {
		r, err := netpolicy.ParseRule(s, netpolicy.ParseOptions{AllowBroad: broad})
		if err != nil {
			return err
		}
		p.Add(r)
	}
	return nil
}

// AllowStopped, DenyStopped and RemoveStopped are the rule changes of a
// stopped sandbox: the running one's (allow, deny, remove), made under the
// supervisor's lock, so that no start begins meanwhile (one that did
// would not see a file edit), and written to the audit log as the
// running one writes them. A sandbox that is running, or starting, is
// ErrRunning: its supervisor makes the change (Client).
func AllowStopped(sb *Sandbox, rules []string, broad bool) (*netpolicy.Policy, error) {
	return editStopped(sb, "allow", rules, func(p *netpolicy.Policy) error { return AddAllowRules(p, rules, broad) })
}

// DenyStopped: see AllowStopped.
func DenyStopped(sb *Sandbox, targets []string) (*netpolicy.Policy, error) {
	return editStopped(sb, "deny", targets, func(p *netpolicy.Policy) error { return AddDenyRules(p, targets) })
}

// RemoveStopped: see AllowStopped.
func RemoveStopped(sb *Sandbox, targets []string) (*netpolicy.Policy, error) {
	return editStopped(sb, "remove", targets, func(p *netpolicy.Policy) error { return RemoveRules(p, targets) })
}

func editStopped(sb *Sandbox, decision string, args []string, f func(*netpolicy.Policy) error) (*netpolicy.Policy, error) {
	release, err := lockStopped(sb.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s started while its rules were being changed: try again", err, sb.Config.Name)
	}
	defer release()
	p, err := sb.LoadPolicy()
	if err != nil {
		return nil, err
	}
	if err := f(p); err != nil {
		return nil, err
	}
	al, err := audit.Open(sb.Path(AuditLog), 0)
	if err != nil {
		return nil, fmt.Errorf("open the audit log: %w", err)
	}
	defer al.Close()
	if err := sb.SavePolicy(p); err != nil {
		return nil, err
	}
	al.Add(audit.Event{Kind: audit.KindPolicy, Decision: decision, Rule: strings.Join(args, " ")})
	return p, nil
}

// AddPortStopped and RemovePortStopped change a stopped sandbox's port
// forwards for its next start, under the supervisor's lock (see
// AllowStopped).
func AddPortStopped(sb *Sandbox, pf api.PortForward) error {
	return editPortsStopped(sb, func(ports []api.PortForward) ([]api.PortForward, error) {
		for _, q := range ports {
			if q.HostPort == pf.HostPort {
				return nil, fmt.Errorf("%w: %d is already forwarded", ErrPortInUse, pf.HostPort)
			}
		}
		return append(ports, pf), nil
	})
}

// RemovePortStopped: see AddPortStopped. A port not forwarded is an error.
func RemovePortStopped(sb *Sandbox, hostPort uint16) error {
	return editPortsStopped(sb, func(ports []api.PortForward) ([]api.PortForward, error) {
		keep := slices.DeleteFunc(slices.Clone(ports), func(p api.PortForward) bool { return p.HostPort == hostPort })
		if len(keep) == len(ports) {
			return nil, fmt.Errorf("host port %d is not forwarded: 'kosa8 port ls %s' lists the forwards", hostPort, sb.Config.Name)
		}
		return keep, nil
	})
}

func editPortsStopped(sb *Sandbox, f func([]api.PortForward) ([]api.PortForward, error)) error {
	release, err := lockStopped(sb.Dir)
	if err != nil {
		return fmt.Errorf("%w: %s started while its ports were being changed: try again", err, sb.Config.Name)
	}
	defer release()
	ports, err := sb.LoadPorts()
	if err != nil {
		return err
	}
	if ports, err = f(ports); err != nil {
		return err
	}
	return sb.SavePorts(ports)
}

// AddDenyRules adds a deny rule for each target ("other.example.com",
// "*.example.com:22", "10.0.0.0/8").
func AddDenyRules(p *netpolicy.Policy, targets []string) error {
	for _, t := range targets {
		if !strings.HasPrefix(t, "deny:") {
			t = "deny:" + t
		}
		r, err := netpolicy.ParseRule(t, netpolicy.ParseOptions{})
		if err != nil {
			return err
		}
		p.Add(r)
	}
	return nil
}

// ErrNoRule: a target to remove matches no rule.
var ErrNoRule = errors.New("no rule matches")

// RemoveRules removes every rule for each target; a target that matches
// no rule is an error (and nothing is removed).
func RemoveRules(p *netpolicy.Policy, targets []string) error {
	c := p.Clone()
	for _, t := range targets {
		n, err := c.Remove(t)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w %q: see the rules with 'kosa8 net ls'", ErrNoRule, t)
		}
	}
	p.Rules = c.Rules
	return nil
}

// ErrPortInUse: the host port is taken.
var ErrPortInUse = errors.New("host port in use")

// addForward starts forwarding pf. Only to the guest, from the host: the
// listener is on the host's loopback (all interfaces only when asked),
// and what connects to it reaches the guest's port through the stack.
// Nothing here opens a path from the guest to the host.
func (n *network) addForward(pf api.PortForward, persist bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.forwards[pf.HostPort]; dup {
		return fmt.Errorf("%w: %d is already forwarded", ErrPortInUse, pf.HostPort)
	}
	host := "127.0.0.1"
	if pf.AllInterfaces {
		host = "0.0.0.0"
	}
	l, err := net.Listen("tcp4", net.JoinHostPort(host, strconv.Itoa(int(pf.HostPort))))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%w: %d (pick another, e.g. -p %d:%d)", ErrPortInUse, pf.HostPort, pf.HostPort+1, pf.GuestPort)
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

// ReadAudit reads the sandbox's audit log.
func (s *Sandbox) ReadAudit() ([]audit.Event, error) {
	return audit.Read(filepath.Join(s.Dir, AuditLog))
}

// BlockedHosts gathers the DNS lookups and connections by name that events
// record as denied and pol still denies, most recent first.
func BlockedHosts(events []audit.Event, pol *netpolicy.Policy) []api.Blocked {
	byKey := map[string]*api.Blocked{}
	for _, e := range events {
		if e.Decision != "deny" || e.Name == "" || (e.Kind != "dns" && e.Kind != "tcp") {
			continue
		}
		host, err := netpolicy.NormalizeHost(e.Name)
		if err != nil {
			continue
		}
		var port uint16
		if e.Kind == "tcp" {
			ap, err := netip.ParseAddrPort(e.Dest)
			if err != nil {
				continue
			}
			port = ap.Port()
		}
		if port == 0 && pol.AllowsName(host).Allow || port != 0 && pol.Decide(host, port).Allow {
			continue // allowed since, or refused for another reason
		}
		key := host + ":" + strconv.Itoa(int(port))
		b := byKey[key]
		if b == nil {
			rule := host
			if port != 0 && port != 80 && port != 443 {
				rule += ":" + strconv.Itoa(int(port))
			}
			b = &api.Blocked{Host: host, Port: port, Rule: rule}
			byKey[key] = b
		}
		b.Count++
		if e.Time.After(b.Last) {
			b.Last = e.Time
		}
	}
	out := make([]api.Blocked, 0, len(byKey))
	for _, b := range byKey {
		out = append(out, *b)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Last.Equal(out[j].Last) {
			return out[i].Last.After(out[j].Last)
		}
		return out[i].Rule < out[j].Rule
	})
	return out
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

// RefusedHost tells whether e records a host the guest asked for and was
// refused that pol still refuses (a candidate for 'kosa8 net approve'),
// and what 'net allow' would take for it.
func RefusedHost(e audit.Event, pol *netpolicy.Policy) (api.Blocked, bool) {
	list := BlockedHosts([]audit.Event{e}, pol)
	if len(list) != 1 {
		return api.Blocked{}, false
	}
	return list[0], true
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
			b, ok := RefusedHost(e, n.gw.Policy())
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
