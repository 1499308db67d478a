package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
)

var (
	forkN    = flag.Int("forks", 4, "bench fork: how many forks (and independent sandboxes beside them)")
	forkMem  = flag.String("fork-memory", "2G", "bench fork: the sandboxes' memory")
	forkFill = flag.Int("fork-fill", 768, "bench fork: MiB of data the source holds in memory when it is forked (its warm state)")
)

// forkFillCmd fills n MiB of the guest's memory with data (not zeros, which
// the host's copies skip): the state an agent's installs and caches leave,
// kept in /dev/shm. A random line of 3 KiB repeated (the guest's
// /dev/urandom makes a few MiB a second under TCG, and a process per MiB
// costs more); nothing on the host merges alike pages, and the line's
// length puts it differently in every page.
func forkFillCmd(mib int) string {
	return fmt.Sprintf(`yes "$(head -c 2304 /dev/urandom | base64 -w0)" | head -c %dM > /dev/shm/warm && sync`, mib)
}

// benchFork: 'kosa8 fork -n N' of a sandbox holding a warm state, to all
// N forks running, beside N 'kosa8 run -d' of the same image, one 'start
// --from' and N at once of sandboxes with the same state; then the host
// memory of the N idle forks beside N independent sandboxes with the same
// state (each made it itself: N setups). Same run, same host; the RAM is
// shared copy-on-write where the QEMU can (8.2+), else copied
// (KOSA8_FORK_RAM=copy forces that: run it twice to compare).
func benchFork() {
	_, cleanup := setupHome()
	defer cleanup()
	paths, err := sandbox.DefaultPaths()
	must(err)
	accel := hostAccel()
	a := string(accel)
	n := *forkN
	mapped := "copied into each fork's memory"
	if d, err := qemu.New(qemu.Config{}); err == nil && d.CanMapRAMTemplate() && os.Getenv("KOSA8_FORK_RAM") != "copy" {
		mapped = "mapped copy-on-write, shared"
	}
	var rows []row

	fmt.Fprintf(os.Stderr, "the source: %s, %d MiB of warm state...\n", *forkMem, *forkFill)
	kosa8("create", "src", "--no-workspace", "--memory", *forkMem)
	kosa8("start", "src")
	kosa8("exec", "src", "--", "sh", "-c", forkFillCmd(*forkFill))
	time.Sleep(3 * time.Second)

	fmt.Fprintf(os.Stderr, "kosa8 fork -n %d...\n", n)
	t0 := time.Now()
	kosa8("fork", "src", "-n", strconv.Itoa(n))
	forkWall := time.Since(t0)
	cp := open(paths, "src.1").Config.Fork.Checkpoint
	var cps struct {
		List []struct {
			ID    string  `json:"id"`
			Pause float64 `json:"pause_ms"`
			Total float64 `json:"total_ms"`
		} `json:"checkpoints"`
	}
	must(json.Unmarshal([]byte(kosa8("checkpoints", "src", "--json")), &cps))
	var pause, cpTotal float64
	for _, c := range cps.List {
		if c.ID == cp {
			pause, cpTotal = c.Pause, c.Total
		}
	}
	time.Sleep(10 * time.Second) // idle
	var forks []string
	for i := 1; i <= n; i++ {
		forks = append(forks, fmt.Sprintf("src.%d", i))
	}
	forkMemUse := sandboxesMem(paths, forks)
	// Gone before the independent ones start: this host's memory is
	// shared with other work.
	for _, f := range forks {
		kosa8("rm", "-f", f)
	}
	kosa8("stop", "src")

	fmt.Fprintf(os.Stderr, "%d kosa8 run -d at once...\n", n)
	var indep []string
	for i := 1; i <= n; i++ {
		indep = append(indep, fmt.Sprintf("ind%d", i))
	}
	runWall := all(indep, func(name string) { kosa8("run", "-d", "--name", name, "--no-workspace", "--memory", *forkMem) })
	fmt.Fprintf(os.Stderr, "the same warm state in each...\n")
	all(indep, func(name string) { kosa8("exec", name, "--", "sh", "-c", forkFillCmd(*forkFill)) })
	time.Sleep(10 * time.Second)
	indepMem := sandboxesMem(paths, indep)

	fmt.Fprintf(os.Stderr, "start --from: one, then %d at once...\n", n)
	all(indep, func(name string) { kosa8("checkpoint", name); kosa8("stop", name) })
	t1 := time.Now()
	kosa8("start", "--from", "latest", indep[0])
	oneFrom := time.Since(t1)
	kosa8("stop", indep[0])
	nFrom := all(indep, func(name string) { kosa8("start", "--from", "latest", name) })
	for _, name := range indep {
		kosa8("rm", "-f", name)
	}

	rows = append(rows,
		row{fmt.Sprintf("kosa8 fork -n %d: to all %d running", n, n), ms(forkWall), a,
			fmt.Sprintf("%.2fx one start --from, %.2fx %d at once; the checkpoint %.0f ms of it, the source paused %.0f ms; RAM %s", ratioF(forkWall, oneFrom), ratioF(forkWall, nFrom), n, cpTotal, pause, mapped)},
		row{fmt.Sprintf("%d kosa8 run -d at once: to all running", n), ms(runWall), a, "new sandboxes of the same image (from its boot template), without the source's state"},
		row{"kosa8 start --from latest: one", ms(oneFrom), a, "baseline"},
		row{fmt.Sprintf("kosa8 start --from latest: %d at once", n), ms(nFrom), a, fmt.Sprintf("%.2fx one", ratioF(nFrom, oneFrom))},
		row{fmt.Sprintf("host memory, %d idle forks", n), mib(forkMemUse.total()), a,
			fmt.Sprintf("%.2fx the independent sandboxes; %s", float64(forkMemUse.total())/float64(indepMem.total()), forkMemUse)},
		row{fmt.Sprintf("host memory, %d independent idle sandboxes, same state", n), mib(indepMem.total()), a, indepMem.String()},
	)
	printTable(fmt.Sprintf("kosa8 fork: %s sandbox, %d MiB of warm state", *forkMem, *forkFill), rows, accel)
}

func ratioF(a, b time.Duration) float64 { return float64(a) / float64(b) }

func mib(kib int) string { return fmt.Sprintf("%d MiB", kib>>10) }

// all runs f for each name at once and returns the time until all ended.
func all(names []string, f func(string)) time.Duration {
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() { defer wg.Done(); f(name) }()
	}
	wg.Wait()
	return time.Since(t0)
}

// groupMem is the host memory some sandboxes take (KiB): their guest RAM
// files in shared memory, whole (what the host cannot reclaim, mapped by
// QEMU or not: a fork's copy is written into its file, not through
// QEMU's mapping, so QEMU's PSS leaves most of it out), and their QEMUs'
// and supervisors' proportional set sizes beside it (a page mapped by k
// processes counts 1/k in each: the checkpoint's pages forks map are
// counted once over all of them).
type groupMem struct {
	ram, qemu, supervisor int
}

func (g groupMem) total() int { return g.ram + g.qemu + g.supervisor }

func (g groupMem) String() string {
	return fmt.Sprintf("guest RAM files %d MiB, QEMU beside them (PSS) %d MiB, supervisors %d MiB", g.ram>>10, g.qemu>>10, g.supervisor>>10)
}

func sandboxesMem(paths sandbox.Paths, names []string) groupMem {
	var g groupMem
	for _, name := range names {
		st := open(paths, name).Status()
		q := pss(st.QEMUPID)
		g.ram += shmFilesKiB(st.QEMUPID)
		g.qemu += q.pss - q.shmem
		g.supervisor += pss(st.SupervisorPID).pss
	}
	return g
}

// shmFilesKiB is what the files in /dev/shm that process pid holds open
// (its guest RAM file, unlinked) take, in KiB.
func shmFilesKiB(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	var kib int
	for _, e := range ents {
		p := fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())
		if l, err := os.Readlink(p); err != nil || !strings.HasPrefix(l, "/dev/shm/") {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil {
			kib += int(st.Blocks / 2)
		}
	}
	return kib
}

type pssUse struct{ pss, shmem int } // KiB

// pss reads a process's proportional set size and its shared memory
// (smaps_rollup).
func pss(pid int) pssUse {
	p, shmem := procKiB(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss:", "Pss_Shmem:")
	return pssUse{p, shmem}
}
