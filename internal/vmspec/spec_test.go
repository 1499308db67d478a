package vmspec

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func sample() Spec {
	return Spec{
		Name: "demo", Arch: AMD64, CPUs: 2, MemoryMiB: 1024,
		Kernel: "/k/vmlinuz", Initrd: "/k/initrd", Cmdline: "console=ttyS0",
		Disks:      []Disk{{ID: "root", Path: "/s/root.qcow2", Format: "qcow2"}, {ID: "base", Path: "/b.raw", Format: "raw", ReadOnly: true}},
		ConsoleLog: "/s/console.log", AgentPort: "org.kosa8.agent",
		Net: &Net{MAC: "52:54:00:12:34:56"},
	}
}

func TestJSONRoundTrip(t *testing.T) {
	in := sample()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Spec
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip changed the spec:\n in: %+v\nout: %+v", in, out)
	}
}

func TestValidate(t *testing.T) {
	if err := func() *Spec { s := sample(); return &s }().Validate(); err != nil {
		t.Fatalf("valid spec rejected: %v", err)
	}
	cases := map[string]struct {
		mutate func(*Spec)
		want   string
	}{
		"no name":      {func(s *Spec) { s.Name = "" }, "no name"},
		"bad arch":     {func(s *Spec) { s.Arch = "mips" }, "architecture"},
		"zero cpus":    {func(s *Spec) { s.CPUs = 0 }, "CPUs"},
		"tiny memory":  {func(s *Spec) { s.MemoryMiB = 64 }, "too little"},
		"no kernel":    {func(s *Spec) { s.Kernel = "" }, "kernel"},
		"disk format":  {func(s *Spec) { s.Disks[0].Format = "vmdk" }, "unknown format"},
		"disk no path": {func(s *Spec) { s.Disks[1].Path = "" }, "needs an id and a path"},
		"no port":      {func(s *Spec) { s.AgentPort = "" }, "agent port"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := sample()
			tc.mutate(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseArch(t *testing.T) {
	for in, want := range map[string]Arch{"": HostArch(), "amd64": AMD64, "x86_64": AMD64, "arm64": ARM64, "aarch64": ARM64} {
		if got, err := ParseArch(in); err != nil || got != want {
			t.Errorf("ParseArch(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"riscv64", "ARM64", "i386", "arm"} {
		_, err := ParseArch(in)
		if err == nil || !strings.Contains(err.Error(), "use amd64 (x86_64) or arm64 (aarch64)") {
			t.Errorf("ParseArch(%q) error = %v", in, err)
		}
	}
}
