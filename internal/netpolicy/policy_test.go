package netpolicy

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func mustPolicy(t *testing.T, rules ...string) *Policy {
	t.Helper()
	p, err := Parse(rules, ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecide(t *testing.T) {
	p := mustPolicy(t, "example.com", "*.npmjs.org", "github.com:22", "Bücher.example", "API.Anthropic.com.")
	cases := []struct {
		host  string
		port  uint16
		allow bool
	}{
		{"example.com", 443, true},
		{"example.com", 80, true},
		{"example.com", 8080, false},
		{"EXAMPLE.COM", 443, true},
		{"example.com.", 443, true},
		{"www.example.com", 443, false}, // exact rule: not subdomains
		{"registry.npmjs.org", 443, true},
		{"a.b.npmjs.org", 443, true},
		{"npmjs.org", 443, false}, // wildcard: subdomains only
		{"evil-npmjs.org", 443, false},
		{"npmjs.org.evil.net", 443, false},
		{"registry.npmjs.org.evil.net", 443, false},
		{"xnpmjs.org", 443, false},
		{"github.com", 22, true},
		{"github.com", 443, false},
		{"xn--bcher-kva.example", 443, true}, // punycode of the unicode rule
		{"bücher.example", 443, true},
		{"BÜCHER.example", 443, true},
		{"api.anthropic.com", 443, true},
		{"example.com\x00.evil.net", 443, false},
		{"example.com\x00", 443, false},
		{"", 443, false},
		{"example.com..", 443, false},
		{".example.com", 443, false},
		{"exa mple.com", 443, false},
	}
	for _, tc := range cases {
		d := p.Decide(tc.host, tc.port)
		if d.Allow != tc.allow {
			t.Errorf("Decide(%q, %d) = %+v, want allow=%v", tc.host, tc.port, d, tc.allow)
		}
		if d.Allow && d.Rule == "" {
			t.Errorf("Decide(%q, %d): allowed without naming the rule", tc.host, tc.port)
		}
		if !d.Allow && d.Reason == "" {
			t.Errorf("Decide(%q, %d): denied without a reason", tc.host, tc.port)
		}
	}
}

func TestEmptyPolicyAllowsNothing(t *testing.T) {
	p := &Policy{}
	if p.Decide("example.com", 443).Allow || p.AllowsName("example.com").Allow || p.DecideIP(netip.MustParseAddr("1.1.1.1"), 443).Allow {
		t.Fatal("empty policy allowed something")
	}
}

func TestDecideIP(t *testing.T) {
	p := mustPolicy(t, "10.1.0.0/16:5432", "192.168.1.7", "example.com")
	cases := []struct {
		ip    string
		port  uint16
		allow bool
	}{
		{"10.1.2.3", 5432, true},
		{"10.1.2.3", 443, false},
		{"10.2.0.1", 5432, false},
		{"192.168.1.7", 443, true},
		{"192.168.1.8", 443, false},
		{"::ffff:10.1.2.3", 5432, true}, // mapped form is the same address
		{"93.184.216.34", 443, false},   // a host rule never allows raw addresses
	}
	for _, tc := range cases {
		if d := p.DecideIP(netip.MustParseAddr(tc.ip), tc.port); d.Allow != tc.allow {
			t.Errorf("DecideIP(%s, %d) = %+v, want %v", tc.ip, tc.port, d, tc.allow)
		}
	}
	if !p.NamesIP(netip.MustParseAddr("10.1.9.9")) || p.NamesIP(netip.MustParseAddr("127.0.0.1")) {
		t.Error("NamesIP")
	}
}

func TestParseRuleErrors(t *testing.T) {
	cases := map[string]string{
		"":                       "empty",
		"https://example.com":    "not a URL",
		"exa mple.com":           "character",
		"example.com:0":          "bad port",
		"example.com:99999":      "bad port",
		"example.com:":           "empty port",
		"foo.*.com":              "wildcard",
		"**.example.com":         "wildcard",
		"2001:db8::/32":          "IPv6",
		"[::1]:22":               "character",
		"300.1.1.1/8":            "CIDR",
		"example.com/path":       "CIDR",
		"user@example.com":       "character",
		"exa\x00mple.com":        "character",
		strings.Repeat("a", 400): "longer",
		"a..b":                   "label",
		"-.example":              "",
	}
	for in, want := range cases {
		_, err := ParseRule(in, ParseOptions{})
		if err == nil {
			t.Errorf("ParseRule(%q) accepted", in)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRule(%q) = %v, want it to mention %q", in, err, want)
		}
		if in != "" && !strings.Contains(err.Error(), "%") && !strings.Contains(err.Error(), strings.TrimSpace(in[:min(len(in), 10)])) && !strings.ContainsAny(in, "\x00") {
			t.Errorf("ParseRule(%q): error does not quote the rule: %v", in, err)
		}
	}
}

func TestBroadRulesNeedFlag(t *testing.T) {
	for _, r := range []string{"*", "*.com", "*.co.uk", "*.github.io", "0.0.0.0/0", "10.0.0.0/4", "*:443"} {
		if _, err := ParseRule(r, ParseOptions{}); !errors.Is(err, ErrBroad) {
			t.Errorf("%q: err = %v, want ErrBroad", r, err)
		}
		if _, err := ParseRule(r, ParseOptions{AllowBroad: true}); err != nil {
			t.Errorf("%q with AllowBroad: %v", r, err)
		}
	}
	for _, r := range []string{"*.example.com", "*.npmjs.org", "10.0.0.0/8"} {
		if _, err := ParseRule(r, ParseOptions{}); err != nil {
			t.Errorf("%q rejected: %v", r, err)
		}
	}
}

func TestAddMergesAndRemove(t *testing.T) {
	p := mustPolicy(t, "github.com", "github.com:22")
	if len(p.Rules) != 1 || p.Rules[0].Text != "github.com:22,80,443" {
		t.Fatalf("merge: %+v", p.Rules)
	}
	if !p.Decide("github.com", 22).Allow || !p.Decide("github.com", 443).Allow {
		t.Fatal("merged rule lost a port")
	}
	// A port given removes that port only.
	n, err := p.Remove("github.com:22")
	if err != nil || n != 1 || p.Decide("github.com", 22).Allow || !p.Decide("github.com", 443).Allow || p.Rules[0].Text != "github.com" {
		t.Fatalf("remove a port: n=%d err=%v rules=%+v", n, err, p.Rules)
	}
	if n, _ := p.Remove("github.com:8080"); n != 0 || len(p.Rules) != 1 {
		t.Fatalf("removing a port the rule lacks changed it: n=%d rules=%+v", n, p.Rules)
	}
	n, err = p.Remove("GitHub.com.")
	if err != nil || n != 1 || p.Decide("github.com", 443).Allow {
		t.Fatalf("remove: n=%d err=%v rules=%+v", n, err, p.Rules)
	}
	// The last ports gone, the rule goes.
	p = mustPolicy(t, "example.com:22")
	if n, _ := p.Remove("example.com:22"); n != 1 || len(p.Rules) != 0 {
		t.Fatalf("rule left without ports: %+v", p.Rules)
	}
	// A deny rule for every port cannot lose one port: say so.
	p = mustPolicy(t, "deny:bad.example.com")
	if _, err := p.Remove("deny:bad.example.com:22"); err == nil || len(p.Rules) != 1 {
		t.Fatalf("a port taken from an every-port deny rule: err=%v rules=%+v", err, p.Rules)
	}
}

func TestReadOnlyAndInspect(t *testing.T) {
	p := mustPolicy(t, "read:github.com", "inspect:api.example.com", "example.org", "read:example.org")
	d := p.Decide("github.com", 443)
	if !d.Allow || !d.ReadOnly || !d.Inspect || d.Rule != "read:github.com" {
		t.Fatalf("read rule: %+v", d)
	}
	d = p.Decide("api.example.com", 443)
	if !d.Allow || d.ReadOnly || !d.Inspect {
		t.Fatalf("inspect rule: %+v", d)
	}
	if d := p.Decide("example.org", 443); !d.Allow || d.ReadOnly || d.Inspect {
		t.Fatalf("a full rule must win over a read-only one for the same host: %+v", d)
	}
	for _, bad := range []string{"read:10.0.0.0/8", "read:1.2.3.4", "inspect:https://x"} {
		if _, err := ParseRule(bad, ParseOptions{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if n, _ := p.Remove("read:example.org"); n != 1 || !p.Decide("example.org", 443).Allow {
		t.Fatalf("removing only the read rule: n=%d", n)
	}
}

func TestPresets(t *testing.T) {
	p, err := Preset("dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"registry.npmjs.org", "pypi.org", "files.pythonhosted.org", "proxy.golang.org", "github.com"} {
		if d := p.Decide(h, 443); !d.Allow || !d.ReadOnly {
			t.Errorf("dev preset does not allow %s read-only: %+v", h, d)
		}
	}
	for _, h := range []string{"evil.github.io", "x.vercel.app", "example.com"} {
		if p.Decide(h, 443).Allow {
			t.Errorf("dev preset allows %s", h)
		}
	}
	none, err := Preset("none")
	if err != nil || len(none.Rules) != 0 {
		t.Fatalf("none preset: %+v %v", none, err)
	}
	if _, err := Preset("everything"); err == nil {
		t.Fatal("unknown preset accepted")
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"example.com", "*.npmjs.org:443", "10.0.0.0/8:22", "bücher.de", "a:1,2,3", "*", "x\x00y", "deny:other.example.com", "deny:*.x.com:22", "deny:10.0.0.0/8", "deny:read:x.com", "pin:x.com=10.0.0.1", "pin:x.com:22=203.0.113.5,10.0.0.1", "pin:x.com"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s, ParseOptions{})
		if err != nil {
			return
		}
		// A parsed rule's text parses back to the same rule.
		r2, err := ParseRule(r.Text, ParseOptions{})
		if err != nil || r2.Text != r.Text {
			t.Fatalf("rule %q → %q does not round-trip: %v", s, r.Text, err)
		}
		if r.Wildcard && r.Host == "" && !r.Deny {
			t.Fatalf("%q parsed to a match-all without AllowBroad", s)
		}
		// A pin names one host and holds only addresses a pin may hold.
		if r.Pinned && (r.Wildcard || r.Prefix.IsValid() || r.Host == "") {
			t.Fatalf("%q parsed to a pin of no single host: %+v", s, r)
		}
		for _, a := range r.Pin {
			if Pinnable(a) != nil || !r.Pinned {
				t.Fatalf("%q parsed to a pin of %s", s, a)
			}
		}
	})
}

func FuzzDecide(f *testing.F) {
	f.Add("registry.npmjs.org")
	f.Add("evil-npmjs.org")
	f.Add("npmjs.org.evil")
	f.Add("x\x00.npmjs.org")
	p, _ := Parse([]string{"*.npmjs.org", "example.com"}, ParseOptions{})
	f.Fuzz(func(t *testing.T, host string) {
		d := p.Decide(host, 443)
		if !d.Allow {
			return
		}
		// Whatever is allowed must, normalised, be example.com or end in
		// ".npmjs.org" with a non-empty label before it.
		h, err := NormalizeHost(host)
		if err != nil {
			t.Fatalf("allowed %q that does not normalise: %v", host, err)
		}
		if h != "example.com" && !(strings.HasSuffix(h, ".npmjs.org") && len(h) > len(".npmjs.org")) {
			t.Fatalf("allowed %q (normalised %q)", host, h)
		}
		if strings.ContainsAny(h, "\x00/ ") {
			t.Fatalf("allowed host with forbidden bytes %q", h)
		}
	})
}

// Deny rules win over allow rules, on every path a decision takes: DNS,
// connections by name, raw addresses.
func TestDenyWins(t *testing.T) {
	p := mustPolicy(t, "*.example.com", "example.com", "deny:other.example.com", "deny:*.bad.example.com", "10.0.0.0/8", "deny:10.1.0.0/16", "ssh.example.com:22,443", "deny:ssh.example.com:22")
	cases := []struct {
		host  string
		port  uint16
		allow bool
	}{
		{"www.example.com", 443, true},
		{"example.com", 80, true},
		{"other.example.com", 443, false},
		{"OTHER.example.com.", 80, false},
		{"x.bad.example.com", 443, false},
		{"bad.example.com", 443, true}, // the wildcard deny is subdomains only
		{"sub.other.example.com", 443, true},
		{"ssh.example.com", 22, false},
		{"ssh.example.com", 443, true},
	}
	for _, tc := range cases {
		d := p.Decide(tc.host, tc.port)
		if d.Allow != tc.allow {
			t.Errorf("Decide(%q, %d) = %+v, want allow=%v", tc.host, tc.port, d, tc.allow)
		}
		if !d.Allow && strings.Contains(tc.host, "other") && (!d.Denied || !strings.Contains(d.Reason, "deny:other.example.com")) {
			t.Errorf("Decide(%q): %+v does not name the deny rule", tc.host, d)
		}
	}
	if d := p.AllowsName("other.example.com"); d.Allow || !d.Denied {
		t.Errorf("DNS for a denied name: %+v", d)
	}
	if d := p.AllowsName("ssh.example.com"); !d.Allow {
		t.Errorf("DNS for a name denied on one port only: %+v", d)
	}
	for ip, allow := range map[string]bool{"10.2.3.4": true, "10.1.2.3": false} {
		if d := p.DecideIP(netip.MustParseAddr(ip), 443); d.Allow != allow {
			t.Errorf("DecideIP(%s) = %+v", ip, d)
		}
	}
	if p.NamesIP(netip.MustParseAddr("10.1.2.3")) {
		t.Error("a denied range still names its addresses")
	}
	// Listed, in order, and they survive a save and a re-parse.
	var texts []string
	for _, r := range p.Rules {
		texts = append(texts, r.Text)
	}
	if !slices.Contains(texts, "deny:other.example.com") || !slices.Contains(texts, "deny:ssh.example.com:22") {
		t.Fatalf("rules %q", texts)
	}
	again, err := Parse(texts, ParseOptions{})
	if err != nil || again.Decide("other.example.com", 443).Allow {
		t.Fatalf("re-parsed: %v", err)
	}
	// Allowing exactly a denied host again takes its deny rule away.
	r, _ := ParseRule("other.example.com", ParseOptions{})
	p.Add(r)
	if d := p.Decide("other.example.com", 443); !d.Allow {
		t.Fatalf("allowed again, still refused: %+v", d)
	}
	// Removing: a target that matches nothing removes nothing.
	if n, err := p.Remove("nothing.example.org"); err != nil || n != 0 {
		t.Fatalf("Remove of nothing: %d %v", n, err)
	}
	if n, _ := p.Remove("deny:*.bad.example.com"); n != 1 || !p.Decide("x.bad.example.com", 443).Allow {
		t.Fatalf("Remove of a deny rule: %d", n)
	}
}

func TestDenyRuleParse(t *testing.T) {
	for in, want := range map[string]string{
		"deny:Other.Example.com.": "deny:other.example.com",
		"deny:*":                  "deny:*",
		"deny:*.com":              "deny:*.com",
		"deny:10.0.0.0/8:5432":    "deny:10.0.0.0/8:5432",
		"deny:x.com:80,443":       "deny:x.com:80,443",
	} {
		r, err := ParseRule(in, ParseOptions{})
		if err != nil || r.Text != want || !r.Deny {
			t.Errorf("ParseRule(%q) = %q %v, want %q", in, r.Text, err, want)
		}
	}
	for _, bad := range []string{"deny:", "deny:read:x.com", "deny:inspect:x.com", "deny:deny:x.com"} {
		if _, err := ParseRule(bad, ParseOptions{}); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}

// FuzzDenyWins: whatever the host, a policy that allows everything under
// example.com and denies other.example.com never allows that name, in
// any spelling.
func FuzzDenyWins(f *testing.F) {
	for _, s := range []string{"other.example.com", "OTHER.example.com.", "xn--other.example.com", "other.example.com\x00", "other.example.com:443"} {
		f.Add(s, uint16(443))
	}
	p, _ := Parse([]string{"*.example.com", "deny:other.example.com"}, ParseOptions{})
	f.Fuzz(func(t *testing.T, host string, port uint16) {
		d := p.Decide(host, port)
		if h, err := NormalizeHost(host); err == nil && h == "other.example.com" && (d.Allow || p.AllowsName(host).Allow) {
			t.Fatalf("denied host %q allowed: %+v", host, d)
		}
	})
}

// A pin allows one host at exactly the addresses it holds: its text
// carries them (so a saved policy keeps them), it never covers another
// name, and no pin may hold an address that reaches the host itself, the
// cloud's metadata service or kosa8's own synthetic range.
func TestPinRules(t *testing.T) {
	for in, want := range map[string]string{
		"pin:Registry.NPMjs.org.=203.0.113.80":          "pin:registry.npmjs.org=203.0.113.80",
		"pin:x.example:8443=10.0.0.2,10.0.0.1,10.0.0.2": "pin:x.example:8443=10.0.0.1,10.0.0.2",
		"pin:x.example": "pin:x.example",
	} {
		r, err := ParseRule(in, ParseOptions{})
		if err != nil || r.Text != want || !r.Pinned {
			t.Errorf("ParseRule(%q) = %q %v, want %q", in, r.Text, err, want)
		}
	}
	for bad, why := range map[string]string{
		"pin:*.example.com=10.0.0.1":    "not a wildcard",
		"pin:10.0.0.1":                  "not a wildcard or an address",
		"pin:10.0.0.0/8":                "not a wildcard or an address",
		"pin:x.example=127.0.0.1":       "loopback",
		"pin:x.example=169.254.169.254": "link-local",
		"pin:x.example=198.18.0.5":      "synthetic",
		"pin:x.example=0.0.0.0":         "unspecified",
		"pin:x.example=224.0.0.1":       "multicast",
		"pin:x.example=255.255.255.255": "reserved",
		"pin:x.example=::1":             "not an IPv4 address",
		"pin:x.example=":                "no address",
		"x.example=10.0.0.1":            "pin: rules only",
		"deny:pin:x.example":            "without read:, inspect: or pin:",
	} {
		if _, err := ParseRule(bad, ParseOptions{}); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseRule(%q) = %v, want an error saying %q", bad, err, why)
		}
	}
	p := mustPolicy(t, "*.npmjs.org", "pin:registry.npmjs.org=203.0.113.80", "other.example")
	d := p.Decide("registry.npmjs.org", 443)
	if !d.Allow || !d.Pinned || len(d.Pin) != 1 || d.Pin[0] != netip.MustParseAddr("203.0.113.80") {
		t.Fatalf("the pinned host: %+v", d)
	}
	if d := p.Decide("www.npmjs.org", 443); !d.Allow || d.Pinned {
		t.Fatalf("a name the pin does not name got its addresses: %+v", d)
	}
	if d := p.Decide("registry.npmjs.org", 8443); d.Allow {
		t.Fatalf("a port the pin does not name: %+v", d)
	}
	// Pinned again: the addresses are replaced, the ports merged.
	r, _ := ParseRule("pin:registry.npmjs.org:8443=203.0.113.81", ParseOptions{})
	p.Add(r)
	if d := p.Decide("registry.npmjs.org", 443); !d.Pinned || d.Pin[0] != netip.MustParseAddr("203.0.113.81") || !slices.Contains(ruleTexts(p), "pin:registry.npmjs.org:80,443,8443=203.0.113.81") {
		t.Fatalf("pinned again: %+v %q", d, ruleTexts(p))
	}
	// A saved policy keeps the pin.
	again, err := Parse(ruleTexts(p), ParseOptions{})
	if err != nil || !again.Decide("registry.npmjs.org", 443).Pinned {
		t.Fatalf("re-parsed: %v", err)
	}
	// An unresolved pin gets its addresses once, from SetPin.
	u, _ := ParseRule("pin:corp.example", ParseOptions{})
	if !u.Unresolved() {
		t.Fatal("a pin without addresses is not unresolved")
	}
	if err := u.SetPin([]netip.Addr{netip.MustParseAddr("127.0.0.1")}); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("SetPin took loopback: %v", err)
	}
	if err := u.SetPin([]netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.1.2.3")}); err != nil || u.Text != "pin:corp.example=10.1.2.3" || u.Unresolved() {
		t.Fatalf("SetPin: %v %q", err, u.Text)
	}
	// Removing: the bare host and pin: both take it away.
	for _, target := range []string{"registry.npmjs.org", "pin:registry.npmjs.org", "pin:registry.npmjs.org=203.0.113.81"} {
		q := again.Clone()
		if n, err := q.Remove(target); err != nil || n != 1 || q.Decide("registry.npmjs.org", 443).Pinned {
			t.Errorf("Remove(%q): n=%d err=%v", target, n, err)
		}
	}
}

func ruleTexts(p *Policy) []string {
	var out []string
	for _, r := range p.Rules {
		out = append(out, r.Text)
	}
	return out
}

// Removing a host's rules without deny: leaves its deny rule: removing an
// allow must never lift a refusal (with *.example.com allowed, taking the
// deny of other.example.com along would let it through).
func TestRemoveKeepsDenyRules(t *testing.T) {
	p := mustPolicy(t, "*.example.com", "other.example.com", "deny:other.example.com")
	// (Add of an allow after a deny takes the deny away; this order keeps both.)
	if len(p.Rules) != 3 {
		r, _ := ParseRule("deny:other.example.com", ParseOptions{})
		p.Add(r)
	}
	if n, err := p.Remove("other.example.com"); err != nil || n != 1 {
		t.Fatalf("Remove: n=%d err=%v rules=%q", n, err, ruleTexts(p))
	}
	if p.Decide("other.example.com", 443).Allow || p.DenyRuleFor("other.example.com") != "deny:other.example.com" {
		t.Fatalf("removing the allow rule lifted the deny rule: %q", ruleTexts(p))
	}
	// Only deny rules left for it: the bare target matches nothing.
	if n, err := p.Remove("other.example.com"); err != nil || n != 0 {
		t.Fatalf("Remove of a deny-only target: n=%d err=%v", n, err)
	}
	if n, _ := p.Remove("deny:other.example.com"); n != 1 || !p.Decide("other.example.com", 443).Allow {
		t.Fatalf("deny: removes it: n=%d rules=%q", n, ruleTexts(p))
	}
}

func TestAddrKind(t *testing.T) {
	for a, want := range map[string]string{"203.0.113.80": "documentation", "10.1.1.1": "private", "100.64.0.1": "shared (CGNAT)", "8.8.8.8": "", "127.0.0.2": "loopback"} {
		if got := AddrKind(netip.MustParseAddr(a)); got != want {
			t.Errorf("AddrKind(%s) = %q, want %q", a, got, want)
		}
	}
}
