package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/supervisor"
)

var cpParts = flag.String("cp", "sizes,incremental", "bench cp: which parts to run (sizes: the checkpoint and rewind per size against plain migrate; incremental: a 2 GiB guest's checkpoint after 64 MiB of writes, ten back to back, and the verifier)")

func kosa8JSON(v any, args ...string) {
	out := kosa8(args...)
	// kosa8 prints notices on stderr; CombinedOutput mixes them in.
	if i := strings.Index(out, "{"); i > 0 {
		out = out[i:]
	}
	must(json.Unmarshal([]byte(out), v))
}

func plainMigrate(name string) api.PlainMigrate {
	out, err := exec.Command("sh", "-c", fmt.Sprintf("curl -s -X POST --unix-socket %s http://kosa8/v1/debug/plain-migrate", filepath.Join(os.Getenv("KOSA8_HOME"), "sandboxes", name, sandbox.APISocket))).Output()
	must(err)
	var r api.PlainMigrate
	must(json.Unmarshal(out, &r))
	return r
}

type cpOut struct {
	ID             string             `json:"id"`
	PauseMillis    float64            `json:"pause_ms"`
	TotalMillis    float64            `json:"total_ms"`
	PauseSteps     map[string]float64 `json:"pause_steps_ms"`
	RAMBytes       int64              `json:"ram_bytes"`
	Incremental    bool               `json:"incremental"`
	RAMCopiedBytes int64              `json:"ram_copied_bytes"`
	FullCopyReason string             `json:"full_copy_reason"`
	Verify         string             `json:"verify"`
}

type rwOut struct {
	Millis float64 `json:"ms"`
	Saved  cpOut   `json:"saved"`
}

// parts says where a rewind's time went: saving the state before (the
// new machine starts meanwhile), then the rest.
func (r rwOut) parts() string {
	return fmt.Sprintf("the state before saved in %.0f ms, the machine running %.0f ms later", r.Saved.TotalMillis, r.Millis-r.Saved.TotalMillis)
}

func benchCP() {
	_, cleanup := setupHome()
	defer cleanup()
	var rows []row
	if strings.Contains(*cpParts, "sizes") {
		rows = append(rows, benchCPSizes()...)
	}
	if strings.Contains(*cpParts, "incremental") {
		rows = append(rows, benchCPIncremental()...)
	}
	printTable("kosa8 checkpoints", rows, hostAccel())
}

// how describes how a checkpoint's RAM was saved.
func (c cpOut) how() string {
	s := fmt.Sprintf("%d MiB stored, %d MiB copied in the pause", c.RAMBytes>>20, c.RAMCopiedBytes>>20)
	if c.Incremental {
		s += ", incremental"
	} else {
		s += ", full copy: " + c.FullCopyReason
	}
	if c.Verify != "" {
		s += ", verifier: " + c.Verify
	}
	return s + "; " + c.steps()
}

// steps is where the pause went.
func (c cpOut) steps() string {
	var parts []string
	for _, k := range []string{"stop", "disks", "devices", "ram", "resume"} {
		if ms, ok := c.PauseSteps[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, ms))
		}
	}
	return "pause: " + strings.Join(parts, ", ") + " ms"
}

// benchCPIncremental: a 2 GiB guest, about half touched, checkpointed,
// then 64 MiB written and checkpointed again; ten more checkpoints a
// second apart after small writes; the rewind; then the same first two
// steps with the verifier on.
func benchCPIncremental() []row {
	accel := string(hostAccel())
	var rows []row
	for _, verify := range []bool{false, true} {
		name := "bench-cp-inc"
		label := "2 GiB, ~half touched"
		if verify {
			name += "-verify"
			label += ", verifier on"
			os.Setenv(supervisor.EnvVerifyCheckpoints, "1")
		}
		fmt.Fprintf(os.Stderr, "incremental: %s...\n", label)
		kosa8("create", name, "--no-workspace", "--memory", "2048M")
		kosa8("start", name)
		os.Unsetenv(supervisor.EnvVerifyCheckpoints)
		// Filled by repeating a random MiB: what the pause copies does not
		// depend on the bytes, and random data is slow to make under TCG.
		kosa8("exec", "-u", "root", name, "--", "sh", "-c", "dd if=/dev/urandom of=/root/r bs=1M count=1 status=none && for i in $(seq 904); do cat /root/r; done > /dev/shm/fill")
		var c1, c2 cpOut
		kosa8JSON(&c1, "checkpoint", name, "--json")
		// The spares are brought up to the first checkpoint meanwhile,
		// as they would be while an agent works.
		time.Sleep(15 * time.Second)
		kosa8("exec", "-u", "root", name, "--", "sh", "-c", "for i in $(seq 64); do cat /root/r; done > /dev/shm/w64")
		kosa8JSON(&c2, "checkpoint", name, "--json")
		rows = append(rows,
			row{label + ": first checkpoint, pause", fmt.Sprintf("%.0f ms", c1.PauseMillis), accel, c1.how()},
			row{label + ": after 64 MiB written, pause", fmt.Sprintf("%.0f ms", c2.PauseMillis), accel, c2.how()},
		)
		if verify {
			kosa8("rm", "-f", name)
			continue
		}
		var pauses, disks []float64
		full := 0
		reasons := map[string]int{}
		for i := 0; i < 10; i++ {
			// The same file each time: the guest's /dev/shm holds half its
			// RAM, most of it filled above.
			kosa8("exec", "-u", "root", name, "--", "sh", "-c", fmt.Sprintf("for i in 1 2 3 4; do cat /root/r; done > /dev/shm/small # %d", i))
			time.Sleep(time.Second)
			var c cpOut
			kosa8JSON(&c, "checkpoint", name, "--json")
			pauses = append(pauses, c.PauseMillis)
			disks = append(disks, c.PauseSteps["disks"])
			if !c.Incremental {
				full++
				reasons[c.FullCopyReason]++
			}
		}
		slices.Sort(pauses)
		slices.Sort(disks)
		note := fmt.Sprintf("each after 4 MiB written, 1 s apart; disk snapshots %.0f / %.0f / %.0f ms; %d full copies", disks[0], (disks[4]+disks[5])/2, disks[9], full)
		for r, n := range reasons {
			note += fmt.Sprintf(" (%dx %s)", n, r)
		}
		rows = append(rows, row{label + ": 10 checkpoints back to back, pause min/median/max",
			fmt.Sprintf("%.0f / %.0f / %.0f ms", pauses[0], (pauses[4]+pauses[5])/2, pauses[9]), accel, note})
		var rw rwOut
		kosa8JSON(&rw, "rewind", name, c1.ID, "--json")
		rows = append(rows, row{label + ": rewind, to running", fmt.Sprintf("%.0f ms", rw.Millis), accel,
			"to the first checkpoint: its RAM copied over the RAM kept ready for the last one; " + rw.parts()})
		kosa8("rm", "-f", name)
	}
	return rows
}

func benchCPSizes() []row {
	accel := string(hostAccel())
	var rows []row
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
		var cp, cp2 cpOut
		kosa8JSON(&cp, "checkpoint", name, "--json")
		base := plainMigrate(name)
		// A second checkpoint: RAM is prepared for the last one only, so
		// the first rewind (to cp) copies; after it cp's RAM is prepared
		// again in the background, and the second rewind, a few seconds
		// on, finds it.
		kosa8JSON(&cp2, "checkpoint", name, "--json")
		var copied, prepared rwOut
		kosa8JSON(&copied, "rewind", name, cp.ID, "--json")
		time.Sleep(5 * time.Second)
		kosa8JSON(&prepared, "rewind", name, cp.ID, "--json")
		rows = append(rows,
			row{c.label + ": plain QEMU migrate, pause", fmt.Sprintf("%.0f ms", base.PauseMillis), accel, fmt.Sprintf("baseline; %d MiB stream", base.Bytes>>20)},
			row{c.label + ": kosa8 checkpoint, pause", fmt.Sprintf("%.0f ms", cp.PauseMillis), accel, fmt.Sprintf("%.1fx less than plain migrate; %d MiB of RAM copied; %s", base.PauseMillis/cp.PauseMillis, cp.RAMBytes>>20, cp.steps())},
			row{c.label + ": kosa8 checkpoint, total", fmt.Sprintf("%.0f ms", cp.TotalMillis), accel, ""},
			row{c.label + ": kosa8 rewind, to running, RAM copied", fmt.Sprintf("%.0f ms", copied.Millis), accel,
				"to an older checkpoint: its RAM copied over the RAM kept ready for the last one; " + copied.parts()},
			row{c.label + ": kosa8 rewind, to running, RAM prepared", fmt.Sprintf("%.0f ms", prepared.Millis), accel,
				"to the same one again, 5 s later: its RAM prepared in the background; " + prepared.parts()},
		)
		kosa8("rm", "-f", name)
	}
	return rows
}
