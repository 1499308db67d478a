package netstack

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

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

// guestStack is a second netstack playing the guest's kernel, joined to
// the stack under test by the same framing QEMU uses.
func guestStack(t *testing.T, link net.Conn) *stack.Stack {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	ep := channel.New(256, mtu+header.EthernetMinimumSize, tcpip.LinkAddress(GuestMAC))
	if err := s.CreateNIC(1, ethernet.New(ep)); err != nil {
		t.Fatal(err)
	}
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: addr(GuestIP), PrefixLen: PrefixLen}}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: addr(GatewayIP), NIC: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); link.Close() })
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
			b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(link, b); err != nil {
				return
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
			ep.InjectInbound(0, pkt)
			pkt.DecRef()
		}
	}()
	return s
}

type recorder struct {
	mu   sync.Mutex
	tcp  []Flow
	udp  []Flow
	deny bool
}

func (r *recorder) HandleTCP(f Flow, accept func() (net.Conn, error)) {
	r.mu.Lock()
	r.tcp = append(r.tcp, f)
	deny := r.deny
	r.mu.Unlock()
	if deny {
		return
	}
	c, err := accept()
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = io.Copy(c, c) // echo
}

func (r *recorder) HandleUDP(f Flow) {
	r.mu.Lock()
	r.udp = append(r.udp, f)
	r.mu.Unlock()
}

func pair(t *testing.T, h Handler) (*Stack, *stack.Stack) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostEnd, _ := net.FileConn(osFile(fds[0], "host"))
	guestEnd, _ := net.FileConn(osFile(fds[1], "guest"))
	st, err := New(hostEnd, h, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, guestStack(t, guestEnd)
}

func TestTCPReachesHandler(t *testing.T) {
	rec := &recorder{}
	_, g := pair(t, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{198, 18, 0, 7}), Port: 443}
	c, err := gonet.DialContextTCP(ctx, g, dst, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.tcp) != 1 || rec.tcp[0].Dst.String() != "198.18.0.7:443" || rec.tcp[0].Src.Addr() != GuestIP {
		t.Fatalf("flows: %+v", rec.tcp)
	}
}

func TestRefusedTCPIsReset(t *testing.T) {
	rec := &recorder{deny: true}
	_, g := pair(t, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := gonet.DialContextTCP(ctx, g, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{1, 1, 1, 1}), Port: 80}, ipv4.ProtocolNumber)
	if err == nil {
		t.Fatal("refused connection succeeded")
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("refusal took %s: a RST should be immediate", time.Since(start))
	}
}

func TestUDPServedAndDropped(t *testing.T) {
	rec := &recorder{}
	st, g := pair(t, rec)
	pc, err := st.ListenUDP(53)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 512)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte("re:"), buf[:n]...), a)
		}
	}()
	gw := tcpip.FullAddress{NIC: 1, Addr: addr(GatewayIP), Port: 53}
	c, err := gonet.DialUDP(g, nil, &gw, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("q"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "re:q" {
		t.Fatalf("DNS port: %q %v", buf[:n], err)
	}
	other := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{8, 8, 8, 8}), Port: 53}
	c2, err := gonet.DialUDP(g, nil, &other, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	c2.Write([]byte("leak"))
	c2.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := c2.Read(buf); err == nil {
		t.Fatalf("UDP to 8.8.8.8 answered: %q", buf[:n])
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.udp) == 0 || rec.udp[0].Dst.String() != "8.8.8.8:53" {
		t.Fatalf("dropped UDP not reported: %+v", rec.udp)
	}
}

func TestDialGuest(t *testing.T) {
	st, g := pair(t, &recorder{})
	l, err := gonet.ListenTCP(g, tcpip.FullAddress{NIC: 1, Addr: addr(GuestIP), Port: 3000}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("from guest"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := st.DialGuest(ctx, 3000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	if string(b) != "from guest" {
		t.Fatalf("got %q", b)
	}
}
