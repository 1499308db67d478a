package e2e

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Crashes never delete the user's files (issue 27). A sandbox's guest
// writes sit in its page cache until its filesystem syncs; a kill -9 of
// the supervisor (QEMU dies with it), of QEMU alone, an OOM kill or a
// power cut throws them away. The sync's record of what both sides hold
// must never get ahead of what the guest's disk holds, and a start after
// a crash merges instead of reading what the guest lost as the agent's
// deletions.

// userFiles are the files the test wrote on the host, as a user would:
// each must be on the host, byte for byte, after every crash.
type userFiles map[string][]byte

func (u userFiles) write(t *testing.T, ws, rel string) {
	t.Helper()
	b := make([]byte, 64+len(u)%7*100)
	rand.Read(b)
	p := filepath.Join(ws, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	u[rel] = b
}

func (u userFiles) check(t *testing.T, ws, when string) {
	t.Helper()
	bad := 0
	for rel, want := range u {
		got, err := os.ReadFile(filepath.Join(ws, rel))
		if err != nil || string(got) != string(want) {
			if bad++; bad <= 5 {
				t.Errorf("%s: the user's %s on the host: %v (%d bytes, want %d)", when, rel, err, len(got), len(want))
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of the user's %d files lost or changed on the host", when, bad, len(u))
	}
}

// crashWorkspace makes a folder and a sandbox syncing it, with the
// guest's writeback put off (as on a guest whose kernel simply had not
// written yet): its writes stay in its page cache until something syncs.
func crashWorkspace(t *testing.T, name string, extra ...string) string {
	t.Helper()
	base, err := os.MkdirTemp(home, "crash-")
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(base, "project")
	os.MkdirAll(ws, 0o755)
	os.WriteFile(filepath.Join(ws, "README"), []byte("the user's project\n"), 0o644)
	sandbox(t, name, append([]string{"--workspace", ws, "--memory", "512M"}, extra...)...)
	slowWriteback(t, name, ws)
	return ws
}

// slowWriteback puts off the guest's writeback and journal commits on the
// workspace's filesystem (again after every boot).
func slowWriteback(t *testing.T, name, ws string) {
	t.Helper()
	must(t, "exec", "-u", "root", name, "--", "sh", "-c",
		"sync && sysctl -qw vm.dirty_expire_centisecs=360000 vm.dirty_writeback_centisecs=0 && mount -o remount,commit=3600 "+ws)
}

// killSupervisor kills the sandbox's supervisor (QEMU dies with it) and
// waits until the sandbox is reported crashed.
func killSupervisor(t *testing.T, name string) {
	t.Helper()
	e := ls(t)[name]
	if e.Status.SupervisorPID == 0 {
		t.Fatalf("%s has no supervisor to kill (state %s)", name, e.State)
	}
	syscall.Kill(e.Status.SupervisorPID, syscall.SIGKILL)
	waitCrashed(t, name, e.Status.SupervisorPID, e.Status.QEMUPID)
}

func waitCrashed(t *testing.T, name string, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		alive := false
		for _, p := range pids {
			alive = alive || (p > 0 && processRunning(p))
		}
		if st := ls(t)[name].State; !alive && (st == "crashed" || st == "stopped") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not down 20 s after the kill: %s", name, ls(t)[name].State)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The reproduction: an agent's new file and the user's new file
// are synced both ways, then the supervisor is killed (QEMU with it).
// After a start and a pass, both must still be on the host. On the build
// before, the first pass read their absence in the guest (the guest's
// writes died with QEMU) as deletions and deleted them from the host, the
// user's own file included. Then the same with QEMU killed alone.
func TestCrashKeepsTheUsersFiles(t *testing.T) {
	name := "crash-repro"
	ws := crashWorkspace(t, name)
	user := userFiles{}
	user.write(t, ws, "user-1")
	must(t, "sync", "now", name)

	must(t, "exec", name, "--", "sh", "-c", "echo agent > "+ws+"/agent-2")
	user.write(t, ws, "user-2")
	must(t, "sync", "now", name)
	waitHost(t, "agent-2 on the host", fileIs(filepath.Join(ws, "agent-2"), "agent\n"))
	if r := must(t, "exec", name, "--", "cat", ws+"/user-2"); r.stdout != string(user["user-2"]) {
		t.Fatalf("user-2 did not reach the guest")
	}
	killSupervisor(t, name)
	must(t, "start", name)
	must(t, "sync", "now", name)
	user.check(t, ws, "after kill -9 of the supervisor")
	if b, _ := os.ReadFile(filepath.Join(ws, "agent-2")); string(b) != "agent\n" {
		t.Errorf("the agent's synced file after the crash: %q", b)
	}
	if r := must(t, "exec", name, "--", "cat", ws+"/user-2"); r.stdout != string(user["user-2"]) {
		t.Errorf("user-2 is not back in the guest after the crash")
	}

	// QEMU alone dies (an OOM kill): the supervisor lives on.
	slowWriteback(t, name, ws)
	must(t, "exec", name, "--", "sh", "-c", "echo agent > "+ws+"/agent-3")
	user.write(t, ws, "user-3")
	must(t, "sync", "now", name)
	waitHost(t, "agent-3 on the host", fileIs(filepath.Join(ws, "agent-3"), "agent\n"))
	e := ls(t)[name]
	syscall.Kill(e.Status.QEMUPID, syscall.SIGKILL)
	waitCrashed(t, name, e.Status.QEMUPID, e.Status.SupervisorPID)
	must(t, "start", name)
	must(t, "sync", "now", name)
	user.check(t, ws, "after kill -9 of QEMU")
	if b, _ := os.ReadFile(filepath.Join(ws, "agent-3")); string(b) != "agent\n" {
		t.Errorf("the agent's synced file after QEMU's crash: %q", b)
	}
}

// A kill while a host-side git checkout of 1,000 files is being synced
// in, and one while the guest deletes a tree: the user's files all stay,
// and the host has of the tree what the guest's disk has, never a half of
// its own (wsync's TestJournalFinishesADeletedTree kills at each step of a
// deletion the guest made durable whole).
func TestCrashDuringBulkSync(t *testing.T) {
	name := "crash-bulk"
	ws := crashWorkspace(t, name)
	user := userFiles{}
	for i := range 1000 {
		user.write(t, ws, fmt.Sprintf("checkout/pkg%02d/f%03d.go", i%40, i))
	}
	// Killed while the pass copies them in.
	waitGuest(t, name, ws+"/checkout", 50)
	killSupervisor(t, name)
	must(t, "start", name)
	must(t, "sync", "now", name)
	user.check(t, ws, "after a kill during the checkout's sync")
	if n := guestCount(t, name, ws+"/checkout"); n != 1000 {
		t.Errorf("the guest has %d of the checkout's 1000 files after the restart", n)
	}

	// The agent's tree, whole on both sides and on the guest's disk.
	slowWriteback(t, name, ws)
	must(t, "exec", name, "--", "sh", "-c", "mkdir -p "+ws+"/tree && cd "+ws+"/tree && for i in $(seq 500); do echo $i > f$i; done && sync")
	must(t, "sync", "now", name)
	waitHost(t, "the agent's tree on the host", func() bool { return hostCount(filepath.Join(ws, "tree")) == 500 })
	must(t, "exec", name, "--", "sh", "-c", "rm -rf "+ws+"/tree")
	// Killed once the host's deletion has begun.
	waitHost(t, "the tree's deletion on the host", func() bool { return hostCount(filepath.Join(ws, "tree")) < 500 })
	killSupervisor(t, name)
	must(t, "start", name)
	must(t, "sync", "now", name)
	// The guest's disk may hold the whole deletion (then so must the
	// host: the journal finishes it), none of it, or part of it (rm's own
	// unflushed work, which the crash cost the guest): the host has
	// exactly what the guest has, never a half of its own.
	if h, g := hostCount(filepath.Join(ws, "tree")), guestCount(t, name, ws+"/tree"); h != g {
		t.Errorf("after a kill during a tree's deletion the host has %d of its 500 files, the guest %d", h, g)
	} else {
		t.Logf("after a kill during a tree's deletion both sides have %d of its 500 files", h)
	}
	user.check(t, ws, "after a kill during a tree's deletion")
}

// waitGuest waits until the guest's dir holds at least n files.
func waitGuest(t *testing.T, name, dir string, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for guestCount(t, name, dir) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the guest's %s never held %d files", dir, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func guestCount(t *testing.T, name, dir string) int {
	t.Helper()
	r := must(t, "exec", name, "--", "sh", "-c", "find "+dir+" -type f 2>/dev/null | wc -l")
	n, _ := strconv.Atoi(strings.TrimSpace(r.stdout))
	return n
}

func hostCount(dir string) int {
	n := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return nil
	})
	return n
}

// crashPoints is how many kill points TestCrashDuringCheckpointAndRewind
// tries in each: KOSA8_CRASH_POINTS (make test-crash: 10), else 2.
func crashPoints() int {
	if n, err := strconv.Atoi(os.Getenv("KOSA8_CRASH_POINTS")); err == nil && n > 0 {
		return n
	}
	return 2
}

// Kills at points spread over a checkpoint, then over a rewind: after
// every restart, every file the user wrote is on the host.
func TestCrashDuringCheckpointAndRewind(t *testing.T) {
	name := "crash-cp"
	ws := crashWorkspace(t, name)
	user := userFiles{}
	user.write(t, ws, "before")
	must(t, "sync", "now", name)
	first := checkpointNow(t, name, "first")
	points := crashPoints()
	for i := range points {
		delay := time.Duration(i) * 1200 * time.Millisecond / time.Duration(points)
		for _, op := range []string{"checkpoint", "rewind"} {
			t.Run(fmt.Sprintf("%s-%dms", op, delay.Milliseconds()), func(t *testing.T) {
				slowWriteback(t, name, ws)
				tag := op + "-" + strconv.Itoa(i)
				user.write(t, ws, "user-"+tag)
				must(t, "exec", name, "--", "sh", "-c", "echo agent > "+ws+"/agent-"+tag)
				must(t, "sync", "now", name)
				args := []string{"checkpoint", name}
				if op == "rewind" {
					args = []string{"rewind", name, first.ID}
				}
				cmd := kosa8Cmd(t.Context(), args...)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(delay)
				e := ls(t)[name]
				syscall.Kill(e.Status.SupervisorPID, syscall.SIGKILL)
				cmd.Wait()
				waitCrashed(t, name, e.Status.SupervisorPID, e.Status.QEMUPID)
				if r := run(t, "", "start", name); r.code != 0 {
					t.Fatalf("start after a kill %v into a %s:\n%s", delay, op, r)
				}
				must(t, "sync", "now", name)
				user.check(t, ws, fmt.Sprintf("after a kill %v into a %s", delay, op))
			})
		}
	}
	if r := must(t, "checkpoints", name, "--json"); !strings.Contains(r.stdout, first.ID) {
		t.Fatalf("the first checkpoint is gone after the kills")
	}
}
