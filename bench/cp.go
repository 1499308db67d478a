package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kosa8/kosa8/internal/sandbox"
)

func kosa8JSON(v any, args ...string) {
	out := kosa8(args...)
	// kosa8 prints notices on stderr; CombinedOutput mixes them in.
	if i := strings.Index(out, "{"); i > 0 {
		out = out[i:]
	}
	must(json.Unmarshal([]byte(out), v))
}

func plainMigrate(name string) sandbox.PlainMigrate {
	out, err := exec.Command("sh", "-c", fmt.Sprintf("curl -s -X POST --unix-socket %s http://kosa8/v1/debug/plain-migrate", filepath.Join(os.Getenv("KOSA8_HOME"), "sandboxes", name, sandbox.APISocket))).Output()
	must(err)
	var r sandbox.PlainMigrate
	must(json.Unmarshal(out, &r))
	return r
}

func benchCP() {
	_, cleanup := setupHome()
	defer cleanup()
	accel := string(hostAccel())
	var rows []row
	type cpOut struct {
		ID          string  `json:"id"`
		PauseMillis float64 `json:"pause_ms"`
		TotalMillis float64 `json:"total_ms"`
		RAMBytes    int64   `json:"ram_bytes"`
	}
	type rwOut struct {
		Millis float64 `json:"ms"`
		Saved  cpOut   `json:"saved"`
	}
	cases := []struct {
		mem   int
		fill  string
		label string
	}{
		{512, "half", "512 MiB, ~half touched"},
		{1024, "half", "1 GiB, ~half touched"},
		{2048, "half", "2 GiB, ~half touched"},
		{1024, "cache", "1 GiB, page cache filled"},
	}
	for _, c := range cases {
		name := fmt.Sprintf("bench-cp-%d-%s", c.mem, c.fill)
		fmt.Fprintf(os.Stderr, "%s...\n", c.label)
		kosa8("create", name, "--no-workspace", "--memory", fmt.Sprintf("%dM", c.mem))
		kosa8("start", name)
		var fill string
		if c.fill == "half" {
			fill = fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/fill bs=1M count=%d status=none", c.mem/2-120)
		} else {
			fill = fmt.Sprintf("dd if=/dev/urandom of=/tmp/big bs=1M count=%d status=none && cat /tmp/big > /dev/null", c.mem*3/4)
		}
		kosa8("exec", "-u", "root", name, "--", "sh", "-c", fill)
		var cp cpOut
		kosa8JSON(&cp, "checkpoint", name, "--json")
		base := plainMigrate(name)
		var rw rwOut
		kosa8JSON(&rw, "rewind", name, cp.ID, "--json")
		restore := rw.Millis - rw.Saved.TotalMillis
		rows = append(rows,
			row{c.label + ": plain QEMU migrate, pause", fmt.Sprintf("%.0f ms", base.PauseMillis), accel, fmt.Sprintf("baseline; %d MiB stream", base.Bytes>>20)},
			row{c.label + ": kosa8 checkpoint, pause", fmt.Sprintf("%.0f ms", cp.PauseMillis), accel, fmt.Sprintf("%.1fx less than plain migrate; %d MiB of RAM copied", base.PauseMillis/cp.PauseMillis, cp.RAMBytes>>20)},
			row{c.label + ": kosa8 checkpoint, total", fmt.Sprintf("%.0f ms", cp.TotalMillis), accel, ""},
			row{c.label + ": kosa8 rewind, restore to running", fmt.Sprintf("%.0f ms", restore), accel, fmt.Sprintf("after saving the state before (%.0f ms)", rw.Saved.TotalMillis)},
		)
		kosa8("rm", "-f", name)
	}
	printTable("kosa8 checkpoints", rows, hostAccel())
}
