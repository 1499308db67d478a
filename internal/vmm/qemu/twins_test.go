package qemu

import "testing"

// The QEMU a rewind starts beside the running one never gets the running
// one's slot (uid), whatever starts failed or were discarded before: a
// rewind whose save failed killed the QEMU it had started ahead, and with
// the slot alternating by start the next rewind's QEMU ran as the old
// one's uid, its layers writable by the old one (the guest may own it).
func TestTwinNeverTheRunningOnes(t *testing.T) {
	var tw twins
	running, _, ok := tw.take()
	if !ok {
		t.Fatal("no slot for the first QEMU")
	}
	// A rewind starts a QEMU ahead; its save fails and that one is killed.
	ahead, releaseAhead, ok := tw.take()
	if !ok || ahead == running {
		t.Fatalf("the QEMU started ahead got slot %d (ok %v), the running one has %d", ahead, ok, running)
	}
	releaseAhead()
	releaseAhead() // once only
	// The next rewind's QEMU, started while the first still runs.
	next, releaseNext, ok := tw.take()
	if !ok || next == running {
		t.Fatalf("the next rewind's QEMU got slot %d (ok %v), the running one's", next, ok)
	}
	// A third while both run: no slot, rather than sharing a uid.
	if s, _, ok := tw.take(); ok {
		t.Errorf("a third QEMU beside two running got slot %d", s)
	}
	releaseNext()
	if s, _, ok := tw.take(); !ok || s == running {
		t.Errorf("after the second exited: slot %d (ok %v), the running one has %d", s, ok, running)
	}
}
