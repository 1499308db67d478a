package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// The agent must match the guest's architecture: an amd64 agent in an
// arm64 guest stops it at its first instruction, so kosa8 refuses it with
// a message that says what to build.
func TestAgentPathByArch(t *testing.T) {
	t.Setenv("KOSA8_AGENT", "")
	self, err := os.ReadFile("/proc/self/exe") // a Linux program of the host's arch
	if err != nil {
		t.Skip("no /proc/self/exe")
	}
	host := vmspec.HostArch()
	other := vmspec.ARM64
	if host == vmspec.ARM64 {
		other = vmspec.AMD64
	}
	dir := t.TempDir()
	kosa8 := filepath.Join(dir, "kosa8")
	os.WriteFile(kosa8, []byte("x"), 0o755)
	if _, err := AgentPath(kosa8, host); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("no agent: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "kosa8-agent"), self, 0o755)
	if p, err := AgentPath(kosa8, host); err != nil || filepath.Base(p) != "kosa8-agent" {
		t.Fatalf("host arch: %q %v", p, err)
	}
	_, err = AgentPath(kosa8, other)
	if err == nil || !strings.Contains(err.Error(), "kosa8-agent-linux-"+string(other)) || !strings.Contains(err.Error(), "built for") {
		t.Fatalf("other arch with only the host's agent: %v", err)
	}
	// The per-arch name wins over kosa8-agent.
	os.WriteFile(filepath.Join(dir, "kosa8-agent-linux-"+string(host)), self, 0o755)
	if p, err := AgentPath(kosa8, host); err != nil || filepath.Base(p) != "kosa8-agent-linux-"+string(host) {
		t.Fatalf("per-arch agent: %q %v", p, err)
	}
	// Not a program at all.
	os.WriteFile(filepath.Join(dir, "kosa8-agent-linux-"+string(other)), []byte("#!/bin/sh\n"), 0o755)
	if _, err := AgentPath(kosa8, other); err == nil || !strings.Contains(err.Error(), "not a Linux program") {
		t.Fatalf("a script as agent: %v", err)
	}
	t.Setenv("KOSA8_AGENT", filepath.Join(dir, "kosa8-agent"))
	if _, err := AgentPath(kosa8, other); err == nil || !strings.Contains(err.Error(), "KOSA8_AGENT") {
		t.Fatalf("KOSA8_AGENT of the wrong arch: %v", err)
	}
}
