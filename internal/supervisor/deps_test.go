package supervisor

import (
	"testing"

	"github.com/kosa8/kosa8/internal/depstest"
)

// The supervisor holds vmm interfaces only: the VMM is picked by its
// caller (Options.NewDriver), so no driver is among its dependencies.
func TestNoDriverDependency(t *testing.T) {
	depstest.Forbid(t, "github.com/kosa8/kosa8/internal/vmm/")
}

// Disk layers are the driver's business too: nothing here runs qemu-img
// or reads a qcow2 header (vmm.DiskLayers does, in internal/vmm/qemu).
func TestNoDiskFormatCode(t *testing.T) {
	depstest.NoDiskFormatCode(t)
}
