package netstack

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type recorder struct {
	mu   sync.Mutex
	tcp  []Flow
	udp  []Flow
	deny bool

	dropped []string
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

func (r *recorder) HandleDropped(proto string, dst netip.Addr) {
	r.mu.Lock()
	r.dropped = append(r.dropped, proto+" "+dst.String())
	r.mu.Unlock()
}

func (r *recorder) HandleUDP(f Flow) {
	r.mu.Lock()
	r.udp = append(r.udp, f)
	r.mu.Unlock()
}

func pair(t *testing.T, h Handler) (*Stack, *Peer) {
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
	peer, err := NewPeer(guestEnd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(peer.Close)
	return st, peer
}

func TestTCPReachesHandler(t *testing.T) {
	rec := &recorder{}
	_, g := pair(t, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := g.DialTCP(ctx, net.IPv4(198, 18, 0, 7), 443)
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
	_, err := g.DialTCP(ctx, net.IPv4(1, 1, 1, 1), 80)
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
	c, err := g.DialUDP(GatewayIP.AsSlice(), 53)
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
	c2, err := g.DialUDP(net.IPv4(8, 8, 8, 8), 53)
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
	l, err := g.ListenTCP(3000)
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

// ICMP, IPv6 and other IP protocols from the guest are dropped and
// reported; TCP, UDP and ARP are not reported as drops.
func TestDroppedFramesReported(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostEnd, _ := net.FileConn(osFile(fds[0], "host"))
	guestEnd, _ := net.FileConn(osFile(fds[1], "guest"))
	defer guestEnd.Close()
	rec := &recorder{}
	st, err := New(hostEnd, rec, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eth := func(typ uint16, payload []byte) []byte {
		f := make([]byte, 14, 14+len(payload))
		copy(f[0:6], []byte{0x52, 0x54, 0, 0, 0, 2})
		copy(f[6:12], []byte{0x52, 0x54, 0, 0, 0, 1})
		f[12], f[13] = byte(typ>>8), byte(typ)
		return append(f, payload...)
	}
	ipv4 := func(proto byte, dst [4]byte) []byte {
		h := make([]byte, 28)
		h[0], h[9] = 0x45, proto
		h[2], h[3] = 0, 28
		h[8] = 64
		copy(h[12:16], []byte{10, 0, 2, 15})
		copy(h[16:20], dst[:])
		return h
	}
	ipv6 := make([]byte, 48)
	ipv6[0] = 0x60
	copy(ipv6[24:40], netip.MustParseAddr("2606:4700::1111").AsSlice())
	frames := [][]byte{
		eth(0x0800, ipv4(1, [4]byte{1, 1, 1, 1})),  // ping
		eth(0x86dd, ipv6),                          // IPv6
		eth(0x0800, ipv4(47, [4]byte{8, 8, 8, 8})), // GRE
		eth(0x0806, make([]byte, 28)),              // ARP: not a drop
		eth(0x0800, ipv4(17, [4]byte{8, 8, 4, 4})), // UDP: decided elsewhere
	}
	for _, f := range frames {
		var n [4]byte
		n[0], n[1], n[2], n[3] = byte(len(f)>>24), byte(len(f)>>16), byte(len(f)>>8), byte(len(f))
		if _, err := guestEnd.Write(append(n[:], f...)); err != nil {
			t.Fatal(err)
		}
	}
	want := "icmp 1.1.1.1,ipv6 2606:4700::1111,ip-proto-47 8.8.8.8"
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec.mu.Lock()
		got := strings.Join(rec.dropped, ",")
		rec.mu.Unlock()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("dropped frames reported: %q, want %q", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
