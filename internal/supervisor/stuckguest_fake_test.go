package supervisor

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// stuckGuest is a guest workspace whose agent never answers its first
// scan (a hostile root guest stopped its agent with SIGSTOP, or wrote one
// that waits): that scan returns only when its context ends.
type stuckGuest struct {
	*wsync.HostSide
	once  sync.Once
	stuck chan struct{} // closed once the first scan waits
}

func (g *stuckGuest) Scan(ctx context.Context, paths []string) (map[string]*wsync.Entry, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.stuck)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return g.HostSide.Scan(ctx, paths)
}

// A sync pass the guest holds up (it never answers) does not hold up a
// checkpoint, nor with it a rewind (which takes one first), nor the sync
// routes: they waited for the pass to let go of the sync, which it never
// did, since only a stop cancels the loop's passes. Each of these now
// cancels the pass in its way and runs its own, under its own deadline;
// the changes the cancelled pass was to bring are brought by the next.
func TestCheckpointDoesNotWaitOnAStuckSyncPass(t *testing.T) {
	s, _, _ := fakeSupervisor(t)
	_, guestDir := withWorkspace(t, s, false, map[string]string{"a": "1"})
	if err := os.WriteFile(s.sb.Path(sandbox.WorkspaceDisk), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	gr, err := wsync.OpenRoot(guestDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gr.Close() })
	g := &stuckGuest{HostSide: &wsync.HostSide{Root: gr}, stuck: make(chan struct{})}
	w := s.ws
	host := &wsync.HostSide{Root: w.root}
	w.engine = wsync.NewEngine(host, g, w.engine.Manifest(), wsync.Options{}, nil)
	host.Skip = w.engine.Excluded
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go w.loop(ctx)
	t.Cleanup(w.detach)
	writeFile(t, guestDir, "b", "agent's")
	w.mark([]string{"b"}, false)
	select {
	case <-g.stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop's pass did not start")
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.checkpoint(context.Background(), "over a stuck pass", "manual")
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the checkpoint still waits on the sync pass the guest holds up after 15 s")
	}
	// The change the cancelled pass was to bring is not forgotten.
	deadline := time.Now().Add(10 * time.Second)
	for readFile(host.Root.Dir(), "b") != "agent's" {
		if time.Now().After(deadline) {
			t.Fatal("the guest's b never reached the host after the cancelled pass")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
