package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/guest/agent"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// A guest that hashes a big workspace (a cold boot's first scan, under
// TCG) answers the scan in batches for longer than the stall limit: each
// batch is progress, and the first copy must not be ended as stalled.
func TestFirstCopyScanBatchesAreProgress(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := pipeAgent(t, ctx, func(ctx context.Context, s net.Conn, req guest.Request) {
		if req.Op != guest.OpWSScan {
			_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{})
			return
		}
		_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{})
		// 12 batches, one per 50 ms: 600 ms of steady progress.
		for i := range 12 {
			time.Sleep(50 * time.Millisecond)
			if guest.WriteJSON(s, guest.FrameData, []guest.WSEntry{{Path: fmt.Sprintf("f%d", i), Type: 'f', Mode: 0o644}}) != nil {
				return
			}
		}
		_ = guest.WriteFrame(s, guest.FrameEOF, nil)
	})

	sctx, moved, stop := watchStall(ctx, "the workspace's first copy", "retry", 200*time.Millisecond, time.Hour)
	defer stop()
	counted := newCountingGuest(&wsync.GuestSide{C: c, Root: "/workspace", MaxFile: wsync.DefaultMaxFile}, nil, moved)
	got, err := counted.Scan(sctx, nil)
	if err != nil {
		t.Fatalf("a scan that kept sending entries was ended: %v (cause %v)", err, context.Cause(sctx))
	}
	if len(got) != 12 {
		t.Fatalf("scan: %d entries, want 12", len(got))
	}
}

// A first pass the stall guard ends must fail the start, also in its last
// try: here the guest refuses the file twice, then stops answering in the
// third pass's put (whose paths fail, as the first two's did: the try
// loop must not take that for an ordinary failure and start anyway).
func TestFirstCopyStallInTheLastTryFailsTheStart(t *testing.T) {
	defer func(d time.Duration) { firstCopyStall = d }(firstCopyStall)
	firstCopyStall = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	puts := 0
	c := pipeAgent(t, ctx, func(ctx context.Context, s net.Conn, req guest.Request) {
		switch req.Op {
		case guest.OpWSScan:
			_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{})
			_ = guest.WriteFrame(s, guest.FrameEOF, nil)
		case guest.OpWSPut:
			puts++
			_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{})
			for {
				f, err := guest.ReadFrame(s)
				if err != nil {
					return
				}
				var it guest.WSPutItem
				if f.Kind == guest.FrameRequest && json.Unmarshal(f.Payload, &it) == nil && it.End {
					break
				}
			}
			if puts == 3 {
				<-ctx.Done() // stops answering
				return
			}
			_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{Failed: map[string]string{"a": "refused"}})
		default:
			_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{})
		}
	})

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := validConfig("stall")
	cfg.Workspace = &sandbox.WorkspaceConfig{Path: dir}
	sb := &sandbox.Sandbox{Dir: t.TempDir(), Config: cfg}
	root, err := wsync.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	w := &workspace{sb: sb, log: slog.New(slog.DiscardHandler), root: root, dirty: map[string]bool{}, kick: make(chan struct{}, 1)}
	defer w.closeFiles()
	defer w.detach()
	err = w.attach(ctx, c, syncState{}, continuePass)
	var st errStalled
	if !errors.As(err, &st) {
		t.Fatalf("attach whose last try its guard ended: %v, want errStalled", err)
	}
}

// pipeAgent serves handle, given each request read, through the agent's
// own channel code over a pipe, and returns a client of it.
func pipeAgent(t *testing.T, ctx context.Context, handle func(ctx context.Context, s net.Conn, req guest.Request)) *guest.Client {
	t.Helper()
	host, port := net.Pipe()
	go agent.ServeChannel(ctx, port, func(ctx context.Context, s net.Conn) {
		defer s.Close()
		f, err := guest.ReadFrame(s)
		if err != nil {
			return
		}
		var req guest.Request
		if json.Unmarshal(f.Payload, &req) != nil {
			return
		}
		handle(ctx, s, req)
	}, slog.New(slog.DiscardHandler))
	c, err := guest.Connect(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// After the first pass the live sync no longer touches its guard: done
// drops it, and the scan hook and readers go straight through.
func TestCountingGuestDoneStopsTouching(t *testing.T) {
	g := &stallGuard{}
	g.touch()
	gs := &wsync.GuestSide{}
	c := newCountingGuest(gs, nil, g)
	c.done()
	before := g.moved.Load()
	time.Sleep(2 * time.Millisecond)
	c.touch()
	gs.Progress()
	r := io.NopCloser(strings.NewReader("x"))
	if c.moving(r) != r || g.moved.Load() != before {
		t.Fatal("the live sync still touches the first pass's guard")
	}
}
