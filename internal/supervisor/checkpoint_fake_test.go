package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/guest/agent"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// fakeGuest is the least of an agent a checkpoint and the API need: it
// records the operations asked for and answers each with an empty
// response, but for exec, which runs a fake program (see exec), and info
// once it has one (SetInfo).
type fakeGuest struct {
	mu      sync.Mutex
	ops     []guest.Op
	execs   []guest.ExecRequest
	signals []syscall.Signal
	info    *guest.Info
	names   []string // the hostnames set_time and restored named
	renewed []bool   // each restored's new_identity
}

// SetInfo is what the guest answers to info from now on.
func (g *fakeGuest) SetInfo(i *guest.Info) {
	g.mu.Lock()
	g.info = i
	g.mu.Unlock()
}

func (g *fakeGuest) Ops() []guest.Op {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.ops)
}

// Execs are the exec requests the guest was asked, oldest first.
func (g *fakeGuest) Execs() []guest.ExecRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.execs)
}

// Signals are the signals its processes were sent, oldest first.
func (g *fakeGuest) Signals() []syscall.Signal {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.signals)
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
		if req.Op == guest.OpSetTime || req.Op == guest.OpRestored {
			g.names = append(g.names, req.Hostname)
		}
		if req.Op == guest.OpRestored {
			g.renewed = append(g.renewed, req.NewBootID)
		}
		info := g.info
		g.mu.Unlock()
		switch req.Op {
		case guest.OpExec:
			g.exec(s, req.Exec)
		case guest.OpInfo:
			_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{Info: info})
		default:
			_ = guest.WriteJSON(s, guest.FrameResponse, &guest.Response{})
		}
	}
	go agent.ServeChannel(ctx, m.Guest(), handle, slog.New(slog.DiscardHandler))
	return g
}

// exec serves an exec stream as the agent does (a response with the
// process's id and pid, then its frames until the exit frame), running a
// fake program named by argv[0]:
//
//	missing  is not found: the agent's error, exit code 127, no process
//	yes      writes "y\n" to stdout until it gets a signal
//	deaf     writes "y\n" to stdout until its stream breaks, and never
//	         reads the stream (a hostile guest; as well an agent whose
//	         process does not read its stdin): what the host sends
//	         fills the stream's window
//	badid    answers an id that is not a token (a hostile guest)
//	others   write their arguments, one line, and then their stdin to
//	         stdout and "stderr\n" to stderr; they exit when stdin ends,
//	         with the number in their EXIT environment entry (0 without)
//
// A process that gets signal n exits with 128+n.
func (g *fakeGuest) exec(s net.Conn, req *guest.ExecRequest) {
	if req == nil || req.Validate() != nil {
		_ = guest.WriteJSON(s, guest.FrameError, guest.Response{Error: "exec: a request the agent refuses"})
		return
	}
	g.mu.Lock()
	g.execs = append(g.execs, *req)
	n := len(g.execs)
	g.mu.Unlock()
	if req.Argv[0] == "missing" {
		_ = guest.WriteJSON(s, guest.FrameError, guest.Response{Error: "exec missing: no such file or directory", ExitCode: 127})
		return
	}
	id := req.ID
	if id == "" {
		id = fmt.Sprintf("fake-%d", n)
	}
	if req.Argv[0] == "badid" {
		// A hostile guest's id: a header line of its own.
		id = "x\r\nKosa8-Exec-Pid: 1"
	}
	if guest.WriteJSON(s, guest.FrameResponse, guest.Response{ID: id, Pid: 1000 + n}) != nil {
		return
	}
	code := 0
	for _, e := range req.Env {
		if v, ok := strings.CutPrefix(e, "EXIT="); ok {
			code, _ = strconv.Atoi(v)
		}
	}
	if req.Argv[0] == "deaf" {
		for guest.WriteFrame(s, guest.FrameStdout, []byte("y\n")) == nil {
		}
		return
	}
	stop := make(chan struct{})
	defer close(stop)
	if req.Argv[0] == "yes" {
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if guest.WriteFrame(s, guest.FrameStdout, []byte("y\n")) != nil {
					return
				}
			}
		}()
	} else {
		_ = guest.WriteFrame(s, guest.FrameStdout, []byte(strings.Join(req.Argv[1:], " ")+"\n"))
		_ = guest.WriteFrame(s, guest.FrameStderr, []byte("stderr\n"))
	}
	for {
		f, err := guest.ReadFrame(s)
		if err != nil {
			return
		}
		switch f.Kind {
		case guest.FrameStdin:
			if req.Argv[0] != "yes" {
				_ = guest.WriteFrame(s, guest.FrameStdout, f.Payload)
			}
		case guest.FrameStdinEOF:
			if req.Argv[0] != "yes" {
				_ = guest.WriteJSON(s, guest.FrameExit, guest.ExitStatus{Code: code})
				return
			}
		case guest.FrameSignal:
			if len(f.Payload) != 1 {
				continue
			}
			sig := syscall.Signal(f.Payload[0])
			g.mu.Lock()
			g.signals = append(g.signals, sig)
			g.mu.Unlock()
			_ = guest.WriteJSON(s, guest.FrameExit, guest.ExitStatus{Code: 128 + int(sig), Signal: unix.SignalName(sig)})
			return
		}
	}
}

// fakeRig is a supervisor of a running fake machine: a sandbox directory
// of its own, an audit log, an agent client on a fake guest; no
// workspace. Machines its driver starts later (a rewind's) get a fake
// guest each too.
type fakeRig struct {
	s   *supervisor
	drv *vmmtest.Driver

	mu     sync.Mutex
	guests map[*vmmtest.Machine]*fakeGuest
}

func (r *fakeRig) guest(m *vmmtest.Machine) *fakeGuest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.guests[m]
}

// newFakeRig starts the rig; with netstack set the supervisor's network
// is the real one (in-process, reaching nothing), as a rewind needs to
// attach a new NIC link, else only its audit log.
func newFakeRig(t *testing.T, netstack bool) *fakeRig {
	t.Helper()
	return newFakeRigIn(t, netstack, t.TempDir(), 2)
}

// newFakeRigIn is newFakeRig with the sandbox's directory at dir and
// memMiB of guest RAM.
func newFakeRigIn(t *testing.T, netstack bool, dir string, memMiB int) *fakeRig {
	t.Helper()
	ctx := context.Background()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sb := &sandbox.Sandbox{Dir: dir, Config: validConfig("fake"), Disks: vmmtest.Layers{}}
	sb.Config.MemoryMiB = memMiB
	// The bottom layer a checkpoint's first overlay goes on.
	if err := os.WriteFile(sb.Path(sandbox.RootDisk), []byte("fake root disk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	r := &fakeRig{guests: map[*vmmtest.Machine]*fakeGuest{}}
	r.drv = &vmmtest.Driver{OnStart: func(m *vmmtest.Machine) {
		g := serveFakeGuest(t, m)
		r.mu.Lock()
		r.guests[m] = g
		r.mu.Unlock()
	}}
	s := &supervisor{sb: sb, log: log, drv: r.drv, spec: &vmspec.Spec{Name: "fake", MemoryMiB: sb.Config.MemoryMiB},
		stop: make(chan stopRequest, 1), clientCh: make(chan struct{}), home: t.TempDir()}
	if netstack {
		n, err := startNetwork(sb, t.TempDir(), log)
		if err != nil {
			t.Fatal(err)
		}
		s.net = n
	} else {
		al, err := audit.Open(sb.Path("audit.log"), 0)
		if err != nil {
			t.Fatal(err)
		}
		s.net = &network{sb: sb, log: log, audit: al}
	}
	mach, err := r.drv.Start(ctx, s.spec, vmm.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := guest.Connect(ctx, mach.Agent())
	if err != nil {
		t.Fatal(err)
	}
	s.machine = mach
	s.setClient(client)
	// No spare RAM files: their background worker would outlive the
	// test's directory, and they are checkpoint.Spares' business (tested
	// there). Every checkpoint here copies into a new file.
	s.ramSaver().Spares.Close()
	t.Cleanup(func() {
		if rr := s.rewindRAM(); rr != nil {
			rr.Close()
		}
		if c := s.currentClient(); c != nil {
			c.Close()
		}
		for _, m := range r.drv.Machines() {
			m.Kill()
		}
		if netstack {
			s.net.close()
		} else {
			s.net.audit.Close()
		}
	})
	r.s = s
	return r
}

// fakeSupervisor is newFakeRig's supervisor, its machine and guest.
func fakeSupervisor(t *testing.T) (*supervisor, *vmmtest.Machine, *fakeGuest) {
	t.Helper()
	r := newFakeRig(t, false)
	m := r.drv.Machines()[0]
	return r.s, m, r.guest(m)
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
	// As a confined QEMU's: the layer it writes is its uid's.
	vmmUID := os.Geteuid()
	if vmmUID == 0 {
		vmmUID = 0x7a000001
		if err := os.Chown(s.sb.Path(sandbox.RootDisk), vmmUID, vmmUID); err != nil {
			t.Fatal(err)
		}
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
	// Where the pause went: every step, adding up to the pause.
	var sum float64
	for _, k := range []string{"stop", "disks", "devices", "ram", "resume"} {
		ms, ok := meta.PauseSteps[k]
		if !ok || ms < 0 {
			t.Errorf("pause step %s: %v, %v (steps %v)", k, ms, ok, meta.PauseSteps)
		}
		sum += ms
	}
	if len(meta.PauseSteps) != 5 || math.Abs(sum-meta.PauseMillis) > 0.006 { // each step truncated to a µs
		t.Errorf("pause steps %v add up to %.3f ms, the pause took %.3f", meta.PauseSteps, sum, meta.PauseMillis)
	}
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
	if d := meta.Disks["root"]; d.Path != sandbox.RootDisk {
		t.Errorf("checkpoint's root layer %q, want %q", d.Path, sandbox.RootDisk)
	}
	// The frozen layer is taken back from the VMM's uid.
	if fi, err := os.Stat(s.sb.Path(sandbox.RootDisk)); err != nil {
		t.Error(err)
	} else if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != os.Geteuid() {
		t.Errorf("the frozen layer is owned by %d, want %d", uid, os.Geteuid())
	}
	active := s.sb.ActiveDisks()["root"]
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
		for _, final := range []bool{false, true} {
			if final && tc.fail == "Resume" {
				continue // a final checkpoint resumes only after a failure
			}
			name, want := tc.fail, tc.wantCalls
			if final {
				// A rewind's machine keeps its layers: no disk switch.
				if tc.fail == "SnapshotDisk" {
					continue
				}
				name += " (final, a rewind's)"
				want = slices.DeleteFunc(slices.Clone(want), func(c string) bool { return strings.HasPrefix(c, "SnapshotDisk") })
			}
			t.Run(name, func(t *testing.T) {
				testCheckpointFailure(t, tc.fail, final, want, tc.wantPaused)
			})
		}
	}
}

// testCheckpointFailure takes a checkpoint (final: a rewind's) whose
// machine call fail fails, and checks what is left.
func testCheckpointFailure(t *testing.T, fail string, final bool, wantCalls []string, wantPaused bool) {
	s, m, g := fakeSupervisor(t)
	injected := errors.New("injected " + fail + " failure")
	m.Fail(fail, injected)
	var err error
	if final {
		var finish func() error
		_, finish, err = s.checkpointFinal(context.Background(), "doomed", "pre-rewind", true)
		if finish != nil {
			t.Fatal("a failed final checkpoint handed over a finish")
		}
	} else {
		_, err = s.checkpoint(context.Background(), "doomed", "manual")
	}
	if !errors.Is(err, injected) {
		t.Fatalf("checkpoint: %v, want the injected error", err)
	}
	if got := m.CallNames(); !slices.Equal(got, wantCalls) {
		t.Errorf("machine calls %v, want %v", got, wantCalls)
	}
	pausedBetween(t, m.Calls())
	if m.Paused() != wantPaused {
		t.Errorf("paused %v after the failed checkpoint, want %v", m.Paused(), wantPaused)
	}
	if wantPaused && !strings.Contains(err.Error(), "kosa8 stop --kill") {
		t.Errorf("the error does not say how to end the machine: %v", err)
	}
	if ops := g.Ops(); len(ops) == 0 || ops[len(ops)-1] != guest.OpThaw {
		t.Errorf("guest asked %v, want thaw last", ops)
	}
	list, err := s.sb.Checkpoints().List()
	if err != nil || len(list) != 0 {
		t.Errorf("checkpoints after a failed one: %v (%v)", list, err)
	}
	if half, _ := filepath.Glob(filepath.Join(s.sb.Checkpoints().Dir, ".tmp-*")); len(half) > 0 {
		t.Errorf("half-written checkpoint left: %v", half)
	}
	if st := s.getStatus(); st.Checkpoint != "" {
		t.Errorf("status names checkpoint %q after a failed one", st.Checkpoint)
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

// The memory route waits for a checkpoint or a rewind in progress (they
// hold cpMu): it pauses the machine and resumes it when done, which in
// the middle of a checkpoint would let the guest run between the disk
// snapshot and the device state.
func TestMemoryWaitsForACheckpoint(t *testing.T) {
	s, m, _ := fakeSupervisor(t)
	s.cpMu.Lock() // as a checkpoint holds it
	var unlock sync.Once
	defer unlock.Do(s.cpMu.Unlock)
	n := len(m.CallNames())
	mem := answerLater(s.routes(), "GET", "/v1/debug/memory", "")
	notAnsweredYet(t, "GET /v1/debug/memory", "the checkpoint ended", mem)
	if got := m.CallNames()[n:]; len(got) != 0 {
		t.Errorf("the memory route called %v during a checkpoint", got)
	}
	unlock.Do(s.cpMu.Unlock)
	rec := answered(t, "GET /v1/debug/memory", mem)
	if rec.Code != http.StatusOK || rec.Body.Len() != s.sb.Config.MemoryMiB<<20 {
		t.Errorf("GET /v1/debug/memory after the checkpoint: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	if got := m.CallNames()[n:]; !slices.Equal(got, []string{"Pause", "Resume"}) || m.Paused() {
		t.Errorf("memory route calls %v, paused %v; want Pause, Resume and a running machine", got, m.Paused())
	}
}

// A memory client that stops reading loses its stream after
// memoryStallTimeout: it held cpMu and the paused machine as long as it
// liked, so a checkpoint, a rewind and the stop of 'kosa8 pause' (which
// takes cpMu) waited on it.
func TestMemoryClientThatStopsReadingIsCut(t *testing.T) {
	s, m, _ := fakeSupervisor(t)
	defer func(d time.Duration) { memoryStallTimeout = d }(memoryStallTimeout)
	memoryStallTimeout = 200 * time.Millisecond
	serveFakeAPI(t, s)
	c, err := net.Dial("unix", s.sb.Path(sandbox.APISocket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Asks for the RAM (2 MiB, more than the socket holds) and reads none of it.
	if _, err := io.WriteString(c, "GET /v1/debug/memory HTTP/1.1\r\nHost: kosa8\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the memory route paused the machine", m.Paused)
	done := make(chan error, 1)
	go func() {
		_, err := s.checkpoint(context.Background(), "after a stalled memory read", "manual")
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("checkpoint after the memory client stalled: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a checkpoint still waits 10s after the memory client stopped reading")
	}
	if m.Paused() {
		t.Error("the machine stays paused")
	}
}

// readAt is n bytes of f at off.
func readAt(t *testing.T, f *os.File, off int64, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s: %v", f.Name(), err)
	}
	return b
}

// waitRewindRAM waits until the RAM prepared in the background for a
// rewind holds checkpoint id's.
func waitRewindRAM(t *testing.T, s *supervisor, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.rewindRAM().Holds() != id; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("RAM for %s never got ready (holds %q)", id, s.rewindRAM().Holds())
		}
	}
}

// newRewindRig is newFakeRig with a network (a rewind attaches a new NIC
// link) and a root disk (a rewind makes new layers over it).
func newRewindRig(t *testing.T) *fakeRig {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (qemu-utils): a rewind's new disk layers need it")
	}
	r := newFakeRig(t, true)
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", r.s.sb.Path(sandbox.RootDisk), "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	return r
}

// A rewind saves the running machine as it is (final: paused, never
// resumed), replaces it with a new one that loads the checkpoint's RAM and
// device state, and runs that one on new disk layers over the
// checkpoint's.
func TestRewindReplacesTheMachine(t *testing.T) {
	r := newRewindRig(t)
	s := r.s
	ctx := context.Background()
	old := r.drv.Machines()[0]
	if _, err := old.RAM().WriteAt(guestPattern, guestPatternAt); err != nil {
		t.Fatal(err)
	}
	cp, err := s.checkpoint(ctx, "before", "manual")
	if err != nil {
		t.Fatal(err)
	}
	later := bytes.ToUpper(guestPattern)
	if _, err := old.RAM().WriteAt(later, guestPatternAt); err != nil {
		t.Fatal(err)
	}
	lastLayer := old.Disk("root")

	// The new machine starts while the state before is saved: the save
	// waits here for it (and would time out without it); and it has
	// started when the old one is killed.
	var saves atomic.Int32
	var startedAhead, startedBeforeKill atomic.Bool
	old.OnCall(func(name string) {
		switch name {
		case "SaveDevices":
			if saves.Add(1) != 1 {
				return
			}
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if len(r.drv.Machines()) == 2 {
					startedAhead.Store(true)
					return
				}
			}
		case "Kill":
			startedBeforeKill.Store(len(r.drv.Machines()) == 2)
		}
	})

	res, err := s.rewind(ctx, cp.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.To != cp.ID || res.Saved == nil || res.ColdBoot || res.Warning != "" {
		t.Fatalf("rewind result %+v", res)
	}
	if !startedAhead.Load() || !startedBeforeKill.Load() {
		t.Errorf("the new machine was not started while the state before was saved (during the save %v, before the kill %v)",
			startedAhead.Load(), startedBeforeKill.Load())
	}

	// The machine before: saved while paused and never resumed, then
	// killed; its disk layers kept as they were (no switch to new ones),
	// as the state before's, and no longer the sandbox's.
	want := []string{"Start", "Pause", "SnapshotDisk(root)", "SaveDevices", "Resume", "Pause", "SaveDevices", "Kill"}
	if got := old.CallNames(); !slices.Equal(got, want) {
		t.Errorf("the old machine's calls %v, want %v", got, want)
	}
	pausedBetween(t, old.Calls())
	if got := s.sb.Path(res.Saved.Disks["root"].Path); got != lastLayer {
		t.Errorf("the state before keeps root layer %s, the old machine wrote to %s", got, lastLayer)
	}
	if got := s.sb.ActiveDisks()["root"]; got.Path == res.Saved.Disks["root"].Path {
		t.Errorf("the sandbox still writes to the state before's layer %s", got.Path)
	}
	saved, err := os.Open(filepath.Join(s.sb.Checkpoints().Path(res.Saved.ID), checkpoint.RAMFile))
	if err != nil {
		t.Fatalf("the state before the rewind: %v", err)
	}
	defer saved.Close()
	if got := readAt(t, saved, guestPatternAt, len(later)); !bytes.Equal(got, later) {
		t.Errorf("the state before the rewind holds %q, want %q", got, later)
	}

	// The machine after: started incoming on the checkpoint's RAM, its
	// devices loaded, then resumed; the guest reseeded.
	ms := r.drv.Machines()
	if len(ms) != 2 || s.currentMachine() != vmm.Machine(ms[1]) {
		t.Fatalf("%d machines, the supervisor holds %v", len(ms), s.currentMachine())
	}
	next := ms[1]
	if got := next.CallNames(); !slices.Equal(got, []string{"Start", "LoadDevices", "Resume"}) {
		t.Errorf("the new machine's calls %v, want Start, LoadDevices, Resume", got)
	}
	if next.Paused() {
		t.Error("the new machine is paused")
	}
	if got := readAt(t, next.RAM(), guestPatternAt, len(guestPattern)); !bytes.Equal(got, guestPattern) {
		t.Errorf("the new machine's RAM holds %q, want the checkpoint's %q", got, guestPattern)
	}
	if ops := r.guest(next).Ops(); !slices.Contains(ops, guest.OpRestored) {
		t.Errorf("the new guest was asked %v, never told it was restored", ops)
	}

	// New layers over the checkpoint's frozen ones.
	spec := next.Spec()
	if len(spec.Disks) != 1 || spec.Disks[0].ID != "root" {
		t.Fatalf("the new machine's disks: %+v", spec.Disks)
	}
	chain, err := vmmtest.Layers{}.Chain(context.Background(), spec.Disks[0].Path, "qcow2")
	if err != nil || len(chain) < 2 || chain[1] != s.sb.Path(cp.Disks["root"].Path) {
		t.Errorf("the new root layer's chain is %q (%v), want it on the checkpoint's %q", chain, err, s.sb.Path(cp.Disks["root"].Path))
	}
	if st := s.getStatus(); st.Checkpoint != cp.ID {
		t.Errorf("status names checkpoint %q, want %q", st.Checkpoint, cp.ID)
	}
}

// A rewind to the last checkpoint hands the new machine the RAM prepared
// for it in the background (no copy while the user waits); a rewind to
// another checkpoint copies that one's RAM. Either way the machine gets
// the checkpoint's RAM exactly.
func TestRewindUsesPreparedRAM(t *testing.T) {
	r := newRewindRig(t)
	s := r.s
	ctx := context.Background()
	write := func(b []byte) {
		t.Helper()
		if _, err := s.currentMachine().(*vmmtest.Machine).RAM().WriteAt(b, guestPatternAt); err != nil {
			t.Fatal(err)
		}
	}
	first := []byte("first checkpoint")
	second := []byte("second checkpoint")
	write(first)
	cp1, err := s.checkpoint(ctx, "one", "manual")
	if err != nil {
		t.Fatal(err)
	}
	waitRewindRAM(t, s, cp1.ID)
	write(second)
	cp2, err := s.checkpoint(ctx, "two", "manual")
	if err != nil {
		t.Fatal(err)
	}
	waitRewindRAM(t, s, cp2.ID)
	write([]byte("after both........"))

	rewindTo := func(cp *checkpoint.Meta, want []byte, copied bool) {
		t.Helper()
		if _, err := s.rewind(ctx, cp.ID); err != nil {
			t.Fatal(err)
		}
		m := s.currentMachine().(*vmmtest.Machine)
		// The RAM kept ready is always the new machine's: as it is, or
		// with the checkpoint's RAM copied over it.
		if !m.Prepared || m.Copied != copied {
			t.Errorf("rewind to %s: RAM kept ready used %v, copied into %v; want true, %v", cp.Message, m.Prepared, m.Copied, copied)
		}
		if got := readAt(t, m.RAM(), guestPatternAt, len(want)); !bytes.Equal(got, want) {
			t.Errorf("rewind to %s: the machine's RAM holds %q, want %q", cp.Message, got, want)
		}
	}
	rewindTo(cp2, second, false)
	// The same one again is prepared again once the rewind is done.
	waitRewindRAM(t, s, cp2.ID)
	write([]byte("changed after the rewind"))
	rewindTo(cp2, second, false)
	waitRewindRAM(t, s, cp2.ID)
	rewindTo(cp1, first, true)
	if n := r.drv.RAMFilesAhead(); n < 2 {
		t.Errorf("%d RAM files made ahead, want one per handover at least", n)
	}
}

// The state before a rewind, saved with its RAM copied during the pause
// (what a rewind does when the outgoing RAM cannot wait in shared memory),
// leaves the RAM prepared for the last checkpoint alone: that is the
// rewind's likeliest target, and nobody rewinds to the state before at once.
func TestStateBeforeRewindKeepsPreparedRAM(t *testing.T) {
	r := newFakeRig(t, false)
	s := r.s
	ctx := context.Background()
	if _, err := s.currentMachine().(*vmmtest.Machine).RAM().WriteAt(guestPattern, guestPatternAt); err != nil {
		t.Fatal(err)
	}
	cp, err := s.checkpoint(ctx, "one", "manual")
	if err != nil {
		t.Fatal(err)
	}
	waitRewindRAM(t, s, cp.ID)
	s.cpMu.Lock()
	_, _, err = s.checkpointFinal(ctx, "before rewind to "+cp.ID, "pre-rewind", false)
	s.cpMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if h := s.rewindRAM().Holds(); h != cp.ID {
		t.Fatalf("after the state before the rewind was saved the prepared RAM holds %q, want %s", h, cp.ID)
	}
	f, exact := s.takeRewindRAM(cp.ID)
	if f == nil || !exact {
		t.Fatalf("no prepared RAM for the rewind's target (file %v, exact %v)", f != nil, exact)
	}
	f.Close()
}

// A first boot that fails under hardware acceleration the user did not
// force is tried again on a TCG driver made from the same options; the
// failure is recorded by the driver that failed and shown in the status.
// A forced accelerator is not replaced.
func TestLaunchFallsBackToTCG(t *testing.T) {
	for _, forced := range []vmm.Accel{"", vmm.KVM} {
		t.Run("forced="+string(forced), func(t *testing.T) {
			r := newFakeRig(t, true)
			s := r.s
			hw := &vmmtest.Driver{AccelAs: vmm.KVM, StartErr: errors.New("injected boot failure")}
			var asked []vmm.DriverOptions
			var recordedBefore []string
			s.newDriver = func(o vmm.DriverOptions) (vmm.Driver, error) {
				asked = append(asked, o)
				if o.Accel == vmm.TCG {
					// Before the (slow) TCG boot: doctor must not
					// meanwhile take kvm for usable.
					recordedBefore = hw.Failures()
					return r.drv, nil
				}
				return hw, nil
			}
			s.driverOpts = vmm.DriverOptions{Arch: vmspec.AMD64, Accel: forced, ReadOnly: []string{"/image"}}
			s.drv, s.accel = hw, vmm.KVM
			before := len(r.drv.Machines())

			err := s.launchFirst(context.Background(), nil, forced)
			if forced != "" {
				if err == nil || !strings.Contains(err.Error(), "KOSA8_ACCEL=tcg") {
					t.Errorf("forced kvm: %v, want the failure and how to use tcg", err)
				}
				if len(asked) != 0 || len(hw.Failures()) != 0 {
					t.Errorf("forced kvm: drivers made %v, failures recorded %v", asked, hw.Failures())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(asked) != 1 || asked[0].Accel != vmm.TCG || !slices.Equal(asked[0].ReadOnly, []string{"/image"}) {
				t.Errorf("drivers made: %+v, want one for tcg with the same confinement", asked)
			}
			if s.accel != vmm.TCG || s.drv != vmm.Driver(r.drv) {
				t.Errorf("running under %s on %v", s.accel, s.drv)
			}
			if f := hw.Failures(); len(f) != 1 || !strings.HasPrefix(f[0], "kvm: ") || !strings.Contains(f[0], "injected boot failure") {
				t.Errorf("failures recorded by the kvm driver: %q", f)
			}
			if len(recordedBefore) != 1 {
				t.Errorf("kvm's failure was not on record while tcg booted: %q", recordedBefore)
			}
			if st := s.getStatus(); !strings.Contains(st.AccelFallback, "injected boot failure") {
				t.Errorf("status says %q about the fallback", st.AccelFallback)
			}
			ms := r.drv.Machines()
			if len(ms) != before+1 || s.currentMachine() != vmm.Machine(ms[len(ms)-1]) {
				t.Errorf("the supervisor does not hold the tcg machine")
			}
		})
	}
}

// A checkpoint of two disks whose second switch fails leaves both new
// layers recorded: the one switched, which the machine writes to, and the
// one whose switch failed, as QEMU may have made it and answered with an
// error (a deadline); an empty layer over the old one reads as the old
// one, so the record is true either way, and a later start loses nothing.
func TestCheckpointRecordsTheDiskLayersMade(t *testing.T) {
	s, m, _ := fakeSupervisor(t)
	before := s.sb.ActiveDisks()
	before["ws"] = checkpoint.Disk{Path: sandbox.WorkspaceDisk, Format: "raw"}
	if err := os.WriteFile(s.sb.Path(sandbox.WorkspaceDisk), []byte("fake workspace disk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.sb.SaveActiveDisks(before); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected: the second snapshot fails")
	m.FailLater("SnapshotDisk", 1, injected)
	if _, err := s.checkpoint(context.Background(), "half", "manual"); !errors.Is(err, injected) {
		t.Fatalf("checkpoint: %v, want the injected failure", err)
	}
	after := s.sb.ActiveDisks()
	switched := 0
	for id, was := range before {
		now, at := after[id], m.Disk(id)
		chain, err := vmmtest.Layers{}.Chain(context.Background(), s.sb.Path(now.Path), now.Format)
		switch {
		case err != nil || len(chain) != 2 || chain[1] != s.sb.Path(was.Path):
			t.Errorf("disk %s: recorded %q (chain %q, %v), want a new layer over %q", id, now.Path, chain, err, was.Path)
		case at == "":
		case s.sb.Path(now.Path) != at:
			t.Errorf("disk %s: the machine writes to %q, the record says %q", id, at, now.Path)
		default:
			switched++
		}
	}
	if switched != 1 || m.Paused() {
		t.Errorf("%d disks switched (want 1); machine paused %v", switched, m.Paused())
	}

	// Both succeed: both recorded.
	if _, err := s.checkpoint(context.Background(), "whole", "manual"); err != nil {
		t.Fatal(err)
	}
	after = s.sb.ActiveDisks()
	for id := range before {
		if at := m.Disk(id); at == "" || s.sb.Path(after[id].Path) != at {
			t.Errorf("disk %s: the machine writes to %q, the record says %q", id, at, after[id].Path)
		}
	}
}

// A checkpoint makes and records its new disk layers before it pauses the
// machine (the pause only switches to them): one that cannot record them
// fails without pausing, and leaves neither a layer nor a checkpoint.
func TestCheckpointRecordsItsLayersBeforeThePause(t *testing.T) {
	s, m, _ := fakeSupervisor(t)
	before := s.sb.ActiveDisks()

	// The record cannot be written: a directory holds its name.
	if err := os.MkdirAll(s.sb.Path(filepath.Join("disks.json", "in-the-way")), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := s.checkpoint(context.Background(), "unrecorded", "manual"); err == nil {
		t.Fatal("a checkpoint whose layers cannot be recorded succeeded")
	}
	if got := m.CallNames(); !slices.Equal(got, []string{"Start"}) {
		t.Errorf("machine calls %v: it was paused for a checkpoint that could not record its layers", got)
	}
	if files, _ := filepath.Glob(s.sb.Path(filepath.Join(sandbox.DisksDir, "*"))); len(files) != 0 {
		t.Errorf("disk layers left behind: %v", files)
	}
	if list, _ := s.sb.Checkpoints().List(); len(list) != 0 {
		t.Errorf("checkpoints %v after a failed one", list)
	}
	if err := os.RemoveAll(s.sb.Path("disks.json")); err != nil {
		t.Fatal(err)
	}

	// A pause that fails: the record names the old layers again and the
	// new ones are gone.
	m.Fail("Pause", errors.New("injected: pause fails"))
	if _, err := s.checkpoint(context.Background(), "unpaused", "manual"); err == nil {
		t.Fatal("a checkpoint whose pause failed succeeded")
	}
	if after := s.sb.ActiveDisks(); !maps.Equal(after, before) {
		t.Errorf("layers recorded after a failed pause %v, want %v", after, before)
	}
	if files, _ := filepath.Glob(s.sb.Path(filepath.Join(sandbox.DisksDir, "*"))); len(files) != 0 {
		t.Errorf("disk layers left behind: %v", files)
	}
}

// A rewind makes the new layers over its checkpoint's while it saves the
// state before; one whose save fails leaves them behind no more than it
// changes the layers the machine writes to.
func TestFailedRewindRemovesItsNewLayers(t *testing.T) {
	r := newRewindRig(t)
	s := r.s
	ctx := context.Background()
	cp, err := s.checkpoint(ctx, "before", "manual")
	if err != nil {
		t.Fatal(err)
	}
	layers := func() []string {
		files, _ := filepath.Glob(s.sb.Path(filepath.Join(sandbox.DisksDir, "*")))
		return files
	}
	before, active := layers(), s.sb.ActiveDisks()
	r.drv.Machines()[0].Fail("Pause", errors.New("injected: the machine cannot pause for the state before"))
	if _, err := s.rewind(ctx, cp.ID); err == nil {
		t.Fatal("a rewind whose save of the state before failed succeeded")
	}
	if after := layers(); !slices.Equal(after, before) {
		t.Errorf("disk layers %v after the failed rewind, want %v", after, before)
	}
	if got := s.sb.ActiveDisks(); !maps.Equal(got, active) {
		t.Errorf("active layers %v after the failed rewind, want %v", got, active)
	}
	// A machine started ahead for the rewind is gone; the old one runs.
	ms := r.drv.Machines()
	for _, m := range ms[1:] {
		select {
		case <-m.Done():
		default:
			t.Errorf("a machine started for the failed rewind still runs: %v", m.CallNames())
		}
	}
	if s.currentMachine() != vmm.Machine(ms[0]) || ms[0].Paused() {
		t.Error("the machine before the failed rewind does not run on")
	}
}

// A rewind whose machine started ahead fails to start starts another once
// the old one is gone.
func TestRewindStartsAgainWhenTheEarlyStartFails(t *testing.T) {
	r := newRewindRig(t)
	s := r.s
	ctx := context.Background()
	cp, err := s.checkpoint(ctx, "before", "manual")
	if err != nil {
		t.Fatal(err)
	}
	r.drv.FailStart(errors.New("injected: no memory for a second QEMU beside the first"))
	res, err := s.rewind(ctx, cp.ID)
	if err != nil {
		t.Fatalf("rewind: %v", err)
	}
	if res.ColdBoot {
		t.Error("the rewind booted cold")
	}
	ms := r.drv.Machines()
	if len(ms) != 2 || s.currentMachine() != vmm.Machine(ms[1]) {
		t.Fatalf("%d machines, the supervisor holds %v", len(ms), s.currentMachine())
	}
	if got := ms[1].CallNames(); !slices.Equal(got, []string{"Start", "LoadDevices", "Resume"}) {
		t.Errorf("the new machine's calls %v, want Start, LoadDevices, Resume", got)
	}
	if ops := r.guest(ms[1]).Ops(); !slices.Contains(ops, guest.OpRestored) {
		t.Errorf("the new guest was asked %v, never told it was restored", ops)
	}
}

// Nor when the record cannot be read: whether a start would write into
// the layers is then unknown.
func TestFinalCheckpointNotKeptOverAnUnreadableRecord(t *testing.T) {
	r := newRewindRig(t)
	s := r.s
	ctx := context.Background()
	if _, err := s.checkpoint(ctx, "first", "manual"); err != nil {
		t.Fatal(err)
	}
	s.cpMu.Lock()
	meta, finish, err := s.checkpointFinal(ctx, "before rewind", "pre-rewind", true)
	s.cpMu.Unlock()
	if err != nil || finish == nil {
		t.Fatalf("final checkpoint: %v (finish %v)", err, finish != nil)
	}
	_ = s.currentMachine().Kill()
	next, err := s.sb.NewOverlays(meta.Disks, checkpoint.NewID())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.sb.SaveActiveDisks(next); err != nil {
		t.Fatal(err)
	}
	// Damaged after the new layers were recorded: read as the first
	// disks, which are not the state before's, the guard would pass.
	if err := os.WriteFile(s.sb.Path("disks.json"), []byte("{\"root\": "), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("finish over an unreadable record: %v", err)
	}
	if list, _ := s.sb.Checkpoints().List(); len(list) != 1 {
		t.Errorf("checkpoints: %d, want only the first", len(list))
	}
}

// A rewind's state before keeps the layers its machine wrote to, so it is
// never kept while the record still names them as the sandbox's: a start
// would write into a checkpoint's disk.
func TestFinalCheckpointNotKeptOverActiveLayers(t *testing.T) {
	r := newRewindRig(t)
	s := r.s
	ctx := context.Background()
	s.cpMu.Lock()
	meta, finish, err := s.checkpointFinal(ctx, "before rewind", "pre-rewind", true)
	s.cpMu.Unlock()
	if err != nil || finish == nil {
		t.Fatalf("final checkpoint: %v (finish %v)", err, finish != nil)
	}
	if meta.Disks["root"] != s.sb.ActiveDisks()["root"] {
		t.Fatalf("the state before's root %v, the sandbox's %v: want the same layer until a rewind records new ones", meta.Disks["root"], s.sb.ActiveDisks()["root"])
	}
	_ = s.currentMachine().Kill()
	if err := finish(); err == nil || !strings.Contains(err.Error(), "still the one the sandbox writes to") {
		t.Fatalf("finish over the active layers: %v", err)
	}
	if list, _ := s.sb.Checkpoints().List(); len(list) != 0 {
		t.Errorf("checkpoints kept: %v", list)
	}
	if half, _ := filepath.Glob(filepath.Join(s.sb.Checkpoints().Dir, ".tmp-*")); len(half) > 0 {
		t.Errorf("half-written checkpoint left: %v", half)
	}
}

// The old machine's layers (the state before's) are taken back from its
// QEMU's uid as soon as it is gone, before another QEMU starts: one
// started after a failed early start may run as that uid again (its slot
// is free once the old one exited), and the guest runs on it before the
// state before is written out and committed.
func TestRewindTakesBackTheOldLayersBeforeAnotherStart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("handing layers to another uid needs root")
	}
	r := newRewindRig(t)
	s := r.s
	ctx := context.Background()
	cp, err := s.checkpoint(ctx, "before", "manual")
	if err != nil {
		t.Fatal(err)
	}
	// The old machine's QEMU writes its layer as a uid of its own.
	const qemuUID = 0x7a0f0f0f
	last := s.sb.Path(s.sb.ActiveDisks()["root"].Path)
	if err := os.Lchown(last, qemuUID, qemuUID); err != nil {
		t.Fatal(err)
	}
	var owners []uint32
	onStart := r.drv.OnStart
	r.drv.OnStart = func(m *vmmtest.Machine) {
		var st syscall.Stat_t
		if err := syscall.Lstat(last, &st); err != nil {
			t.Errorf("the old machine's layer at a start: %v", err)
		}
		owners = append(owners, st.Uid)
		onStart(m)
	}
	r.drv.FailStart(errors.New("injected: no memory for a second QEMU beside the first"))
	if _, err := s.rewind(ctx, cp.ID); err != nil {
		t.Fatalf("rewind: %v", err)
	}
	if len(owners) != 1 || owners[0] == qemuUID {
		t.Errorf("the state before's layer belonged to uid %v as the next QEMU started, want it taken back from the old QEMU's %d", owners, qemuUID)
	}
}
