package vmmtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

func TestSnapshotRoundTrip(t *testing.T) {
	ctx := context.Background()
	d := &Driver{}
	mach, err := d.Start(ctx, &vmspec.Spec{MemoryMiB: 1}, vmm.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := mach.(*Machine)
	defer m.Kill()
	if _, err := m.RAM().WriteAt([]byte("guest data"), 4096); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dev, err := os.Create(filepath.Join(dir, "devices"))
	if err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "root.qcow2")
	if err := os.WriteFile(overlay, []byte("made beforehand, as a checkpoint does\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.SnapshotDisk(ctx, "root", overlay); err != nil {
		t.Fatal(err)
	}
	if err := m.SaveDevices(ctx, dev); err != nil {
		t.Fatal(err)
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(overlay); err != nil || m.Disk("root") != overlay {
		t.Errorf("overlay: %v, disk root on %q", err, m.Disk("root"))
	}
	want := []string{"Start", "Pause", "SnapshotDisk(root)", "SaveDevices", "Resume"}
	if got := m.CallNames(); !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	for _, c := range m.Calls() {
		if paused := c.Name == "SnapshotDisk" || c.Name == "SaveDevices" || c.Name == "Resume"; c.Paused != paused {
			t.Errorf("%s: paused %v", c, c.Paused)
		}
	}

	// An incoming machine gets the RAM and the device state back.
	ram := m.RAM()
	next, err := d.Start(ctx, &vmspec.Spec{MemoryMiB: 1}, vmm.StartOptions{Incoming: true, PrepareRAM: func(f *os.File) error {
		buf := make([]byte, 1<<20)
		if _, err := ram.ReadAt(buf, 0); err != nil {
			return err
		}
		_, err := f.WriteAt(buf, 0)
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	n := next.(*Machine)
	defer n.Kill()
	if _, running, _ := n.RunState(ctx); running {
		t.Error("an incoming machine runs before its devices are loaded")
	}
	if _, err := dev.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.LoadDevices(ctx, dev); err != nil {
		t.Fatal(err)
	}
	if err := n.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 10)
	if _, err := n.RAM().ReadAt(got, 4096); err != nil || string(got) != "guest data" {
		t.Errorf("restored RAM: %q, %v", got, err)
	}
}

func TestFailOnceAndExit(t *testing.T) {
	ctx := context.Background()
	m, err := NewMachine(4096)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	m.Fail("Pause", boom)
	if err := m.Pause(ctx); !errors.Is(err, boom) {
		t.Fatalf("Pause: %v, want boom", err)
	}
	if m.Paused() {
		t.Error("a failed pause paused the machine")
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatalf("second Pause: %v", err)
	}
	m.Exit(boom)
	if err := m.Wait(ctx); !errors.Is(err, boom) {
		t.Errorf("Wait: %v", err)
	}
	if err := m.Resume(ctx); err == nil {
		t.Error("Resume of an exited machine worked")
	}
	if _, err := m.Agent().Write([]byte("x")); err == nil {
		t.Error("the agent channel outlived the machine")
	}
}

func TestLayersChain(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.ext4")
	os.WriteFile(base, []byte("raw"), 0o600)
	l := Layers{}
	ctx := context.Background()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := l.Create(ctx, a, base, "raw", 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := l.Create(ctx, b, a, l.Format(), 0); err != nil {
		t.Fatal(err)
	}
	chain, err := l.Chain(ctx, b, l.Format())
	if err != nil || strings.Join(chain, " ") != b+" "+a+" "+base {
		t.Fatalf("chain %v %v", chain, err)
	}
	if err := l.Create(ctx, filepath.Join(dir, "c"), filepath.Join(dir, "missing"), "raw", 0); err == nil {
		t.Fatal("a layer over a missing file")
	}
}

// A start that fails closes the RAM file it was handed, as
// vmm.StartOptions.RAM says (a real driver's RAM file is guest memory).
func TestFailedStartClosesItsRAMFile(t *testing.T) {
	spec := &vmspec.Spec{MemoryMiB: 1}
	d := &Driver{StartErr: errors.New("boom")}
	ram, err := d.NewRAMFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Start(context.Background(), spec, vmm.StartOptions{RAM: ram}); err == nil {
		t.Fatal("Start did not fail")
	}
	if ram.Fd() != ^uintptr(0) {
		ram.Close()
		t.Error("the failed start left its RAM file open")
	}
}
