package sandbox

import (
	"os/exec"
	"strings"
	"testing"
)

// The supervisor holds vmm interfaces only: the VMM is picked by its
// caller (SuperviseOptions.NewDriver), so no driver is among its
// dependencies.
func TestNoDriverDependency(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to list the package's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/kosa8/kosa8/internal/vmm/") {
			t.Errorf("internal/sandbox depends on %s", dep)
		}
	}
}
