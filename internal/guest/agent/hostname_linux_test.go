package agent

import "testing"

// The host names the guest after a boot or a restore (the kernel's
// command line names no sandbox): only a DNS label of what
// sandbox.Hostname makes is taken, never text that would land in
// /etc/hosts as more than a name.
func TestHostnameFromTheHost(t *testing.T) {
	for name, ok := range map[string]bool{
		"box-1": true, "a": true, "kosa8": true,
		"": false, "-a": false, "a-": false, "Box": false, "a b": false, "a\n127.0.0.1 evil": false,
		"a.b": false, "a\x00": false, string(make([]byte, 64)): false,
	} {
		if got := validHostname(name); got != ok {
			t.Errorf("validHostname(%q) = %v, want %v", name, got, ok)
		}
	}
	long := "a"
	for len(long) < 63 {
		long += "b"
	}
	if !validHostname(long) || validHostname(long+"c") {
		t.Error("the 63-byte limit of a label")
	}
	if err := takeHostname(""); err != nil {
		t.Errorf("no hostname asked for: %v", err)
	}
	if err := takeHostname("a\nb"); err == nil {
		t.Error("a hostname with a newline was taken")
	}
}
