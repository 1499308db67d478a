package qemu

import (
	"os"
	"testing"
	"time"
)

// TestProbeKVM runs the probe on this host. Whatever it decides, it must
// decide quickly and say why when the answer is no.
func TestProbeKVM(t *testing.T) {
	start := time.Now()
	err := ProbeKVM()
	took := time.Since(start)
	t.Logf("ProbeKVM: %v in %v", err, took)
	if took > 5*time.Second {
		t.Errorf("the probe took %v", took)
	}
	if _, statErr := os.Stat("/dev/kvm"); os.IsNotExist(statErr) {
		if err == nil {
			t.Fatal("KVM usable without /dev/kvm")
		}
	}
	ok, why := kvmUsable()
	if ok != (err == nil) || (!ok && why == "") {
		t.Fatalf("kvmUsable = %v, %q against ProbeKVM %v", ok, why, err)
	}
}
