package sandbox

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
)

// A new layer never takes the name of one that exists: ids share their
// second and 16 random bits, and a layer written over would be a disk lost.
func TestNewOverlaysNeverOverwrite(t *testing.T) {
	sb := &Sandbox{Dir: t.TempDir(), Disks: vmmtest.Layers{}}
	if err := os.WriteFile(sb.Path(RootDisk), []byte("base\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	layers := map[string]checkpoint.Disk{"root": {Path: RootDisk, Format: "qcow2"}}
	next, err := sb.NewOverlays(layers, "20261202-000000-abcd")
	if err != nil {
		t.Fatal(err)
	}
	made := sb.Path(next["root"].Path)
	before, err := os.ReadFile(made)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.NewOverlays(layers, "20261202-000000-abcd"); err == nil {
		t.Fatal("a second layer of the same name was made")
	}
	if after, err := os.ReadFile(made); err != nil || string(after) != string(before) {
		t.Errorf("the layer that was there: %q, %v; want %q", after, err, before)
	}
	// A link planted at a layer's name is not followed either.
	target := filepath.Join(t.TempDir(), "outside")
	if err := os.Symlink(target, sb.Path(Overlay(vmmtest.Layers{}, "20261202-000001-abcd", "root").Path)); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.NewOverlays(layers, "20261202-000001-abcd"); err == nil {
		t.Fatal("a layer was made through a link")
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Errorf("the link's target was created: %v", err)
	}
}

// When one of a sandbox's new layers cannot be made, the others made
// beside it go too: nothing records them.
func TestNewOverlaysFailingLeaveNone(t *testing.T) {
	sb := &Sandbox{Dir: t.TempDir(), Disks: vmmtest.Layers{}}
	for _, p := range []string{RootDisk, WorkspaceDisk} {
		if err := os.WriteFile(sb.Path(p), []byte("base\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	layers := map[string]checkpoint.Disk{"root": {Path: RootDisk, Format: "qcow2"}, "ws": {Path: WorkspaceDisk, Format: "raw"}}
	if err := os.MkdirAll(sb.Path(DisksDir), 0o700); err != nil {
		t.Fatal(err)
	}
	taken := sb.Path(Overlay(vmmtest.Layers{}, "20261202-000000-abcd", "ws").Path)
	if err := os.WriteFile(taken, []byte("in use\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	next, err := sb.NewOverlays(layers, "20261202-000000-abcd")
	if err == nil || next != nil {
		t.Fatalf("NewOverlays over a taken name: %v, %v", next, err)
	}
	files, _ := filepath.Glob(sb.Path(filepath.Join(DisksDir, "*")))
	if len(files) != 1 || files[0] != taken {
		t.Errorf("layers left: %v, want only the one that was there", files)
	}
}

// The layers a stopped sandbox's disks checkpoint freezes are taken back
// from the uid of the QEMU that last wrote them (a supervisor under root
// hands them to the QEMU's own uid and nothing took them back at its
// exit): a later QEMU whose uid is that one again (its supervisor's pid
// reused, and its Landlock rule lets it write any file of its uid in the
// disks folder) must not write into a checkpoint's disk.
func TestSaveDisksTakesTheLayersBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("handing layers to another uid needs root")
	}
	sb := &Sandbox{Dir: t.TempDir(), Disks: vmmtest.Layers{}}
	if err := os.WriteFile(sb.Path(RootDisk), []byte("base\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const qemuUID = 0x7a0f0f0f
	if err := os.Lchown(sb.Path(RootDisk), qemuUID, qemuUID); err != nil {
		t.Fatal(err)
	}
	meta, err := SaveDisks(sb, "disks before start --from")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(sb.Path(meta.Disks["root"].Path))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != uint32(os.Geteuid()) {
		t.Errorf("the checkpoint's layer belongs to uid %d, want the supervisor's %d", uid, os.Geteuid())
	}
}
