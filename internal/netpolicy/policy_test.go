package netpolicy

import (
	"errors"
	"net/netip"
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
	n, err := p.Remove("GitHub.com.")
	if err != nil || n != 1 || p.Decide("github.com", 443).Allow {
		t.Fatalf("remove: n=%d err=%v rules=%+v", n, err, p.Rules)
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
	for _, s := range []string{"example.com", "*.npmjs.org:443", "10.0.0.0/8:22", "bücher.de", "a:1,2,3", "*", "x\x00y"} {
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
		if r.Wildcard && r.Host == "" {
			t.Fatalf("%q parsed to a match-all without AllowBroad", s)
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
