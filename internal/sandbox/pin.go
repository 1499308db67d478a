package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/kosa8/kosa8/internal/netpolicy"
)

// EnvNetResolver sends the host-side lookups of a sandbox's names to one
// DNS server ("127.0.0.1:5353"): a test setting, read on the host only
// (by the supervisor, and by whoever resolves a pin).
const EnvNetResolver = "KOSA8_NET_RESOLVER"

// Lookup resolves a name on the host.
type Lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)

// HostLookup is the host's resolver, or the server EnvNetResolver names.
func HostLookup() (Lookup, error) {
	addr := os.Getenv(EnvNetResolver)
	if addr == "" {
		return net.DefaultResolver.LookupNetIP, nil
	}
	if _, err := netip.ParseAddrPort(addr); err != nil {
		return nil, fmt.Errorf("%s=%q: want ip:port", EnvNetResolver, addr)
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	return r.LookupNetIP, nil
}

// pinLookupTimeout bounds the resolution of one pin.
const pinLookupTimeout = 10 * time.Second

// ResolvePin gives an unresolved pin (pin:HOST, see netpolicy) the
// addresses HOST resolves to now, on the host: from then on the sandbox
// reaches HOST at exactly those, and HOST is never resolved for it again.
// A resolved pin, or another rule, is left as it is.
func ResolvePin(ctx context.Context, r *netpolicy.Rule, lookup Lookup) error {
	if !r.Unresolved() {
		return nil
	}
	if lookup == nil {
		var err error
		if lookup, err = HostLookup(); err != nil {
			return err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, pinLookupTimeout)
	defer cancel()
	addrs, err := lookup(rctx, "ip4", r.Host)
	if err != nil {
		return fmt.Errorf("pin %s: resolve it on this machine: %w", r.Host, err)
	}
	if err := r.SetPin(addrs); err != nil {
		return fmt.Errorf("pin %s: %w", r.Host, err)
	}
	return nil
}

// ResolveRules returns rules with each unresolved pin among them resolved
// (ResolvePin); the others as they are.
func ResolveRules(ctx context.Context, rules []string, broad bool, lookup Lookup) ([]string, error) {
	out := make([]string, 0, len(rules))
	for _, s := range rules {
		r, err := netpolicy.ParseRule(s, netpolicy.ParseOptions{AllowBroad: broad})
		if err != nil {
			return nil, err
		}
		if !r.Unresolved() {
			out = append(out, s)
			continue
		}
		if err := ResolvePin(ctx, &r, lookup); err != nil {
			return nil, err
		}
		out = append(out, r.Text)
	}
	return out, nil
}
