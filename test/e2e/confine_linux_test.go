package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// procStatus reads the fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// QEMU is a process the guest may take over (a device-emulation bug): on
// Linux it must not run as root, must not gain privileges, and must reach
// only its own files (Landlock: proven on QEMU itself by
// TestConfinedQEMUCannotOpenOutside in internal/vmm/qemu; here the running
// QEMU is checked to be in that state). Checkpoints and rewinds keep
// working, and the confinement carries over to the QEMU a rewind starts.
func TestQEMUConfined(t *testing.T) {
	name := sandbox(t, "confined", "--memory", "384M")
	landlock := false
	if v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION); e == 0 && v > 0 {
		landlock = true
	}
	check := func(pid int) {
		t.Helper()
		st := procStatus(t, pid)
		t.Logf("QEMU pid %d: Uid %s, NoNewPrivs %s, CapEff %s", pid, st["Uid"], st["NoNewPrivs"], st["CapEff"])
		if st["NoNewPrivs"] != "1" {
			t.Errorf("QEMU can gain privileges (NoNewPrivs %q)", st["NoNewPrivs"])
		}
		if os.Geteuid() == 0 {
			for _, id := range strings.Fields(st["Uid"]) {
				if id == "0" {
					t.Errorf("QEMU runs as root: Uid %s", st["Uid"])
				}
			}
			if strings.Fields(st["Gid"])[0] == "0" {
				t.Errorf("QEMU runs in group root: Gid %s", st["Gid"])
			}
			// CAP_DAC_READ_SEARCH only: reading its image under root's
			// private home; Landlock limits it to its own files.
			if st["CapEff"] != "0000000000000004" || st["CapPrm"] != "0000000000000004" {
				t.Errorf("QEMU's capabilities: CapEff %s CapPrm %s, want only CAP_DAC_READ_SEARCH", st["CapEff"], st["CapPrm"])
			}
			// The console log is the supervisor's: QEMU hands what the
			// guest prints to it over a socket and cannot write the log
			// (which it could make grow without bound).
			var fst syscall.Stat_t
			if err := syscall.Stat(filepath.Join(ls(t)[name].Dir, "console.log"), &fst); err != nil {
				t.Fatal(err)
			}
			if strconv.Itoa(int(fst.Uid)) == strings.Fields(st["Uid"])[0] {
				t.Errorf("console.log belongs to QEMU's uid %d", fst.Uid)
			}
		}
		if landlock {
			log := must(t, "logs", "--supervisor", name).stdout
			i := strings.LastIndex(log, `msg="qemu started"`)
			if i < 0 || !strings.Contains(log[i:], "landlock v") {
				t.Errorf("the supervisor log does not say QEMU is under Landlock:\n%s", log)
			}
		}
	}
	first := ls(t)[name].Status.QEMUPID
	check(first)

	must(t, "exec", name, "--", "sh", "-c", "echo before > ~/f && sync")
	cp := checkpointNow(t, name, "confined")
	must(t, "exec", name, "--", "sh", "-c", "echo after > ~/f && sync")
	must(t, "rewind", name, cp.ID)
	if r := must(t, "exec", name, "--", "sh", "-c", "cat ~/f"); r.stdout != "before\n" {
		t.Fatalf("after the rewind: %q", r.stdout)
	}
	second := ls(t)[name].Status.QEMUPID
	if second == first {
		t.Fatalf("the rewind did not start a new QEMU (pid %d)", second)
	}
	check(second)

	// The parent-death signal survives the change of uid: QEMU dies with
	// its supervisor.
	sup := ls(t)[name].Status.SupervisorPID
	if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); processRunning(second); {
		if time.Now().After(deadline) {
			t.Fatalf("QEMU (pid %d, its own uid) still runs 10 s after its supervisor was killed", second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
