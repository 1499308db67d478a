package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
)

// NetConfig is the guest's one interface, from the kernel command line
// (kosa8.ip=ADDR/PREFIX kosa8.gw=ADDR). The gateway is also the resolver.
type NetConfig struct {
	Addr    netip.Prefix
	Gateway netip.Addr
	MTU     int // 0: 1500
}

// configureNet brings up eth0 with a static IPv4 address, a default route
// through the gateway and the gateway as resolver. IPv6 is switched off:
// the host side drops it anyway, and a client should not wait on it.
func configureNet(c NetConfig) error {
	for _, p := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
		_ = os.WriteFile(p, []byte("1"), 0o644)
	}
	var link netlink.Link
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		if link, err = netlink.LinkByName("eth0"); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("no eth0: %w", err)
	}
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", []byte("1"), 0o644)
	mtu := c.MTU
	if mtu == 0 {
		mtu = 1500
	}
	if err := netlink.LinkSetMTU(link, mtu); err != nil {
		return fmt.Errorf("eth0 mtu %d: %w", mtu, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: c.Addr.Addr().AsSlice(), Mask: net.CIDRMask(c.Addr.Bits(), 32)}}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("eth0 address: %w", err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: c.Gateway.AsSlice()}
	if err := netlink.RouteReplace(route); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("default route: %w", err)
	}
	resolv := "# written by kosa8-agent: the gateway answers DNS for the sandbox\nnameserver " + c.Gateway.String() + "\noptions edns0\n"
	_ = os.Remove("/etc/resolv.conf") // may be a dangling link into /run
	return os.WriteFile("/etc/resolv.conf", []byte(resolv), 0o644)
}
