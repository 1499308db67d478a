package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/netstack"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// start boots the sandbox and serves its API: named steps (startJob's
// methods, in order below), each pushing what gives back what it took
// (the network, QEMU, the workspace's watchers, the API socket) on the
// job's undo stack. A start that fails runs the stack, last in first out,
// and leaves the sandbox crashed with the error; one that succeeds hands
// all of it to Supervise, whose stop path ends it.
//
// Each step's time goes to the log ("boot steps"): where a start's time
// beyond the guest's own boot goes.
//
// A machine restored from a boot template that dies during the rest of
// the start (its QEMU exits, or its kernel stops) does not end the start:
// it runs again, booting (runStart).
func (s *supervisor) start(ctx context.Context, m *sandbox.Manager, o Options) (*http.Server, error) {
	s.cache, s.home = m.Paths.Cache, m.Paths.Home
	j, err := s.runStart(ctx, func() *startJob { return &startJob{s: s, m: m, o: o} }, (*startJob).allSteps)
	return j.srv, err
}

// runStart runs a new job's steps, and once more, with another new job,
// if the first restored a template whose machine stopped under it (the
// first job's run decides: retry). The second gets what the first left of
// the start's time limit, appends its console lines to the first's (the
// restored guest's last words), and removes the template once it has got
// past where the first died: a machine the sandbox itself kills (its
// first copy running the guest out of memory) dies in the boot too, and
// the template, shared with other sandboxes, stays.
func (s *supervisor) runStart(ctx context.Context, newJob func() *startJob, steps func(*startJob) []step) (*startJob, error) {
	j := newJob()
	err := j.run(ctx, steps(j))
	if err == nil || !j.retry {
		return j, err
	}
	first := j
	s.log.Warn("the machine started from a template stopped during the start: booting instead", "template", first.template, "err", err)
	if first.setupDone != nil {
		// The first job's guest setup ends with its context (ended):
		// nothing of it runs beside the second.
		select {
		case <-first.setupDone:
		case <-time.After(guestCallTimeout):
		}
	}
	first.phase("the VM restored from a boot template stopped: booting instead")
	s.setStatus(func(st *api.Status) { st.Error, st.Template = "", "" })
	j = newJob()
	j.o.BootTimeout = first.left
	j.keepConsole = true
	if err2 := j.run(ctx, steps(j)); err2 != nil {
		return j, fmt.Errorf("%w (after a start from a boot template whose machine stopped: %v)", err2, err)
	}
	os.RemoveAll(filepath.Join(s.templatesDir(), first.template))
	s.log.Warn("removed the boot template whose machine stopped in a start", "template", first.template)
	return j, nil
}

// allSteps are a start's steps, in order.
func (j *startJob) allSteps() []step {
	return []step{
		{"image", j.image},
		{"driver", j.driver},
		{"network", j.network},
		{"machine", j.machine}, // QEMU started, the guest booted, its agent answering
		{"guest_setup_begin", j.guestSetup},
		{"workspace", j.workspace},
		{"guest_setup", j.guestSetupDone}, // what was left of it after the workspace
		{"ports", j.ports},
		{"api", j.serve},
	}
}

// run runs steps in order, within the boot timeout.
func (j *startJob) run(ctx context.Context, steps []step) (err error) {
	s := j.s
	limit := j.o.BootTimeout
	if s.sb.Config.Docker != nil {
		// The container engine's first start (under TCG, tens of
		// seconds) comes on top of the boot, with a deadline of its own.
		limit += dockerStartTimeout
	}
	// The limit covers every step but the workspace's first copy, whose
	// length follows the folder's size (10,000 files of 20 KB took 31 s
	// under TCG; a loaded host's ran past the whole boot's limit, and no
	// fixed limit fits every folder): that step is bounded by its
	// progress instead (firstCopyStall, firstCopyMax). One context serves
	// every step (a step may start work that a later one waits for); its
	// deadline is the furthest the start can last, and a timer that stops
	// during the first copy ends it once the limit is used up.
	ctx, cancelAll := context.WithTimeout(ctx, limit+firstCopyMax+time.Minute)
	defer cancelAll()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	overdue := errOverdue{limit}
	due := time.Now().Add(limit)
	budget := time.AfterFunc(limit, func() { cancel(overdue) })
	defer budget.Stop()
	var times []any
	defer func() { s.log.Info("boot steps", times...) }()
	defer func() {
		if err == nil {
			return
		}
		j.srv = nil
		// A guest connection that broke after the boot (a step's "agent:
		// EOF") most often means QEMU or the guest's kernel died: its
		// exit and the console say why, the broken stream does not.
		if gone := j.vmStopped(ctx, err); gone != nil {
			err = gone
		}
		err = j.undo.run(err)
		// A template's machine that stopped is retried (runStart) while
		// the limit has time left: the sandbox is still starting.
		j.left = time.Until(due)
		j.retry = j.template != "" && errors.As(err, new(errVMStopped)) && !errors.As(err, new(errOverdue)) &&
			!errors.As(err, new(errStalled)) && context.Cause(ctx) == nil && j.left > 0
		if j.retry {
			return
		}
		s.setStatus(func(st *api.Status) {
			st.State, st.Error, st.Stopped, st.QEMUPID = api.Crashed, err.Error(), time.Now().UTC(), 0
		})
	}()
	defer func() {
		// A step ended by the limit says so, not only "context canceled".
		if err != nil && context.Cause(ctx) == error(overdue) && !errors.As(err, new(errOverdue)) {
			err = fmt.Errorf("%w: %w", overdue, err)
		}
	}()
	for i := range steps {
		// Each step tells the waiting command where the start is.
		st, n := steps[i], i+1
		steps[i].run = func(ctx context.Context) error {
			j.step, j.steps = n, len(steps)
			j.phase(j.stepWords(st.name))
			if st.name == "workspace" && budget.Stop() {
				t := time.Now()
				err := st.run(ctx)
				due = due.Add(time.Since(t))
				if err == nil {
					// Not after a failure: the start ends with the step's
					// own error, not a limit that ran out meanwhile.
					budget.Reset(time.Until(due))
				}
				return err
			}
			return st.run(ctx)
		}
	}
	return runSteps(ctx, s.log, "start", steps, func(name string, ms float64) { times = append(times, name+"_ms", ms) })
}

// vmStopped returns the error that says the VM stopped, if a step after
// the boot failed because it did: QEMU has exited, or exits within a
// moment of a broken guest connection. Only this job's machine counts: a
// retry's failure before its own QEMU runs is not the first's machine
// stopping again.
func (j *startJob) vmStopped(ctx context.Context, err error) error {
	if j.machineUp == nil || errors.As(err, new(errVMStopped)) {
		return nil
	}
	wait := time.Duration(0)
	if guest.ConnectionLost(err) && ctx.Err() == nil {
		wait = vmExitGrace
	}
	return j.s.vmStopped(j.machineUp, wait, "starting", err)
}

// errOverdue ends a start that used up its time limit (the workspace's
// first copy not counted); it is a context.DeadlineExceeded.
type errOverdue struct{ limit time.Duration }

func (e errOverdue) Error() string {
	return fmt.Sprintf("the start took longer than %v (not counting the workspace's first copy)", e.limit)
}

func (errOverdue) Is(target error) bool { return target == context.DeadlineExceeded }

// stepWords says what a start's step does, for the command that waits.
func (j *startJob) stepWords(name string) string {
	switch name {
	case "machine":
		if j.o.Restore != "" {
			return "restoring the machine saved in checkpoint " + j.o.Restore
		}
		return "booting the VM (QEMU, the guest's kernel, its agent)"
	case "workspace":
		return "attaching the workspace"
	}
	return map[string]string{
		"image":             "opening the image",
		"driver":            "checking QEMU",
		"network":           "starting the network",
		"guest_setup_begin": "setting up the guest",
		"guest_setup":       "finishing the guest's setup",
		"ports":             "forwarding ports",
		"api":               "serving the API",
	}[name]
}

// phase tells the command waiting on the ready pipe, if any, what the
// current step does. Once the sandbox is ready the pipe is closed: a
// later write fails at once, harmlessly.
func (j *startJob) phase(what string) {
	if j.o.Ready == nil || what == "" {
		return
	}
	b, _ := json.Marshal(launch.ReadyMessage{Phase: &launch.BootPhase{Step: j.step, Of: j.steps, What: what}})
	_, _ = j.o.Ready.Write(append(b, '\n'))
}

// startJob is one start under way.
type startJob struct {
	s    *supervisor
	m    *sandbox.Manager
	o    Options
	undo undoStack

	img      *image.Image
	initrd   string
	forced   vmm.Accel    // the accelerator the user asked for, if any
	setup    chan error   // the guest's setup, run beside the workspace's first copy
	cold     bool         // a checkpoint's disks booted without its memory
	fork     string       // a fork's first start: its source's checkpoint's folder
	template string       // the boot template the machine was restored from, if any
	srv      *http.Server // the API, once served

	machineUp   vmm.Machine   // the machine this job's machine step brought up
	setupDone   chan struct{} // closed when the guest setup's goroutine has ended
	keepConsole bool          // the console log goes on from a failed start's (runStart's second job)
	// A failed run: what was left of the time limit, and whether the
	// start is tried again (runStart).
	left  time.Duration
	retry bool

	step, steps int // the step under way, of how many (for phase)
}

// image opens the sandbox's image and its initramfs with this kosa8's
// agent.
func (j *startJob) image(context.Context) error {
	img, err := image.Store{Dir: j.m.Paths.Cache}.Open(j.s.sb.Config.ImageDir)
	if err != nil {
		return fmt.Errorf("the sandbox's image is gone (%v): recreate the sandbox", err)
	}
	if j.o.AgentPath == "" {
		return errors.New("kosa8-agent not found")
	}
	mods := image.GuestModules
	if j.s.sb.Config.Docker != nil {
		// Only a sandbox that runs containers has their kernel modules
		// (loaded at its boot): each is code an attacker inside reaches.
		mods = append(slices.Clone(mods), image.DockerModules...)
	}
	if j.initrd, err = img.InitramfsWith(j.o.AgentPath, mods); err != nil {
		return err
	}
	j.img = img
	return nil
}

// driver makes the VMM driver. The VMM reaches its image and this
// sandbox's disk layers and nothing else of the host (QEMU runs as a uid
// of its own under root).
func (j *startJob) driver(context.Context) error {
	s, cfg := j.s, &j.s.sb.Config
	if j.o.NewDriver == nil {
		return errors.New("no VMM driver: the supervisor was started without one")
	}
	j.forced = vmm.Accel(cfg.Accel)
	s.newDriver = j.o.NewDriver
	s.driverOpts = vmm.DriverOptions{
		Arch: vmspec.Arch(cfg.Arch), Accel: j.forced, RecordDir: j.m.Paths.Home,
		ReadWrite: []string{s.sb.Path(sandbox.DisksDir)}, ReadOnly: []string{j.img.Dir},
	}
	// The disks' lowest layers: its own, or a fork's source's (a fork's
	// layers build on its source's, read-only, frozen), and the frozen
	// layers of the source's checkpoint (and, for a fork's checkpoint
	// restored, its RAM file, which it maps read-only).
	base := s.sb.Dir
	if src := s.sb.SourceDir(); src != "" {
		base = src
		s.driverOpts.ReadOnly = append(s.driverOpts.ReadOnly, filepath.Join(src, sandbox.DisksDir), filepath.Join(src, "checkpoints", cfg.Fork.Checkpoint))
	}
	s.driverOpts.ReadOnly = append(s.driverOpts.ReadOnly, filepath.Join(base, sandbox.RootDisk))
	if cfg.Workspace != nil {
		s.driverOpts.ReadOnly = append(s.driverOpts.ReadOnly, filepath.Join(base, sandbox.WorkspaceDisk))
	}
	if cfg.Docker != nil {
		s.driverOpts.ReadOnly = append(s.driverOpts.ReadOnly, filepath.Join(base, sandbox.DockerDisk))
	}
	drv, err := s.newDriver(s.driverOpts)
	if err != nil {
		return err
	}
	var vinfo vmm.Info
	if i, ok := drv.(vmm.Informer); ok {
		vinfo = i.Info()
	}
	s.accel = drv.Accel()
	if s.accel == vmm.TCG {
		if why := vinfo.AccelFallback; why != "" {
			s.log.Warn("not using hardware acceleration", "why", why)
			s.setStatus(func(st *api.Status) { st.AccelFallback = why })
		}
		s.log.Warn(vmm.IsolationWarning)
	}
	s.qemuVersion = vinfo.Version
	s.qemuFirmware = vinfo.Firmware
	if vinfo.Version != "" && !vinfo.Tested {
		s.log.Warn("VMM outside the tested range", "vmm", drv.Name(), "version", vinfo.Version, "supported", vinfo.TestedRange)
	}
	s.drv = drv
	return nil
}

// network starts the sandbox's network: its stack, DNS, egress broker and
// audit log.
func (j *startJob) network(context.Context) error {
	s := j.s
	n, err := startNetwork(s.sb, j.m.Paths.Config, s.log)
	if err != nil {
		return err
	}
	s.net = n
	j.undo.push(func(err error) error { n.close(); return err })
	return nil
}

// machine boots the guest, or restores it from a checkpoint, until its
// agent answers.
func (j *startJob) machine(ctx context.Context) error {
	s, cfg := j.s, &j.s.sb.Config
	s.spec = &vmspec.Spec{
		Name:       cfg.Name,
		Arch:       vmspec.Arch(cfg.Arch),
		CPUs:       cfg.CPUs,
		MemoryMiB:  cfg.MemoryMiB,
		Kernel:     j.img.Kernel().Image,
		Initrd:     j.initrd,
		Cmdline:    Cmdline(cfg) + " " + NetCmdline(),
		ConsoleLog: s.sb.Path(sandbox.ConsoleLog),
		AgentPort:  guestPortName,
		Net:        &vmspec.Net{MAC: netstack.GuestMAC.String()},
	}
	if !j.keepConsole {
		s.resetConsoleLog() // one log per start; restores append to it
	}
	var restore *checkpoint.Meta
	switch {
	case j.o.Restore != "":
		var err error
		if restore, err = s.prepareRestore(j.o.Restore); err != nil {
			return err
		}
		j.cold = restore == nil
	case s.forkFirst():
		// A fork's first start: its source's checkpoint's machine.
		var err error
		if restore, err = s.prepareForkRestore(); err != nil {
			return err
		}
		if restore != nil {
			defer restore.Root.Close()
		}
		j.cold = restore == nil
		if _, j.fork, err = s.sb.ForkCheckpoint(); err != nil {
			return err
		}
	}
	// Pushed first: a launch that fails may leave QEMU running (and with
	// it its descriptors of the unlinked RAM file).
	j.undo.push(func(err error) error {
		if m := s.currentMachine(); m != nil {
			if kerr := m.Kill(); kerr != nil {
				s.log.Error("kill QEMU after a failed start", "err", kerr)
			}
		}
		return err
	})
	// A new sandbox: its boot is every new sandbox's of its shape, so a
	// template of it stands in (template.go), or is made of it.
	template := ""
	if restore == nil && s.sb.DisksUnused() {
		// Recorded before any QEMU has them: a start that stops short
		// after the guest (or the workspace's copy) wrote them can put
		// the sandbox back to "created" (launch.Launch), and its disks
		// are then no longer every new sandbox's.
		if err := s.sb.SaveActiveDisks(s.sb.ActiveDisks()); err != nil {
			s.log.Warn("record the disks: no template for this start", "err", err)
		} else if j.o.Restore == "" && s.firstBoot && !templatesOff() && cfg.Docker == nil {
			// (A sandbox with a container engine boots afresh: its
			// kernel modules and its third disk make it a shape of its
			// own, and its engine starts after the boot anyway.)
			template = s.templateKey()
		}
	}
	if template != "" {
		j.phase("starting from a boot template")
		if s.startFromTemplate(ctx, template) {
			j.template, j.machineUp = template, s.currentMachine()
			return nil
		}
		j.phase(j.stepWords("machine"))
	}
	s.unnamed = template != ""
	if err := s.launchFirst(ctx, restore, j.forced); err != nil {
		return err
	}
	j.machineUp = s.currentMachine()
	if j.fork != "" {
		s.forkRestored()
	}
	if template != "" {
		// The key again: the boot may have fallen back to TCG.
		key := s.templateKey()
		if t := s.findTemplate(key); t != nil {
			t.close()
		} else if err := s.captureTemplate(ctx, key); errors.Is(err, errNotResumed) {
			return err
		} else if err != nil {
			s.log.Warn("no template made of this boot", "err", err)
		}
		if err := s.nameGuest(ctx); err != nil {
			return fmt.Errorf("name the guest: %w", err)
		}
	}
	return nil
}

// guestSetup starts the guest's setup (its kernel's name, the sandbox CA
// in its roots). It runs beside the workspace's first copy: neither needs
// the other, and the copy's host side (scanning and hashing the folder)
// overlaps the guest's work. guestSetupDone waits for it: no command runs
// before the CA is in place.
func (j *startJob) guestSetup(ctx context.Context) error {
	s := j.s
	j.setup = make(chan error, 1)
	j.setupDone = make(chan struct{})
	go func() {
		defer close(j.setupDone)
		info, err := s.currentClient().Info(ctx)
		if err == nil {
			s.setStatus(func(st *api.Status) { st.Kernel = info.Kernel })
			if err = s.installCA(ctx); err != nil {
				err = fmt.Errorf("install the sandbox CA in the guest: %w", err)
			}
			// After the CA: dockerd reads the roots it trusts once.
			if err == nil && s.sb.Config.Docker != nil {
				err = s.startDocker(ctx, j.m.Paths.Config)
			}
		}
		if err == nil {
			s.nameNetworkNote(ctx)
		}
		j.setup <- err
	}()
	return nil
}

func (j *startJob) guestSetupDone(ctx context.Context) error {
	select {
	case err := <-j.setup:
		return err
	case <-ctx.Done():
		return fmt.Errorf("the guest's setup: %w", ctx.Err())
	}
}

// workspace attaches the workspace folder, if the sandbox has one: its
// first copy into the guest, or the merge after a restore.
func (j *startJob) workspace(ctx context.Context) error {
	s := j.s
	if s.sb.Config.Workspace == nil {
		return nil
	}
	ws, err := openWorkspace(s.sb, j.m.Paths.Home, s.log)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	s.ws = ws
	j.undo.push(func(err error) error {
		ws.detach()
		ws.closeFiles()
		return err
	})
	if ready := j.o.Ready; ready != nil {
		// Once the sandbox is ready the pipe is closed: later writes
		// fail at once, harmlessly.
		ws.progress = func(p launch.CopyProgress) {
			b, _ := json.Marshal(launch.ReadyMessage{Progress: &p})
			_, _ = ready.Write(append(b, '\n'))
		}
	}
	st, first := j.firstPass()
	if err := ws.attach(ctx, s.currentClient(), st, first); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return nil
}

// firstPass decides how this start brings the workspace in step, and from
// what record (issue 27). Only a record known to describe the guest's
// workspace exactly is continued as it is: the last run's, saved by a
// clean stop, or a pause's, saved with the machine restored. A rewind or a
// start --from merges the host folder back to the checkpoint. Every other
// start (after a crash of the supervisor, of QEMU or of the host; a cold
// boot of a paused sandbox or of a checkpoint another QEMU build saved)
// finds a guest that may hold less than the record says, and merges
// without inferring any deletion.
func (j *startJob) firstPass() (syncState, firstPass) {
	s := j.s
	st := syncState{manifest: s.sb.LoadManifest(), guest: s.sb.LoadWorkspaceGuest(), journal: s.sb.LoadJournal()}
	switch {
	case j.o.Restore != "" && j.o.Rewind:
		return syncState{manifest: st.manifest}, rewindPass
	case j.o.Restore != "":
		// The machine of a checkpoint: its record, not the last run's.
		dir := s.sb.Checkpoints().Path(j.o.Restore)
		st.manifest = sandbox.ReadManifest(filepath.Join(dir, checkpoint.ManifestFile))
		st.guest = sandbox.ReadManifest(filepath.Join(dir, sandbox.WorkspaceGuestFile))
		if s.cleanStop.Paused == j.o.Restore && !j.cold {
			return st, continuePass
		}
		return st, recoverPass
	case j.fork != "":
		// A fork's first start: the record of its source's checkpoint,
		// which describes the guest's workspace exactly when its machine
		// was restored.
		st.manifest = sandbox.ReadManifest(filepath.Join(j.fork, checkpoint.ManifestFile))
		st.guest = sandbox.ReadManifest(filepath.Join(j.fork, sandbox.WorkspaceGuestFile))
		if !j.cold {
			return st, continuePass
		}
		return st, recoverPass
	case s.cleanStop.Stopped:
		return st, continuePass
	}
	return st, recoverPass
}

// ports forwards the host ports the sandbox was given.
func (j *startJob) ports(context.Context) error {
	ports, err := j.s.sb.LoadPorts()
	if err != nil {
		return err
	}
	for _, pf := range ports {
		if err := j.s.net.addForward(pf, false); err != nil {
			return err
		}
	}
	return nil
}

// serve marks the sandbox running and serves its API; the API socket is
// never left behind by a start that fails.
func (j *startJob) serve(context.Context) error {
	s := j.s
	sock := s.sb.Path(sandbox.APISocket)
	j.undo.push(func(err error) error { os.Remove(sock); return err })
	s.setStatus(func(st *api.Status) {
		st.State = api.Running
		st.QEMUPID = s.machine.Pid()
		st.Accel = string(s.accel)
		st.BootMillis = msSince(st.Started)
	})
	srv, err := s.serveAPI()
	if err != nil {
		return err
	}
	j.srv = srv
	j.undo.push(func(err error) error { srv.Close(); return err })
	return nil
}
