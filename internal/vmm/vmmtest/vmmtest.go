// Package vmmtest is a fake VMM driver for unit tests: checkpoint, rewind,
// pause and the API run against it without QEMU. Its machines run no
// guest. Guest RAM is an unlinked temporary file, as QEMU's is; the device
// state is a small blob; a disk snapshot creates the overlay file; the
// agent channel is one end of a net.Pipe whose other end (Guest) a test
// serves a fake agent on. Every call is recorded with whether the machine
// was paused at the time, so a test can assert the order of a
// checkpoint's steps, and any call can be made to fail once (Fail).
package vmmtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// devicesMagic starts the fake device state.
const devicesMagic = "vmmtest devices v1\n"

// Driver starts fake machines. The zero value is ready: it runs under TCG.
type Driver struct {
	// AccelAs is what Accel reports (TCG when empty).
	AccelAs vmm.Accel
	// About is what Info reports.
	About vmm.Info
	// OnStart, when set, is called with each new machine before Start
	// returns: a test serves its fake guest on m.Guest() there.
	OnStart func(m *Machine)
	// StartErr, when set, fails Start.
	StartErr error
	// NoRAMAhead makes NewRAMFile fail.
	NoRAMAhead bool
	// NoRAMTemplate: the driver cannot map a RAM template (as QEMU
	// before 8.2).
	NoRAMTemplate bool

	mu         sync.Mutex
	machines   []*Machine
	opts       []vmm.DriverOptions
	failures   []string
	ramAhead   int
	startFails []error // FailStart: the errors of the next starts
}

// FailStart makes the next start fail with err, once (StartErr fails
// them all).
func (d *Driver) FailStart(err error) {
	d.mu.Lock()
	d.startFails = append(d.startFails, err)
	d.mu.Unlock()
}

// RecordFailure notes "accel: reason" (vmm.FailureRecorder).
func (d *Driver) RecordFailure(a vmm.Accel, reason string) error {
	d.mu.Lock()
	d.failures = append(d.failures, string(a)+": "+reason)
	d.mu.Unlock()
	return nil
}

// ForgetFailure drops the failures recorded for a (vmm.FailureForgetter).
func (d *Driver) ForgetFailure(a vmm.Accel) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	keep := d.failures[:0]
	for _, f := range d.failures {
		if !strings.HasPrefix(f, string(a)+": ") {
			keep = append(keep, f)
		}
	}
	d.failures = keep
	return nil
}

// Failures are what RecordFailure was told, in order.
func (d *Driver) Failures() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.failures...)
}

var (
	_ vmm.Driver          = (*Driver)(nil)
	_ vmm.Informer        = (*Driver)(nil)
	_ vmm.FailureRecorder = (*Driver)(nil)
	_ vmm.Machine         = (*Machine)(nil)
	_ vmm.Snapshotter     = (*Machine)(nil)
	_ vmm.RunStater       = (*Machine)(nil)
	_ vmm.FullSaver       = (*Machine)(nil)
	_ vmm.FullLoader      = (*Machine)(nil)
	_ vmm.RAMTemplater    = (*Driver)(nil)
)

// CanMapRAMTemplate implements vmm.RAMTemplater (unless NoRAMTemplate).
func (d *Driver) CanMapRAMTemplate() bool { return !d.NoRAMTemplate }

// NewDriver is a vmm.NewDriver that hands out d and records the options
// it was asked for.
func (d *Driver) NewDriver(o vmm.DriverOptions) (vmm.Driver, error) {
	d.mu.Lock()
	d.opts = append(d.opts, o)
	d.mu.Unlock()
	return d, nil
}

// Options are the options NewDriver was called with, in order.
func (d *Driver) Options() []vmm.DriverOptions {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]vmm.DriverOptions(nil), d.opts...)
}

func (d *Driver) Name() string { return "vmmtest" }

func (d *Driver) Accel() vmm.Accel {
	if d.AccelAs == "" {
		return vmm.TCG
	}
	return d.AccelAs
}

func (d *Driver) Info() vmm.Info { return d.About }

// Machines are the machines Start made, oldest first.
func (d *Driver) Machines() []*Machine {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*Machine(nil), d.machines...)
}

// Start makes a machine with spec.MemoryMiB of RAM. With opts.Incoming it
// starts paused, as QEMU's -incoming does, until its devices are loaded
// and it is resumed.
func (d *Driver) Start(ctx context.Context, spec *vmspec.Spec, opts vmm.StartOptions) (vmm.Machine, error) {
	d.mu.Lock()
	startErr := d.StartErr
	if startErr == nil && len(d.startFails) > 0 {
		startErr, d.startFails = d.startFails[0], d.startFails[1:]
	}
	d.mu.Unlock()
	if startErr != nil {
		if opts.RAM != nil {
			opts.RAM.Close()
		}
		return nil, startErr
	}
	var m *Machine
	var err error
	if opts.RAMTemplate != nil {
		// Private memory: a copy of the template's, the template only
		// read (the guest's writes stay in the copy, as in QEMU's
		// private mapping), and no RAM file for the host.
		defer opts.RAMTemplate.Close()
		if opts.RAM != nil {
			opts.RAM.Close()
		}
		if d.NoRAMTemplate {
			return nil, fmt.Errorf("vmmtest: a RAM template: %w", vmm.ErrNotSupported)
		}
		if fi, err := opts.RAMTemplate.Stat(); err != nil || fi.Size() != int64(spec.MemoryMiB)<<20 {
			return nil, fmt.Errorf("vmmtest: RAM template of the wrong size (%v)", err)
		}
		if m, err = NewMachine(int64(spec.MemoryMiB) << 20); err != nil {
			return nil, err
		}
		if err := copyNonZero(m.ram, opts.RAMTemplate, int64(spec.MemoryMiB)<<20); err != nil {
			m.Kill()
			return nil, err
		}
		m.Private = true
	} else if opts.RAM != nil {
		if fi, err := opts.RAM.Stat(); err != nil || fi.Size() != int64(spec.MemoryMiB)<<20 {
			opts.RAM.Close()
			return nil, fmt.Errorf("vmmtest: prepared RAM file of the wrong size (%v)", err)
		}
		m = newMachine(opts.RAM)
		m.Prepared = true
	} else if m, err = NewMachine(int64(spec.MemoryMiB) << 20); err != nil {
		return nil, err
	}
	m.spec = spec
	if opts.Incoming {
		m.paused, m.state = true, "inmigrate"
	}
	if opts.PrepareRAM != nil {
		if err := opts.PrepareRAM(m.ram); err != nil {
			m.Kill()
			return nil, fmt.Errorf("prepare guest RAM: %w", err)
		}
		m.Copied = true
	}
	m.record("Start", "")
	d.mu.Lock()
	d.machines = append(d.machines, m)
	d.mu.Unlock()
	if d.OnStart != nil {
		d.OnStart(m)
	}
	return m, nil
}

// Call is one recorded call on a Machine.
type Call struct {
	Name   string // the method: Pause, Resume, SnapshotDisk, SaveDevices, …
	Arg    string // SnapshotDisk: "id overlay"; otherwise empty
	Paused bool   // whether the machine was paused when the call began
	Err    error  // what the call returned
}

func (c Call) String() string {
	s := c.Name
	if c.Arg != "" {
		s += "(" + c.Arg + ")"
	}
	if c.Err != nil {
		s += " failed"
	}
	return s
}

// Machine is a fake running VM.
type Machine struct {
	// Prepared: Start was handed the RAM file (StartOptions.RAM); Copied:
	// it filled the RAM file (StartOptions.PrepareRAM); Private: its RAM
	// is a copy of a template (StartOptions.RAMTemplate), RAM() nil.
	Prepared, Copied, Private bool

	spec  *vmspec.Spec
	ram   *os.File
	host  net.Conn // Agent
	guest net.Conn // Guest

	mu      sync.Mutex
	calls   []Call
	paused  bool
	state   string
	fail    map[string]failure // by method: what Fail and FailLater arranged
	disks   map[string]string  // disk id → the overlay new writes go to
	devices int                // how many device states were saved
	onCall  func(name string)  // OnCall

	done     chan struct{}
	exitOnce sync.Once
	waitErr  error
}

// NewMachine makes a running machine with ram bytes of RAM, outside any
// driver (a test of the layer below Start).
func NewMachine(ram int64) (*Machine, error) {
	f, err := newRAMFile(ram)
	if err != nil {
		return nil, err
	}
	return newMachine(f), nil
}

// newRAMFile makes an unlinked RAM file of size bytes: like QEMU's, the
// descriptor is all there is.
func newRAMFile(size int64) (*os.File, error) {
	f, err := os.CreateTemp("", "vmmtest-ram-*")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func newMachine(ram *os.File) *Machine {
	host, guest := net.Pipe()
	return &Machine{ram: ram, host: host, guest: guest, state: "running", fail: map[string]failure{},
		disks: map[string]string{}, done: make(chan struct{})}
}

// NewRAMFile makes a RAM file ahead of a start (vmm.RAMFileMaker); with
// NoRAMAhead set it fails, as a driver that cannot.
func (d *Driver) NewRAMFile(spec *vmspec.Spec) (*os.File, error) {
	if d.NoRAMAhead {
		return nil, errors.New("vmmtest: no RAM files ahead")
	}
	f, err := newRAMFile(int64(spec.MemoryMiB) << 20)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.ramAhead++
	d.mu.Unlock()
	return f, nil
}

// RAMFilesAhead counts the RAM files NewRAMFile made.
func (d *Driver) RAMFilesAhead() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ramAhead
}

// Fail makes the next call of method (a Machine method's name) fail with
// err, once.
func (m *Machine) Fail(method string, err error) { m.FailLater(method, 0, err) }

// failure is a failure Fail or FailLater arranged: the calls to let
// through first, then the error.
type failure struct {
	skip int
	err  error
}

// FailLater makes the call of method after the next skip calls of it
// fail with err, once.
func (m *Machine) FailLater(method string, skip int, err error) {
	m.mu.Lock()
	m.fail[method] = failure{skip, err}
	m.mu.Unlock()
}

// OnCall has f called at the start of each call of the machine's
// methods, with the method's name: a test holds a step there, or checks
// what else has happened by then.
func (m *Machine) OnCall(f func(name string)) {
	m.mu.Lock()
	m.onCall = f
	m.mu.Unlock()
}

// record notes a call and returns the error Fail or FailLater arranged
// for it, if any.
func (m *Machine) record(name, arg string) error {
	m.mu.Lock()
	f := m.onCall
	m.mu.Unlock()
	if f != nil {
		f(name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	if f, ok := m.fail[name]; ok {
		if f.skip == 0 {
			err = f.err
			delete(m.fail, name)
		} else {
			f.skip--
			m.fail[name] = f
		}
	}
	if err == nil && m.exited() && name != "Kill" {
		err = errors.New("vmmtest: the machine has exited")
	}
	m.calls = append(m.calls, Call{Name: name, Arg: arg, Paused: m.paused, Err: err})
	return err
}

func (m *Machine) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// Calls are the calls made so far, oldest first.
func (m *Machine) Calls() []Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Call(nil), m.calls...)
}

// CallNames are the names of Calls, with SnapshotDisk's disk id:
// "Pause", "SnapshotDisk(root)", "SaveDevices", "Resume", …; RunState
// calls are left out (a supervisor asks it whenever it checks health).
func (m *Machine) CallNames() []string {
	var out []string
	for _, c := range m.Calls() {
		switch c.Name {
		case "RunState":
			continue
		case "SnapshotDisk":
			id, _, _ := strings.Cut(c.Arg, " ")
			out = append(out, "SnapshotDisk("+id+")")
		default:
			out = append(out, c.Name)
		}
	}
	return out
}

// Paused tells whether the guest's CPUs are stopped.
func (m *Machine) Paused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.paused
}

// Disk is the overlay new writes to disk id go to since its last
// SnapshotDisk ("" if it had none).
func (m *Machine) Disk(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.disks[id]
}

// Spec is what the machine was started with (nil for NewMachine).
func (m *Machine) Spec() *vmspec.Spec { return m.spec }

// Guest is the guest's end of the agent channel: serve a fake agent on it.
func (m *Machine) Guest() net.Conn { return m.guest }

// Pid is 0: there is no VMM process (so no dirty-page tracking either: a
// checkpoint copies all of the RAM).
func (m *Machine) Pid() int { return 0 }

func (m *Machine) Agent() net.Conn { return m.host }

func (m *Machine) Done() <-chan struct{} { return m.done }

// Wait blocks until the machine exits (Kill or Exit) or ctx ends.
func (m *Machine) Wait(ctx context.Context) error {
	select {
	case <-m.done:
		return m.waitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Kill ends the machine: the agent channel breaks, Done is closed.
func (m *Machine) Kill() error {
	if err := m.record("Kill", ""); err != nil {
		return err
	}
	m.Exit(nil)
	return nil
}

// Exit ends the machine as if the VMM had exited with err (a crash when
// set, a guest power-off when nil).
func (m *Machine) Exit(err error) {
	m.exitOnce.Do(func() {
		m.mu.Lock()
		m.waitErr, m.state = err, "shutdown"
		m.mu.Unlock()
		m.host.Close()
		m.guest.Close()
		m.ram.Close()
		close(m.done)
	})
}

func (m *Machine) Pause(ctx context.Context) error {
	if err := m.record("Pause", ""); err != nil {
		return err
	}
	m.mu.Lock()
	m.paused, m.state = true, "paused"
	m.mu.Unlock()
	return nil
}

func (m *Machine) Resume(ctx context.Context) error {
	if err := m.record("Resume", ""); err != nil {
		return err
	}
	m.mu.Lock()
	m.paused, m.state = false, "running"
	m.mu.Unlock()
	return nil
}

// RunState says "running" or "paused" ("inmigrate" before an incoming
// machine's devices are loaded, "shutdown" once it has exited).
func (m *Machine) RunState(ctx context.Context) (string, bool, error) {
	if err := m.record("RunState", ""); err != nil {
		return "", false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state, !m.paused, nil
}

// SnapshotDisk creates overlay (a small text file, not a qcow2) and sends
// disk id's writes there from now on.
func (m *Machine) SnapshotDisk(ctx context.Context, id, overlay string) error {
	if err := m.record("SnapshotDisk", id+" "+overlay); err != nil {
		return err
	}
	// As QEMU's mode existing: the layer was made beforehand, and (a fake
	// layer) over the one the disk is on, once that is known.
	if _, err := os.Stat(overlay); err != nil {
		return fmt.Errorf("vmmtest: snapshot of disk %s: %w", id, err)
	}
	backing, err := backingOf(overlay)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if prev := m.disks[id]; prev != "" && backing != "" && backing != prev {
		return fmt.Errorf("vmmtest: snapshot of disk %s: the new layer is over %s, the disk is on %s", id, backing, prev)
	}
	m.disks[id] = overlay
	return nil
}

// SaveDevices writes a small blob that LoadDevices accepts.
func (m *Machine) SaveDevices(ctx context.Context, w *os.File) error {
	if err := m.record("SaveDevices", ""); err != nil {
		return err
	}
	m.mu.Lock()
	m.devices++
	n := m.devices
	m.mu.Unlock()
	_, err := fmt.Fprintf(w, "%ssave %d\n", devicesMagic, n)
	return err
}

// LoadDevices reads what SaveDevices wrote; anything else fails, as a
// foreign device state fails in QEMU. The machine stays paused.
func (m *Machine) LoadDevices(ctx context.Context, r *os.File) error {
	if err := m.record("LoadDevices", ""); err != nil {
		return err
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) || line != devicesMagic {
		return fmt.Errorf("vmmtest: not a device state: %q", line)
	}
	m.mu.Lock()
	m.state = "paused"
	m.mu.Unlock()
	return nil
}

// SaveAll writes the device blob followed by the whole RAM.
func (m *Machine) SaveAll(ctx context.Context, w *os.File) error {
	if err := m.record("SaveAll", ""); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "%sall\n", devicesMagic); err != nil {
		return err
	}
	st, err := m.ram.Stat()
	if err != nil {
		return err
	}
	_, err = io.Copy(w, io.NewSectionReader(m.ram, 0, st.Size()))
	return err
}

// RAM is the guest's RAM file, nil for a machine started on a template
// (its memory is private: Memory reads it).
func (m *Machine) RAM() *os.File {
	if m.Private {
		return nil
	}
	return m.ram
}

// copyNonZero copies size bytes of src into dst (sparse, of that size),
// writing only the 1 MiB pieces that hold data.
func copyNonZero(dst, src *os.File, size int64) error {
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		n, err := src.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		for _, b := range buf[:n] {
			if b != 0 {
				if _, err := dst.WriteAt(buf[:n], off); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

// Memory is the guest's memory, private or not, for a test to read or
// write as the guest would.
func (m *Machine) Memory() *os.File { return m.ram }

// LoadAll reads what SaveAll wrote, RAM included, into the machine's
// memory. The machine stays paused.
func (m *Machine) LoadAll(ctx context.Context, r *os.File) error {
	if err := m.record("LoadAll", ""); err != nil {
		return err
	}
	br := bufio.NewReader(r)
	head, err := br.ReadString('\n')
	if err == nil {
		var all string
		if all, err = br.ReadString('\n'); err == nil && all != "all\n" {
			err = fmt.Errorf("a device state without RAM (%q)", all)
		}
	}
	if err != nil || head != devicesMagic {
		return fmt.Errorf("vmmtest: not a whole-machine state: %q (%v)", head, err)
	}
	if _, err := io.Copy(io.NewOffsetWriter(m.ram, 0), br); err != nil {
		return err
	}
	m.mu.Lock()
	m.state = "paused"
	m.mu.Unlock()
	return nil
}
