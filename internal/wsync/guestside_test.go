package wsync

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kosa8/kosa8/internal/guest"
)

// endlessScanGuest is a hostile guest agent on conn: it answers a scan
// with paths for as long as the host reads them.
func endlessScanGuest(t *testing.T, conn net.Conn) {
	br := bufio.NewReader(conn)
	hello, err := guest.ReadControl(br)
	if err != nil {
		return
	}
	guest.WriteControl(conn, guest.Control{Kind: guest.Ack, Generation: hello.Generation})
	for {
		c, err := guest.ReadControl(br)
		if err != nil {
			return
		}
		if c.Kind == guest.Start {
			break
		}
	}
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = io.Discard
	srv, err := yamux.Server(bufConn{br, conn}, cfg)
	if err != nil {
		return
	}
	for {
		s, err := srv.Accept()
		if err != nil {
			return
		}
		go func() {
			defer s.Close()
			if _, err := guest.ReadFrame(s); err != nil {
				return
			}
			if guest.WriteJSON(s, guest.FrameResponse, &guest.Response{}) != nil {
				return
			}
			for i := 0; ; i++ {
				batch := make([]guest.WSEntry, 500)
				for j := range batch {
					batch[j] = guest.WSEntry{Path: fmt.Sprintf("d/f%09d", i*500+j), Type: 'f', Mode: 0o644}
				}
				b, _ := json.Marshal(batch)
				if guest.WriteFrame(s, guest.FrameData, b) != nil {
					return
				}
			}
		}()
	}
}

// bufConn reads through the reader that read the handshake.
type bufConn struct {
	r *bufio.Reader
	net.Conn
}

func (c bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// A guest that answers a scan with paths without end: the scan stops at
// its bound with an error that says what to do, instead of holding every
// path the guest names in the host's memory.
func TestGuestScanIsBounded(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go endlessScanGuest(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := guest.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	g := &GuestSide{C: c, Root: "/workspace", MaxEntries: 20_000}
	out, err := g.Scan(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "more than 20000 paths") || !strings.Contains(err.Error(), "exclude") {
		t.Fatalf("scan of an endless guest: %d entries, %v", len(out), err)
	}
}
