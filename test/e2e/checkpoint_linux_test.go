package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A checkpoint that runs out of disk space fails with a message that says
// what to do, removes only its own partial files, and leaves the earlier
// checkpoints and the running machine as they were.
func TestCheckpointDiskFull(t *testing.T) {
	name := sandbox(t, "cpfull", "--memory", "512M")
	cpDir := filepath.Join(ls(t)[name].Dir, "checkpoints")
	if err := os.MkdirAll(cpDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A small filesystem under the checkpoints: room for one checkpoint of
	// the idle guest, not for a second once the guest holds 200 MiB more.
	if err := syscall.Mount("tmpfs", cpDir, "tmpfs", 0, "size=220m,mode=0700"); err != nil {
		t.Skipf("this test mounts a small tmpfs to fill, which needs root (CI runs as root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(cpDir, syscall.MNT_DETACH) })

	must(t, "exec", name, "--", "sh", "-c", "echo before > ~/f && sync")
	a := checkpointNow(t, name, "fits")
	must(t, "exec", name, "--", "sh", "-c", "echo after > ~/f && head -c 200M /dev/urandom > /dev/shm/fill && sync")
	r := run(t, "", "checkpoint", name)
	if r.code == 0 {
		t.Fatalf("a checkpoint larger than the disk succeeded:\n%s", r)
	}
	if !strings.Contains(r.stderr, "not enough disk space") || !strings.Contains(r.stderr, "checkpoint rm") {
		t.Fatalf("the error does not say the disk is full and what to do:\n%s", r)
	}
	t.Logf("the failed checkpoint said: %s", strings.TrimSpace(r.stderr))
	leftovers, _ := filepath.Glob(filepath.Join(cpDir, ".tmp-*"))
	if len(leftovers) != 0 {
		t.Fatalf("partial checkpoint files left: %v", leftovers)
	}
	var list []cpMeta
	json.Unmarshal([]byte(must(t, "checkpoints", name, "--json").stdout), &list)
	if len(list) != 1 || list[0].ID != a.ID {
		t.Fatalf("checkpoints after the failed one: %+v, want only %s", list, a.ID)
	}
	if r := must(t, "exec", name, "--", "sh", "-c", "cat ~/f"); r.stdout != "after\n" {
		t.Fatalf("the machine after the failed checkpoint: %q", r.stdout)
	}
	// Space freed (as a user would): the earlier checkpoint rewinds intact.
	if err := syscall.Mount("tmpfs", cpDir, "tmpfs", syscall.MS_REMOUNT, "size=2g,mode=0700"); err != nil {
		t.Fatal(err)
	}
	must(t, "rewind", name, a.ID)
	if r := must(t, "exec", name, "--", "sh", "-c", "cat ~/f"); r.stdout != "before\n" {
		t.Fatalf("after rewinding to the checkpoint taken before the disk filled: %q", r.stdout)
	}
}
