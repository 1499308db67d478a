package sandbox

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/netpolicy"
)

// A pin given without addresses is resolved once, when it is added, and
// stored with what it resolved to; what no pin may hold is dropped, and a
// pin that keeps nothing, or does not resolve, adds nothing.
func TestPinsAreResolvedWhenAdded(t *testing.T) {
	lookup := func(_ context.Context, _, host string) ([]netip.Addr, error) {
		switch host {
		case "corp.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("203.0.113.80")}, nil
		case "local.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
		return nil, errors.New("no such host")
	}
	rules, err := ResolveRules(context.Background(), []string{"example.com", "pin:corp.test:8443"}, false, lookup)
	if err != nil || strings.Join(rules, " ") != "example.com pin:corp.test:8443=203.0.113.80" {
		t.Fatalf("ResolveRules = %q, %v", rules, err)
	}
	p := &netpolicy.Policy{}
	if err := AddAllowRules(context.Background(), p, []string{"a.test", "pin:local.test"}, false, lookup); err == nil || !strings.Contains(err.Error(), "loopback") || len(p.Rules) != 0 {
		t.Fatalf("a pin of loopback only: %v, rules %+v", err, p.Rules)
	}
	if err := AddAllowRules(context.Background(), p, []string{"pin:nowhere.test"}, false, lookup); err == nil || !strings.Contains(err.Error(), "resolve it on this machine") {
		t.Fatalf("a pin that does not resolve: %v", err)
	}
	if err := AddAllowRules(context.Background(), p, []string{"pin:corp.test"}, false, lookup); err != nil || len(p.Rules) != 1 || p.Rules[0].Text != "pin:corp.test=203.0.113.80" {
		t.Fatalf("pin: %v %+v", err, p.Rules)
	}
}
