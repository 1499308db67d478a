package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
)

// newStartJob is a start of a fake machine: the real network, port
// forwards and API, the fake driver's machine (its guest answering).
func newStartJob(t *testing.T) (*startJob, *vmmtest.Driver) {
	t.Helper()
	sb := &sandbox.Sandbox{Dir: t.TempDir(), Config: validConfig("fake"), Disks: vmmtest.Layers{}}
	sb.Config.MemoryMiB = 2
	drv := &vmmtest.Driver{OnStart: func(m *vmmtest.Machine) { serveFakeGuest(t, m) }}
	s := &supervisor{sb: sb, log: slog.New(slog.DiscardHandler), drv: drv, accel: vmm.TCG,
		stop: make(chan stopRequest, 1), clientCh: make(chan struct{}), home: t.TempDir()}
	t.Cleanup(func() {
		if c := s.currentClient(); c != nil {
			c.Close()
		}
		for _, m := range drv.Machines() {
			m.Kill()
		}
	})
	m := &sandbox.Manager{Paths: sandbox.Paths{Config: t.TempDir()}}
	j := &startJob{s: s, m: m, o: Options{BootTimeout: 10 * time.Second}, img: &image.Image{Dir: t.TempDir()}}
	return j, drv
}

// The steps a start runs after the image and driver (which need a built
// image): each test below ends the same way or with a failure after them.
func (j *startJob) fakeSteps() []step {
	return []step{
		{"network", j.network},
		{"machine", j.machine},
		{"ports", j.ports},
		{"api", j.serve},
	}
}

// A start that fails after any step gives back all that the steps before
// it took: QEMU killed, forwarded ports closed (only closing the network
// closes them), no API socket left; the sandbox is crashed with the
// step's error. The same steps without a failure leave a running sandbox
// that serves its API and forwards its ports.
func TestStartUndoesWhatItTookOnFailure(t *testing.T) {
	port := freePort(t)
	forwarded := fmt.Sprintf("127.0.0.1:%d", port)
	injected := errors.New("injected step failure")
	start := func(t *testing.T) (*startJob, *vmmtest.Driver) {
		j, drv := newStartJob(t)
		j.s.setStatus(func(st *api.Status) { st.State, st.Started = api.Starting, time.Now() })
		if err := j.s.sb.SavePorts([]api.PortForward{{HostPort: port, GuestPort: 8080}}); err != nil {
			t.Fatal(err)
		}
		return j, drv
	}

	t.Run("no failure", func(t *testing.T) {
		j, drv := start(t)
		s := j.s
		if err := j.run(context.Background(), j.fakeSteps()); err != nil {
			t.Fatal(err)
		}
		defer func() {
			j.srv.Close()
			s.net.close()
		}()
		if n := len(drv.Machines()); n != 1 {
			t.Errorf("%d machines started, want 1", n)
		}
		if st := s.getStatus(); st.State != api.Running || st.Accel != string(vmm.TCG) || st.BootMillis <= 0 {
			t.Errorf("status after a start: %+v", st)
		}
		sock := s.sb.Path(sandbox.APISocket)
		hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
		resp, err := hc.Get("http://sandbox/v1/status")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the API after a start: %v %v", resp, err)
		}
		resp.Body.Close()
		c, err := net.DialTimeout("tcp4", forwarded, 2*time.Second)
		if err != nil {
			t.Fatalf("the forwarded port after a start: %v", err)
		}
		c.Close()
	})

	steps := (&startJob{}).fakeSteps()
	for k := range steps {
		t.Run("failure after "+steps[k].name, func(t *testing.T) {
			j, drv := start(t)
			s := j.s
			run := append(j.fakeSteps()[:k+1], step{"fail", func(context.Context) error { return injected }})
			if err := j.run(context.Background(), run); !errors.Is(err, injected) {
				t.Fatalf("start: %v, want the injected failure", err)
			}
			if j.srv != nil {
				t.Error("a failed start kept its API server")
			}
			st := s.getStatus()
			if st.State != api.Crashed || !strings.Contains(st.Error, injected.Error()) || st.QEMUPID != 0 || st.Stopped.IsZero() {
				t.Errorf("status after a failed start: %+v", st)
			}
			if onDisk := s.sb.Status(); onDisk.State != api.Crashed {
				t.Errorf("status on disk after a failed start: %s", onDisk.State)
			}
			for _, m := range drv.Machines() {
				select {
				case <-m.Done():
				case <-time.After(5 * time.Second):
					t.Error("the machine still runs after a failed start")
				}
			}
			if _, err := os.Lstat(s.sb.Path(sandbox.APISocket)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the API socket is left behind: %v", err)
			}
			if c, err := net.DialTimeout("tcp4", forwarded, 2*time.Second); err == nil {
				c.Close()
				t.Error("the forwarded port still listens after a failed start: the network was not closed")
			}
		})
	}
}

// A start tells the command that waits for it each step as it begins, on
// the ready pipe: what the step does and which of how many it is, so a
// boot is never a silent wait.
func TestStartTellsItsPhases(t *testing.T) {
	j, _ := newStartJob(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	j.o.Ready = w
	var phases []launch.BootPhase
	read := make(chan struct{})
	go func() {
		defer close(read)
		dec := json.NewDecoder(r)
		for {
			var m launch.ReadyMessage
			if dec.Decode(&m) != nil {
				return
			}
			if m.Phase != nil {
				phases = append(phases, *m.Phase)
			}
		}
	}()
	if err := j.run(context.Background(), j.fakeSteps()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		j.srv.Close()
		j.s.net.close()
	}()
	w.Close()
	<-read
	want := []launch.BootPhase{
		{Step: 1, Of: 4, What: "starting the network"},
		{Step: 2, Of: 4, What: "booting the VM (QEMU, the guest's kernel, its agent)"},
		{Step: 3, Of: 4, What: "forwarding ports"},
		{Step: 4, Of: 4, What: "serving the API"},
	}
	if fmt.Sprint(phases) != fmt.Sprint(want) {
		t.Fatalf("phases:\n%v\nwant\n%v", phases, want)
	}
}

// The boot's time limit bounds every step of a start but the workspace's
// first copy, whose length follows the folder's size: a workspace step
// longer than the whole limit completes, and the steps after it get what
// was left of the limit; any other step past the limit fails.
func TestBootLimitLeavesTheFirstCopyOut(t *testing.T) {
	wait := func(d time.Duration) func(context.Context) error {
		return func(ctx context.Context) error {
			select {
			case <-time.After(d):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	t.Run("long first copy", func(t *testing.T) {
		j, _ := newStartJob(t)
		j.o.BootTimeout = time.Second
		// A step may start work that a later one waits for: the context
		// the first step got still serves the last.
		var first context.Context
		steps := []step{
			{"network", func(ctx context.Context) error { first = ctx; return wait(100 * time.Millisecond)(ctx) }},
			{"workspace", wait(1500 * time.Millisecond)},
			{"ports", func(ctx context.Context) error {
				if first.Err() != nil {
					return fmt.Errorf("the first step's context ended before the last step: %w", context.Cause(first))
				}
				return wait(300 * time.Millisecond)(ctx)
			}},
		}
		if err := j.run(context.Background(), steps); err != nil {
			t.Fatalf("a first copy longer than the boot's limit failed the start: %v", err)
		}
	})
	t.Run("other step past the limit", func(t *testing.T) {
		j, _ := newStartJob(t)
		j.o.BootTimeout = 300 * time.Millisecond
		steps := []step{{"workspace", wait(400 * time.Millisecond)}, {"ports", wait(200 * time.Millisecond)}, {"api", wait(200 * time.Millisecond)}}
		err := j.run(context.Background(), steps)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "the start took longer than 300ms") {
			t.Fatalf("steps past the limit (less the first copy): %v, want the deadline", err)
		}
		if st := j.s.getStatus(); st.State != api.Crashed || !strings.Contains(st.Error, "took longer than") {
			t.Fatalf("status after the limit: %s %q", st.State, st.Error)
		}
	})
}

// The first copy's bound is its progress: touched, the watch lets it run
// past its limit; left alone, it ends the context with errStalled.
func TestFirstCopyStall(t *testing.T) {
	ctx, g, stop := watchStall(context.Background(), "the copy", "retry", 200*time.Millisecond, time.Hour)
	defer stop()
	for range 8 {
		time.Sleep(50 * time.Millisecond)
		g.touch()
	}
	if ctx.Err() != nil {
		t.Fatalf("a copy that moved was ended after 400 ms: %v", context.Cause(ctx))
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a copy that stopped moving was not ended")
	}
	var st errStalled
	if !errors.As(context.Cause(ctx), &st) || !strings.Contains(st.Error(), "made no progress for 200ms") {
		t.Fatalf("cause %v", context.Cause(ctx))
	}
	// A reader that moves is progress.
	ctx2, g2, stop2 := watchStall(context.Background(), "the copy", "retry", 200*time.Millisecond, time.Hour)
	defer stop2()
	r := movingReader{io.NopCloser(&slowReader{n: 8, every: 50 * time.Millisecond}), g2}
	if _, err := io.Copy(io.Discard, r); err != nil || ctx2.Err() != nil {
		t.Fatalf("a slow stream that kept moving: %v, %v", err, context.Cause(ctx2))
	}
}

// The ceiling ends a first copy that keeps moving, but too long.
func TestFirstCopyCeiling(t *testing.T) {
	ctx, g, stop := watchStall(context.Background(), "the copy", "retry", time.Hour, 300*time.Millisecond)
	defer stop()
	for ctx.Err() == nil {
		g.touch()
		time.Sleep(20 * time.Millisecond)
	}
	var st errStalled
	if !errors.As(context.Cause(ctx), &st) || !st.total || !strings.Contains(st.Error(), "took longer than 300ms") {
		t.Fatalf("cause %v", context.Cause(ctx))
	}
}

// slowReader gives n bytes, one per every.
type slowReader struct {
	n     int
	every time.Duration
}

func (r *slowReader) Read(b []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.every)
	r.n--
	b[0] = 'x'
	return 1, nil
}

// A step after the boot whose guest connection breaks because QEMU died
// (an "agent: EOF" in the workspace's mount) ends the start with what
// QEMU's exit says, not only the broken stream; one whose QEMU still runs
// keeps its own error.
func TestStartSaysTheVMStopped(t *testing.T) {
	defer func(g time.Duration) { vmExitGrace = g }(vmExitGrace)
	vmExitGrace = 100 * time.Millisecond
	lost := fmt.Errorf("workspace: agent: %w", io.EOF)
	for _, dies := range []bool{true, false} {
		t.Run(fmt.Sprintf("QEMU dies: %v", dies), func(t *testing.T) {
			j, _ := newStartJob(t)
			steps := append(j.fakeSteps()[:2], step{"workspace", func(context.Context) error {
				if dies {
					j.s.currentMachine().Kill()
				}
				return lost
			}})
			err := j.run(context.Background(), steps)
			if !errors.Is(err, io.EOF) {
				t.Fatalf("start: %v, want the step's error kept", err)
			}
			said := strings.Contains(err.Error(), "the VM stopped while starting")
			if said != dies {
				t.Errorf("start: %q; says the VM stopped: %v, want %v", err, said, dies)
			}
			if st := j.s.getStatus(); !strings.Contains(st.Error, err.Error()) {
				t.Errorf("the status's error %q is not the start's %q", st.Error, err)
			}
		})
	}
}
