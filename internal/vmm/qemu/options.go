package qemu

import "github.com/kosa8/kosa8/internal/vmm"

// NewDriver makes a Driver from the VMM-neutral options (a vmm.NewDriver):
// the supervisor gets it from its caller and never names QEMU itself.
func NewDriver(o vmm.DriverOptions) (vmm.Driver, error) {
	d, err := New(Config{
		Arch:      o.Arch,
		Accel:     o.Accel,
		RecordDir: o.RecordDir,
		Confine:   &Confinement{ReadWrite: o.ReadWrite, ReadOnly: o.ReadOnly},
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Info describes this QEMU (vmm.Informer).
func (d *Driver) Info() vmm.Info {
	i := vmm.Info{
		Version:     d.inst.VersionLine,
		Firmware:    d.inst.FirmwareName(),
		Tested:      d.inst.Version.Tested(),
		TestedRange: SupportedRange(),
	}
	if d.accel == vmm.TCG && d.cfg.Accel == "" && len(d.host.Failed) > 0 {
		i.AccelFallback = d.host.WhyNot(d.cfg.Arch)
	}
	return i
}

// RecordFailure remembers that a failed to boot a sandbox, in the
// driver's RecordDir (vmm.FailureRecorder).
func (d *Driver) RecordFailure(a vmm.Accel, reason string) error {
	return RecordFailure(d.cfg.RecordDir, a, reason)
}

// ForgetFailure takes a recorded failure back (vmm.FailureForgetter).
func (d *Driver) ForgetFailure(a vmm.Accel) error {
	return ClearFailure(d.cfg.RecordDir, a)
}

var (
	_ vmm.Driver          = (*Driver)(nil)
	_ vmm.Informer        = (*Driver)(nil)
	_ vmm.FailureRecorder = (*Driver)(nil)
	_ vmm.Machine         = (*Machine)(nil)
	_ vmm.Snapshotter     = (*Machine)(nil)
	_ vmm.RunStater       = (*Machine)(nil)
	_ vmm.FullSaver       = (*Machine)(nil)
)
