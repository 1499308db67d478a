package netstack

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// Peer is a user-space stand-in for the guest's kernel: a second stack on
// the other end of the link, configured as the agent configures eth0. Tests
// and benchmarks drive the real Stack through it without booting a VM.
type Peer struct {
	s      *stack.Stack
	cancel context.CancelFunc
	link   io.ReadWriteCloser
}

// NewPeer starts a guest-side stack on link.
func NewPeer(link io.ReadWriteCloser) (*Peer, error) {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	ep := channel.New(queueLen, mtu+header.EthernetMinimumSize, tcpip.LinkAddress(GuestMAC))
	if err := s.CreateNIC(1, ethernet.New(ep)); err != nil {
		return nil, fmt.Errorf("peer NIC: %s", err)
	}
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: addr(GuestIP), PrefixLen: PrefixLen}}, stack.AddressProperties{}); err != nil {
		return nil, fmt.Errorf("peer address: %s", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: addr(GatewayIP), NIC: 1}})
	tuneTCP(s)
	ctx, cancel := context.WithCancel(context.Background())
	p := &Peer{s: s, cancel: cancel, link: link}
	go func() {
		for {
			pkt := ep.ReadContext(ctx)
			if pkt == nil {
				return
			}
			v := pkt.ToView()
			b := make([]byte, 4+v.Size())
			binary.BigEndian.PutUint32(b, uint32(v.Size()))
			copy(b[4:], v.AsSlice())
			v.Release()
			pkt.DecRef()
			if _, err := link.Write(b); err != nil {
				return
			}
		}
	}()
	go func() {
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(link, hdr[:]); err != nil {
				return
			}
			n := binary.BigEndian.Uint32(hdr[:])
			if n > maxFrame {
				return
			}
			b := make([]byte, n)
			if _, err := io.ReadFull(link, b); err != nil {
				return
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
			ep.InjectInbound(0, pkt)
			pkt.DecRef()
		}
	}()
	return p, nil
}

// DialTCP connects from the guest side to ip:port.
func (p *Peer) DialTCP(ctx context.Context, dst net.IP, port uint16) (net.Conn, error) {
	return gonet.DialContextTCP(ctx, p.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4Slice(dst.To4()), Port: port}, ipv4.ProtocolNumber)
}

// DialUDP opens a UDP socket from the guest side to ip:port.
func (p *Peer) DialUDP(dst net.IP, port uint16) (net.Conn, error) {
	return gonet.DialUDP(p.s, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4Slice(dst.To4()), Port: port}, ipv4.ProtocolNumber)
}

// ListenTCP listens on the guest side.
func (p *Peer) ListenTCP(port uint16) (net.Listener, error) {
	return gonet.ListenTCP(p.s, tcpip.FullAddress{NIC: 1, Addr: addr(GuestIP), Port: port}, ipv4.ProtocolNumber)
}

// Close stops the peer.
func (p *Peer) Close() {
	p.cancel()
	p.link.Close()
	p.s.Close()
}
