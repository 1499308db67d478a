package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
)

// Files of the network, in the sandbox's directory.
const (
	policyFile = "network.json" // the allow-list in force (survives restarts)
	portsFile  = "ports.json"
	NamesFile  = "dns-names" // name ↔ synthetic address bindings
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
	return WriteJSONAtomic(s.Path(policyFile), p)
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
	return WriteJSONAtomic(s.Path(portsFile), p)
}

// AddAllowRules adds an allow rule for each of rules; broad accepts rules
// that match a whole public suffix or everything. An unresolved pin
// (pin:HOST) is resolved with lookup first (ResolvePin; nil: the host's
// resolver); rules that fail to parse or resolve add nothing.
func AddAllowRules(ctx context.Context, p *netpolicy.Policy, rules []string, broad bool, lookup Lookup) error {
	var add []netpolicy.Rule
	for _, s := range rules {
		r, err := netpolicy.ParseRule(s, netpolicy.ParseOptions{AllowBroad: broad})
		if err != nil {
			return err
		}
		if err := ResolvePin(ctx, &r, lookup); err != nil {
			return err
		}
		add = append(add, r)
	}
	for _, r := range add {
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
func AllowStopped(ctx context.Context, sb *Sandbox, rules []string, broad bool) (*netpolicy.Policy, error) {
	return editStopped(sb, "allow", rules, func(p *netpolicy.Policy) error { return AddAllowRules(ctx, p, rules, broad, nil) })
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

// RemoveRules removes the rules for each target (netpolicy's Remove: a
// bare target takes its allow rules, deny:TARGET its deny rule); a target
// that matches no rule is an error (and nothing is removed).
func RemoveRules(p *netpolicy.Policy, targets []string) error {
	c := p.Clone()
	for _, t := range targets {
		n, err := c.Remove(t)
		if err != nil {
			return err
		}
		if n == 0 {
			if d := c.DenyRuleFor(t); d != "" && !strings.HasPrefix(strings.TrimSpace(t), "deny:") {
				return fmt.Errorf("%w %q among the allow rules; its deny rule is removed by naming it: %s", ErrNoRule, t, d)
			}
			return fmt.Errorf("%w %q: see the rules with 'kosa8 net ls'", ErrNoRule, t)
		}
	}
	p.Rules = c.Rules
	return nil
}

// ErrPortInUse: the host port is taken.
var ErrPortInUse = errors.New("host port in use")

// ReadAudit reads the sandbox's audit log.
func (s *Sandbox) ReadAudit() ([]audit.Event, error) {
	return audit.Read(filepath.Join(s.Dir, AuditLog))
}

// BlockedHosts gathers what events record the guest was refused and pol
// still refuses, most recent first, each with the rule that lets it
// through (one entry per rule): names refused by DNS or on connecting
// (refused by no rule, a port, or a deny rule), allowed names refused for
// the address they resolved to (private, documentation, shared or the
// host's own: their rule is a pin), and raw addresses.
func BlockedHosts(events []audit.Event, pol *netpolicy.Policy) []api.Blocked {
	byRule := map[string]*api.Blocked{}
	for _, e := range events {
		b, ok := blocked(e, pol)
		if !ok {
			continue
		}
		have := byRule[b.Rule]
		if have == nil {
			have = &b
			byRule[b.Rule] = have
			have.Count = 0
		} else if b.Last.After(have.Last) || have.Port == 0 && b.Port != 0 {
			have.Port, have.Address, have.Why = b.Port, b.Address, b.Why
		}
		have.Count++
		if e.Time.After(have.Last) {
			have.Last = e.Time
		}
	}
	out := make([]api.Blocked, 0, len(byRule))
	for _, b := range byRule {
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

// blocked reads one event as a refusal pol still makes, with its fix.
func blocked(e audit.Event, pol *netpolicy.Policy) (api.Blocked, bool) {
	if e.Decision != "deny" || (e.Kind != "dns" && e.Kind != "tcp") {
		return api.Blocked{}, false
	}
	var port uint16
	var ip netip.Addr
	if e.Kind == "tcp" {
		ap, err := netip.ParseAddrPort(e.Dest)
		if err != nil {
			return api.Blocked{}, false
		}
		port, ip = ap.Port(), ap.Addr().Unmap()
	}
	b := api.Blocked{Port: port, Last: e.Time, Count: 1}
	denyRule := func(reason string) string {
		if r, ok := strings.CutPrefix(reason, "denied by rule "); ok {
			r, _, _ = strings.Cut(r, " ")
			return r
		}
		return ""
	}
	if e.Name == "" {
		// A raw address, refused by the allow-list (not by the cap on
		// connections, nor one of the synthetic range's).
		if e.Kind != "tcp" || syntheticNet.Contains(ip) || !strings.HasPrefix(e.Reason, "no rule allows the address") && !strings.HasPrefix(e.Reason, "denied by rule") {
			return api.Blocked{}, false
		}
		d := pol.DecideIP(ip, port)
		if d.Allow {
			return api.Blocked{}, false
		}
		b.Host, b.Address, b.Why = ip.String(), ip.String(), d.Reason
		b.Rule, b.DenyRule = netpolicy.RuleFor(ip.String(), port, false), denyRule(d.Reason)
		return b, true
	}
	host, err := netpolicy.NormalizeHost(e.Name)
	if err != nil {
		return api.Blocked{}, false
	}
	b.Host = host
	if e.Refused != "" {
		// Allowed, but refused for where it resolved: fixed by a pin, or
		// by nothing the user has done since.
		d := pol.Decide(host, port)
		if !d.Allow || d.Pinned {
			return api.Blocked{}, false
		}
		b.Address = e.Refused
		b.Why = "resolved to " + netpolicy.DescribeAddrs(e.Refused)
		b.Rule = netpolicy.RuleFor(host, port, true)
		return b, true
	}
	var d netpolicy.Decision
	if port == 0 {
		d = pol.AllowsName(host)
	} else {
		d = pol.Decide(host, port)
	}
	if d.Allow {
		return api.Blocked{}, false // allowed since, or refused for another reason
	}
	b.Why, b.DenyRule = d.Reason, denyRule(d.Reason)
	b.Rule = netpolicy.RuleFor(host, port, false)
	return b, true
}

// syntheticNet is where kosa8's DNS answers point (egress.SyntheticNet):
// a connection there without a name is no address the user could allow.
var syntheticNet = netip.MustParsePrefix("198.18.0.0/15")

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
