package launch

import (
	"testing"

	"github.com/kosa8/kosa8/internal/depstest"
)

// Launching is forking a process and reading its pipe: no VMM driver, no
// network stack, no supervisor.
func TestLightDependencies(t *testing.T) {
	depstest.Forbid(t,
		"github.com/kosa8/kosa8/internal/vmm/",
		"github.com/kosa8/kosa8/internal/supervisor",
		"github.com/kosa8/kosa8/internal/egress",
		"github.com/kosa8/kosa8/internal/netstack",
		"gvisor.dev/",
	)
}
