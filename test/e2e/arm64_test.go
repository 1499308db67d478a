package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// An arm64 guest on this (x86-64) host: emulated by TCG, from the image
// 'kosa8 setup --arch arm64' (make setup-arm64) builds. A host without
// that QEMU or that image skips these tests, saying which is missing: the
// arm64 image takes long enough to build that it is not part of 'make
// setup'.

// armTimeout bounds one kosa8 command on an emulated arm64 guest: a boot
// took 5 s here, but every instruction is translated and python3 or a
// rewind take many times longer than on the host's own guests.
const armTimeout = 10 * time.Minute

func requireARM64(t *testing.T) {
	t.Helper()
	if runtime.GOARCH == "arm64" {
		t.Skip("the host is arm64: its own guests are the ones every other test boots")
	}
	if _, err := exec.LookPath("qemu-system-aarch64"); err != nil {
		t.Skip("qemu-system-aarch64 is not installed (Debian: apt-get install qemu-system-arm): arm64 guests not tested")
	}
	var imgs []struct {
		Recipe struct {
			Arch string `json:"arch"`
		} `json:"recipe"`
		Derived json.RawMessage `json:"derived"`
	}
	r := must(t, "image", "ls", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &imgs); err != nil {
		t.Fatalf("image ls --json: %v: %q", err, r.stdout)
	}
	for _, img := range imgs {
		if img.Recipe.Arch == "arm64" && len(img.Derived) == 0 {
			return
		}
	}
	t.Skip("no arm64 guest image in " + imageCache(t) + ": run 'make setup-arm64' (kosa8 setup --arch arm64) to test arm64 guests")
}

// TestARM64Run: 'kosa8 run --arch arm64' runs the command on an aarch64
// kernel, and says the guest is emulated.
func TestARM64Run(t *testing.T) {
	requireARM64(t)
	start := time.Now()
	r := invocation{timeout: armTimeout}.run(t, "run", "--rm", "--arch", "arm64", "--", "uname", "-m")
	if r.code != 0 || r.stdout != "aarch64\n" {
		t.Fatalf("run --arch arm64 -- uname -m:\n%s", r)
	}
	t.Logf("arm64 run --rm -- uname -m: %s", time.Since(start).Round(100*time.Millisecond))
	if !strings.Contains(r.stderr, "emulat") && !strings.Contains(r.stderr, "tcg") {
		t.Errorf("no word that the guest is emulated: %q", r.stderr)
	}
	// KOSA8_ARCH chooses it too.
	r = invocation{timeout: armTimeout, env: []string{"KOSA8_ARCH=aarch64"}}.run(t, "run", "--rm", "--no-workspace", "--", "sh", "-c", "uname -m; dpkg --print-architecture; dpkg --audit && echo configured")
	if r.code != 0 || r.stdout != "aarch64\narm64\nconfigured\n" {
		t.Fatalf("KOSA8_ARCH=aarch64 run:\n%s", r)
	}
}

// TestARM64ExecAndCheckpoint: a running arm64 sandbox answers exec with
// stdin and exit status, syncs its workspace both ways, and is
// checkpointed and rewound with a process's memory.
func TestARM64ExecAndCheckpoint(t *testing.T) {
	requireARM64(t)
	ws, _ := os.MkdirTemp(home, "arm64-ws-")
	os.WriteFile(filepath.Join(ws, "from-host.txt"), []byte("host side\n"), 0o644)
	name := "arm"
	in := invocation{timeout: armTimeout}
	if r := in.run(t, "create", name, "--arch", "arm64", "--workspace", ws); r.code != 0 {
		t.Fatalf("create:\n%s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	start := time.Now()
	if r := in.run(t, "start", name); r.code != 0 {
		t.Fatalf("start:\n%s", r)
	}
	t.Logf("arm64 start: %s", time.Since(start).Round(100*time.Millisecond))
	if e := ls(t)[name]; e.Status.Accel != "tcg" {
		t.Errorf("accel %q, want tcg", e.Status.Accel)
	}

	r := invocation{timeout: armTimeout, stdin: "through stdin\n"}.run(t, "exec", "-i", name, "--", "sh", "-c", "cat; cat from-host.txt; uname -m; exit 7")
	if r.code != 7 || r.stdout != "through stdin\nhost side\naarch64\n" {
		t.Fatalf("exec round trip:\n%s", r)
	}
	must(t, "exec", name, "--", "sh", "-c", "echo guest side > from-guest.txt")
	waitHost(t, "from-guest.txt", fileIs(filepath.Join(ws, "from-guest.txt"), "guest side\n"))

	startCounter(t, name)
	c1 := checkpointNow(t, name, "arm64")
	t.Logf("arm64 checkpoint %s paused %.0f ms", c1.ID, c1.PauseMillis)
	atC1 := count(t, name)
	must(t, "exec", name, "--", "sh", "-c", "pkill -USR1 -f 'count[.]tmp' && echo after > after.txt")
	markIs(t, name, "after")
	waitHost(t, "after.txt", fileIs(filepath.Join(ws, "after.txt"), "after\n"))

	if r := in.run(t, "rewind", name, c1.ID); r.code != 0 {
		t.Fatalf("rewind:\n%s", r)
	}
	markIs(t, name, "before")
	if n := count(t, name); n < atC1-2 {
		t.Fatalf("after the rewind the counter is %d: want it to go on from about %d", n, atC1)
	}
	r = must(t, "exec", name, "--", "sh", "-c", "ls; uname -m")
	if strings.Contains(r.stdout, "after.txt") || !strings.Contains(r.stdout, "aarch64") {
		t.Fatalf("inside after rewind: %q", r.stdout)
	}
	waitHost(t, "after.txt gone from the host", gone(filepath.Join(ws, "after.txt")))
}
