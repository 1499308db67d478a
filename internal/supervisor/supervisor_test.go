package supervisor

import (
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/sandbox"
)

// validConfig is a sandbox's Config that passes Validate.
func validConfig(name string) sandbox.Config {
	return sandbox.Config{Name: name, Arch: "amd64", CPUs: 1, MemoryMiB: 512, DiskGiB: 4, User: "u", UID: 1000, GID: 1000}
}

func TestCmdline(t *testing.T) {
	c := validConfig("Box_1")
	got := Cmdline(&c)
	for _, want := range []string{"kosa8.user=u", "kosa8.uid=1000", "kosa8.gid=1000", "panic=-1"} {
		if !strings.Contains(got, want) {
			t.Errorf("cmdline %q lacks %q", got, want)
		}
	}
	// The host names the guest after its boot: the line is the same for
	// every sandbox of a user, so a booted template serves them all.
	other := validConfig("other")
	if o := Cmdline(&other); o != got || strings.Contains(got, "hostname") {
		t.Errorf("cmdline differs between sandboxes or names one: %q vs %q", got, o)
	}
}
