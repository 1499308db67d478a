package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// The whole suite runs against an arm64 guest on an x86-64 host with
// KOSA8_ARCH=arm64 (make test-vm-arm64-all): every sandbox the tests make
// is then an emulated arm64 one. The tests that are about the host's own
// accelerator or QEMU binaries skip there (requireNativeGuest).

// guestArch is the architecture of the sandboxes this run boots, in Go's
// names: KOSA8_ARCH as kosa8 reads it, else the host's.
func guestArch() string {
	switch a := os.Getenv("KOSA8_ARCH"); a {
	case "":
		return runtime.GOARCH
	case "aarch64":
		return "arm64"
	case "x86_64", "x86-64":
		return "amd64"
	default:
		return a
	}
}

// requireNativeGuest skips a test about the host's accelerator or its
// QEMU for the host's own architecture when this run's guests are
// another architecture's.
func requireNativeGuest(t *testing.T, why string) {
	t.Helper()
	if a := guestArch(); a != runtime.GOARCH {
		t.Skipf("this run's guests are %s (KOSA8_ARCH) on a %s host: %s", a, runtime.GOARCH, why)
	}
}

// setupAdvice is the command kosa8 names when this run's guests lack
// their QEMU or image: `kosa8 setup`, with --arch for a foreign guest.
func setupAdvice() string {
	if a := guestArch(); a != runtime.GOARCH {
		return "kosa8 setup --arch " + a
	}
	return "kosa8 setup"
}

// buildForGuest builds the one-file Go program src, static, for this
// run's guests, and returns the binary's path.
func buildForGuest(t *testing.T, src string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", "prog", "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off", "GOOS=linux", "GOARCH="+guestArch())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build a program for the guest: %v\n%s", err, out)
	}
	return filepath.Join(dir, "prog")
}
