package guest

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// A guest that takes requests and never answers them: a paused machine.
// A call must still end when its context does (a rewind cancels the sync
// pass waiting on the machine it replaces): yamux's Close alone leaves the
// Read waiting.
func TestOpenEndsWithContextOnSilentGuest(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = io.Discard
	srv, err := yamux.Server(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			s, err := srv.Accept()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, s) // reads the request, answers nothing
		}
	}()
	sess, err := yamux.Client(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{sess: sess}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := c.Open(ctx, &Request{Op: OpPing})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Open: %v, want the context's deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Open still waits on a silent guest 10 s after its context ended")
	}
}
