package sandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
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
