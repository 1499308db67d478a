package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// forkEntry is what 'kosa8 fork ls --json' says of a fork.
type forkEntry struct {
	Name string `json:"name"`
	Fork struct {
		Source     string `json:"source"`
		Checkpoint string `json:"checkpoint"`
		Index      int    `json:"index"`
	} `json:"fork"`
	State     string `json:"state"`
	RAMShared bool   `json:"ram_shared"`
	ExitCode  *int   `json:"exit_code"`
	Error     string `json:"command_error"`
	Changes   *struct {
		Files []struct {
			Path    string `json:"path"`
			Added   int    `json:"added"`
			Removed int    `json:"removed"`
		} `json:"files"`
		Added   int  `json:"added"`
		Removed int  `json:"removed"`
		Live    bool `json:"live"`
	} `json:"changes"`
}

func forkLs(t *testing.T, source string) []forkEntry {
	t.Helper()
	var forks []forkEntry
	if err := json.Unmarshal([]byte(must(t, "fork", "ls", source, "--json").stdout), &forks); err != nil {
		t.Fatal(err)
	}
	return forks
}

// TestForkIntoThree forks a sandbox with a running counter and a modified
// file into three: each fork's counter goes on from the source's value,
// each fork is a machine of its own (hostname, boot id, machine id), each
// changes the file its own way while the host folder stays as it was,
// until one is applied; two forks compare with 'diff A B'; a second
// fork's apply meets the first's as today's conflicts do. A kill -9 in
// the middle of a fork leaves only sandboxes 'ls' explains (forks of the
// source, complete, in a state of their own). Removing the forks leaves
// the source running, with its checkpoints.
func TestForkIntoThree(t *testing.T) {
	ws, _ := os.MkdirTemp(home, "fork-ws-")
	os.WriteFile(filepath.Join(ws, "file.txt"), []byte("original\n"), 0o644)
	base := "base"
	must(t, "create", base, "--workspace", ws, "--memory", "512M")
	t.Cleanup(func() {
		// Forks first: the source cannot go while they build on it.
		out, _ := kosa8Cmd(context.Background(), "ls", "--json").Output()
		var list []struct{ Name string }
		_ = json.Unmarshal(out, &list)
		for _, l := range list {
			if strings.HasPrefix(l.Name, base+".") {
				run(t, "", "rm", "-f", l.Name)
			}
		}
		run(t, "", "rm", "-f", base)
	})
	must(t, "start", base)
	startCounter(t, base)
	// The modified file: synced to the host (the source is not in review
	// mode), so that the forks start from a folder in step.
	must(t, "exec", base, "--", "sh", "-c", "echo modified > file.txt")
	waitHostFile(t, filepath.Join(ws, "file.txt"), "modified\n")
	baseInfo := guestIdentity(t, base)
	must(t, "exec", base, "--", "sh", "-c", "for i in $(seq 300); do [ $(cat /tmp/count) -gt 20 ] && exit 0; sleep 0.1; done; exit 1")
	before := count(t, base)

	r := must(t, "fork", base, "-n", "3", "--json", "--", "sh", "-c", `echo "attempt $(hostname)" >> file.txt`)
	var forks []forkEntry
	if err := json.Unmarshal([]byte(r.stdout), &forks); err != nil {
		t.Fatalf("fork --json: %v\n%s", err, r)
	}
	var names []string
	for _, f := range forks {
		names = append(names, f.Name)
		if f.Fork.Source != base || f.ExitCode == nil || *f.ExitCode != 0 || f.Error != "" {
			t.Errorf("fork %+v: want a fork of %s whose command exited 0", f, base)
		}
		if f.Changes == nil || len(f.Changes.Files) != 1 || f.Changes.Files[0].Path != "file.txt" || f.Changes.Added != 1 || f.Changes.Removed != 0 {
			t.Errorf("fork %s changes %+v: want file.txt, +1 -0", f.Name, f.Changes)
		}
	}
	if !slices.Equal(names, []string{"base.1", "base.2", "base.3"}) {
		t.Fatalf("forks %v", names)
	}
	// Their memory is the checkpoint's, mapped copy-on-write where QEMU
	// can (8.2 and later), else copied.
	shares := qemuAtLeast(t, 8, 2)
	for _, f := range forks {
		if f.RAMShared != shares {
			t.Errorf("%s: RAM shared %v under this QEMU (8.2 or later: %v)", f.Name, f.RAMShared, shares)
		}
	}
	if st := ls(t)[base]; st.State != "running" {
		t.Errorf("the source is %s after the fork, want running", st.State)
	}

	// Each fork's counter went on from the source's value, in its own
	// machine.
	seen := map[string]string{baseInfo.bootID: base}
	seenMachine := map[string]string{}
	for _, f := range names {
		at := count(t, f)
		if at < before {
			t.Errorf("%s counts %d, the source counted %d before the fork: the process did not go on from its memory", f, at, before)
		}
		must(t, "exec", f, "--", "sh", "-c", "n=$(cat /tmp/count); for i in $(seq 100); do [ $(cat /tmp/count) -gt $n ] && exit 0; sleep 0.1; done; exit 1")
		id := guestIdentity(t, f)
		if want := strings.ReplaceAll(f, ".", "-"); id.hostname != want {
			t.Errorf("%s's hostname %q, want %q", f, id.hostname, want)
		}
		if other, ok := seen[id.bootID]; ok || id.bootID == "" {
			t.Errorf("%s's boot id %q is %s's too", f, id.bootID, other)
		}
		seen[id.bootID] = f
		if other, ok := seenMachine[id.machineID]; ok || id.machineID == "" {
			t.Errorf("%s's machine id %q is %s's too", f, id.machineID, other)
		}
		seenMachine[id.machineID] = f
		if got := must(t, "exec", f, "--", "cat", "file.txt").stdout; got != "modified\nattempt "+strings.ReplaceAll(f, ".", "-")+"\n" {
			t.Errorf("%s's file.txt: %q", f, got)
		}
	}
	// The host folder is untouched until an apply.
	if got := readHostDir(t, ws); !maps.Equal(got, map[string]string{"file.txt": "modified\n"}) {
		t.Errorf("the host folder after the forks' commands: %v", got)
	}
	d := must(t, "diff", "base.1", "base.3").stdout
	if !strings.Contains(d, "-attempt base-1") || !strings.Contains(d, "+attempt base-3") || strings.Contains(d, "-modified") {
		t.Errorf("diff base.1 base.3:\n%s", d)
	}

	must(t, "apply", "base.2")
	if got := readHostFile(t, ws, "file.txt"); got != "modified\nattempt base-2\n" {
		t.Errorf("the host's file.txt after apply base.2: %q", got)
	}
	// Another fork changed the same file: its sync meets base.2's change
	// as a conflict (the host's version stays, the fork's goes beside).
	st := waitConflict(t, "base.1", "file.txt")
	must(t, "apply", "base.1")
	if got := readHostFile(t, ws, "file.txt"); got != "modified\nattempt base-2\n" {
		t.Errorf("the host's file.txt after apply base.1 too: %q", got)
	}
	if got := readHostFile(t, ws, st); got != "modified\nattempt base-1\n" {
		t.Errorf("base.1's version beside it (%s): %q", st, got)
	}

	// A kill -9 in the middle of a fork: whatever it left, 'ls' explains
	// (the source, and forks of it, each complete, none crashed).
	cps := len(checkpointIDs(t, base))
	cmd := kosa8Cmd(context.Background(), "fork", base, "-n", "2", "-d")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed once the first of the two is made: the second half made,
	// neither started.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(filepath.Join(home, "sandboxes", "base.4")); err == nil {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	time.Sleep(2 * time.Second)
	entries, _ := os.ReadDir(filepath.Join(home, "sandboxes"))
	listed := ls(t)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue // a staging folder: never a sandbox, swept later
		}
		if e.Name() != base && !strings.HasPrefix(e.Name(), base+".") {
			continue // another test's (the suite shares one home)
		}
		l, ok := listed[e.Name()]
		if !ok {
			t.Errorf("%s is in the sandboxes folder but not listed", e.Name())
			continue
		}
		switch l.State {
		case "created", "starting", "running":
		default:
			t.Errorf("%s is %s after the kill -9", e.Name(), l.State)
		}
	}
	forks = forkLs(t, base)
	for name := range listed {
		if !strings.HasPrefix(name, base+".") {
			continue
		}
		if !slices.ContainsFunc(forks, func(f forkEntry) bool { return f.Name == name }) {
			t.Errorf("%s is listed but not a fork of %s", name, base)
		}
	}
	t.Logf("after the kill -9: %d forks of %s (%v)", len(forks), base, listed)

	// The forks go; the source runs on, its checkpoints all there (the
	// forks' among them, deletable now).
	var all []string
	for _, f := range forkLs(t, base) {
		all = append(all, f.Name)
	}
	for _, f := range all {
		// Until a fork's start is done ('created' ones included), rm -f
		// ends it.
		must(t, "rm", "-f", f)
	}
	if got := checkpointIDs(t, base); len(got) < cps {
		t.Errorf("%d checkpoints of %s after its forks went, %d before", len(got), base, cps)
	}
	must(t, "exec", base, "--", "sh", "-c", "n=$(cat /tmp/count); for i in $(seq 100); do [ $(cat /tmp/count) -gt $n ] && exit 0; sleep 0.1; done; exit 1")
	if l := ls(t); len(l) != 1 || l[base].State != "running" {
		t.Errorf("after the forks went: %v", l)
	}
	for _, id := range checkpointIDs(t, base) {
		must(t, "checkpoint", "rm", base, id)
	}
}

// qemuAtLeast tells whether the QEMU the sandboxes run (KOSA8_QEMU, else
// the system's) is major.minor or later.
func qemuAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	bin := os.Getenv("KOSA8_QEMU")
	if bin == "" {
		bin = "qemu-system-x86_64"
		if guestArch() == "arm64" {
			bin = "qemu-system-aarch64"
		}
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(strings.TrimPrefix(string(out), "QEMU emulator version "), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("QEMU's version %q: %v", out, err)
	}
	return ma > major || ma == major && mi >= minor
}

// identity is what tells one machine from another.
type identity struct{ hostname, bootID, machineID string }

func guestIdentity(t *testing.T, name string) identity {
	t.Helper()
	out := must(t, "exec", name, "--", "sh", "-c", "hostname; cat /proc/sys/kernel/random/boot_id; cat /etc/machine-id 2>/dev/null || echo").stdout
	f := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for len(f) < 3 {
		f = append(f, "")
	}
	return identity{f[0], f[1], f[2]}
}

func checkpointIDs(t *testing.T, name string) []string {
	t.Helper()
	var list []struct {
		ID string `json:"id"`
	}
	checkpointsJSON(t, name, &list)
	var ids []string
	for _, c := range list {
		ids = append(ids, c.ID)
	}
	return ids
}

// waitHostFile waits until the host file reads want.
func waitHostFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(path); string(b) == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(path)
	t.Fatalf("%s holds %q, want %q", path, b, want)
}

// waitConflict waits until name's sync reports a conflict at path and
// returns where the sandbox's version went.
func waitConflict(t *testing.T, name, path string) string {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		var st struct {
			Conflicts []struct {
				Path string `json:"path"`
				Copy string `json:"copy"`
			} `json:"conflicts"`
		}
		if err := json.Unmarshal([]byte(must(t, "sync", "status", name, "--json").stdout), &st); err == nil {
			for _, c := range st.Conflicts {
				if c.Path == path {
					return c.Copy
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%s reports no conflict at %s", name, path)
	return ""
}

func readHostFile(t *testing.T, dir, rel string) string {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(dir, rel))
	return string(b)
}

// readHostDir is every regular file in dir, by relative path.
func readHostDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			b, _ := os.ReadFile(p)
			out[rel] = string(b)
		}
		return nil
	})
	return out
}
