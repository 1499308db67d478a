package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
)

var memTB = flag.String("tb", "1024,256,128,64", "bench mem: TCG translation cache sizes to compare, in MiB (1024 is QEMU's default)")

// memWorkload runs new code in the guest, as an agent's commands do: the
// translation cache grows with every program the guest has not run yet.
const memWorkload = `for d in /usr/bin /usr/lib /etc; do ls -lR $d > /dev/null 2>&1; done; ` +
	`python3 -c 'import json, ssl, sqlite3, email, http.client, xml.dom.minidom, decimal, asyncio'; ` +
	`tar -cf - /usr/share/doc 2>/dev/null | gzip -1 | wc -c > /dev/null; apt-cache policy > /dev/null 2>&1; ` +
	`printf 'int main(void){return 0;}' > /tmp/m.c && gcc -O2 /tmp/m.c -o /tmp/m; ` +
	`node -e "require('http'); require('crypto').createHash('sha256').update(JSON.stringify(Array.from({length: 1e5}, (_, i) => i))).digest('hex')"; ` +
	`git --version > /dev/null; true`

// benchMem: an idle sandbox's host memory beyond its guest RAM, by
// component (supervisor, QEMU's own, TCG's translation cache), after a
// workload of new code, for each translation cache size, same run.
func benchMem() {
	_, cleanup := setupHome()
	defer cleanup()
	paths, err := sandbox.DefaultPaths()
	must(err)
	accel := hostAccel()
	var rows []row
	for _, f := range strings.Split(*memTB, ",") {
		tb, err := strconv.Atoi(strings.TrimSpace(f))
		must(err)
		name := fmt.Sprintf("bench-mem-%d", tb)
		fmt.Fprintf(os.Stderr, "tb-size %d MiB...\n", tb)
		os.Setenv(qemu.TBSizeEnv, strconv.Itoa(tb))
		kosa8("create", name, "--no-workspace", "--memory", "1024M")
		kosa8("start", name)
		os.Unsetenv(qemu.TBSizeEnv)
		t0 := time.Now()
		for i := 0; i < 3; i++ {
			kosa8("exec", "-u", "root", name, "--", "sh", "-c", memWorkload)
		}
		work := time.Since(t0)
		// The same again: what a cache too small to hold it translates anew.
		t1 := time.Now()
		kosa8("exec", "-u", "root", name, "--", "sh", "-c", memWorkload)
		again := time.Since(t1)
		time.Sleep(3 * time.Second)
		st := open(paths, name).Status()
		sup := procMem(st.SupervisorPID)
		q := procMem(st.QEMUPID)
		own := q.rss - q.shmem - q.jit
		rows = append(rows,
			row{fmt.Sprintf("tb-size %d MiB: host memory beyond guest RAM", tb), fmt.Sprintf("%d MiB", (sup.rss+q.rss-q.shmem)>>10), string(accel),
				fmt.Sprintf("supervisor %d MiB, QEMU's own %d MiB, TCG translation cache %d MiB; guest RAM in use %d of 1024 MiB", sup.rss>>10, own>>10, q.jit>>10, q.shmem>>10)},
			row{fmt.Sprintf("tb-size %d MiB: workload, 3 runs / once more", tb), fmt.Sprintf("%.1f / %.1f s", work.Seconds(), again.Seconds()), string(accel),
				"new programs each first run: ls -lR, python3 imports, tar|gzip, apt-cache, gcc -O2, node"},
		)
		kosa8("rm", "-f", name)
	}
	printTable("kosa8 memory, idle 1 GiB sandbox after a workload", rows, accel)
}

type memUse struct{ rss, shmem, jit int } // KiB

// procMem reads a process's resident memory: all of it and its shared
// memory (guest RAM) as rssKiB does, and TCG's code buffer: QEMU's
// executable anonymous mapping (or its "tcg-jit" memfd where QEMU splits
// writing from running).
func procMem(pid int) memUse {
	r := rssKiB(pid)
	m := memUse{rss: r.total, shmem: r.shmem}
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return m
	}
	defer f.Close()
	jit := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		if !strings.HasSuffix(fs[0], ":") { // a mapping's header line
			jit = strings.Contains(fs[1], "x") && (len(fs) < 6 || strings.Contains(fs[5], "tcg-jit"))
			continue
		}
		if jit && fs[0] == "Rss:" {
			v, _ := strconv.Atoi(fs[1])
			m.jit += v
		}
	}
	return m
}
