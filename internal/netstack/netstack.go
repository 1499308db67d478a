// Package netstack is the guest's only network: a user-space TCP/IP stack
// (gVisor's netstack) on the host end of the VM's NIC. QEMU sends the
// guest's Ethernet frames over a stream socket (-netdev stream), each behind
// a 4-byte big-endian length, and this stack answers them. Nothing routes
// the frames anywhere: every TCP connection the guest opens is handed to a
// Handler, which decides it; UDP other than what the stack serves itself,
// ICMP and IPv6 are dropped (no protocol is registered for them).
package netstack

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"

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
	"gvisor.dev/gvisor/pkg/waiter"
)

// Addresses of the virtual network: the guest, and the gateway that is
// also its resolver.
var (
	GatewayIP  = netip.MustParseAddr("192.168.127.1")
	GuestIP    = netip.MustParseAddr("192.168.127.2")
	PrefixLen  = 24
	GatewayMAC = net.HardwareAddr{0x5a, 0x94, 0xef, 0xe4, 0x0c, 0xdd}
	GuestMAC   = net.HardwareAddr{0x5a, 0x94, 0xef, 0xe4, 0x0c, 0xee}
)

// MTU is the guest NIC's MTU. Both ends of the link are virtual, so jumbo
// frames cost nothing and cut the per-packet work of both TCP stacks six
// times (in-process HTTPS throughput went from 18% to 44–49% of loopback
// here, with buffered, batched frame I/O).
const MTU = 9000

const (
	nicID = 1
	mtu   = MTU
	// maxFrame bounds a frame read from QEMU. Larger ones are skipped: the
	// guest's NIC cannot legitimately produce them.
	maxFrame = MTU + 256
	// queueLen is the outbound queue towards the guest.
	queueLen = 1024
)

// Flow is a connection attempt from the guest.
type Flow struct {
	Src, Dst netip.AddrPort
}

// Handler decides the guest's connections.
type Handler interface {
	// HandleTCP is called, in a goroutine of its own, for every new TCP
	// connection the guest opens (the SYN has arrived). Calling accept
	// completes the handshake and returns the connection; returning
	// without calling it refuses the connection with a RST.
	HandleTCP(flow Flow, accept func() (net.Conn, error))
	// HandleUDP is told of UDP the stack drops (everything but DNS to the
	// gateway).
	HandleUDP(flow Flow)
	// HandleDropped is told of the other packets the stack drops: proto
	// is "icmp", "ipv6" or "ip-proto-N"; dst is where the guest sent it.
	HandleDropped(proto string, dst netip.Addr)
}

// Dropped tells whether a guest's Ethernet frame is one the stack drops
// without a word (ICMP, IPv6, IPv4 protocols other than TCP and UDP), and
// what it was and where it went. ARP and malformed frames are not
// reported.
func Dropped(frame []byte) (proto string, dst netip.Addr, ok bool) {
	if len(frame) < header.EthernetMinimumSize {
		return "", netip.Addr{}, false
	}
	ip := frame[header.EthernetMinimumSize:]
	switch header.Ethernet(frame).Type() {
	case header.IPv6ProtocolNumber:
		if len(ip) < header.IPv6MinimumSize {
			return "ipv6", netip.Addr{}, true
		}
		a, _ := netip.AddrFromSlice(ip[24:40])
		return "ipv6", a, true
	case header.IPv4ProtocolNumber:
		if len(ip) < header.IPv4MinimumSize {
			return "", netip.Addr{}, false
		}
		a, _ := netip.AddrFromSlice(ip[16:20])
		switch p := ip[9]; p {
		case 6, 17: // TCP, UDP: decided elsewhere
			return "", netip.Addr{}, false
		case 1:
			return "icmp", a, true
		default:
			return "ip-proto-" + strconv.Itoa(int(p)), a, true
		}
	}
	return "", netip.Addr{}, false
}

// Stack is a running network for one guest.
type Stack struct {
	s    *stack.Stack
	h    Handler
	ep   *channel.Endpoint
	link io.ReadWriteCloser
	log  *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

func addr(a netip.Addr) tcpip.Address { return tcpip.AddrFrom4(a.As4()) }

func toAddrPort(a tcpip.Address, port uint16) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return netip.AddrPortFrom(ip, port)
}

// New assembles the stack on link (the host end of QEMU's -netdev stream).
func New(link io.ReadWriteCloser, h Handler, log *slog.Logger) (*Stack, error) {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
		// No ICMP: the guest cannot ping its way out, or signal with it.
	})
	ep := channel.New(queueLen, mtu+header.EthernetMinimumSize, tcpip.LinkAddress(GatewayMAC))
	if err := s.CreateNIC(nicID, ethernet.New(ep)); err != nil {
		return nil, fmt.Errorf("create NIC: %s", err)
	}
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: addr(GatewayIP), PrefixLen: PrefixLen},
	}, stack.AddressProperties{}); err != nil {
		return nil, fmt.Errorf("gateway address: %s", err)
	}
	// Promiscuous: accept packets for any destination (the guest connects
	// to the world through the gateway). Spoofing: answer from those
	// destinations' addresses.
	if err := s.SetPromiscuousMode(nicID, true); err != nil {
		return nil, fmt.Errorf("promiscuous mode: %s", err)
	}
	if err := s.SetSpoofing(nicID, true); err != nil {
		return nil, fmt.Errorf("spoofing: %s", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}})
	tuneTCP(s)

	fwd := tcp.NewForwarder(s, 0, 1024, func(r *tcp.ForwarderRequest) {
		id := r.ID()
		flow := Flow{Src: toAddrPort(id.RemoteAddress, id.RemotePort), Dst: toAddrPort(id.LocalAddress, id.LocalPort)}
		completed := false
		accept := func() (net.Conn, error) {
			var wq waiter.Queue
			tep, terr := r.CreateEndpoint(&wq)
			completed = true
			if terr != nil {
				r.Complete(true)
				return nil, fmt.Errorf("accept %s: %s", flow.Dst, terr)
			}
			r.Complete(false)
			tep.SocketOptions().SetKeepAlive(true)
			return gonet.NewTCPConn(&wq, tep), nil
		}
		h.HandleTCP(flow, accept)
		if !completed {
			r.Complete(true) // RST
		}
	})
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	ufwd := udp.NewForwarder(s, func(r *udp.ForwarderRequest) {
		id := r.ID()
		h.HandleUDP(Flow{Src: toAddrPort(id.RemoteAddress, id.RemotePort), Dst: toAddrPort(id.LocalAddress, id.LocalPort)})
	})
	s.SetTransportProtocolHandler(udp.ProtocolNumber, ufwd.HandlePacket)

	ctx, cancel := context.WithCancel(context.Background())
	st := &Stack{s: s, h: h, ep: ep, link: link, log: log, cancel: cancel}
	st.wg.Add(2)
	go st.readLoop()
	go st.writeLoop(ctx)
	return st, nil
}

// Buffer sizes of the stack's TCP endpoints. Both ends of the guest's link
// are in this machine, so a window needs to cover microseconds (a few
// milliseconds under TCG), not a WAN's bandwidth-delay product: 512 KiB
// is ample. They are also what a guest that stops reading makes the host
// hold per connection (the send buffer towards it fills, then the copy
// from upstream waits), so they are kept small: a connection costs at most
// MaxBufferPerConn of the supervisor's memory in each direction.
const (
	defaultBuffer    = 128 << 10
	MaxBufferPerConn = 512 << 10
)

// tuneTCP sets what both stacks need for bulk transfers: SACK, and send
// and receive buffers that grow with use (receive moderation, send
// auto-tuning) up to MaxBufferPerConn.
func tuneTCP(s *stack.Stack) {
	sack := tcpip.TCPSACKEnabled(true)
	_ = s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4096, Default: defaultBuffer, Max: MaxBufferPerConn}
	_ = s.SetTransportProtocolOption(tcp.ProtocolNumber, &rcv)
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: 4096, Default: defaultBuffer, Max: MaxBufferPerConn}
	_ = s.SetTransportProtocolOption(tcp.ProtocolNumber, &snd)
	moderate := tcpip.TCPModerateReceiveBufferOption(true)
	_ = s.SetTransportProtocolOption(tcp.ProtocolNumber, &moderate)
}

// readLoop takes frames from QEMU into the stack.
func (st *Stack) readLoop() {
	defer st.wg.Done()
	defer st.Close()
	var hdr [4]byte
	buf := make([]byte, maxFrame)
	link := bufio.NewReaderSize(st.link, 256<<10)
	for {
		if _, err := io.ReadFull(link, hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				st.log.Debug("netstack link read", "err", err)
			}
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFrame || n < header.EthernetMinimumSize {
			if _, err := io.CopyN(io.Discard, link, int64(n)); err != nil {
				return
			}
			continue
		}
		if _, err := io.ReadFull(link, buf[:n]); err != nil {
			return
		}
		if proto, dst, drop := Dropped(buf[:n]); drop {
			st.h.HandleDropped(proto, dst)
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(append([]byte(nil), buf[:n]...))})
		st.ep.InjectInbound(0, pkt) // the Ethernet endpoint reads the type from the frame
		pkt.DecRef()
	}
}

// writeLoop sends the stack's frames to QEMU, as many per write as are
// queued.
func (st *Stack) writeLoop(ctx context.Context) {
	defer st.wg.Done()
	w := bufio.NewWriterSize(st.link, 256<<10)
	var hdr [4]byte
	for {
		pkt := st.ep.Read()
		if pkt == nil {
			if w.Buffered() > 0 {
				if err := w.Flush(); err != nil {
					st.Close()
					return
				}
			}
			if pkt = st.ep.ReadContext(ctx); pkt == nil {
				return
			}
		}
		v := pkt.ToView()
		binary.BigEndian.PutUint32(hdr[:], uint32(v.Size()))
		w.Write(hdr[:])
		_, err := w.Write(v.AsSlice())
		v.Release()
		pkt.DecRef()
		if err != nil {
			st.Close()
			return
		}
	}
}

// ListenTCP listens on the gateway's port (DNS over TCP).
func (st *Stack) ListenTCP(port uint16) (net.Listener, error) {
	return gonet.ListenTCP(st.s, tcpip.FullAddress{NIC: nicID, Addr: addr(GatewayIP), Port: port}, ipv4.ProtocolNumber)
}

// ListenUDP binds the gateway's port (DNS).
func (st *Stack) ListenUDP(port uint16) (net.PacketConn, error) {
	return gonet.DialUDP(st.s, &tcpip.FullAddress{NIC: nicID, Addr: addr(GatewayIP), Port: port}, nil, ipv4.ProtocolNumber)
}

// DialGuest connects to a port of the guest, from the gateway (inbound
// port forwarding).
func (st *Stack) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	return gonet.DialContextTCP(ctx, st.s, tcpip.FullAddress{NIC: nicID, Addr: addr(GuestIP), Port: port}, ipv4.ProtocolNumber)
}

// Close stops the stack and closes the link.
func (st *Stack) Close() error {
	st.once.Do(func() {
		st.cancel()
		st.link.Close()
		st.ep.Close()
		go func() {
			st.wg.Wait()
			st.s.Close()
		}()
	})
	return nil
}
