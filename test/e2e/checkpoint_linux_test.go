package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
	checkpointsJSON(t, name, &list)
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

// timed runs kosa8 and fails the test if it takes longer than bound.
func timed(t *testing.T, bound time.Duration, args ...string) result {
	t.Helper()
	start := time.Now()
	r := run(t, "", args...)
	took := time.Since(start)
	t.Logf("kosa8 %v: %v, exit %d %s", args, took.Round(time.Millisecond), r.code, strings.TrimSpace(r.stderr))
	if took > bound {
		t.Fatalf("kosa8 %v took %v, more than %v:\n%s", args, took, bound, r)
	}
	return r
}

// The disk under the sandbox's disk layers fills while the guest writes:
// under QEMU's default error policy that stopped the VM, the next
// checkpoint waited for ever on the stopped guest (in the thaw after its
// failure) and stop and rm -f with it. Now the guest gets the I/O error,
// the checkpoint fails and says why, and stop and rm -f finish in bounded
// time.
func TestCheckpointDiskFullNoHang(t *testing.T) {
	name := "cphang"
	must(t, "create", name, "--memory", "512M")
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	dir := ls(t)[name].Dir
	// One small filesystem under both the checkpoints and the disk layers
	// a checkpoint starts: once it is full, guest writes fail on the host.
	// Mounted before the start, which hands the layers' directory to QEMU.
	small := t.TempDir()
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, "size=300m,mode=0700"); err != nil {
		t.Skipf("this test mounts a small tmpfs to fill, which needs root (CI runs as root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(small, syscall.MNT_DETACH) })
	for _, sub := range []string{"checkpoints", "disks"} {
		if err := os.MkdirAll(filepath.Join(small, sub), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(filepath.Join(small, sub), filepath.Join(dir, sub), "", syscall.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	unmount := func() {
		for _, sub := range []string{"checkpoints", "disks"} {
			syscall.Unmount(filepath.Join(dir, sub), syscall.MNT_DETACH)
		}
	}
	t.Cleanup(unmount)
	must(t, "start", name)
	free := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(small, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	// The spare RAM file the supervisor prepares after the start does not
	// fit: wait until it has given up on it.
	for deadline := time.Now().Add(time.Minute); free() < 250<<20; {
		if time.Now().After(deadline) {
			t.Fatalf("the small filesystem stays full after the start: %d MiB free", free()>>20)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The first checkpoint moves the disks' writes onto the small
	// filesystem.
	checkpointNow(t, name, "moves the disk layers")
	// A writer that fills it, past the end, bypassing the guest's page cache.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writer := kosa8Cmd(ctx, "exec", name, "--", "sh", "-c",
		"i=0; while :; do dd if=/dev/urandom of=/var/tmp/fill$i bs=1M count=4 oflag=direct 2>/dev/null; i=$((i+1)); done")
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	defer writer.Wait()
	defer cancel()
	for deadline := time.Now().Add(3 * time.Minute); free() >= 1<<20; {
		if time.Now().After(deadline) {
			t.Fatalf("the guest did not fill the disk: %d MiB still free", free()>>20)
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // the guest's writes now fail on the host
	r := timed(t, 100*time.Second, "checkpoint", name)
	if r.code == 0 {
		t.Fatalf("a checkpoint on a full disk succeeded:\n%s", r)
	}
	if !strings.Contains(r.stderr, "disk space") {
		t.Errorf("the failed checkpoint does not say the disk is full:\n%s", r)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "console.log")); err == nil {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		t.Logf("the guest's console ends with:\n%s", strings.Join(lines[max(0, len(lines)-8):], "\n"))
	}
	timed(t, 150*time.Second, "stop", name)
	// The test's own mounts go (rm renames the directory, which a mount
	// inside would refuse); the supervisor is gone already.
	unmount()
	if r := timed(t, 60*time.Second, "rm", "-f", name); r.code != 0 {
		t.Fatalf("rm -f: %s", r)
	}
	if _, ok := ls(t)[name]; ok {
		t.Fatalf("%s is still listed after rm -f", name)
	}
}

// A QEMU that answers nothing (stopped with SIGSTOP: as wedged as it gets):
// a checkpoint fails within its deadlines and says so, and stop and rm -f
// end it, each in bounded time.
func TestUnresponsiveQEMUStopAndRemove(t *testing.T) {
	name := sandbox(t, "wedged", "--memory", "384M")
	wedge := func() int {
		pid := ls(t)[name].Status.QEMUPID
		if pid <= 0 {
			t.Fatal("no QEMU pid")
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	pid := wedge()
	r := timed(t, 60*time.Second, "checkpoint", name)
	if r.code == 0 || !strings.Contains(r.stderr, "does not answer") {
		t.Fatalf("a checkpoint of a QEMU that does not answer:\n%s", r)
	}
	timed(t, 100*time.Second, "stop", name)
	if processRunning(pid) {
		t.Fatalf("QEMU (pid %d) still runs after stop", pid)
	}
	must(t, "start", name)
	pid = wedge()
	if r := timed(t, 60*time.Second, "rm", "-f", name); r.code != 0 {
		t.Fatalf("rm -f: %s", r)
	}
	if processRunning(pid) {
		t.Fatalf("QEMU (pid %d) still runs after rm -f", pid)
	}
	if _, ok := ls(t)[name]; ok {
		t.Fatalf("%s is still listed after rm -f", name)
	}
}

// A rewind whose restore fails after QEMU started (the checkpoint's device
// state is missing) leaves no QEMU running beside a supervisor that gave
// up on it: the sandbox ends as crashed, nothing of it keeps running, and
// it starts again.
func TestFailedRewindLeavesNothingRunning(t *testing.T) {
	name := sandbox(t, "badrewind", "--memory", "384M")
	cp := checkpointNow(t, name, "to damage")
	e := ls(t)[name]
	// Its device state gone: QEMU is up, waiting for a stream that never
	// comes (damaged state makes QEMU exit by itself, which proves less).
	if err := os.Remove(filepath.Join(e.Dir, "checkpoints", cp.ID, "devices")); err != nil {
		t.Fatal(err)
	}
	r := run(t, "", "rewind", name, cp.ID)
	if r.code == 0 {
		t.Fatalf("a rewind to damaged device state succeeded:\n%s", r)
	}
	t.Logf("the failed rewind said: %s", strings.TrimSpace(r.stderr))
	deadline := time.Now().Add(30 * time.Second)
	for {
		cur := ls(t)[name]
		qemus := qemuProcesses(t, name)
		if cur.State != "running" && len(qemus) == 0 && !processRunning(e.Status.SupervisorPID) {
			// Read again: cur was read before the supervisor was seen
			// gone, and may be its last moment ("stopping").
			if st := ls(t)[name].State; st != "crashed" {
				t.Errorf("state after the failed rewind, its supervisor gone: %q, want crashed", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after a failed rewind: state %q, QEMU processes %v, supervisor running %v",
				cur.State, qemus, processRunning(e.Status.SupervisorPID))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(e.Dir, "api.sock")); err == nil {
		t.Errorf("the API socket is left behind")
	}
	must(t, "start", name)
	must(t, "exec", name, "--", "true")
}

// A checkpoint taken right after a first boot, while the root filesystem
// still grows to its disk online, gives disks a start from them alone
// boots whole: the freeze waits for the grow. (Without the wait, a 64 GiB
// root came back stuck at 6 GiB and full, every time.)
func TestDiskOnlyStartAfterACheckpointDuringTheGrow(t *testing.T) {
	name := sandbox(t, "earlycp", "--memory", "384M", "--disk", "64G")
	cp := checkpointNow(t, name, "as the root grows")
	e := ls(t)[name]
	if err := os.Remove(filepath.Join(e.Dir, "checkpoints", cp.ID, "devices")); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "", "rewind", name, cp.ID); r.code == 0 {
		t.Fatalf("a rewind to damaged device state succeeded:\n%s", r)
	}
	for deadline := time.Now().Add(30 * time.Second); processRunning(e.Status.SupervisorPID); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the supervisor still runs 30 s after the failed rewind")
		}
	}
	must(t, "start", name) // from the checkpoint's disks alone
	out := must(t, "exec", name, "--", "df", "-B1", "--output=size,used", "/").stdout
	f := strings.Fields(out)
	if len(f) != 4 {
		t.Fatalf("df: %q", out)
	}
	size, _ := strconv.ParseInt(f[2], 10, 64)
	used, _ := strconv.ParseInt(f[3], 10, 64)
	if size < 60<<30 || used > 8<<30 {
		t.Errorf("the root filesystem after a start from the checkpoint's disks: %d bytes, %d used; want the 64 GiB disk, mostly free", size, used)
	}
}

// qemuProcesses lists the live QEMU processes of a sandbox.
func qemuProcesses(t *testing.T, name string) []int {
	t.Helper()
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "kosa8-"+name+",") && processRunning(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A root guest writes a qcow2 header naming a host FIFO at the start of
// its raw workspace disk (ext4 leaves the first KiB unused); once a
// checkpoint has frozen that disk as a raw layer, deleting a checkpoint
// collects unused layers as root. That must not read the guest's bytes as
// a header and open what it names (qemu-img, probing, did: the FIFO held
// the deletion forever; a device or a json: name does worse).
func TestGuestDiskHeaderNamesNothingToTheHost(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	opened := make(chan struct{})
	go func() { // a reader's open lets this one return
		if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			close(opened)
			f.Close()
		}
	}()
	t.Cleanup(func() { // release the writer if nothing did
		if f, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			time.Sleep(10 * time.Millisecond)
			f.Close()
		}
	})
	hdr := filepath.Join(dir, "hdr.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-u", "-f", "qcow2",
		"-o", "backing_file="+fifo+",backing_fmt=raw", hdr, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	b, err := os.ReadFile(hdr)
	if err != nil || len(b) < 1024 {
		t.Fatalf("header: %d bytes, %v", len(b), err)
	}

	name := sandbox(t, "hdrattack", "--memory", "384M")
	find := `for d in /sys/block/vd*; do [ "$(cat $d/serial 2>/dev/null)" = ws ] && echo /dev/${d##*/}; done`
	if r := run(t, string(b[:1024]), "exec", "-i", "-u", "root", name, "--", "sh", "-c",
		`dd of=$(`+find+`) bs=1024 count=1 iflag=fullblock conv=notrunc status=none && sync && head -c 4 $(`+find+`)`); r.code != 0 || r.stdout != "QFI\xfb" {
		t.Fatalf("the guest writing its disk's first KiB:\n%s", r)
	}
	first := checkpointNow(t, name, "freezes the raw workspace disk")
	second := checkpointNow(t, name, "to delete")
	if first.Disks["ws"].Format != "raw" {
		t.Fatalf("the first checkpoint's workspace layer: %+v, want the raw disk", first.Disks["ws"])
	}
	timed(t, 60*time.Second, "checkpoint", "rm", name, second.ID)
	select {
	case <-opened:
		t.Fatal("deleting a checkpoint opened the host FIFO the guest's disk header names")
	case <-time.After(200 * time.Millisecond):
	}
}
