package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
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

// Disk layers are the driver's business too: nothing here runs qemu-img
// or reads a qcow2 header (vmm.DiskLayers does, in internal/vmm/qemu).
func TestNoDiskFormatCode(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{`"qemu-img"`, `QFI\xfb`} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s has %s", f, bad)
			}
		}
	}
}
