package sdk

import (
	"testing"

	"github.com/kosa8/kosa8/internal/depstest"
)

// A program that imports the SDK gets a client, not a supervisor: it
// starts sandboxes through internal/launch (a `kosa8 supervise` process),
// so neither the network stack (gVisor) nor the supervisor is linked in.
func TestClientDependencies(t *testing.T) {
	depstest.Forbid(t,
		"github.com/kosa8/kosa8/internal/supervisor",
		"github.com/kosa8/kosa8/internal/egress",
		"github.com/kosa8/kosa8/internal/netstack",
		"gvisor.dev/",
	)
}
