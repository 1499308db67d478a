package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/guest/agent"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// fakeGuest is the least of an agent a checkpoint needs: it answers every
// request with an empty response and records the operations asked for.
type fakeGuest struct {
	mu  sync.Mutex
	ops []guest.Op
}

func (g *fakeGuest) Ops() []guest.Op {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.ops)
}

// serveFakeGuest runs a fakeGuest on m's guest end, through the agent's
// own channel code (handshake, yamux).
func serveFakeGuest(t *testing.T, m *vmmtest.Machine) *fakeGuest {
	g := &fakeGuest{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	handle := func(ctx context.Context, s net.Conn) {
		defer s.Close()
		f, err := guest.ReadFrame(s)
		if err != nil {
			return
		}
		var req guest.Request
		if err := json.Unmarshal(f.Payload, &req); err != nil {
			return
		}
		g.mu.Lock()
		g.ops = append(g.ops, req.Op)
		g.mu.Unlock()
		_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{})
	}
	go agent.ServeChannel(ctx, m.Guest(), handle, slog.New(slog.DiscardHandler))
	return g
}

// fakeSupervisor is a supervisor of a running fake machine: a sandbox
// directory of its own, an audit log, an agent client on the fake guest;
// no network, no workspace.
func fakeSupervisor(t *testing.T) (*supervisor, *vmmtest.Machine, *fakeGuest) {
	t.Helper()
	ctx := context.Background()
	sb := &Sandbox{Dir: t.TempDir(), Config: validConfig("fake")}
	sb.Config.MemoryMiB = 2
	log := slog.New(slog.DiscardHandler)
	al, err := audit.Open(sb.Path("audit.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	drv := &vmmtest.Driver{}
	mach, err := drv.Start(ctx, &vmspec.Spec{MemoryMiB: sb.Config.MemoryMiB}, vmm.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := mach.(*vmmtest.Machine)
	g := serveFakeGuest(t, m)
	client, err := guest.Connect(ctx, m.Agent())
	if err != nil {
		t.Fatal(err)
	}
	s := &supervisor{sb: sb, log: log, net: &network{sb: sb, log: log, audit: al}, machine: m,
		stop: make(chan stopRequest, 1), clientCh: make(chan struct{})}
	s.setClient(client)
	// No spare RAM files: their background worker would outlive the
	// test's directory, and they are checkpoint.Spares' business (tested
	// there). Every checkpoint here copies into a new file.
	s.ramSaver().Spares.Close()
	t.Cleanup(func() {
		client.Close()
		m.Kill()
		al.Close()
	})
	return s, m, g
}

// guestPattern is written into the fake guest's RAM: a checkpoint must
// carry it.
var guestPattern = []byte("written by the guest before the checkpoint")

const guestPatternAt = 3 * 4096

// pausedBetween checks that every call after the first Pause and before
// the last Resume found the machine paused.
func pausedBetween(t *testing.T, calls []vmmtest.Call) {
	t.Helper()
	in := false
	for _, c := range calls {
		switch c.Name {
		case "Pause":
			in = true
		case "Resume":
			in = false
		case "SnapshotDisk", "SaveDevices":
			if !in || !c.Paused {
				t.Errorf("%s ran on a machine that was not paused", c)
			}
		}
	}
}

func TestCheckpointPausesSavesAndResumes(t *testing.T) {
	s, m, g := fakeSupervisor(t)
	if _, err := m.RAM().WriteAt(guestPattern, guestPatternAt); err != nil {
		t.Fatal(err)
	}
	meta, err := s.checkpoint(context.Background(), "first", "manual")
	if err != nil {
		t.Fatal(err)
	}

	want := []string{"Start", "Pause", "SnapshotDisk(root)", "SaveDevices", "Resume"}
	if got := m.CallNames(); !slices.Equal(got, want) {
		t.Errorf("machine calls %v, want %v", got, want)
	}
	pausedBetween(t, m.Calls())
	if m.Paused() {
		t.Error("the machine stays paused after the checkpoint")
	}
	if ops := g.Ops(); !slices.Equal(ops, []guest.Op{guest.OpPing, guest.OpFreeze, guest.OpThaw}) {
		t.Errorf("guest asked %v, want ping, freeze, thaw", ops)
	}

	// The checkpoint is committed, with the device state and the RAM.
	list, err := s.sb.Checkpoints().List()
	if err != nil || len(list) != 1 || list[0].ID != meta.ID {
		t.Fatalf("checkpoints %v (%v), want just %s", list, err, meta.ID)
	}
	dir := s.sb.Checkpoints().Path(meta.ID)
	dev, err := os.ReadFile(filepath.Join(dir, checkpoint.DevicesFile))
	if err != nil || !strings.HasPrefix(string(dev), "vmmtest devices") {
		t.Errorf("device state %q, %v", dev, err)
	}
	if meta.DeviceBytes != int64(len(dev)) {
		t.Errorf("meta says %d device bytes, the file has %d", meta.DeviceBytes, len(dev))
	}
	ram, err := os.Open(filepath.Join(dir, checkpoint.RAMFile))
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	got := make([]byte, len(guestPattern))
	if _, err := ram.ReadAt(got, guestPatternAt); err != nil || !bytes.Equal(got, guestPattern) {
		t.Errorf("checkpoint RAM at %d: %q, %v", guestPatternAt, got, err)
	}

	// The disk layer: the checkpoint keeps the frozen one, new writes go
	// to the overlay the machine snapshotted to, and the sandbox says so.
	if d := meta.Disks["root"]; d.Path != RootDisk {
		t.Errorf("checkpoint's root layer %q, want %q", d.Path, RootDisk)
	}
	active := s.sb.activeDisks()["root"]
	if !strings.Contains(active.Path, meta.ID) || m.Disk("root") != s.sb.Path(active.Path) {
		t.Errorf("active root layer %q, the machine writes to %q", active.Path, m.Disk("root"))
	}
	if _, err := os.Stat(s.sb.Path(active.Path)); err != nil {
		t.Errorf("the new layer: %v", err)
	}
	if st := s.getStatus(); st.Checkpoint != meta.ID {
		t.Errorf("status names checkpoint %q, want %q", st.Checkpoint, meta.ID)
	}
}

// A checkpoint that fails at any step leaves no checkpoint (nor a half
// one) behind, thaws the guest and, once the machine was paused, resumes
// it.
func TestCheckpointFailureResumesAndLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		fail       string
		wantCalls  []string
		wantPaused bool
	}{
		{fail: "Pause", wantCalls: []string{"Start", "Pause"}},
		{fail: "SnapshotDisk", wantCalls: []string{"Start", "Pause", "SnapshotDisk(root)", "Resume"}},
		{fail: "SaveDevices", wantCalls: []string{"Start", "Pause", "SnapshotDisk(root)", "SaveDevices", "Resume"}},
		// A machine that does not resume stays paused, and the error says
		// how to end it.
		{fail: "Resume", wantCalls: []string{"Start", "Pause", "SnapshotDisk(root)", "SaveDevices", "Resume"}, wantPaused: true},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			s, m, g := fakeSupervisor(t)
			injected := errors.New("injected " + tc.fail + " failure")
			m.Fail(tc.fail, injected)
			_, err := s.checkpoint(context.Background(), "doomed", "manual")
			if !errors.Is(err, injected) {
				t.Fatalf("checkpoint: %v, want the injected error", err)
			}
			if got := m.CallNames(); !slices.Equal(got, tc.wantCalls) {
				t.Errorf("machine calls %v, want %v", got, tc.wantCalls)
			}
			pausedBetween(t, m.Calls())
			if m.Paused() != tc.wantPaused {
				t.Errorf("paused %v after the failed checkpoint, want %v", m.Paused(), tc.wantPaused)
			}
			if tc.wantPaused && !strings.Contains(err.Error(), "kosa8 stop --kill") {
				t.Errorf("the error does not say how to end the machine: %v", err)
			}
			if ops := g.Ops(); len(ops) == 0 || ops[len(ops)-1] != guest.OpThaw {
				t.Errorf("guest asked %v, want thaw last", ops)
			}
			list, err := s.sb.Checkpoints().List()
			if err != nil || len(list) != 0 {
				t.Errorf("checkpoints after a failed one: %v (%v)", list, err)
			}
			if half, _ := filepath.Glob(filepath.Join(s.sb.Path(checkpointsDir), ".tmp-*")); len(half) > 0 {
				t.Errorf("half-written checkpoint left: %v", half)
			}
			if st := s.getStatus(); st.Checkpoint != "" {
				t.Errorf("status names checkpoint %q after a failed one", st.Checkpoint)
			}
		})
	}
}

// The API's checkpoint route takes one through the same steps; the memory
// route streams the RAM of a paused machine and resumes it.
func TestAPICheckpointAndMemory(t *testing.T) {
	s, m, _ := fakeSupervisor(t)
	if _, err := m.RAM().WriteAt(guestPattern, guestPatternAt); err != nil {
		t.Fatal(err)
	}
	h := s.routes()

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/checkpoints", strings.NewReader(`{"message":"via the API"}`)))
	if rec.Code != http.StatusOK {
		t.Fatalf("POST /v1/checkpoints: %d %s", rec.Code, rec.Body)
	}
	var meta checkpoint.Meta
	if err := json.Unmarshal(rec.Body.Bytes(), &meta); err != nil || meta.Message != "via the API" {
		t.Fatalf("answer %s (%v)", rec.Body, err)
	}
	if _, err := s.sb.Checkpoints().Load(meta.ID); err != nil {
		t.Errorf("the checkpoint the API named: %v", err)
	}

	before := len(m.Calls())
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/debug/memory", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /v1/debug/memory: %d %s", rec.Code, rec.Body)
	}
	body, _ := io.ReadAll(rec.Body)
	if len(body) != s.sb.Config.MemoryMiB<<20 || !bytes.Equal(body[guestPatternAt:guestPatternAt+len(guestPattern)], guestPattern) {
		t.Errorf("memory: %d bytes, pattern missing", len(body))
	}
	var names []string
	for _, c := range m.Calls()[before:] {
		if c.Name != "RunState" {
			names = append(names, c.Name)
		}
	}
	if !slices.Equal(names, []string{"Pause", "Resume"}) || m.Paused() {
		t.Errorf("memory route calls %v, paused %v; want Pause, Resume and a running machine", names, m.Paused())
	}
}

// A machine without the checkpoint capability is told apart: the API
// says not supported rather than failing half-way.
func TestMemoryWithoutSnapshotter(t *testing.T) {
	s, m, _ := fakeSupervisor(t)
	s.machine = struct{ vmm.Machine }{m} // hides every optional capability
	rec := httptest.NewRecorder()
	s.routes().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/debug/memory", nil))
	if rec.Code != http.StatusNotImplemented || !strings.Contains(rec.Body.String(), vmm.ErrNotSupported.Error()) {
		t.Errorf("GET /v1/debug/memory: %d %s, want 501 not supported", rec.Code, rec.Body)
	}
	if _, err := s.checkpoint(context.Background(), "", "manual"); !errors.Is(err, vmm.ErrNotSupported) {
		t.Errorf("checkpoint: %v, want ErrNotSupported", err)
	}
	if slices.Contains(m.CallNames(), "Pause") {
		t.Error("a machine without snapshots was paused")
	}
}
