// Package vmm is the contract between kosa8 and the programs that run its
// virtual machines. A driver starts a Machine from a vmspec.Spec; optional
// capabilities are separate interfaces, checked with a type assertion, and
// a driver that lacks one says so with ErrNotSupported rather than a stub.
package vmm

import (
	"context"
	"errors"
	"io"
	"net"
	"os"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// Accel is the hardware acceleration a machine runs with.
type Accel string

const (
	KVM Accel = "kvm"
	HVF Accel = "hvf"
	TCG Accel = "tcg" // software emulation: slow, and not a security boundary like KVM/HVF
)

// IsolationWarning is what kosa8 says wherever a sandbox runs under TCG.
const IsolationWarning = "running under TCG (software emulation, no KVM/HVF): slow, and QEMU's emulator is not a security boundary on the level of KVM or HVF"

var (
	// ErrNotSupported: the driver cannot do this.
	ErrNotSupported = errors.New("not supported by this VMM")
	// ErrNotFound: the VMM program is not installed.
	ErrNotFound = errors.New("VMM not found")
)

// Driver starts machines.
type Driver interface {
	Name() string
	Accel() Accel
	Start(ctx context.Context, spec *vmspec.Spec, opts StartOptions) (Machine, error)
}

// DriverOptions say how a driver is made for one sandbox.
type DriverOptions struct {
	Arch vmspec.Arch
	// Accel forces an acceleration; empty picks the best the host has.
	Accel Accel
	// RecordDir holds the accelerators that failed to boot a machine in
	// this boot of the host (FailureRecorder); empty: none are remembered.
	RecordDir string
	// ReadWrite and ReadOnly are the host paths the VMM may reach, beyond
	// its own files, where the driver confines it.
	ReadWrite, ReadOnly []string
}

// NewDriver makes a driver. The supervisor is handed one by its caller,
// so it never names a VMM itself; it calls it again with Accel TCG when a
// boot under hardware acceleration fails.
type NewDriver func(DriverOptions) (Driver, error)

// Info describes the VMM a driver runs.
type Info struct {
	// Version is the VMM's own version line and Firmware its firmware's
	// file name ("" for its default). A checkpoint records both: device
	// state saved by another build may not load.
	Version  string
	Firmware string
	// Tested is false for a version outside TestedRange.
	Tested      bool
	TestedRange string
	// AccelFallback, when set, says why the driver chose TCG although
	// no acceleration was forced and the host has hardware acceleration.
	AccelFallback string
}

// Informer is a driver that describes its VMM.
type Informer interface {
	Info() Info
}

// FailureRecorder is a driver that remembers, for this boot of the host,
// that an accelerator failed to boot a machine (DriverOptions.RecordDir):
// drivers made later do not choose it unless it is forced.
type FailureRecorder interface {
	RecordFailure(a Accel, reason string) error
}

// FailureForgetter takes back a failure recorded a moment earlier (the
// fallback failed too: the accelerator was not shown to be the cause).
type FailureForgetter interface {
	ForgetFailure(a Accel) error
}

// StartOptions carry what the host side of a machine provides.
type StartOptions struct {
	// Net, when set, is the host end's peer for the NIC: a connected stream
	// socket the VMM sends and receives the guest's frames on.
	Net *os.File
	// Stderr receives the VMM's own messages.
	Stderr interface{ Write([]byte) (int, error) }
	// Incoming starts the machine paused, waiting for its device state
	// (Snapshotter.LoadDevices) instead of booting.
	Incoming bool
	// PrepareRAM, when set, fills the RAM file before the guest runs (a
	// restore copies a checkpoint's RAM into it). With Incoming it may run
	// while the VMM starts; Start returns only after it has finished.
	PrepareRAM func(ram *os.File) error
	// RAM, when set, is the guest's RAM file, made by the driver's
	// NewRAMFile: filled already (a restore's RAM prepared ahead of time),
	// or to be filled by PrepareRAM over whatever it holds. Start takes it
	// over, closing it if the start fails.
	RAM *os.File
	// RAMTemplate, when set, is a file holding guest RAM to start from (a
	// checkpoint's, read by a restore), mapped copy-on-write: what the
	// guest writes stays in the VMM's private memory and never reaches
	// the file, which the VMM opens read-only, so machines started from
	// one file share its pages until they write them. The machine's RAM()
	// is nil then, and a checkpoint of it carries its RAM in the device
	// stream (FullSaver, FullLoader): the host cannot copy private memory.
	// Only for a driver that is a RAMTemplater and says it can. Start
	// takes it over, closing it once the VMM has exited or if the start
	// fails.
	RAMTemplate *os.File
}

// RAMTemplater is a driver that can map a RAMTemplate (QEMU 8.2 and later
// on Linux: a read-only file mapped private and writable).
type RAMTemplater interface {
	CanMapRAMTemplate() bool
}

// RAMFileMaker is a driver whose guest RAM is a file the host may make
// ahead of a start (StartOptions.RAM): where and how the VMM wants it
// (on Linux an unlinked file on tmpfs).
type RAMFileMaker interface {
	NewRAMFile(spec *vmspec.Spec) (*os.File, error)
}

// Snapshotter is a machine that can be checkpointed and restored. Guest RAM
// lives in a file the host can copy (RAM); the device state travels
// separately, without RAM.
type Snapshotter interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// SnapshotDisk freezes the disk id's current layer and continues on
	// overlay, an empty layer over it made beforehand (DiskLayers.Create,
	// while the guest ran): in the pause it only opens and switches.
	SnapshotDisk(ctx context.Context, id, overlay string) error
	SaveDevices(ctx context.Context, w *os.File) error
	LoadDevices(ctx context.Context, r *os.File) error
	// RAM is the guest's RAM file, which the host copies; nil when the
	// guest's RAM is private to the VMM (StartOptions.RAMTemplate).
	RAM() *os.File
}

// FullSaver is a machine that can save itself whole, RAM included, into
// one stream (QEMU's plain migration): the baseline that checkpoints,
// which leave RAM out, are measured against, and how a machine whose RAM
// is private (StartOptions.RAMTemplate) is checkpointed. The machine must
// be paused.
type FullSaver interface {
	SaveAll(ctx context.Context, w *os.File) error
}

// FullLoader is a machine started Incoming that can load a FullSaver's
// stream, RAM included.
type FullLoader interface {
	LoadAll(ctx context.Context, r *os.File) error
}

// RunStater is a machine whose VMM says whether the guest runs. A VMM that
// does not answer fails the call: a checkpoint asks first, rather than
// wait on it.
type RunStater interface {
	RunState(ctx context.Context) (state string, running bool, err error)
}

// Machine is a running VM. Its lifetime is its own, not the start context's.
type Machine interface {
	// Pid is the VMM process.
	Pid() int
	// Agent is the host end of the guest agent's channel.
	Agent() net.Conn
	// Wait blocks until the machine exits or ctx ends; safe for many callers.
	Wait(ctx context.Context) error
	// Done is closed when the machine has exited.
	Done() <-chan struct{}
	// Kill stops the machine at once.
	Kill() error
}

// DiskLayers makes and reads the copy-on-write layers a sandbox's disks
// are made of: its root disk over the image, and the layer each
// checkpoint freezes and each rewind branches from. They are the VMM's
// format (qcow2 for QEMU), so the driver's package knows them; the rest of
// kosa8 only names their files.
type DiskLayers interface {
	// Format is the layers' format name ("qcow2"), as checkpoints record it.
	Format() string
	// Create makes an empty layer at path over backing, a file of the
	// format backingFormat ("raw" or Format()), of size bytes; 0: the
	// size the guest sees of backing.
	Create(ctx context.Context, path, backing, backingFormat string, size int64) error
	// Chain lists path, a layer of format ("raw" or Format()), and every
	// layer under it, path first. The files are hostile (the guest writes
	// a raw layer, QEMU a qcow2 one's header): it opens nothing but the
	// layers' regular files.
	Chain(ctx context.Context, path, format string) ([]string, error)
	// Flatten writes the disk the guest sees at path, its layers merged,
	// to dst as a raw file; the tool's own messages go to log.
	Flatten(ctx context.Context, path, dst string, log io.Writer) error
}
