package api

import (
	"testing"

	"github.com/kosa8/kosa8/internal/depstest"
)

// The API is types, routes and a client: whoever talks to a supervisor
// (the CLI, the SDK, the MCP server) gets neither a VMM driver, nor the
// network stack (gVisor), nor the sandbox store with it.
func TestLightDependencies(t *testing.T) {
	depstest.Forbid(t,
		"github.com/kosa8/kosa8/internal/vmm/",
		"github.com/kosa8/kosa8/internal/sandbox",
		"github.com/kosa8/kosa8/internal/egress",
		"github.com/kosa8/kosa8/internal/netstack",
		"gvisor.dev/",
	)
}
