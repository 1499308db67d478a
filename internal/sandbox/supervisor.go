package sandbox

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

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/egress"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/netstack"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// SuperviseOptions configure the supervisor process.
type SuperviseOptions struct {
	// Restore resumes the sandbox from this checkpoint instead of booting;
	// with Rewind the host folder is merged back to it too (else it is a
	// resume: edits made on the host meanwhile flow in).
	Restore     string
	Rewind      bool
	AgentPath   string   // kosa8-agent binary for the initramfs
	Ready       *os.File // told once: {"ok":true} or {"error":…}; may be nil
	Log         *slog.Logger
	BootTimeout time.Duration
}

// ReadyMessage is what the supervisor writes to its ready pipe.
type ReadyMessage struct {
	OK     bool    `json:"ok"`
	Error  string  `json:"error,omitempty"`
	Status *Status `json:"status,omitempty"`
}

// supervisor owns one running sandbox.
type supervisor struct {
	sb      *Sandbox
	log     *slog.Logger
	machine *qemu.Machine
	client  *guest.Client
	accel   vmm.Accel
	net     *network
	ws      *workspace

	drv         *qemu.Driver
	spec        *vmspec.Spec
	qemuVersion string
	cpMu        sync.Mutex // one checkpoint or rewind at a time
	replacing   atomic.Pointer[qemu.Machine]
	spareMu     sync.Mutex
	spareReady  bool
	clientMu    sync.Mutex
	clientCh    chan struct{} // closed when s.client is replaced

	mu     sync.Mutex
	status Status

	stop     chan stopRequest
	stopOnce sync.Once
}

type stopRequest struct {
	kill     bool
	pause    bool       // checkpoint first, then stop: a paused sandbox uses no host RAM
	pausedAt string     // set once paused
	done     chan error // told the outcome of a pause
}

// Supervise boots the sandbox and serves it until it stops. It is the body
// of the detached 'kosa8 supervise' process.
func (m *Manager) Supervise(ctx context.Context, name string, o SuperviseOptions) (err error) {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	ready := func(msg ReadyMessage) {
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
			ready(ReadyMessage{Error: err.Error()})
		}
	}()
	sb, err := m.Open(name)
	if err != nil {
		return err
	}
	lock, err := lockSupervisor(sb.Dir)
	if err != nil {
		return fmt.Errorf("%w: %s", err, name)
	}
	defer lock.Close()

	s := &supervisor{sb: sb, log: log, stop: make(chan stopRequest, 1), clientCh: make(chan struct{})}
	start := time.Now()
	parent := sb.Status().Checkpoint // the checkpoint tree carries across restarts
	s.setStatus(func(st *Status) {
		*st = Status{State: Starting, SupervisorPID: os.Getpid(), Started: start.UTC(), Checkpoint: parent}
	})
	if err := s.boot(ctx, m, o); err != nil {
		s.setStatus(func(st *Status) { st.State, st.Error, st.Stopped = Crashed, err.Error(), time.Now().UTC() })
		if s.machine != nil {
			_ = s.machine.Kill()
		}
		if s.net != nil {
			s.net.close()
		}
		return err
	}
	defer s.net.close()
	s.setStatus(func(st *Status) {
		st.State = Running
		st.QEMUPID = s.machine.Pid()
		st.Accel = string(s.accel)
		st.BootMillis = msSince(start)
	})
	srv, err := s.serveAPI()
	if err != nil {
		_ = s.machine.Kill()
		s.setStatus(func(st *Status) { st.State, st.Error = Crashed, err.Error() })
		return err
	}
	go s.prepareSpare()
	if every := time.Duration(sb.Config.CheckpointEvery); every > 0 {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		go s.autoCheckpoints(actx, every)
	}
	st := s.getStatus()
	ready(ReadyMessage{OK: true, Status: &st})
	log.Info("running", "accel", s.accel, "boot_ms", st.BootMillis, "qemu_pid", st.QEMUPID)

	var req stopRequest
	var exitErr error
	exited := false
wait:
	for {
		m := s.currentMachine()
		select {
		case req = <-s.stop:
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
	s.setStatus(func(st *Status) { st.State = Stopping })
	if s.ws != nil {
		if !exited && !req.kill {
			// A last pass, so nothing the guest just wrote is left behind.
			wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			s.ws.stop(wctx)
			cancel()
		} else {
			s.ws.detach()
			s.ws.closeFiles()
		}
	}
	if !exited {
		exitErr = s.shutdown(req.kill)
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = srv.Shutdown(shutCtx)
	cancel()
	os.Remove(sb.Path(APISocket))
	s.setStatus(func(st *Status) {
		st.Stopped = time.Now().UTC()
		st.State = Stopped
		st.QEMUPID = 0
		if exitErr != nil && !req.kill {
			st.State, st.Error = Crashed, exitErr.Error()
		}
		if req.pausedAt != "" {
			st.State, st.Checkpoint = Paused, req.pausedAt
		}
	})
	log.Info("stopped", "err", exitErr)
	if sb.Config.Ephemeral {
		lock.Close()
		return m.Remove(name)
	}
	return nil
}

func (s *supervisor) setStatus(f func(*Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.status)
	if err := s.sb.WriteStatus(s.status); err != nil {
		s.log.Error("write state", "err", err)
	}
}

func (s *supervisor) getStatus() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Cmdline is the guest kernel's command line for a sandbox.
func Cmdline(c *Config) string {
	parts := []string{
		// A panic ends QEMU (-no-reboot) instead of hanging; warnings and
		// worse reach the console log.
		"panic=-1", "loglevel=4",
		"kosa8.user=" + c.User,
		"kosa8.uid=" + strconv.Itoa(c.UID),
		"kosa8.gid=" + strconv.Itoa(c.GID),
		"kosa8.hostname=" + Hostname(c.Name),
	}
	return strings.Join(parts, " ")
}

func (s *supervisor) boot(ctx context.Context, m *Manager, o SuperviseOptions) error {
	cfg := &s.sb.Config
	img, err := image.Store{Dir: m.Paths.Cache}.Open(cfg.ImageDir)
	if err != nil {
		return fmt.Errorf("the sandbox's image is gone (%v): recreate the sandbox", err)
	}
	if o.AgentPath == "" {
		return errors.New("kosa8-agent not found")
	}
	initrd, err := img.Initramfs(o.AgentPath)
	if err != nil {
		return err
	}
	drv, err := qemu.New(qemu.Config{Arch: vmspec.Arch(cfg.Arch), Accel: vmm.Accel(cfg.Accel)})
	if err != nil {
		return err
	}
	s.accel = drv.Accel()
	if s.accel == vmm.TCG {
		s.log.Warn(vmm.IsolationWarning)
	}
	if s.net, err = startNetwork(s.sb, m.Paths.Config, s.log); err != nil {
		return err
	}
	if _, line, err := qemu.BinaryVersion(ctx, drv.BinaryPath()); err == nil {
		s.qemuVersion = line
	}
	s.drv = drv
	s.spec = &vmspec.Spec{
		Name:       cfg.Name,
		Arch:       vmspec.Arch(cfg.Arch),
		CPUs:       cfg.CPUs,
		MemoryMiB:  cfg.MemoryMiB,
		Kernel:     img.Kernel().Image,
		Initrd:     initrd,
		Cmdline:    Cmdline(cfg) + " " + NetCmdline(),
		ConsoleLog: s.sb.Path(ConsoleLog),
		AgentPort:  guestPortName,
		Net:        &vmspec.Net{MAC: netstack.GuestMAC.String()},
	}
	_ = os.Truncate(s.sb.Path(ConsoleLog), 0) // one log per start; restores append to it
	bootCtx, cancel := context.WithTimeout(ctx, o.BootTimeout)
	defer cancel()
	var restore *checkpoint.Meta
	if o.Restore != "" {
		if restore, err = s.prepareRestore(o.Restore); err != nil {
			return err
		}
	}
	if err := s.launch(bootCtx, restore); err != nil {
		return err
	}
	info, err := s.currentClient().Info(bootCtx)
	if err != nil {
		return err
	}
	s.setStatus(func(st *Status) { st.Kernel = info.Kernel })
	if err := s.installCA(bootCtx); err != nil {
		return fmt.Errorf("install the sandbox CA in the guest: %w", err)
	}
	if cfg.Workspace != nil {
		if s.ws, err = openWorkspace(s.sb, m.Paths.Home, s.log); err != nil {
			return fmt.Errorf("workspace: %w", err)
		}
		if err := s.ws.attach(bootCtx, s.currentClient(), s.sb.loadManifest(), o.Restore != "" && o.Rewind); err != nil {
			return fmt.Errorf("workspace: %w", err)
		}
	}
	ports, err := s.sb.LoadPorts()
	if err != nil {
		return err
	}
	for _, pf := range ports {
		if err := s.net.addForward(pf, false); err != nil {
			return err
		}
	}
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
	if _, err := c.ReadFile(ctx, GuestCABundle, &bundle); err != nil {
		return fmt.Errorf("read %s: %w", GuestCABundle, err)
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
	if err := c.WriteFile(ctx, GuestCAPath, 0o644, "root", bytes.NewReader(ca)); err != nil {
		return err
	}
	if len(extra) > 0 {
		if err := c.WriteFile(ctx, GuestHostCAPath, 0o644, "root", bytes.NewReader(extra)); err != nil {
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
	return c.WriteFile(ctx, GuestCABundle, 0o644, "root", bytes.NewReader(append(b, extra...)))
}

// guestPortName must match the agent's agent.DefaultPortName.
const guestPortName = "org.kosa8.agent"

// consoleTail returns the last lines of the console log for an error.
func consoleTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 12 {
		lines = lines[len(lines)-12:]
	}
	return "\nlast console lines:\n  " + strings.Join(lines, "\n  ")
}

// shutdown stops the guest: a clean poweroff through the agent unless
// kill, then QEMU is killed if it is still there after a grace period.
func (s *supervisor) shutdown(kill bool) error {
	m := s.currentMachine()
	if c := s.currentClient(); !kill && c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.Poweroff(ctx)
		cancel()
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err = m.Wait(ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			s.log.Warn("guest did not power off in time: killing QEMU")
		} else {
			s.log.Warn("poweroff request failed: killing QEMU", "err", err)
		}
	}
	_ = m.Kill()
	return nil
}

func (s *supervisor) requestStop(req stopRequest) {
	s.stopOnce.Do(func() { s.stop <- req })
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
	l, err := listenAPI(s.sb.Path(APISocket))
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}
