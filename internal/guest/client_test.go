package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
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

// A broken channel is told apart from the agent's own answers: only the
// former makes a start look for a QEMU that died.
func TestConnectionLost(t *testing.T) {
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{fmt.Errorf("agent: %w", io.EOF), true},
		{fmt.Errorf("agent: %w", io.ErrUnexpectedEOF), true},
		{fmt.Errorf("agent: %w", yamux.ErrSessionShutdown), true},
		{fmt.Errorf("write: %w", syscall.EPIPE), true},
		{&AgentError{Msg: "mount the workspace: EOF"}, false},
		{fmt.Errorf("agent ws_mount: %w", context.DeadlineExceeded), false},
		{errors.New("agent: bad response"), false},
		{nil, false},
	} {
		if got := ConnectionLost(c.err); got != c.lost {
			t.Errorf("ConnectionLost(%v) = %v, want %v", c.err, got, c.lost)
		}
	}
}
