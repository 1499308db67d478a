package egress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/netstack"
)

// A burst of connections from a guest that does not read (the stand-in
// guest here is a second stack in this process, so its buffers count
// too): the heap they took is given back after they close, without
// anything else making the runtime collect.
func TestMemoryReturnsAfterBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 20 s for the gateway to give memory back")
	}
	l, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer l.Close()
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.(*net.TCPConn).SetWriteBuffer(64 << 10)
			go func() {
				defer c.Close()
				for {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}()
		}
	}()
	port := netip.MustParseAddrPort(l.Addr().String()).Port()
	g, _ := newGateway(t, []string{fmt.Sprintf("flood.test:%d", port)}, nil, map[string]netip.Addr{"flood.test": netip.MustParseAddr("127.0.0.1")})
	fds, _ := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	hostEnd, _ := net.FileConn(os.NewFile(uintptr(fds[0]), "h"))
	guestEnd, _ := net.FileConn(os.NewFile(uintptr(fds[1]), "g"))
	st, err := netstack.New(hostEnd, g, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	peer, _ := netstack.NewPeer(guestEnd)
	defer peer.Close()
	ip := syntheticFor(t, g, "flood.test")
	ms := func(what string) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		t.Logf("%s: conns=%d heapInuse=%dMiB heapIdle=%dMiB released=%dMiB stack=%dMiB sys=%dMiB goroutines=%d", what, g.conns.Load(), m.HeapInuse>>20, m.HeapIdle>>20, m.HeapReleased>>20, m.StackInuse>>20, m.Sys>>20, runtime.NumGoroutine())
	}
	ms("before")
	var cs []net.Conn
	for i := 0; i < 128; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := peer.DialTCP(ctx, ip.AsSlice(), port)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	time.Sleep(3 * time.Second)
	ms("open")
	if g.conns.Load() != 128 {
		t.Fatalf("%d connections open, want 128", g.conns.Load())
	}
	for _, c := range cs {
		c.Close()
	}
	time.Sleep(5 * time.Second)
	ms("closed")
	time.Sleep(15 * time.Second)
	ms("later")
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	if m.HeapInuse > 16<<20 {
		t.Fatalf("heap in use %d MiB 20 s after the burst closed", m.HeapInuse>>20)
	}
}
