// Package netpolicy decides what a sandbox may reach. It is pure: rules in,
// decisions out, no I/O, so that every decision can be tested and fuzzed.
//
// A rule is one of
//
//	example.com            that host, ports 80 and 443
//	example.com:22         that host, port 22 (ports: 22,2222 or a list)
//	*.example.com          any subdomain of example.com (not example.com itself)
//	10.1.2.0/24[:5432]     raw IPv4 addresses in that range (ports as above)
//	read:example.com       inspected (TLS terminated by kosa8's broker) and
//	                       read-only: GET and HEAD, and the read endpoints of
//	                       git smart HTTP (git-upload-pack)
//	inspect:example.com    inspected: every request's Host is checked
//	deny:example.com       refused, whatever allows it: deny rules win over
//	                       allow rules (and over a secret's implicit
//	                       allow). Any target form; without a port, all
//	                       ports.
//	pin:example.com=203.0.113.80[,ADDR...]
//	                       that host (ports as above), connected to at
//	                       exactly these addresses, never resolved again,
//	                       even where they are private, shared (CGNAT),
//	                       documentation or the host's own addresses,
//	                       which a name may otherwise not reach: a
//	                       registry behind a corporate proxy or
//	                       split-horizon DNS. Written without addresses
//	                       (pin:example.com), it is resolved on the host
//	                       once, when it is added (see Rule.Unresolved),
//	                       and stored with what it resolved to. Never a
//	                       wildcard or a range; never loopback, link-local,
//	                       multicast, reserved or kosa8's own synthetic
//	                       addresses. It pins a name, not an address: no
//	                       other name that resolves to the same address
//	                       gets through, and the pinned name that later
//	                       resolves elsewhere (DNS rebinding) still goes
//	                       to the pinned addresses only.
//
// Hosts match case-insensitively, without a trailing dot, in their IDNA
// (punycode) form; a wildcard matches at a dot boundary only, so
// *.example.com does not match evil-example.com. An empty policy allows
// nothing.
package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// DefaultPorts are the ports a rule without any allows.
var DefaultPorts = []uint16{80, 443}

// Rule is one allow rule.
type Rule struct {
	// Host is a normalised host name; with Wildcard, the suffix after "*.".
	Host     string `json:"host,omitempty"`
	Wildcard bool   `json:"wildcard,omitempty"`
	// Prefix is set for CIDR rules.
	Prefix netip.Prefix `json:"prefix,omitzero"`
	Ports  []uint16     `json:"ports"`
	// ReadOnly rules are inspected and allow only reads.
	ReadOnly bool `json:"read_only,omitempty"`
	// Inspect rules have their TLS terminated by the broker so that each
	// request can be checked.
	Inspect bool `json:"inspect,omitempty"`
	// Deny rules refuse what they match, whatever allows it. Their Ports
	// may be empty: every port.
	Deny bool `json:"deny,omitempty"`
	// Pinned rules are reached at exactly Pin (see the package doc); a
	// pinned rule without addresses is one still to be resolved.
	Pinned bool         `json:"pinned,omitempty"`
	Pin    []netip.Addr `json:"pin,omitempty"`
	// Text is the rule as the user wrote it, normalised; it names the rule
	// in decisions and logs.
	Text string `json:"text"`
}

func (r *Rule) prefix() string {
	switch {
	case r.Deny:
		return "deny:"
	case r.Pinned:
		return "pin:"
	case r.ReadOnly:
		return "read:"
	case r.Inspect:
		return "inspect:"
	}
	return ""
}

// ParseOptions tune ParseRule.
type ParseOptions struct {
	// AllowBroad accepts rules that match a whole public suffix (*.com,
	// *.co.uk) or everything (*, 0.0.0.0/0).
	AllowBroad bool
}

// ErrBroad is returned for a rule that matches far more than any one
// service: it needs ParseOptions.AllowBroad.
var ErrBroad = errors.New("rule matches a whole public suffix or everything")

const maxRuleLen = 300

// ParseRule reads one rule.
func ParseRule(s string, o ParseOptions) (Rule, error) {
	orig := s
	fail := func(msg string, args ...any) (Rule, error) {
		return Rule{}, fmt.Errorf("invalid network rule %q: %s", orig, fmt.Sprintf(msg, args...))
	}
	if len(s) > maxRuleLen {
		return fail("longer than %d characters", maxRuleLen)
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return fail("empty")
	}
	if strings.ContainsAny(s, "\x00 \t\r\n\\?#@[]") {
		return fail("contains a character hosts cannot have")
	}
	if strings.Contains(s, "://") {
		return fail("give a host, not a URL (for example github.com)")
	}
	readOnly, inspect, deny, pinned := false, false, false, false
	var pin []netip.Addr
	if rest, ok := strings.CutPrefix(s, "deny:"); ok {
		s, deny = rest, true
		if strings.HasPrefix(s, "read:") || strings.HasPrefix(s, "inspect:") || strings.HasPrefix(s, "deny:") || strings.HasPrefix(s, "pin:") {
			return fail("deny: takes a host, wildcard or range, without read:, inspect: or pin:")
		}
		// A deny rule can only narrow what is allowed: broad is fine.
		o.AllowBroad = true
	} else if rest, ok := strings.CutPrefix(s, "read:"); ok {
		s, readOnly, inspect = rest, true, true
	} else if rest, ok := strings.CutPrefix(s, "inspect:"); ok {
		s, inspect = rest, true
	} else if rest, ok := strings.CutPrefix(s, "pin:"); ok {
		s, pinned = rest, true
		if target, addrs, ok := strings.Cut(s, "="); ok {
			s = target
			var err error
			if pin, err = parsePinAddrs(addrs); err != nil {
				return fail("%v", err)
			}
		}
	}
	if strings.Contains(s, "=") {
		return fail("'=ADDRESS' belongs to pin: rules only (pin:%s)", s)
	}
	hostPart, portPart := s, ""
	// CIDR with a port: 10.0.0.0/8:5432. Host with a port: example.com:22.
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		hostPart, portPart = s[:i], s[i+1:]
		if strings.Contains(hostPart, ":") {
			return fail("IPv6 is not supported: sandboxes have IPv4 only")
		}
	}
	ports := DefaultPorts
	if deny {
		ports = nil // every port
	}
	if portPart != "" || strings.HasSuffix(s, ":") {
		var err error
		if ports, err = parsePorts(portPart); err != nil {
			return fail("%v", err)
		}
	}
	r := Rule{Ports: slices.Clone(ports), ReadOnly: readOnly, Inspect: inspect, Deny: deny, Pinned: pinned, Pin: pin}
	if (readOnly || inspect) && (strings.Contains(hostPart, "/") || isIP(hostPart)) {
		return fail("read: and inspect: rules take host names, not addresses")
	}
	if pinned && (strings.Contains(hostPart, "/") || isIP(hostPart) || strings.Contains(hostPart, "*")) {
		return fail("pin: takes one host name, not a wildcard or an address: it pins what that name resolves to (an address is allowed with a CIDR rule such as 10.0.0.5/32)")
	}
	if strings.Contains(hostPart, "/") {
		p, err := netip.ParsePrefix(hostPart)
		if err != nil {
			return fail("not a CIDR range (like 10.0.0.0/8)")
		}
		if !p.Addr().Is4() {
			return fail("IPv6 is not supported: sandboxes have IPv4 only")
		}
		p = p.Masked()
		if p.Bits() < 8 && !o.AllowBroad {
			return Rule{}, fmt.Errorf("network rule %q: %w (a /%d); it needs --allow-broad", orig, ErrBroad, p.Bits())
		}
		r.Prefix = p
		r.Text = r.prefix() + p.String() + r.portText()
		return r, nil
	}
	if ip, err := netip.ParseAddr(hostPart); err == nil {
		if !ip.Is4() {
			return fail("IPv6 is not supported: sandboxes have IPv4 only")
		}
		r.Prefix = netip.PrefixFrom(ip, 32)
		r.Text = r.prefix() + r.Prefix.String() + r.portText()
		return r, nil
	}
	if hostPart == "*" {
		if !o.AllowBroad {
			return Rule{}, fmt.Errorf("network rule %q: %w; it needs --allow-broad", orig, ErrBroad)
		}
		r.Wildcard, r.Host = true, ""
		r.Text = r.prefix() + "*" + r.portText()
		return r, nil
	}
	wild := false
	if rest, ok := strings.CutPrefix(hostPart, "*."); ok {
		wild, hostPart = true, rest
	}
	if strings.Contains(hostPart, "*") {
		return fail("a wildcard may only be a leading '*.'")
	}
	h, err := NormalizeHost(hostPart)
	if err != nil {
		return fail("%v", err)
	}
	switch h {
	case "deny", "read", "inspect", "pin":
		// With a port, its text (deny:1) would read back as a rule of
		// that kind: no real host is a lone label anyway.
		return fail("%q is a rule prefix, not a host (write %s:HOST)", h, h)
	}
	if wild && !o.AllowBroad {
		// *.com, *.co.uk, *.github.io: everything under a public suffix
		// belongs to unrelated owners.
		if suffix, _ := publicsuffix.PublicSuffix(h); suffix == h {
			return Rule{}, fmt.Errorf("network rule %q: %w; it needs --allow-broad", orig, ErrBroad)
		}
	}
	r.Host, r.Wildcard = h, wild
	r.Text = r.text()
	return r, nil
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// text is the rule as written: its kind, target, ports and, for a pin,
// its addresses.
func (r *Rule) text() string {
	t := r.prefix() + r.target() + r.portText()
	if len(r.Pin) > 0 {
		a := make([]string, len(r.Pin))
		for i, ip := range r.Pin {
			a[i] = ip.String()
		}
		t += "=" + strings.Join(a, ",")
	}
	return t
}

// RuleFor is the allow rule that lets host (a normalised name, or an
// IPv4 address) through on port: host, host:port beyond 80 and 443, an
// address as ADDR/32, and with pin a pin of the name (one that resolved
// to an address a name may reach only when pinned).
func RuleFor(host string, port uint16, pin bool) string {
	if a, err := netip.ParseAddr(host); err == nil {
		host = netip.PrefixFrom(a.Unmap(), 32).String()
	} else if pin {
		host = "pin:" + host
	}
	if port != 0 && !slices.Contains(DefaultPorts, port) {
		host += ":" + strconv.Itoa(int(port))
	}
	return host
}

// Unresolved reports whether r is a pin still to be resolved: whoever
// adds it resolves its host on the host (ResolvePin) first.
func (r *Rule) Unresolved() bool { return r.Pinned && len(r.Pin) == 0 }

// maxPinAddrs bounds the addresses of one pin.
const maxPinAddrs = 16

// parsePinAddrs reads a pin's comma-separated IPv4 addresses.
func parsePinAddrs(s string) ([]netip.Addr, error) {
	if s == "" {
		return nil, errors.New("no address after '='")
	}
	var out []netip.Addr
	for _, f := range strings.Split(s, ",") {
		a, err := netip.ParseAddr(f)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("pinned address %q is not an IPv4 address", f)
		}
		if err := Pinnable(a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	out = slices.Compact(out)
	if len(out) > maxPinAddrs {
		return nil, fmt.Errorf("more than %d pinned addresses", maxPinAddrs)
	}
	return out, nil
}

// SetPin gives an unresolved pin the addresses its host resolved to
// (Pinnable ones only; an error says why none are).
func (r *Rule) SetPin(addrs []netip.Addr) error {
	var keep []netip.Addr
	var why []string
	for _, a := range addrs {
		a = a.Unmap()
		if !a.Is4() {
			continue
		}
		if err := Pinnable(a); err != nil {
			why = append(why, err.Error())
			continue
		}
		keep = append(keep, a)
	}
	if len(keep) == 0 {
		if len(why) == 0 {
			return fmt.Errorf("%s resolves to no IPv4 address here", r.Host)
		}
		return fmt.Errorf("%s cannot be pinned: %s", r.Host, strings.Join(why, "; "))
	}
	slices.SortFunc(keep, netip.Addr.Compare)
	keep = slices.Compact(keep)
	if len(keep) > maxPinAddrs {
		keep = keep[:maxPinAddrs]
	}
	r.Pin = keep
	r.Text = r.text()
	return nil
}

// AddrKind names the kind of a special IPv4 address (one a name may not
// reach without a pin or a CIDR rule), or "" for an ordinary one.
func AddrKind(a netip.Addr) string {
	a = a.Unmap()
	for _, k := range addrKinds {
		if k.p.Contains(a) {
			return k.kind
		}
	}
	return ""
}

var addrKinds = func() []struct {
	p    netip.Prefix
	kind string
} {
	var out []struct {
		p    netip.Prefix
		kind string
	}
	for _, s := range [][2]string{
		{"0.0.0.0/8", "unspecified"}, {"10.0.0.0/8", "private"}, {"100.64.0.0/10", "shared (CGNAT)"},
		{"127.0.0.0/8", "loopback"}, {"169.254.0.0/16", "link-local"}, {"172.16.0.0/12", "private"},
		{"192.0.0.0/24", "IETF protocol"}, {"192.0.2.0/24", "documentation"}, {"192.88.99.0/24", "relay (6to4)"},
		{"192.168.0.0/16", "private"}, {"198.18.0.0/15", "benchmarking (kosa8's synthetic)"},
		{"198.51.100.0/24", "documentation"}, {"203.0.113.0/24", "documentation"}, {"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved"},
	} {
		out = append(out, struct {
			p    netip.Prefix
			kind string
		}{netip.MustParsePrefix(s[0]), s[1]})
	}
	return out
}()

// DescribeAddrs names each of a comma-separated list of addresses with
// its kind: "203.0.113.80 (a documentation address)"; an ordinary one
// there is this host's own (the only kind a gateway refuses besides).
func DescribeAddrs(list string) string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		k := AddrKind(a)
		if k == "" {
			k = "this host's own"
		}
		art := "a"
		if strings.ContainsRune("aeiou", rune(k[0])) {
			art = "an"
		}
		out = append(out, s+" ("+art+" "+k+" address)")
	}
	return strings.Join(out, ", ")
}

// Pinnable says why a may not be pinned, or nil: loopback and link-local
// addresses reach the host itself and its cloud's metadata service,
// unspecified, multicast and reserved ones nothing real, and the
// synthetic range is kosa8's own DNS answers.
func Pinnable(a netip.Addr) error {
	switch k := AddrKind(a); k {
	case "unspecified", "loopback", "link-local", "multicast", "reserved", "benchmarking (kosa8's synthetic)":
		return fmt.Errorf("%s is a %s address, which no pin may hold", a, k)
	}
	return nil
}

// portText is the rule's ports as written after its target: nothing for
// the default (80 and 443; for a deny rule, every port).
func (r *Rule) portText() string {
	if r.Deny {
		if len(r.Ports) == 0 {
			return ""
		}
		return ":" + joinPorts(r.Ports)
	}
	return portSuffix(r.Ports)
}

func joinPorts(p []uint16) string {
	s := make([]string, len(p))
	for i, v := range p {
		s[i] = strconv.Itoa(int(v))
	}
	return strings.Join(s, ",")
}

func portSuffix(p []uint16) string {
	if len(p) == 0 || slices.Equal(p, DefaultPorts) {
		return ""
	}
	s := make([]string, len(p))
	for i, v := range p {
		s[i] = strconv.Itoa(int(v))
	}
	return ":" + strings.Join(s, ",")
}

func parsePorts(s string) ([]uint16, error) {
	if s == "" {
		return nil, errors.New("empty port")
	}
	var out []uint16
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("bad port %q (1–65535)", f)
		}
		out = append(out, uint16(n))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

var idnaProfile = idna.New(idna.MapForLookup(), idna.BidiRule(), idna.StrictDomainName(false), idna.Transitional(false))

// NormalizeHost returns the canonical form of a host name: IDNA (punycode)
// ASCII, lower case, no trailing dot. It refuses names no DNS lookup could
// carry (NUL and control bytes, empty or over-long labels).
func NormalizeHost(h string) (string, error) {
	if h == "" {
		return "", errors.New("empty host")
	}
	if len(h) > 255 {
		return "", errors.New("host longer than 253 characters")
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; c < 0x21 || c == 0x7f {
			return "", errors.New("host contains a control character or space")
		}
	}
	if !utf8.ValidString(h) || strings.ContainsRune(h, utf8.RuneError) {
		return "", errors.New("host name is not valid UTF-8")
	}
	h = strings.TrimSuffix(h, ".")
	a, err := idnaProfile.ToASCII(h)
	if err != nil {
		return "", fmt.Errorf("not a valid host name: %v", err)
	}
	// The canonical form must be a fixed point, or two spellings of one
	// name could decide differently.
	if again, err := idnaProfile.ToASCII(a); err != nil || !strings.EqualFold(again, a) {
		return "", errors.New("not a valid host name: its IDNA form does not round-trip")
	}
	a = strings.ToLower(a)
	if len(a) > 253 || a == "" {
		return "", errors.New("host name length out of range")
	}
	labels := strings.Split(a, ".")
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		// No top-level domain is numeric: this is an address in disguise
		// (0.0.0.0., 127.1, 0x7f.1), which resolvers never send to DNS.
		return "", errors.New("looks like an IP address, not a host name (use a CIDR rule such as 10.0.0.5/32)")
	}
	for _, label := range labels {
		if label == "" || len(label) > 63 {
			return "", errors.New("host name has an empty or over-long label")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("host name has character %q", c)
			}
		}
	}
	return a, nil
}

// matchesHost reports whether r covers host (normalised).
func (r *Rule) matchesHost(host string) bool {
	if r.Prefix.IsValid() {
		return false
	}
	if !r.Wildcard {
		return host == r.Host
	}
	if r.Host == "" { // "*"
		return true
	}
	return strings.HasSuffix(host, "."+r.Host)
}

// allowsPort reports whether r covers port (a deny rule without ports
// covers all).
func (r *Rule) allowsPort(port uint16) bool {
	return r.Deny && len(r.Ports) == 0 || slices.Contains(r.Ports, port)
}

// Policy is a sandbox's allow-list.
type Policy struct {
	Rules []Rule `json:"rules"`
}

// Decision is the answer to one question.
type Decision struct {
	Allow  bool   `json:"allow"`
	Rule   string `json:"rule,omitempty"`   // the rule that allowed it
	Reason string `json:"reason,omitempty"` // why it was denied
	// Inspect: the connection must go through the broker; ReadOnly: and
	// only reads are allowed on it.
	Inspect  bool `json:"inspect,omitempty"`
	ReadOnly bool `json:"read_only,omitempty"`
	// Denied: a deny rule refused it; nothing may allow it then (not even
	// a secret bound to the host).
	Denied bool `json:"denied,omitempty"`
	// Pinned: the host is reached at exactly Pin, never resolved (a
	// pinned rule without addresses: reached nowhere).
	Pinned bool         `json:"pinned,omitempty"`
	Pin    []netip.Addr `json:"pin,omitempty"`
}

// Parse builds a policy from rule texts.
func Parse(rules []string, o ParseOptions) (*Policy, error) {
	p := &Policy{}
	for _, s := range rules {
		r, err := ParseRule(s, o)
		if err != nil {
			return nil, err
		}
		p.Add(r)
	}
	return p, nil
}

// Add adds r, merging the ports of a rule for the same target. An allow
// rule takes away the deny rules for exactly its target: allowing a host
// after denying it allows it again.
func (p *Policy) Add(r Rule) {
	if !r.Deny {
		p.Rules = slices.DeleteFunc(p.Rules, func(e Rule) bool { return e.Deny && e.target() == r.target() })
	}
	for i := range p.Rules {
		e := &p.Rules[i]
		if e.Host == r.Host && e.Wildcard == r.Wildcard && e.Prefix == r.Prefix && e.ReadOnly == r.ReadOnly && e.Inspect == r.Inspect && e.Deny == r.Deny && e.Pinned == r.Pinned {
			if len(r.Pin) > 0 {
				e.Pin = slices.Clone(r.Pin) // pinned again: what it resolves to now
			}
			if e.Deny && (len(e.Ports) == 0 || len(r.Ports) == 0) {
				e.Ports = nil // every port
			} else {
				e.Ports = append(e.Ports, r.Ports...)
				slices.Sort(e.Ports)
				e.Ports = slices.Compact(e.Ports)
			}
			e.Text = e.text()
			return
		}
	}
	p.Rules = append(p.Rules, r)
}

func (r *Rule) target() string {
	switch {
	case r.Prefix.IsValid():
		return r.Prefix.String()
	case r.Wildcard && r.Host == "":
		return "*"
	case r.Wildcard:
		return "*." + r.Host
	}
	return r.Host
}

// Remove drops the rules whose target is host, as written:
// "github.com", "*.npmjs.org", "10.0.0.0/8" remove the allow rules (plain,
// read:, inspect: and pin:) for it; with a prefix such as "deny:" or
// "pin:", only rules of that kind. A deny rule goes only when asked for
// with deny: (removing an allow rule must never lift a refusal: with
// *.example.com allowed, removing other.example.com's allow rule would
// otherwise take its deny rule too and let it through). With ports
// ("github.com:22"), only those ports go, and a rule goes when it has
// none left. It reports how many rules it changed.
func (p *Policy) Remove(target string) (int, error) {
	r, err := ParseRule(target, ParseOptions{AllowBroad: true})
	if err != nil {
		return 0, err
	}
	bare := strings.TrimSpace(target)
	for _, k := range []string{"deny:", "read:", "inspect:", "pin:"} {
		bare = strings.TrimPrefix(bare, k)
	}
	bare, _, _ = strings.Cut(bare, "=")
	withPorts := strings.Contains(bare, ":")
	match := func(e *Rule) bool {
		if r.prefix() == "" && e.Deny {
			return false // a deny rule goes only when asked for with deny:
		}
		return e.target() == r.target() && (r.prefix() == "" || r.prefix() == e.prefix())
	}
	if withPorts {
		for i := range p.Rules {
			if e := &p.Rules[i]; match(e) && len(e.Ports) == 0 {
				return 0, fmt.Errorf("%s covers every port: remove it whole (%s) and add back the ports to keep", e.Text, e.prefix()+e.target())
			}
		}
	}
	n := 0
	kept := p.Rules[:0]
	for _, e := range p.Rules {
		if match(&e) && !withPorts {
			n++
			continue
		}
		if match(&e) {
			left := slices.DeleteFunc(slices.Clone(e.Ports), func(port uint16) bool { return slices.Contains(r.Ports, port) })
			if len(left) != len(e.Ports) {
				n++
				if len(left) == 0 {
					continue
				}
				e.Ports = left
				e.Text = e.text()
			}
		}
		kept = append(kept, e)
	}
	p.Rules = kept
	return n, nil
}

// DenyRuleFor returns the text of the deny rule whose target is target's
// (as Remove reads it), or "".
func (p *Policy) DenyRuleFor(target string) string {
	r, err := ParseRule(target, ParseOptions{AllowBroad: true})
	if err != nil {
		return ""
	}
	for i := range p.Rules {
		if e := &p.Rules[i]; e.Deny && e.target() == r.target() {
			return e.Text
		}
	}
	return ""
}

// Clone returns a deep copy.
func (p *Policy) Clone() *Policy {
	c := &Policy{Rules: make([]Rule, len(p.Rules))}
	for i, r := range p.Rules {
		r.Ports = slices.Clone(r.Ports)
		r.Pin = slices.Clone(r.Pin)
		c.Rules[i] = r
	}
	return c
}

// deniedBy returns the deny rule that covers host on port (any port: 0
// means the name itself, denied only by a rule for every port), or nil.
func (p *Policy) deniedBy(host string, port uint16) *Rule {
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.Deny || !r.matchesHost(host) {
			continue
		}
		if port == 0 && len(r.Ports) == 0 || port != 0 && r.allowsPort(port) {
			return r
		}
	}
	return nil
}

func denied(r *Rule) Decision {
	return Decision{Reason: "denied by rule " + r.Text, Denied: true}
}

// AllowsName reports whether any rule covers host on any port: DNS answers
// a name the policy could let through.
func (p *Policy) AllowsName(host string) Decision {
	h, err := NormalizeHost(host)
	if err != nil {
		return Decision{Reason: err.Error()}
	}
	if r := p.deniedBy(h, 0); r != nil {
		return denied(r)
	}
	for i := range p.Rules {
		if !p.Rules[i].Deny && p.Rules[i].matchesHost(h) {
			return Decision{Allow: true, Rule: p.Rules[i].Text}
		}
	}
	return Decision{Reason: "no rule allows " + h}
}

// Decide answers whether host:port may be reached. A deny rule that
// covers it wins over every allow rule.
func (p *Policy) Decide(host string, port uint16) Decision {
	h, err := NormalizeHost(host)
	if err != nil {
		return Decision{Reason: err.Error()}
	}
	if r := p.deniedBy(h, port); r != nil {
		return denied(r)
	}
	named := false
	var best *Rule
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.Deny && r.matchesHost(h) {
			named = true
			// The least restrictive matching rule wins: a full allow over
			// an inspect over a read-only one; among full allows, a pin
			// (its addresses are the user's answer for this host).
			if r.allowsPort(port) && (best == nil || restriction(r) < restriction(best) ||
				restriction(r) == restriction(best) && r.Pinned && !best.Pinned) {
				best = r
			}
		}
	}
	if best != nil {
		return Decision{Allow: true, Rule: best.Text, Inspect: best.Inspect, ReadOnly: best.ReadOnly, Pinned: best.Pinned, Pin: slices.Clone(best.Pin)}
	}
	if named {
		return Decision{Reason: fmt.Sprintf("port %d of %s is not allowed", port, h)}
	}
	return Decision{Reason: "no rule allows " + h}
}

func restriction(r *Rule) int {
	switch {
	case r.ReadOnly:
		return 2
	case r.Inspect:
		return 1
	}
	return 0
}

// DecideIP answers whether a raw address may be reached: only a CIDR rule
// can allow one, and a deny CIDR rule wins.
func (p *Policy) DecideIP(ip netip.Addr, port uint16) Decision {
	ip = ip.Unmap()
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.Deny && r.Prefix.IsValid() && r.Prefix.Contains(ip) && r.allowsPort(port) {
			return denied(r)
		}
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.Deny && r.Prefix.IsValid() && r.Prefix.Contains(ip) && r.allowsPort(port) {
			return Decision{Allow: true, Rule: r.Text}
		}
	}
	return Decision{Reason: fmt.Sprintf("no rule allows the address %s:%d", ip, port)}
}

// NamesIP reports whether a CIDR rule allows ip: a special destination (a
// private or loopback address a name resolved to) is reachable only then.
func (p *Policy) NamesIP(ip netip.Addr) bool {
	ip = ip.Unmap()
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.Deny && r.Prefix.IsValid() && r.Prefix.Contains(ip) && len(r.Ports) == 0 {
			return false
		}
	}
	for i := range p.Rules {
		if !p.Rules[i].Deny && p.Rules[i].Prefix.IsValid() && p.Rules[i].Prefix.Contains(ip) {
			return true
		}
	}
	return false
}
