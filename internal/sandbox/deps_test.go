package sandbox

import (
	"testing"

	"github.com/kosa8/kosa8/internal/depstest"
)

// The state directory is files and locks: its package needs no VMM driver
// (the Manager's disk layers are handed in, as vmm.DiskLayers), nor the
// supervisor, nor the network stack the supervisor runs (gVisor).
func TestNoDriverDependency(t *testing.T) {
	depstest.Forbid(t,
		"github.com/kosa8/kosa8/internal/vmm/",
		"github.com/kosa8/kosa8/internal/supervisor",
		"github.com/kosa8/kosa8/internal/egress",
		"github.com/kosa8/kosa8/internal/netstack",
		"gvisor.dev/",
	)
}

// Disk layers are the driver's business too: nothing here runs qemu-img
// or reads a qcow2 header (vmm.DiskLayers does, in internal/vmm/qemu).
func TestNoDiskFormatCode(t *testing.T) {
	depstest.NoDiskFormatCode(t)
}
