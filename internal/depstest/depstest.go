// Package depstest checks, from a package's tests, what the package may
// not depend on or contain: the layering of internal/ (which package holds
// a VMM driver, gVisor, the sandbox store) is kept by tests, not by hope.
package depstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Forbid fails t for each dependency of the package under test (the
// current directory) whose import path starts with one of prefixes. It
// skips when there is no go tool to list them.
func Forbid(t *testing.T, prefixes ...string) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to list the package's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, p := range prefixes {
			if strings.HasPrefix(dep, p) {
				t.Errorf("the package depends on %s", dep)
			}
		}
	}
}

// NoDiskFormatCode fails t for a non-test Go file of the package under
// test that runs qemu-img or reads a qcow2 header: disk layers are the
// driver's business (vmm.DiskLayers, in internal/vmm/qemu).
func NoDiskFormatCode(t *testing.T) {
	t.Helper()
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
