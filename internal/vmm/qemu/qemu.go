// Package qemu runs kosa8's machines with QEMU: microvm on x86-64, virt on
// arm64, KVM or HVF where the host has them, TCG where it does not.
package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// Driver starts QEMU machines.
type Driver struct {
	binary  string
	accel   vmm.Accel
	ramDir  string
	host    Host
	inst    Install
	confine *Confinement
	cfg     Config // as New completed it: Info and RecordFailure read it
	twins   twins  // the uid slot of each QEMU it starts (twins.go)
}

// Config selects how a Driver runs QEMU.
type Config struct {
	Arch vmspec.Arch
	// Accel forces an acceleration; empty picks the best the host has.
	Accel vmm.Accel
	// Binary overrides the QEMU program (default: found in PATH, or $KOSA8_QEMU).
	Binary string
	// RAMDir holds guest RAM files; it must be tmpfs on Linux. Default:
	// a private directory under /dev/shm.
	RAMDir string
	// RecordDir holds the accelerators that failed to boot a sandbox in
	// this boot of the host (RecordFailure; kosa8 uses its state
	// directory, KOSA8_HOME); they are not chosen again unless forced.
	// It caches what a probe of QEMU found too (ProbeCached). Empty: none
	// are remembered.
	RecordDir string
	// Confine, when set, confines QEMU to these files and its own (see
	// confine_linux.go).
	Confine *Confinement
}

// New finds QEMU and decides the acceleration.
func New(cfg Config) (*Driver, error) {
	if cfg.Arch == "" {
		cfg.Arch = vmspec.HostArch()
	}
	bin, err := FindBinary(cfg.Arch, cfg.Binary)
	if err != nil {
		return nil, err
	}
	if cfg.Arch == vmspec.AMD64 && vmspec.HostArch() == vmspec.AMD64 {
		// A TCG start needs the host's TSC rate, measured over 60 ms of
		// sleeps once per boot of the host (recorded in RecordDir): read
		// or measured meanwhile, it is there when the start asks (it
		// waits for the measurement if not).
		go HostTSCkHzIn(cfg.RecordDir)
	}
	pctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	inst, err := ProbeCached(pctx, bin, cfg.Arch, cfg.RecordDir)
	cancel()
	if err != nil {
		return nil, err
	}
	if err := inst.Supported(); err != nil {
		return nil, err
	}
	host := DetectHostIn(cfg.RecordDir)
	accel, err := ChooseAccel(host, cfg.Arch, cfg.Accel)
	if err != nil {
		return nil, err
	}
	if cfg.RAMDir == "" {
		cfg.RAMDir = defaultRAMDir()
	}
	return &Driver{binary: bin, accel: accel, ramDir: cfg.RAMDir, host: host, inst: inst, confine: cfg.Confine, cfg: cfg}, nil
}

// FindBinary locates the QEMU program for arch. $KOSA8_QEMU overrides it
// unless it names the program of another architecture
// (qemu-system-x86_64 for an arm64 guest): that override is meant for
// the other guests.
func FindBinary(arch vmspec.Arch, override string) (string, error) {
	name := Binary(arch)
	if override == "" {
		override = os.Getenv("KOSA8_QEMU")
		if b := filepath.Base(override); strings.HasPrefix(b, "qemu-system-") && b != name {
			override = ""
		}
	}
	if override != "" {
		name = override
	}
	p, err := exec.LookPath(name)
	if err != nil {
		pkg := "qemu-system-x86"
		if arch == vmspec.ARM64 {
			pkg = "qemu-system-arm"
		}
		hint := "run '" + vmspec.SetupCommand(arch) + "' or install " + pkg
		if runtime.GOOS == "darwin" {
			hint = "run 'brew install qemu'"
		}
		return "", fmt.Errorf("%s not found: %s: %w", name, hint, vmm.ErrNotFound)
	}
	return p, nil
}

// Version is a QEMU release.
type Version struct{ Major, Minor, Micro int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// AtLeast reports whether v is major.minor or newer.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

var versionRE = regexp.MustCompile(`QEMU emulator version (\d+)\.(\d+)(?:\.(\d+))?`)

// ParseVersion reads the first line of `qemu-system-* --version`.
func ParseVersion(out string) (Version, error) {
	m := versionRE.FindStringSubmatch(out)
	if m == nil {
		return Version{}, fmt.Errorf("unrecognised QEMU version output %q", firstLine(out))
	}
	var v Version
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	if m[3] != "" {
		v.Micro, _ = strconv.Atoi(m[3])
	}
	return v, nil
}

func firstLine(s string) string {
	if i := bytes.IndexByte([]byte(s), '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// MinVersion is the oldest QEMU kosa8 runs: 7.2 brought -netdev stream.
var MinVersion = Version{7, 2, 0}

// MaxTestedMajor is the newest QEMU major release kosa8 is tested with
// (CI runs the VM tests under Debian's 7.2 and bookworm-backports' 10.0).
// A newer one runs, with a warning: its command line and migration flags
// are those of the newest tested release.
const MaxTestedMajor = 10

// SupportedRange names the versions kosa8 supports, for messages and docs.
func SupportedRange() string {
	return fmt.Sprintf("%d.%d to %d.x", MinVersion.Major, MinVersion.Minor, MaxTestedMajor)
}

// Less reports whether v is older than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Micro < w.Micro
}

// Tested reports whether v is inside the supported range.
func (v Version) Tested() bool { return !v.Less(MinVersion) && v.Major <= MaxTestedMajor }

// BinaryVersion runs bin --version.
func BinaryVersion(ctx context.Context, bin string) (Version, string, error) {
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return Version{}, "", fmt.Errorf("%s --version: %w", bin, err)
	}
	v, err := ParseVersion(string(out))
	return v, firstLine(string(out)), err
}

func (d *Driver) Name() string       { return "qemu" }
func (d *Driver) Accel() vmm.Accel   { return d.accel }
func (d *Driver) BinaryPath() string { return d.binary }

// Host is what the driver found about the host's accelerators.
func (d *Driver) Host() Host { return d.host }

// Install is what the driver found out about the QEMU it runs: the version
// chooses flags that differ across releases.
func (d *Driver) Install() Install { return d.inst }

// Machine is a running QEMU.
type Machine struct {
	cmd   *exec.Cmd
	pid   int
	qmp   *QMP
	agent net.Conn
	ram   *os.File

	done     chan struct{}
	waitErr  error
	stderr   *tail
	version  Version // chooses the migration URI
	confined string
	plan     *confinePlan // hands QEMU the disk layers made for it
}

func (m *Machine) Pid() int              { return m.pid }
func (m *Machine) Agent() net.Conn       { return m.agent }
func (m *Machine) QMP() *QMP             { return m.qmp }
func (m *Machine) RAM() *os.File         { return m.ram }
func (m *Machine) Done() <-chan struct{} { return m.done }

// Confined says how QEMU is confined ("none", or its uid, no_new_privs,
// the Landlock version).
func (m *Machine) Confined() string { return m.confined }

// Wait blocks until QEMU exits (its error, with the tail of what QEMU
// printed) or ctx ends.
func (m *Machine) Wait(ctx context.Context) error {
	select {
	case <-m.done:
		return m.waitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// killWait bounds the wait for QEMU to be reaped after SIGKILL (a process
// in uninterruptible sleep on a dead disk takes time to die).
var killWait = 10 * time.Second

// Kill ends QEMU at once: SIGKILL, then a bounded wait for it to be gone.
func (m *Machine) Kill() error {
	select {
	case <-m.done:
		return nil
	default:
	}
	if err := m.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill qemu (pid %d): %w", m.pid, err)
	}
	select {
	case <-m.done:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("qemu (pid %d) was sent SIGKILL but has not exited after %v", m.pid, killWait)
	}
}

// RunState asks QEMU whether the guest's CPUs run, and its run state
// ("running", "paused", "io-error", …).
func (m *Machine) RunState(ctx context.Context) (string, bool, error) {
	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	err := m.qmp.Execute(ctx, "query-status", nil, &st)
	return st.Status, st.Running, err
}

// Stderr returns the last of what QEMU printed.
func (m *Machine) Stderr() string { return m.stderr.String() }

// NewRAMFile makes a guest RAM file for spec ahead of its start
// (vmm.RAMFileMaker): where Start would make one, with the same checks.
func (d *Driver) NewRAMFile(spec *vmspec.Spec) (*os.File, error) {
	if !ramAhead {
		return nil, fmt.Errorf("RAM files made ahead of a start: %w on this system", errors.ErrUnsupported)
	}
	return createRAMFile(d.ramDir, spec.Name, int64(spec.MemoryMiB)<<20)
}

var _ vmm.RAMTemplater = (*Driver)(nil)

// CanMapRAMTemplate says whether this QEMU maps a read-only RAM file
// copy-on-write (vmm.RAMTemplater): the rom property of
// memory-backend-file came with QEMU 8.2 (before it, readonly=on made the
// guest's RAM a ROM), and only a Linux RAM file is reopened through a
// descriptor QEMU inherits.
func (d *Driver) CanMapRAMTemplate() bool {
	return runtime.GOOS == "linux" && d.inst.Version.AtLeast(8, 2)
}

// checkRAMFile refuses a RAM file handed to Start that is not guest RAM
// of this size.
func checkRAMFile(f *os.File, size int64) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != size {
		return fmt.Errorf("prepared RAM file: %d bytes (%v), the guest has %d", fi.Size(), fi.Mode(), size)
	}
	return nil
}

// Start starts QEMU for spec. ctx bounds the start only; the machine runs
// until it exits or is killed, and dies with this process.
func (d *Driver) Start(ctx context.Context, spec *vmspec.Spec, opts vmm.StartOptions) (vmm.Machine, error) {
	var cleanup []func()
	fail := func(err error) (vmm.Machine, error) {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
		return nil, err
	}
	ram := opts.RAM
	template := opts.RAMTemplate != nil
	if template {
		if ram != nil {
			ram.Close()
		}
		ram = opts.RAMTemplate
		if !d.CanMapRAMTemplate() {
			ram.Close()
			return fail(fmt.Errorf("a RAM file mapped copy-on-write needs QEMU 8.2 or later on Linux (this is %s): %w", d.inst.Version, vmm.ErrNotSupported))
		}
		if err := checkRAMFile(ram, int64(spec.MemoryMiB)<<20); err != nil {
			ram.Close()
			return fail(err)
		}
	} else if ram != nil {
		if err := checkRAMFile(ram, int64(spec.MemoryMiB)<<20); err != nil {
			ram.Close()
			return fail(err)
		}
	} else {
		var err error
		if ram, err = createRAMFile(d.ramDir, spec.Name, int64(spec.MemoryMiB)<<20); err != nil {
			return fail(err)
		}
	}
	// A RAM file made here is removed here (macOS names it); one handed
	// in is only closed.
	closeRAM := func() { ram.Close() }
	if opts.RAM == nil && !template {
		closeRAM = func() { closeRAMFile(ram) }
	}
	cleanup = append(cleanup, closeRAM)
	// The slot is held until QEMU has exited (the goroutine below), or
	// given back here if it never starts.
	twin, releaseTwin, ok := d.twins.take()
	if !ok && runsAsOwnUID(d.confine) {
		return fail(errors.New("two QEMUs of this sandbox still run: no uid left that neither can write to"))
	}
	qemuStarted := false
	cleanup = append(cleanup, func() {
		if !qemuStarted {
			releaseTwin()
		}
	})
	plan, err := planConfinement(d.confine, d.binary, ram, template, spec, d.accel, twin)
	if err != nil {
		return fail(err)
	}
	defer plan.close() // the child holds its domain; the ruleset is not needed after the fork
	if err := plan.prepare(ram, template); err != nil {
		return fail(err)
	}
	qmpHost, qmpQemu, err := vmm.SocketPair("qmp")
	if err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, func() { qmpHost.Close(); qmpQemu.Close() })
	agentHost, agentQemu, err := vmm.SocketPair("agent")
	if err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, func() { agentHost.Close(); agentQemu.Close() })

	// Descriptors 3, 4, 5 (and 6) in QEMU, in ExtraFiles order.
	extra := []*os.File{ram, qmpQemu, agentQemu}
	// An incoming QEMU leaves guest RAM alone until the migration stream
	// arrives (it does not even copy ROMs in), so the restore's RAM copy
	// runs while QEMU starts; it ends before Start returns, and so before
	// the device state is loaded.
	prepared := make(chan error, 1)
	if opts.PrepareRAM == nil {
		prepared <- nil
	} else if opts.Incoming {
		go func() { prepared <- opts.PrepareRAM(ram) }()
		// Never leave with the copy still writing into the file.
		cleanup = append(cleanup, func() { <-prepared; prepared <- nil })
	} else {
		prepared <- opts.PrepareRAM(ram)
	}
	o := Options{Accel: d.accel, RAMPath: ramPath(3, ram), RAMTemplate: template, QMPFd: 4, AgentFd: 5,
		Version: d.inst.Version, DataDirs: d.inst.DataDirs, Firmware: d.inst.Firmware}
	if opts.Incoming {
		o.Incoming = "defer"
	}
	if d.accel == vmm.TCG && spec.Arch == vmspec.AMD64 && vmspec.HostArch() == vmspec.AMD64 {
		// The driver's record too: whichever call comes first measures
		// (New's, started ahead, usually has).
		o.TSCkHz = HostTSCkHzIn(d.cfg.RecordDir)
	}
	if opts.Net != nil {
		extra = append(extra, opts.Net)
		o.NetFd = 2 + len(extra)
	}
	var consoleHost, consoleQemu *os.File
	if spec.ConsoleLog != "" {
		host, qemuEnd, err := vmm.SocketPair("console")
		if err != nil {
			return fail(err)
		}
		cleanup = append(cleanup, func() { host.Close(); qemuEnd.Close() })
		consoleHost, consoleQemu = host, qemuEnd
		extra = append(extra, qemuEnd)
		o.ConsoleFd = 2 + len(extra)
	}
	args, err := Args(spec, o)
	if err != nil {
		return fail(err)
	}
	m := &Machine{done: make(chan struct{}), ram: ram, stderr: newTail(8 << 10), version: d.inst.Version, confined: plan.String(), plan: plan}
	if template {
		m.ram = nil // the guest's RAM is QEMU's private memory: nothing the host can copy
	}
	consoleDone := make(chan struct{})
	if consoleHost == nil {
		close(consoleDone)
	}
	cmd := exec.Command(d.binary, args...)
	cmd.ExtraFiles = extra
	cmd.Stdin = nil
	var errOut io.Writer = m.stderr
	if opts.Stderr != nil {
		errOut = io.MultiWriter(m.stderr, opts.Stderr)
	}
	cmd.Stdout, cmd.Stderr = errOut, errOut
	cmd.SysProcAttr = procAttr()
	plan.apply(cmd.SysProcAttr)
	m.cmd = cmd

	started := make(chan error, 1)
	go func() {
		// The parent-death signal fires when the thread that forked QEMU
		// exits, not the process: keep this thread for QEMU's whole life.
		// The confinement goes on this thread too, and the fork inherits it.
		runtime.LockOSThread()
		if err := plan.enterThread(); err != nil {
			started <- fmt.Errorf("confine QEMU: %w", err)
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		releaseTwin() // exited: its uid runs nothing any more
		if err != nil {
			err = fmt.Errorf("qemu exited: %w%s", err, m.stderr.Suffix())
		}
		m.waitErr = err
		// The console's last lines explain a failed boot: they are in
		// its log before Done. (QEMU held the socket's other end alone.)
		select {
		case <-consoleDone:
		case <-time.After(2 * time.Second):
		}
		// The RAM file is unlinked: this was its last name, and guest RAM
		// stays allocated on tmpfs while any descriptor is open. Whoever
		// needs it after QEMU (a checkpoint written out later) holds a
		// duplicate.
		closeRAM()
		close(m.done)
	}()
	if err := <-started; err != nil {
		return fail(fmt.Errorf("start %s: %w", d.binary, err))
	}
	qemuStarted = true // the slot is the goroutine's to give back
	m.pid = cmd.Process.Pid
	cleanup = append(cleanup, func() { _ = m.Kill() })
	if !parentDeathSignal() {
		// Started here, not on the confined thread above.
		dog, err := startWatchdog(m.pid)
		if err != nil {
			return fail(err)
		}
		go func() {
			<-m.done
			dog.release()
		}()
	}
	qmpQemu.Close()
	agentQemu.Close()
	if consoleHost != nil {
		consoleQemu.Close()
		go func() {
			defer close(consoleDone)
			defer consoleHost.Close()
			copyConsole(consoleHost, spec.ConsoleLog, consoleMax)
		}()
	}

	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	qc, err := net.FileConn(qmpHost)
	if err != nil {
		return fail(err)
	}
	qmpHost.Close()
	go func() {
		select {
		case <-m.done:
			cancel() // QEMU died before its greeting: stop waiting for it
		case <-qctx.Done():
		}
	}()
	m.qmp, err = NewQMP(qctx, qc.(*net.UnixConn))
	if err != nil {
		// QEMU that dies at start (a bad option, an accelerator that
		// refuses the CPU) closes the socket before its exit is reaped:
		// give the exit a moment, so the error carries QEMU's own words.
		select {
		case <-m.done:
			if m.waitErr != nil {
				return fail(fmt.Errorf("qemu failed to start: %w", m.waitErr))
			}
			return fail(fmt.Errorf("qemu failed to start%s", m.stderr.Suffix()))
		case <-time.After(2 * time.Second):
		}
		return fail(fmt.Errorf("%w%s", err, m.stderr.Suffix()))
	}
	ac, err := net.FileConn(agentHost)
	if err != nil {
		return fail(err)
	}
	agentHost.Close()
	m.agent = ac
	if err := <-prepared; err != nil {
		prepared <- nil
		return fail(fmt.Errorf("prepare guest RAM: %w", err))
	}
	prepared <- nil
	return m, nil
}

// tail keeps the last n bytes written to it.
type tail struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func newTail(n int) *tail { return &tail{n: n} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.n {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.n:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// Suffix formats the tail for the end of an error message.
func (t *tail) Suffix() string {
	if s := t.String(); s != "" {
		return ": " + s
	}
	return ""
}
