// Package supervisor is the per-sandbox process ('kosa8 supervise'): it
// boots the sandbox's VM through a driver its caller picks (it holds vmm
// interfaces only), wires the guest's network and workspace, takes
// checkpoints and rewinds, and serves the API (internal/api) on the
// sandbox's api.sock until the sandbox stops. Launch starts it, detached.
package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/egress"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// Options configure the supervisor process.
type Options struct {
	// Restore resumes the sandbox from this checkpoint instead of booting;
	// with Rewind the host folder is merged back to it too (else it is a
	// resume: edits made on the host meanwhile flow in).
	Restore     string
	Rewind      bool
	AgentPath   string   // kosa8-agent binary for the initramfs
	Ready       *os.File // told once: {"ok":true} or {"error":…}; may be nil
	Log         *slog.Logger
	BootTimeout time.Duration
	// NewDriver makes the driver that runs the sandbox's machine (the
	// caller picks the VMM: cmd/kosa8 passes qemu.NewDriver).
	NewDriver vmm.NewDriver
}

// supervisor owns one running sandbox.
type supervisor struct {
	sb      *sandbox.Sandbox
	log     *slog.Logger
	machine vmm.Machine
	client  *guest.Client
	accel   vmm.Accel
	net     *network
	ws      *workspace

	drv         vmm.Driver
	newDriver   vmm.NewDriver
	driverOpts  vmm.DriverOptions // how drv was made; the TCG fallback changes only the accelerator
	spec        *vmspec.Spec
	qemuVersion string
	cpMu        sync.Mutex // one checkpoint or rewind at a time
	replacing   replacing
	undoOnce    sync.Once // ramSaver (checkpoint_undo.go)
	undo        *checkpoint.RAMSaver
	rewindOnce  sync.Once // rewindRAM (checkpoint_undo.go)
	rewindMem   *checkpoint.RewindRAM
	clientMu    sync.Mutex
	clientCh    chan struct{} // closed when s.client is replaced
	// privateRAM: the machine's RAM is mapped copy-on-write from a
	// checkpoint (a fork's start): its checkpoints carry it in the
	// device stream (guarded by clientMu, with machine).
	privateRAM bool

	// qemuFirmware: the microvm firmware's file name ("" for QEMU's default).
	qemuFirmware string

	// firstBoot: the sandbox was never started before this supervisor
	// (its disks are as sandbox.Create made them): a boot template may
	// stand in for its boot, or be made from it (template.go).
	firstBoot bool
	// cleanStop is how the last run ended (sandbox.TakeCleanStop): it
	// decides the workspace's first pass.
	cleanStop sandbox.CleanStop
	// poweredOff: the guest powered off when asked (its filesystems
	// synced), not killed.
	poweredOff bool
	unnamed    bool           // a boot a template is made of: named after the copy
	cache      string         // KOSA8_CACHE: the images, and the templates beside them
	home       string         // KOSA8_HOME: the folders' locks
	forkUp     bool           // a fork's machine was restored from its source's checkpoint by this supervisor
	bg         sync.WaitGroup // work that outlives a step (a template's publication)

	mu     sync.Mutex
	status api.Status

	stop     chan stopRequest
	stopOnce sync.Once
}

// replacing holds the machine a rewind is replacing: its exit is not the
// end of the sandbox.
type replacing struct {
	mu sync.Mutex
	m  vmm.Machine
}

func (r *replacing) Store(m vmm.Machine) {
	r.mu.Lock()
	r.m = m
	r.mu.Unlock()
}

func (r *replacing) Load() vmm.Machine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m
}

// CompareAndSwap sets next if old is the machine held.
func (r *replacing) CompareAndSwap(old, next vmm.Machine) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m != old {
		return false
	}
	r.m = next
	return true
}

type stopRequest struct {
	kill     bool
	pause    bool       // checkpoint first, then stop: a paused sandbox uses no host RAM
	pausedAt string     // set once paused
	done     chan error // told the outcome of a pause
}

// Supervise boots m's sandbox name and serves it until it stops. It is
// the body of the detached 'kosa8 supervise' process.
func Supervise(ctx context.Context, m *sandbox.Manager, name string, o Options) (err error) {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	ready := func(msg launch.ReadyMessage) {
		if o.Ready == nil {
			return
		}
		b, _ := json.Marshal(msg)
		_, _ = o.Ready.Write(append(b, '\n'))
		o.Ready.Close()
		o.Ready = nil
	}
	defer func() {
		if err != nil {
			ready(launch.ReadyMessage{Error: err.Error()})
		}
	}()
	sb, err := m.Open(name)
	if err != nil {
		return err
	}
	lock, err := sandbox.LockSupervisor(sb.Dir)
	if err != nil {
		return fmt.Errorf("%w: %s", err, name)
	}
	defer lock.Close()

	s := &supervisor{sb: sb, log: log, stop: make(chan stopRequest, 1), clientCh: make(chan struct{})}
	start := time.Now()
	parent := sb.Status().Checkpoint // the checkpoint tree carries across restarts
	s.firstBoot = sb.NeverStarted()
	// Taken (and removed, durably) before anything runs: a crash of this
	// run must leave no mark of a clean stop behind.
	if s.cleanStop, err = sb.TakeCleanStop(); err != nil {
		log.Warn("read how the last run stopped: its workspace is merged as after a crash", "err", err)
	}
	defer waitBackground(&s.bg, time.Minute, log)
	s.setStatus(func(st *api.Status) {
		*st = api.Status{State: api.Starting, SupervisorPID: os.Getpid(), Started: start.UTC(), Checkpoint: parent}
	})
	srv, err := s.start(ctx, m, o)
	if err != nil {
		return err
	}
	defer s.net.close()
	if sb.Config.Fork == nil {
		// A fork makes its spares at its first checkpoint: most never
		// take one, and N forks would hold 2N of them.
		go s.prepareSpare()
	}
	if every := time.Duration(sb.Config.CheckpointEvery); every > 0 {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		go s.autoCheckpoints(actx, every)
	}
	st := s.getStatus()
	ready(launch.ReadyMessage{OK: true, Status: &st})
	log.Info("running", "accel", s.accel, "boot_ms", st.BootMillis, "qemu_pid", st.QEMUPID)
	forkDone := make(chan struct{})
	fctx, stopFork := context.WithCancel(ctx)
	if s.forkUp {
		go func() { defer close(forkDone); s.runForkCommand(fctx) }()
	} else {
		close(forkDone)
	}

	var req stopRequest
	var exitErr error
	exited, took := false, false
wait:
	for {
		m := s.currentMachine()
		select {
		case req = <-s.stop:
			took = true
			break wait
		case <-ctx.Done():
			log.Info("signalled: stopping")
			break wait
		case <-m.Done():
			if s.replacing.Load() == m {
				// A rewind killed it and starts the next one: wait for that,
				// unless the rewind gives up (then this is the end).
				for s.currentMachine() == m && s.replacing.Load() == m {
					time.Sleep(20 * time.Millisecond)
					if ctx.Err() != nil {
						break wait
					}
				}
				if s.currentMachine() != m {
					continue
				}
			}
			exited = true
			exitErr = m.Wait(context.Background())
			break wait
		}
	}
	s.closeStop(took)
	if req.pause {
		// Written out: the next start resumes it.
		s.cpMu.Lock()
		meta, err := s.checkpointLocked(context.Background(), "paused", "pause")
		s.cpMu.Unlock()
		if err != nil {
			log.Error("pause", "err", err)
			req.pause = false
		} else {
			req.kill = true
			req.pausedAt = meta.ID
		}
		select {
		case req.done <- err:
		default:
		}
	}
	if sb.Config.Fork != nil && !exited && !req.kill {
		// What the fork changed, for 'kosa8 fork ls' once it is stopped.
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s.recordChanges(cctx)
		cancel()
	}
	s.setStatus(func(st *api.Status) { st.State = api.Stopping })
	stopped := exited
	kill := req.kill
	if !stopped && !kill {
		if err := s.answers(context.Background()); err != nil {
			// A clean stop would only wait on it.
			log.Warn("the machine does not answer: killing QEMU", "err", err)
			kill = true
		}
	}
	if !stopped && kill {
		// QEMU goes first: whatever waits on the guest or on QEMU (a
		// checkpoint, a sync pass, holding the locks the sync's detach
		// waits for) fails at once instead of holding up the stop.
		exitErr = s.shutdown(true)
		stopped = true
	}
	var syncDone chan struct{}
	var cleanSync atomic.Bool // the last pass brought both sides in step and saved it
	syncEnded := true
	if s.ws != nil {
		syncDone = make(chan struct{})
		last := !stopped
		go func() {
			defer close(syncDone)
			if last {
				// A last pass, so nothing the guest just wrote is left behind.
				wctx, cancel := context.WithTimeout(context.Background(), syncStopTimeout)
				cleanSync.Store(s.ws.stop(wctx))
				cancel()
			} else {
				s.ws.detach()
				s.ws.closeFiles()
			}
		}()
		select {
		case <-syncDone:
			syncDone = nil
		case <-time.After(syncStopTimeout + 5*time.Second):
			// Waiting on a lock a stuck call holds: stopping QEMU ends it.
			log.Warn("the workspace sync did not stop in time: stopping the VM without its last pass")
		}
	}
	if !stopped {
		exitErr = s.shutdown(req.kill)
	}
	if syncDone != nil {
		select {
		case <-syncDone:
		case <-time.After(10 * time.Second):
			log.Error("the workspace sync did not end after the VM did")
			syncEnded = false
		}
	}
	if s.ws != nil {
		// What the next start may trust of the workspace's record: the
		// machine a pause saved, with the record saved beside it; or, after
		// a last pass saved durably and a guest that powered off, the
		// record itself. Anything else makes it merge, deleting nothing.
		var mark *sandbox.CleanStop
		switch {
		case req.pausedAt != "":
			mark = &sandbox.CleanStop{Paused: req.pausedAt}
		case syncEnded && cleanSync.Load() && s.poweredOff:
			mark = &sandbox.CleanStop{Stopped: true}
		}
		if mark != nil {
			if err := sb.MarkCleanStop(*mark); err != nil {
				log.Warn("record the clean stop: the next start merges the workspace as after a crash", "err", err)
			}
		} else {
			log.Info("the workspace did not stop cleanly: the next start merges it, deleting nothing", "last_pass_saved", syncEnded && cleanSync.Load(), "powered_off", s.poweredOff)
		}
	}
	pending := 0
	if s.ws != nil && s.ws.engine != nil {
		ws := s.ws.engine.Status()
		pending = len(ws.Pending) + len(ws.Held)
	}
	// --rm removes the sandbox when it stops, but not the agent's
	// unreviewed work, which lives on its disk: with changes pending it
	// stays, stopped and still --rm, and goes at the first stop with none
	// left (once every change is applied or discarded). A pause is not a
	// stop: a paused sandbox stays too.
	remove := sb.Config.Ephemeral && pending == 0 && req.pausedAt == ""
	if sb.Config.Ephemeral && pending > 0 {
		log.Info("kept for review", "pending", pending)
	}
	stopFork() // its stream is gone with the machine: it records why
	select {
	case <-forkDone:
	case <-time.After(5 * time.Second):
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = srv.Shutdown(shutCtx)
	cancel()
	os.Remove(sb.Path(sandbox.APISocket))
	s.setStatus(func(st *api.Status) {
		st.Stopped = time.Now().UTC()
		st.State = api.Stopped
		st.QEMUPID = 0
		if exitErr != nil && !req.kill {
			st.State, st.Error = api.Crashed, exitErr.Error()
		}
		if req.pausedAt != "" {
			st.State, st.Checkpoint = api.Paused, req.pausedAt
		}
		st.Pending = pending
	})
	log.Info("stopped", "err", exitErr)
	if remove {
		lock.Close()
		return m.Remove(name)
	}
	return nil
}

// waitBackground waits for wg, at most d.
func waitBackground(wg *sync.WaitGroup, d time.Duration, log *slog.Logger) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		log.Warn("background work did not end in time", "waited", d)
	}
}

func (s *supervisor) setStatus(f func(*api.Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.status)
	if err := s.sb.WriteStatus(s.status); err != nil {
		s.log.Error("write state", "err", err)
	}
}

func (s *supervisor) getStatus() api.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Cmdline is the guest kernel's command line for a sandbox.
func Cmdline(c *sandbox.Config) string {
	parts := []string{
		// A panic ends QEMU (-no-reboot) instead of hanging; warnings and
		// worse reach the console log.
		"panic=-1", "loglevel=4",
		"kosa8.user=" + c.User,
		"kosa8.uid=" + strconv.Itoa(c.UID),
		"kosa8.gid=" + strconv.Itoa(c.GID),
		// No hostname: the host names the guest once its agent answers
		// (SetTime, Restored), so the line, and a machine booted with it
		// (a template), is the same for every sandbox of a user.
	}
	return strings.Join(parts, " ")
}

// accelBootTimeout bounds a first boot under KVM or HVF before kosa8 gives
// up on the accelerator: such a guest reaches its agent in about a second,
// and one that has not by then is hung (as Debian's kernel hangs after
// "Probing EDD" on some nested, paravirtualized hosts whose /dev/kvm passes
// the probe).
const accelBootTimeout = 20 * time.Second

// launchFirst starts the machine for the sandbox's first boot in this
// supervisor. Under hardware acceleration the user did not force, a boot
// that fails (QEMU exits, or the agent does not answer in
// accelBootTimeout) is tried again under TCG; if that works, the failure is
// recorded for this boot of the host (so later starts go straight to TCG),
// and the sandbox's status says why it fell back.
func (s *supervisor) launchFirst(ctx context.Context, restore *checkpoint.Meta, forced vmm.Accel) error {
	if s.accel == vmm.TCG {
		return s.launch(ctx, restore)
	}
	actx, cancel := context.WithTimeout(ctx, accelBootTimeout)
	err := s.launch(actx, restore)
	cancel()
	if err == nil {
		return nil
	}
	tried := s.accel
	if m := s.currentMachine(); m != nil {
		_ = m.Kill()
	}
	if ctx.Err() != nil {
		return err // the caller gave up (a signal, or its own deadline)
	}
	if forced != "" {
		return fmt.Errorf("booting under %s failed: %w\nkosa8 was asked for %s (KOSA8_ACCEL or --accel); to run under emulation instead, set KOSA8_ACCEL=tcg", tried, err, tried)
	}
	s.log.Warn("hardware acceleration failed to boot the sandbox: trying tcg", "accel", tried, "err", err)
	// Recorded before the TCG boot, which takes a while, so that doctor
	// and other starts meanwhile do not take the accelerator for usable;
	// taken back if TCG fails too (the accelerator is then not shown to
	// be the cause).
	reason := fmt.Sprintf("%s failed to boot a sandbox: %v", tried, err)
	failed := s.drv
	r, recorder := failed.(vmm.FailureRecorder)
	if recorder {
		if rerr := r.RecordFailure(tried, reason); rerr != nil {
			s.log.Warn("record the accelerator's failure", "err", rerr)
		}
	}
	tcg := s.driverOpts
	tcg.Accel = vmm.TCG
	forget := func() {
		if f, ok := failed.(vmm.FailureForgetter); recorder && ok {
			_ = f.ForgetFailure(tried)
		}
	}
	drv, derr := s.newDriver(tcg)
	if derr != nil {
		forget()
		return errors.Join(err, derr)
	}
	s.drv, s.accel = drv, vmm.TCG
	s.log.Warn(vmm.IsolationWarning)
	s.resetConsoleLog()
	if terr := s.launch(ctx, restore); terr != nil {
		forget()
		return fmt.Errorf("booting under %s failed (%v), and under tcg too: %w", tried, err, terr)
	}
	s.setStatus(func(st *api.Status) { st.AccelFallback = reason })
	return nil
}

// installCA puts the sandbox CA into the guest's system roots, once (the
// root disk keeps it): its certificate goes where update-ca-certificates
// finds it, so a later run keeps it, and is appended to the bundle at once
// (running update-ca-certificates took tens of seconds under TCG).
func (s *supervisor) installCA(ctx context.Context) error {
	ca := s.net.ca.CertPEM()
	var bundle bytes.Buffer
	c := s.currentClient()
	if _, err := c.ReadFile(ctx, sandbox.GuestCABundle, &bundle); err != nil {
		return fmt.Errorf("read %s: %w", sandbox.GuestCABundle, err)
	}
	// The host's own roots beyond the guest's (a TLS-inspecting proxy's
	// CA), unless the sandbox was made with --no-host-ca.
	var extra []byte
	if !s.sb.Config.NoHostCA {
		extra = egress.ExtraRoots(egress.HostRootsPEM(), bundle.Bytes())
	}
	if bytes.Contains(bundle.Bytes(), ca) && len(extra) == 0 {
		return nil
	}
	if err := c.WriteFile(ctx, sandbox.GuestCAPath, 0o644, "root", bytes.NewReader(ca)); err != nil {
		return err
	}
	if len(extra) > 0 {
		if err := c.WriteFile(ctx, sandbox.GuestHostCAPath, 0o644, "root", bytes.NewReader(extra)); err != nil {
			return err
		}
	}
	b := bundle.Bytes()
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	if !bytes.Contains(b, ca) {
		b = append(b, ca...)
	}
	return c.WriteFile(ctx, sandbox.GuestCABundle, 0o644, "root", bytes.NewReader(append(b, extra...)))
}

// networkNoteFiles hold the network note in the guest (see
// agent.NetworkNote): the login banner, and the file the presets' memory
// files are made from.
var networkNoteFiles = []string{"/etc/motd", "/etc/kosa8/network.md"}

// nameNetworkNote writes the network note with this sandbox's name in
// place of the image's NAME, so that the commands it tells an agent to
// pass on are the ones the user runs. A failure only costs the name: it
// is logged, not fatal.
func (s *supervisor) nameNetworkNote(ctx context.Context) {
	note := agent.NetworkNoteFor(s.sb.Config.Name)
	for _, p := range networkNoteFiles {
		if err := s.currentClient().WriteFile(ctx, p, 0o644, "root", strings.NewReader(note)); err != nil {
			s.log.Warn("name the sandbox in the guest's network note", "file", p, "err", err)
		}
	}
}

// guestPortName must match the agent's agent.DefaultPortName.
const guestPortName = "org.kosa8.agent"

// resetConsoleLog empties the console log, and removes the older half
// the driver keeps of a long one (console.log.1), for a new boot.
func (s *supervisor) resetConsoleLog() {
	p := s.sb.Path(sandbox.ConsoleLog)
	_ = os.Truncate(p, 0)
	_ = os.Remove(p + ".1")
}

// consoleTail returns the last lines of the console log for an error.
func consoleTail(path string) string {
	lines := vmspec.ConsoleTail(path, 12)
	if lines == nil {
		return ""
	}
	return "\nlast console lines:\n  " + strings.Join(lines, "\n  ")
}

// syncStopTimeout bounds the workspace's last pass at a stop.
const syncStopTimeout = 60 * time.Second

// shutdown stops the guest: a clean poweroff through the agent unless
// kill, then QEMU is killed if it is still there after a grace period.
// Every wait in it has a deadline.
func (s *supervisor) shutdown(kill bool) error {
	m := s.currentMachine()
	if c := s.currentClient(); !kill && c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := within(ctx, c.Poweroff)
		cancel()
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err = m.Wait(ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				s.poweredOff = err == nil
				return err
			}
			s.log.Warn("guest did not power off in time: killing QEMU")
		} else {
			s.log.Warn("poweroff request failed: killing QEMU", "err", err)
		}
	}
	if err := m.Kill(); err != nil {
		s.log.Error("kill QEMU", "err", err)
	}
	return nil
}

// within runs f and returns when it does or when ctx ends, whichever is
// first: a call into the guest can block past its context on a channel the
// guest no longer reads (yamux opens a stream without one).
func within(ctx context.Context, f func(context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// requestStop hands req to Supervise, which takes one request: it reports
// false, and drops req, when a stop or pause was asked for already, or
// the sandbox is stopping without one (closeStop).
func (s *supervisor) requestStop(req stopRequest) bool {
	taken := false
	s.stopOnce.Do(func() { s.stop <- req; taken = true })
	return taken
}

// closeStop is called once Supervise's loop has ended; took says whether
// on a request. Later requests are refused (requestStop reports false);
// a pause handed over as the loop ended another way is not carried out.
func (s *supervisor) closeStop(took bool) {
	s.stopOnce.Do(func() {})
	if took {
		return // requestStop sends once: nothing else is on its way
	}
	select {
	case late := <-s.stop:
		if late.done != nil {
			late.done <- errors.New("the sandbox stopped before it could be paused")
		}
	default:
	}
}

// logWriter turns QEMU's output into log lines.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line != "" {
			w.log.Warn("qemu", "msg", line)
		}
	}
	return len(p), nil
}

// listenAPI opens the supervisor's socket in the state directory.
func listenAPI(path string) (net.Listener, error) {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		if len(path) > 100 {
			return nil, fmt.Errorf("API socket path %s is too long for a unix socket: set KOSA8_HOME to a shorter directory", path)
		}
		return nil, err
	}
	_ = os.Chmod(path, 0o600)
	return l, nil
}

func (s *supervisor) serveAPI() (*http.Server, error) {
	l, err := listenAPI(s.sb.Path(sandbox.APISocket))
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}
