package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// counter counts in its memory and writes the count to /tmp/count; SIGUSR1
// changes a mark it keeps in memory too (written to /tmp/mark), which a
// rewind must bring back whatever the timing.
const counter = `(nohup python3 -c '
import os, signal, time
n = 0
mark = ["before"]
signal.signal(signal.SIGUSR1, lambda *_: mark.__setitem__(0, "after"))
while True:
    n += 1
    open("/tmp/count.tmp", "w").write(str(n))
    os.replace("/tmp/count.tmp", "/tmp/count")
    open("/tmp/mark.tmp", "w").write(mark[0])
    os.replace("/tmp/mark.tmp", "/tmp/mark")
    time.sleep(0.1)
' >/dev/null 2>&1 &)`

// markIs waits until the counter's mark reads want.
func markIs(t *testing.T, name, want string) {
	t.Helper()
	must(t, "exec", name, "--", "sh", "-c", "for i in $(seq 300); do [ \"$(cat /tmp/mark 2>/dev/null)\" = "+want+" ] && exit 0; sleep 0.1; done; echo mark: $(cat /tmp/mark) >&2; exit 1")
}

type cpMeta struct {
	ID          string  `json:"id"`
	Parent      string  `json:"parent"`
	Kind        string  `json:"kind"`
	PauseMillis float64 `json:"pause_ms"`
	Disks       map[string]struct {
		Path   string `json:"path"`
		Format string `json:"format"`
	} `json:"disks"`
}

func checkpointNow(t *testing.T, name, msg string) cpMeta {
	t.Helper()
	var m cpMeta
	if err := json.Unmarshal([]byte(must(t, "checkpoint", name, "-m", msg, "--json").stdout), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// startCounter starts the counter and waits until it has counted past 3:
// python3 took 8 s to start in a guest on a loaded host.
func startCounter(t *testing.T, name string) {
	t.Helper()
	must(t, "exec", name, "--", "sh", "-c", counter)
	must(t, "exec", name, "--", "sh", "-c", "for i in $(seq 600); do [ \"$(cat /tmp/count 2>/dev/null || echo 0)\" -gt 3 ] && exit 0; sleep 0.1; done; echo the counter never started >&2; exit 1")
}

func count(t *testing.T, name string) int {
	t.Helper()
	r := must(t, "exec", name, "--", "cat", "/tmp/count")
	n, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatalf("count: %q", r.stdout)
	}
	return n
}

func TestCheckpointAndRewind(t *testing.T) {
	ws, _ := os.MkdirTemp(home, "cp-ws-")
	os.WriteFile(filepath.Join(ws, "keep.txt"), []byte("original\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "doomed.txt"), []byte("will be deleted\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "user.txt"), []byte("v1\n"), 0o644)
	name := "cp"
	must(t, "create", name, "--workspace", ws)
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	startCounter(t, name)

	before := count(t, name)
	c1 := checkpointNow(t, name, "first")
	atC1 := count(t, name)
	t.Logf("checkpoint %s paused %.0f ms", c1.ID, c1.PauseMillis)

	// More work: the counter runs on, files change on both sides.
	must(t, "exec", name, "--", "sh", "-c", "echo made-after > after.txt && rm doomed.txt")
	waitHost(t, "after.txt", fileIs(filepath.Join(ws, "after.txt"), "made-after\n"))
	waitHost(t, "doomed.txt deleted", gone(filepath.Join(ws, "doomed.txt")))
	os.WriteFile(filepath.Join(ws, "user.txt"), []byte("v2 by the user\n"), 0o644)
	time.Sleep(3 * time.Second)
	later := count(t, name)
	if later <= atC1 {
		t.Fatalf("the counter did not run on: %d then %d", atC1, later)
	}
	// The process's memory changes after the checkpoint.
	must(t, "exec", name, "--", "sh", "-c", "pkill -USR1 -f 'count[.]tmp'")
	markIs(t, name, "after")

	must(t, "rewind", name, c1.ID)
	now := count(t, name)
	if now < before {
		t.Fatalf("after rewind the counter is %d: want it to continue from the checkpoint (%d or more)", now, before)
	}
	// What the process held in memory at the checkpoint is back: its
	// mark reads "before" again (and the counter counts on from there).
	markIs(t, name, "before")
	r := must(t, "exec", name, "--", "sh", "-c", "ls; cat user.txt")
	if strings.Contains(r.stdout, "after.txt") || !strings.Contains(r.stdout, "doomed.txt") {
		t.Fatalf("inside after rewind: %s", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(ws, "after.txt")); err == nil {
		t.Fatal("a file made after the checkpoint is still on the host")
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "doomed.txt")); string(b) != "will be deleted\n" {
		t.Fatal("a file deleted after the checkpoint is not back on the host")
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "user.txt")); string(b) != "v2 by the user\n" {
		t.Fatalf("the user's edit after the checkpoint was lost: %q", b)
	}
	if !strings.Contains(r.stdout, "v2 by the user") {
		t.Fatalf("the user's edit did not reach the rewound guest: %s", r.stdout)
	}

	// The state before the rewind was kept; rewind to it (newer), then back
	// to the first (older) again.
	var list []cpMeta
	checkpointsJSON(t, name, &list)
	var pre cpMeta
	for _, c := range list {
		if c.Kind == "pre-rewind" {
			pre = c
		}
	}
	if pre.ID == "" {
		t.Fatalf("no pre-rewind checkpoint: %+v", list)
	}
	must(t, "rewind", name, pre.ID)
	if n := count(t, name); n < later {
		t.Fatalf("after rewinding to the newer checkpoint the counter is %d, want at least %d", n, later)
	}
	if r := must(t, "exec", name, "--", "cat", "after.txt"); r.stdout != "made-after\n" {
		t.Fatalf("the newer checkpoint's file: %q", r.stdout)
	}
	waitHost(t, "after.txt back on the host", fileIs(filepath.Join(ws, "after.txt"), "made-after\n"))

	// Two rewinds to the same checkpoint: the RNG is reseeded each time.
	var randoms []string
	for i := 0; i < 2; i++ {
		must(t, "rewind", name, c1.ID)
		randoms = append(randoms, strings.TrimSpace(must(t, "exec", name, "--", "python3", "-c", "import os; print(os.urandom(16).hex())").stdout))
	}
	if randoms[0] == randoms[1] || len(randoms[0]) != 32 {
		t.Fatalf("two rewinds gave the same random numbers: %v", randoms)
	}
	if log := must(t, "logs", name).stdout; strings.Count(log, "RNG reseeded") < 2 {
		t.Fatalf("the agent did not report reseeding: %s", log)
	}
}

func TestPauseResume(t *testing.T) {
	name := "pausing"
	must(t, "create", name)
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	startCounter(t, name)
	qemu := ls(t)[name].Status.QEMUPID
	must(t, "pause", name)
	e := ls(t)[name]
	if e.State != "paused" {
		t.Fatalf("state %q after pause", e.State)
	}
	if processRunning(qemu) {
		t.Fatal("QEMU still runs: a paused sandbox must free the host's memory")
	}
	must(t, "start", name)
	a := count(t, name)
	time.Sleep(1 * time.Second)
	b := count(t, name)
	if a == 0 || b <= a {
		t.Fatalf("the process did not survive pause and resume: %d then %d", a, b)
	}
	if a > 40 {
		t.Fatalf("count %d after resume: it should continue from the pause (~10)", a)
	}
}

func TestKillDuringCheckpoint(t *testing.T) {
	name := "cpkill"
	must(t, "create", name, "--memory", "1G")
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	must(t, "exec", name, "--", "sh", "-c", "echo kept > ~/f && head -c 300M /dev/urandom > /dev/shm/fill && sync")
	c1 := checkpointNow(t, name, "good one")
	pid := ls(t)[name].Status.SupervisorPID
	// A second checkpoint, killed while it copies the RAM.
	cmd := kosa8Cmd(t.Context(), "checkpoint", name)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond)
	syscall.Kill(pid, syscall.SIGKILL)
	cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); processRunning(pid) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	var list []cpMeta
	checkpointsJSON(t, name, &list)
	found := false
	for _, c := range list {
		if c.ID == c1.ID {
			found = true
		}
	}
	if !found {
		t.Fatalf("the earlier checkpoint is gone: %+v", list)
	}
	if st := ls(t)[name].State; st != "crashed" {
		t.Fatalf("state %q", st)
	}
	must(t, "start", name)
	if r := must(t, "exec", name, "--", "sh", "-c", "cat ~/f"); r.stdout != "kept\n" {
		t.Fatalf("after restart: %q", r.stdout)
	}
	// The good checkpoint still rewinds.
	must(t, "rewind", name, c1.ID)
	if r := must(t, "exec", name, "--", "sh", "-c", "cat ~/f"); r.stdout != "kept\n" {
		t.Fatalf("after rewind: %q", r.stdout)
	}
	leftovers, _ := filepath.Glob(filepath.Join(ls(t)[name].Dir, "checkpoints", ".tmp-*"))
	if len(leftovers) != 0 {
		t.Fatalf("half-written checkpoints left: %v", leftovers)
	}
}

func TestStreamReattachesAcrossRewind(t *testing.T) {
	name := "stream"
	must(t, "create", name)
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	cmd := kosa8Cmd(t.Context(), "exec", name, "--", "sh", "-c", "i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo tick $i; sleep 0.2; done; echo finished")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) == 5 {
			c := checkpointNow(t, name, "mid-stream")
			go func() {
				time.Sleep(time.Second)
				run(t, "", "rewind", name, c.ID)
			}()
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the streaming command failed across the rewind: %v (%d lines)", err, len(lines))
	}
	if lines[len(lines)-1] != "finished" {
		t.Fatalf("the stream did not reach its end: last line %q", lines[len(lines)-1])
	}
	// Ticks after the checkpoint come again after the rewind.
	seen := map[string]int{}
	for _, l := range lines {
		seen[l]++
	}
	repeated := 0
	for _, n := range seen {
		if n > 1 {
			repeated++
		}
	}
	if repeated == 0 {
		t.Fatalf("no output repeated: was the stream re-attached to the rewound process? %s", fmt.Sprint(lines))
	}
}

// A stopped sandbox (after a host reboot, say) starts from a checkpoint,
// processes and memory included; the disks it had are kept as a checkpoint
// of their own, which a rewind boots from.
func TestStartFromCheckpoint(t *testing.T) {
	name := sandbox(t, "cpfrom")
	must(t, "exec", name, "--", "sh", "-c", counter+" && echo one > ~/f && sync")
	// Python takes its time to start under TCG: checkpoint a counter that counts.
	must(t, "exec", name, "--", "sh", "-c", "for i in $(seq 200); do [ -e /tmp/count ] && exit 0; sleep 0.1; done; exit 1")
	checkpointNow(t, name, "with the counter")
	must(t, "exec", name, "--", "sh", "-c", "echo two > ~/f && sync")
	must(t, "stop", name)

	r := must(t, "start", "--from", "latest", name)
	if !strings.Contains(r.stderr, "kept as checkpoint") {
		t.Fatalf("start --from does not say where the disks went:\n%s", r)
	}
	a := count(t, name) // the counter is running again: memory came back
	time.Sleep(time.Second)
	if b := count(t, name); b <= a {
		t.Fatalf("the restored counter does not run: %d then %d", a, b)
	}
	if r := must(t, "exec", name, "--", "sh", "-c", "cat ~/f"); r.stdout != "one\n" {
		t.Fatalf("the disk after start --from: %q", r.stdout)
	}
	var list []struct {
		ID        string `json:"id"`
		DisksOnly bool   `json:"disks_only"`
	}
	checkpointsJSON(t, name, &list)
	disks := ""
	for _, c := range list {
		if c.DisksOnly {
			disks = c.ID
		}
	}
	if disks == "" {
		t.Fatalf("no disks-only checkpoint: %+v", list)
	}
	must(t, "rewind", name, disks)
	if r := must(t, "exec", name, "--", "sh", "-c", "cat ~/f"); r.stdout != "two\n" {
		t.Fatalf("after a rewind to the disks kept by start --from: %q", r.stdout)
	}
	if r := run(t, "", "start", "--from", "nosuch", name); r.code == 0 || !strings.Contains(r.stderr, "no checkpoint \"nosuch\"") {
		t.Fatalf("start --from an unknown checkpoint:\n%s", r)
	}
}

// undoMeta is a checkpoint as `checkpoint --json` reports it, with how its
// RAM was saved.
type undoMeta struct {
	ID             string  `json:"id"`
	PauseMillis    float64 `json:"pause_ms"`
	RAMBytes       int64   `json:"ram_bytes"`
	Incremental    bool    `json:"incremental"`
	RAMCopiedBytes int64   `json:"ram_copied_bytes"`
	FullCopyReason string  `json:"full_copy_reason"`
	Verify         string  `json:"verify"`
}

func undoCheckpoint(t *testing.T, name, msg string) undoMeta {
	t.Helper()
	var m undoMeta
	if err := json.Unmarshal([]byte(must(t, "checkpoint", name, "-m", msg, "--json").stdout), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// holdBuf is a guest process holding a random buffer in its memory: SIGUSR2
// changes random bytes of it, SIGUSR1 writes its hash to /tmp/h.
const holdBuf = `import os, hashlib, time, signal
buf = bytearray(os.urandom(1 << 20)) * 8 # random bytes are slow to make under TCG
def h(*a):
    open('/tmp/h.tmp', 'w').write(hashlib.sha256(buf).hexdigest())
    os.replace('/tmp/h.tmp', '/tmp/h')
def mut(*a):
    for _ in range(4000):
        i = int.from_bytes(os.urandom(4), 'little') % len(buf)
        buf[i] = (buf[i] + 1) % 256
    h()
signal.signal(signal.SIGUSR1, h)
signal.signal(signal.SIGUSR2, mut)
open('/tmp/holdbuf.pid', 'w').write(str(os.getpid()))
while True:
    time.sleep(1)
`

// bufHash signals the holder (sig USR1: hash; USR2: change, then hash) and
// returns the hash it writes.
func bufHash(t *testing.T, name, sig string) string {
	t.Helper()
	// Each wait in its own exec, each within run's deadline: a loaded
	// TCG guest takes its time.
	must(t, "exec", "-u", "root", name, "--", "sh", "-c", "for i in $(seq 100); do [ -s /tmp/holdbuf.pid ] && exit 0; sleep 1; done; exit 1")
	must(t, "exec", "-u", "root", name, "--", "sh", "-c", "rm -f /tmp/h; kill -"+sig+" $(cat /tmp/holdbuf.pid)")
	r := must(t, "exec", "-u", "root", name, "--", "sh", "-c", "for i in $(seq 100); do [ -s /tmp/h ] && cat /tmp/h && exit 0; sleep 1; done; exit 1")
	h := strings.TrimSpace(r.stdout)
	if len(h) != 64 {
		t.Fatalf("buffer hash: %q", r.stdout)
	}
	return h
}

// Ten checkpoints in a row, a second apart, each after a small change,
// while a guest process writes random pages all the time (so also in the
// pause window) and the disk device writes by DMA: every checkpoint is
// verified byte for byte against the guest's RAM during its pause
// (KOSA8_CHECKPOINT_VERIFY=1), and every one can be rewound to.
func TestCheckpointsBackToBackVerified(t *testing.T) {
	t.Setenv("KOSA8_CHECKPOINT_VERIFY", "1")
	name := sandbox(t, "cp-b2b", "--no-workspace", "--memory", "1G")
	must(t, "exec", "-u", "root", name, "--", "sh", "-c", `(nohup python3 -c '
import os, random, time
b = bytearray(64 << 20)
while True:
    for _ in range(256):
        i = random.randrange(len(b) >> 12) << 12
        b[i:i+64] = os.urandom(64)
    time.sleep(0.01)
' >/dev/null 2>&1 &)
(nohup sh -c 'while :; do dd if=/dev/urandom of=/root/dma bs=1M count=4 conv=fsync status=none; done' >/dev/null 2>&1 &)`)
	var cps []undoMeta
	for i := 0; i < 10; i++ {
		must(t, "exec", "-u", "root", name, "--", "sh", "-c", fmt.Sprintf("echo %d > /dev/shm/marker", i))
		time.Sleep(time.Second)
		m := undoCheckpoint(t, name, fmt.Sprintf("b2b %d", i))
		t.Logf("checkpoint %d: pause %.0f ms, %d MiB, incremental %v (copied %d MiB; %s), verify %q",
			i, m.PauseMillis, m.RAMBytes>>20, m.Incremental, m.RAMCopiedBytes>>20, m.FullCopyReason, m.Verify)
		if m.Verify != "ok" {
			t.Errorf("checkpoint %d: verifier: %q", i, m.Verify)
		}
		cps = append(cps, m)
	}
	for _, i := range []int{2, 9} {
		must(t, "rewind", name, cps[i].ID)
		got := strings.TrimSpace(must(t, "exec", name, "--", "cat", "/dev/shm/marker").stdout)
		if got != strconv.Itoa(i) {
			t.Fatalf("rewound to checkpoint %d: marker %q", i, got)
		}
	}
}

// A checkpoint after guest writes (incremental where the kernel tracks
// soft-dirty pages) rewinds to exactly the guest's memory: a process's
// random buffer hashes as it did at the checkpoint, after it changed
// since, and so does a file the disk wrote by DMA.
func TestIncrementalCheckpointRewindsExactMemory(t *testing.T) {
	name := sandbox(t, "cp-inc", "--no-workspace", "--memory", "1G")
	must(t, "exec", "-u", "root", name, "--", "sh", "-c",
		"cat > /root/holdbuf.py <<'EOF'\n"+holdBuf+"EOF\n(nohup python3 /root/holdbuf.py >/dev/null 2>&1 &)")
	h1 := bufHash(t, name, "USR1")
	c1 := undoCheckpoint(t, name, "first")
	h2 := bufHash(t, name, "USR2")
	dma := must(t, "exec", "-u", "root", name, "--", "sh", "-c",
		"dd if=/dev/urandom of=/root/dma bs=1M count=8 conv=fsync status=none && echo 3 > /proc/sys/vm/drop_caches && sha256sum < /root/dma").stdout
	c2 := undoCheckpoint(t, name, "after writes")
	t.Logf("first: pause %.0f ms, %d MiB (%s); second: pause %.0f ms, incremental %v, copied %d MiB of %d (%s)",
		c1.PauseMillis, c1.RAMBytes>>20, c1.FullCopyReason, c2.PauseMillis, c2.Incremental, c2.RAMCopiedBytes>>20, c2.RAMBytes>>20, c2.FullCopyReason)
	if !c2.Incremental && c2.FullCopyReason == "" {
		t.Fatal("a full copy must say why")
	}
	h3 := bufHash(t, name, "USR2")
	if h3 == h2 || h2 == h1 {
		t.Fatal("the buffer did not change")
	}
	must(t, "rewind", name, c2.ID)
	if got := bufHash(t, name, "USR1"); got != h2 {
		t.Fatalf("after the rewind to the incremental checkpoint the buffer hashes %s, want %s", got, h2)
	}
	// The page cache holds what the disk wrote by DMA before drop_caches
	// read it back: it must hash alike too.
	if got := must(t, "exec", "-u", "root", name, "--", "sh", "-c", "sha256sum < /root/dma").stdout; got != dma {
		t.Fatalf("DMA-written file after the rewind: %q, want %q", got, dma)
	}
	must(t, "rewind", name, c1.ID)
	if got := bufHash(t, name, "USR1"); got != h1 {
		t.Fatalf("after the rewind to the first checkpoint the buffer hashes %s, want %s", got, h1)
	}
}

// A checkpoint's disks hold what the guest wrote before it, not only what
// the guest's kernel had written out by then: they are what a machine
// boots from when its memory cannot be loaded, as happens to every older
// checkpoint once a distribution's update changes the QEMU build. A file
// written just before the checkpoint, never synced, was missing after
// such a boot. The guest's own writeback and journal commits are put off
// for the test, so that only the checkpoint can have written anything:
// a few bytes (which the kernel's dirty-page count can miss), a rename
// of a file already synced (no dirty page at all, only the journal), and
// 1 MiB.
func TestCheckpointDisksHoldUnsyncedWrites(t *testing.T) {
	name := sandbox(t, "cp-unsynced", "--no-workspace")
	must(t, "exec", "-u", "root", name, "--", "sh", "-c",
		"sync && sysctl -qw vm.dirty_expire_centisecs=360000 vm.dirty_writeback_centisecs=0 && mount -o remount,commit=3600 /")
	must(t, "exec", name, "--", "sh", "-c", "echo small > ~/note")
	small := checkpointNow(t, name, "right after a small unsynced write")
	must(t, "exec", name, "--", "sh", "-c", "sync && echo old > ~/f && sync && echo new > ~/f.tmp && sync ~/f.tmp && mv ~/f.tmp ~/f")
	renamed := checkpointNow(t, name, "right after a rename")
	sum := strings.Fields(must(t, "exec", name, "--", "sh", "-c",
		"head -c 1048576 /dev/urandom > ~/precious && md5sum < ~/precious").stdout)
	if len(sum) == 0 {
		t.Fatal("no checksum")
	}
	large := checkpointNow(t, name, "right after a larger unsynced write")
	must(t, "exec", name, "--", "sh", "-c", "rm ~/precious ~/note ~/f && sync")

	state := "for x in note f; do cat ~/$x 2>/dev/null || echo -; done; [ -e ~/precious ] && md5sum < ~/precious; true"
	for _, c := range []struct {
		what string
		cp   cpMeta
		want string
	}{{"a few bytes", small, "small\n-\n"}, {"a rename", renamed, "small\nnew\n"}, {"1 MiB", large, "small\nnew\n" + sum[0]}} {
		coldOnly(t, name, c.cp.ID)
		r := must(t, "rewind", name, c.cp.ID)
		if !strings.Contains(r.stderr, "another QEMU build") {
			t.Fatalf("the rewind did not boot from the checkpoint's disks:\n%s", r)
		}
		got := must(t, "exec", name, "--", "sh", "-c", state).stdout
		if !strings.HasPrefix(got, c.want) {
			t.Fatalf("after a boot from the disks of the checkpoint after %s: %q, want %q...: writes before the checkpoint were not on its disks", c.what, got, c.want)
		}
	}
}

// coldOnly marks a checkpoint as saved by another QEMU build, as after an
// upgrade: its machine cannot be loaded, only its disks booted.
func coldOnly(t *testing.T, name, id string) {
	t.Helper()
	metaPath := filepath.Join(ls(t)[name].Dir, "checkpoints", id, "meta.json")
	b, err := os.ReadFile(metaPath)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	meta["qemu"] = "QEMU emulator version 0.0.1 (an earlier build)"
	if b, err = json.Marshal(meta); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(metaPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkpointsJSON reads the list of 'kosa8 checkpoints NAME --json' into v.
func checkpointsJSON(t *testing.T, name string, v any) {
	t.Helper()
	var out struct {
		Checkpoints json.RawMessage `json:"checkpoints"`
	}
	if err := json.Unmarshal([]byte(must(t, "checkpoints", name, "--json").stdout), &out); err != nil {
		t.Fatalf("checkpoints --json: %v", err)
	}
	if err := json.Unmarshal(out.Checkpoints, v); err != nil {
		t.Fatalf("checkpoints --json's list: %v", err)
	}
}
