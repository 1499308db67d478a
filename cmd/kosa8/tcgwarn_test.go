package main

import (
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/vmm"
)

// The TCG warning is said in full once per boot of the host (and again
// when the reason changes), then in one short line.
func TestTCGWarningOnceInFull(t *testing.T) {
	home := t.TempDir()
	st := &api.Status{Accel: string(vmm.TCG), AccelFallback: "kvm ran the test guest but failed to boot a sandbox at 09:32:57: qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69\nqemu-system-x86_64: kvm.c:3183: kvm_buf_set_msrs: Assertion `ret == n' failed."}
	first := tcgWarning(home, st)
	if len(first) != 2 || !strings.Contains(first[0], "0x69 / qemu-system-x86_64") || strings.Contains(first[0], "failed..") ||
		!strings.Contains(first[0], "fell back to tcg") || !strings.Contains(first[1], "not a security boundary") {
		t.Fatalf("first: %q", first)
	}
	for i := 0; i < 2; i++ {
		again := tcgWarning(home, st)
		if len(again) != 1 || strings.Contains(again[0], "MSR") || !strings.Contains(again[0], "kvm failed to boot a sandbox here earlier") || !strings.Contains(again[0], "kosa8 doctor") {
			t.Fatalf("again: %q", again)
		}
	}
	// A later start reads the failure from the record, in other words:
	// still the same failure, one short line.
	st.AccelFallback = "kvm ran the test guest but failed to boot a sandbox at 09:32:57: kvm failed to boot a sandbox: qemu exited"
	if got := tcgWarning(home, st); len(got) != 1 {
		t.Fatalf("the same failure in the record's words: %q", got)
	}
	// TCG without a fallback is another story, told once in full too.
	plain := &api.Status{Accel: string(vmm.TCG)}
	if got := tcgWarning(home, plain); len(got) != 1 || !strings.Contains(got[0], "said in full once") {
		t.Fatalf("plain tcg, first: %q", got)
	}
	if got := tcgWarning(home, plain); len(got) != 1 || strings.Contains(got[0], "said in full once") || strings.Contains(got[0], "kvm failed") {
		t.Fatalf("plain tcg, again: %q", got)
	}
	if got := tcgWarning(home, st); len(got) != 1 {
		t.Fatalf("the fallback again after plain tcg: %q", got)
	}
	// Not under TCG: nothing.
	if got := tcgWarning(home, &api.Status{Accel: "kvm"}); got != nil {
		t.Fatalf("kvm: %q", got)
	}
}

// doctor's text keeps a long or many-lined detail inside its column.
func TestPrintCheckWraps(t *testing.T) {
	var b strings.Builder
	printCheck(&b, check{Name: "acceleration", OK: true, Warn: true, Detail: "tcg: qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69\nqemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed; running under TCG", Fix: "run kosa8 on a host with full nested virtualization or on bare metal; the record is forgotten at the next reboot"})
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "warn  acceleration  tcg:") {
		t.Fatalf("%q", b.String())
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, strings.Repeat(" ", 20)) || len(l) > doctorWidth {
			t.Errorf("line outside the column: %q", l)
		}
	}
	if !strings.Contains(b.String(), "fix: run kosa8") {
		t.Errorf("no fix: %q", b.String())
	}
}
