package launch

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// 'make install' puts kosa8 in PREFIX/bin and the guest agents in
// PREFIX/lib/kosa8, where the installed kosa8 finds them, and says when
// PREFIX/bin is not on the PATH. GO=true stands in for the build: the
// binaries are this test's own program, a Linux program of the host's arch.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Skip("no /proc/self/exe")
	}
	t.Setenv("KOSA8_AGENT", "")
	dir := t.TempDir()
	bin, prefix := filepath.Join(dir, "bin"), filepath.Join(dir, "prefix")
	os.MkdirAll(bin, 0o755)
	for _, f := range []string{"kosa8", "kosa8-agent", "kosa8-agent-linux-amd64", "kosa8-agent-linux-arm64"} {
		os.WriteFile(filepath.Join(bin, f), self, 0o755)
	}
	cmd := exec.Command("make", "-s", "-C", "../..", "install", "GO=true", "BIN="+bin, "PREFIX="+prefix)
	cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	if want := `export PATH="` + prefix + `/bin:$PATH"`; !strings.Contains(string(out), want) {
		t.Fatalf("make install off the PATH: want %q in\n%s", want, out)
	}
	installed := filepath.Join(prefix, "bin", "kosa8")
	if fi, err := os.Stat(installed); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("installed kosa8: %v", err)
	}
	arch := vmspec.HostArch()
	p, err := AgentPath(installed, arch)
	if want := filepath.Join(prefix, "lib", "kosa8", "kosa8-agent-linux-"+string(arch)); err != nil || filepath.Clean(p) != want {
		t.Fatalf("agent of the installed kosa8: %q %v, want %s", p, err, want)
	}

	cmd = exec.Command("make", "-s", "-C", "../..", "install", "GO=true", "BIN="+bin, "PREFIX="+prefix)
	cmd.Env = append(os.Environ(), "PATH="+prefix+"/bin:/usr/bin:/bin")
	if out, err = cmd.CombinedOutput(); err != nil || strings.Contains(string(out), "not on your PATH") {
		t.Fatalf("make install on the PATH: %v\n%s", err, out)
	}

	cmd = exec.Command("make", "-s", "-C", "../..", "uninstall", "PREFIX="+prefix)
	if out, err = cmd.CombinedOutput(); err != nil {
		t.Fatalf("make uninstall: %v\n%s", err, out)
	}
	if _, err := os.Stat(installed); !os.IsNotExist(err) {
		t.Fatalf("uninstall left %s: %v", installed, err)
	}
	if _, err := os.Stat(filepath.Join(prefix, "lib", "kosa8")); !os.IsNotExist(err) {
		t.Fatalf("uninstall left lib/kosa8: %v", err)
	}
}
