package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
)

var (
	soakN      = flag.Int("sandboxes", 6, "soak: sandboxes at once")
	soakMem    = flag.String("memory", "384M", "soak: memory of each sandbox")
	soakFor    = flag.Duration("duration", 10*time.Minute, "soak: how long each sandbox works")
	soakKill   = flag.Duration("kill-every", 0, "soak: kill -9 a random sandbox's supervisor this often, then start it again (0: never)")
	soakKeep   = 40 // files each sandbox keeps at the end; older ones it deletes
	soakScript = `import json, os, sys, time, urllib.request
i, url, until = sys.argv[1], sys.argv[2], time.time() + float(sys.argv[3])
os.makedirs("soak", exist_ok=True)
n = ok = fail = 0
errs = {}
while time.time() < until:
    n += 1
    d = "soak/d%d" % (n % 8)
    os.makedirs(d, exist_ok=True)
    with open("%s/f%d" % (d, n), "w") as f:
        f.write(("%s-%d\n" % (i, n)) * (1 + n % 300))
    old = n - KEEP
    if old > 0:
        os.remove("soak/d%d/f%d" % (old % 8, old))
    if n % 5 == 0:
        try:
            urllib.request.urlopen(url, timeout=10).read()
            ok += 1
        except Exception as e:
            fail += 1
            errs[type(e).__name__ + ": " + str(e)[:80]] = errs.get(type(e).__name__ + ": " + str(e)[:80], 0) + 1
    time.sleep(0.05)
print(json.dumps({"n": n, "ok": ok, "fail": fail, "errors": errs}))
`
)

// benchSoak runs as many sandboxes as asked at once, each writing and
// deleting files in its workspace and making allowed requests for the
// duration; then it counts, on the host, files lost or corrupted (must be
// 0) and sandboxes stuck (must be 0), with the supervisors' memory.
func benchSoak() {
	if *soakKill > 0 {
		benchSoakKills()
		return
	}
	home, cleanup := setupHome()
	defer cleanup()
	accel := hostAccel()
	var served atomic.Int64
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	must(err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		io.WriteString(w, "ok")
	})}
	go srv.Serve(l)
	defer srv.Close()
	port := l.Addr().(*net.TCPAddr).Port
	os.Setenv("KOSA8_NET_OVERRIDES", "soak.test=127.0.0.1")
	url := fmt.Sprintf("http://soak.test:%d/", port)

	type result struct {
		name                  string
		ws                    string
		n, ok, fail           int
		lost, corrupt, extra  int
		stuck                 string
		rssStart, rssEnd, rss int
		errors                map[string]int
	}
	results := make([]*result, *soakN)
	for i := range *soakN {
		r := &result{name: fmt.Sprintf("soak-%d", i), ws: filepath.Join(home, fmt.Sprintf("ws-%d", i))}
		results[i] = r
		must(os.MkdirAll(r.ws, 0o755))
		kosa8("create", r.name, "--workspace", r.ws, "--memory", *soakMem, "--allow", fmt.Sprintf("soak.test:%d", port))
	}
	fmt.Fprintf(os.Stderr, "starting %d sandboxes of %s...\n", *soakN, *soakMem)
	for _, r := range results {
		kosa8("start", r.name)
	}
	paths, err := sandbox.DefaultPaths()
	must(err)
	for _, r := range results {
		st := open(paths, r.name).Status()
		r.rssStart = rssKiB(st.SupervisorPID).total
		accel = vmm.Accel(st.Accel) // what they run under (a failed KVM falls back)
	}
	a := string(accel)
	fmt.Fprintf(os.Stderr, "soaking for %v...\n", *soakFor)
	script := strings.Replace(soakScript, "KEEP", fmt.Sprint(soakKeep), 1)
	var wg sync.WaitGroup
	for idx, r := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), *soakFor+3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(*binDir, "kosa8"), "exec", "-w", r.ws, r.name, "--",
				"python3", "-c", script, fmt.Sprint(idx), url, fmt.Sprint(soakFor.Seconds()))
			var errb strings.Builder
			cmd.Stderr = &errb
			out, err := cmd.Output()
			if ctx.Err() != nil {
				r.stuck = "the workload did not end 3 min after its time"
				return
			}
			if err != nil {
				r.stuck = fmt.Sprintf("the workload failed: %v: %.300s", err, errb.String())
				return
			}
			var res struct {
				N, Ok, Fail int
				Errors      map[string]int
			}
			if err := json.Unmarshal(out, &res); err != nil {
				r.stuck = fmt.Sprintf("workload output %q: %v", out, err)
				return
			}
			r.n, r.ok, r.fail, r.errors = res.N, res.Ok, res.Fail, res.Errors
		}()
	}
	wg.Wait()
	for idx, r := range results {
		if r.stuck != "" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := exec.CommandContext(ctx, filepath.Join(*binDir, "kosa8"), "sync", "now", r.name).Run()
		cancel()
		if err != nil {
			r.stuck = fmt.Sprintf("sync now: %v", err)
			continue
		}
		// What the host must hold: the last soakKeep files, each with its
		// exact content; none of the deleted ones.
		want := map[string]string{}
		for n := max(1, r.n-soakKeep+1); n <= r.n; n++ {
			want[fmt.Sprintf("soak/d%d/f%d", n%8, n)] = strings.Repeat(fmt.Sprintf("%d-%d\n", idx, n), 1+n%300)
		}
		for p, content := range want {
			b, err := os.ReadFile(filepath.Join(r.ws, p))
			switch {
			case err != nil:
				r.lost++
			case string(b) != content:
				r.corrupt++
			}
		}
		files, _ := filepath.Glob(filepath.Join(r.ws, "soak", "d*", "f*"))
		for _, f := range files {
			rel, _ := filepath.Rel(r.ws, f)
			if _, ok := want[filepath.ToSlash(rel)]; !ok {
				r.extra++
			}
		}
		st := open(paths, r.name).Status()
		r.rssEnd = rssKiB(st.SupervisorPID).total
	}
	for _, r := range results {
		kosa8("rm", "-f", r.name)
	}

	var rows []row
	var lost, stuck, writes, reqOK, reqFail int
	for _, r := range results {
		note := fmt.Sprintf("%d files written, %d requests ok, %d failed; supervisor RSS %d → %d MiB", r.n, r.ok, r.fail, r.rssStart>>10, r.rssEnd>>10)
		for e, n := range r.errors {
			note += fmt.Sprintf("; %d× %s", n, e)
		}
		value := fmt.Sprintf("lost %d, corrupt %d, left over %d", r.lost, r.corrupt, r.extra)
		if r.stuck != "" {
			value, note = "STUCK", r.stuck
			stuck++
		}
		rows = append(rows, row{r.name, value, a, note})
		lost += r.lost + r.corrupt + r.extra
		writes += r.n
		reqOK += r.ok
		reqFail += r.fail
	}
	rows = append(rows,
		row{"files lost or corrupted (must be 0)", fmt.Sprint(lost), a, fmt.Sprintf("of %d written in %v by %d sandboxes of %s", writes, *soakFor, *soakN, *soakMem)},
		row{"sandboxes stuck (must be 0)", fmt.Sprint(stuck), a, fmt.Sprintf("%d allowed requests ok, %d failed; upstream served %d", reqOK, reqFail, served.Load())},
	)
	printTable("soak: sandboxes writing, deleting and fetching at once", rows, accel)
	if lost > 0 || stuck > 0 {
		os.Exit(1)
	}
}

// The agent's workload of the soak with kills: files named by the run
// (epoch) that wrote them, so that a run started again after a crash
// never writes a name an earlier one used; each file's content is a
// function of its name.
const soakKillScript = `import os, sys, time
epoch, until = sys.argv[1], time.time() + float(sys.argv[2])
n = 0
while time.time() < until:
    n += 1
    d = "agent/e%s/d%d" % (epoch, n % 8)
    os.makedirs(d, exist_ok=True)
    with open("%s/f%d" % (d, n), "w") as f:
        f.write(("%s-%d\n" % (epoch, n)) * (1 + n % 300))
    if n > 40:
        os.remove("agent/e%s/d%d/f%d" % (epoch, (n - 40) % 8, n - 40))
    time.sleep(0.05)
`

// benchSoakKills is the soak with crashes (issue 27): while each sandbox's
// agent writes and deletes files and its user writes, edits and deletes
// files on the host, a random sandbox's supervisor is killed (QEMU dies
// with it) every -kill-every and started again. At the end, on the host:
// every file the user kept, byte for byte (lost and corrupted must be 0);
// every file of the agent's there with the content its name says
// (corrupted must be 0; the agent's unflushed work may die in a crash,
// leaving a file cut short, and a file the agent deleted may come back
// with a crash: both counted apart, as are the guest's versions kept
// beside the host's as conflicts).
func benchSoakKills() {
	home, cleanup := setupHome()
	defer cleanup()
	paths, err := sandbox.DefaultPaths()
	must(err)
	type box struct {
		name, ws string
		epoch    int
		work     *exec.Cmd
		kills    int

		mu      sync.Mutex
		user    map[string]string // the user's files as last written
		deleted map[string]bool   // the user's deletions
	}
	boxes := make([]*box, *soakN)
	for i := range boxes {
		b := &box{name: fmt.Sprintf("soakk-%d", i), ws: filepath.Join(home, fmt.Sprintf("ws-%d", i)), user: map[string]string{}, deleted: map[string]bool{}}
		boxes[i] = b
		must(os.MkdirAll(filepath.Join(b.ws, "user"), 0o755))
		kosa8("create", b.name, "--workspace", b.ws, "--memory", *soakMem)
	}
	fmt.Fprintf(os.Stderr, "starting %d sandboxes of %s...\n", *soakN, *soakMem)
	for _, b := range boxes {
		kosa8("start", b.name)
	}
	accel := vmm.Accel(open(paths, boxes[0].name).Status().Accel)
	end := time.Now().Add(*soakFor)
	work := func(b *box) {
		b.epoch++
		left := time.Until(end).Seconds()
		if left < 1 {
			return
		}
		b.work = exec.Command(filepath.Join(*binDir, "kosa8"), "exec", "-w", b.ws, b.name, "--",
			"python3", "-c", soakKillScript, fmt.Sprint(b.epoch), fmt.Sprint(left))
		must(b.work.Start())
	}
	for _, b := range boxes {
		work(b)
	}
	// The users: one write, edit or delete per sandbox every 200 ms.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, b := range boxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				rel := fmt.Sprintf("user/u%d.txt", (n*7+i)%97)
				b.mu.Lock()
				if n%5 == 4 {
					if os.Remove(filepath.Join(b.ws, rel)) == nil {
						delete(b.user, rel)
						b.deleted[rel] = true
					}
				} else {
					content := strings.Repeat(fmt.Sprintf("user %d %d\n", i, n), 1+n%50)
					if os.WriteFile(filepath.Join(b.ws, rel), []byte(content), 0o644) == nil {
						b.user[rel] = content
						delete(b.deleted, rel)
					}
				}
				b.mu.Unlock()
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "soaking for %v, killing a supervisor every %v...\n", *soakFor, *soakKill)
	stuck := map[string]string{}
	for k := 0; time.Until(end) > *soakKill/2; k++ {
		time.Sleep(min(*soakKill, time.Until(end)))
		b := boxes[k%len(boxes)]
		st := open(paths, b.name).Status()
		if st.SupervisorPID > 0 {
			syscall.Kill(st.SupervisorPID, syscall.SIGKILL)
		}
		b.work.Wait()
		for deadline := time.Now().Add(30 * time.Second); open(paths, b.name).Alive() && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
		b.kills++
		if out, err := exec.Command(filepath.Join(*binDir, "kosa8"), "start", b.name).CombinedOutput(); err != nil {
			stuck[b.name] = fmt.Sprintf("start after kill %d: %v: %.300s", b.kills, err, out)
			continue
		}
		work(b)
	}
	close(stop)
	wg.Wait()
	var rows []row
	var bad, kills int
	for _, b := range boxes {
		if b.work != nil {
			b.work.Wait()
		}
		kills += b.kills
		if why := stuck[b.name]; why != "" {
			rows = append(rows, row{b.name, "STUCK", string(accel), why})
			bad++
			continue
		}
		if out, err := exec.Command(filepath.Join(*binDir, "kosa8"), "sync", "now", b.name).CombinedOutput(); err != nil {
			rows = append(rows, row{b.name, "STUCK", string(accel), fmt.Sprintf("sync now: %v: %.300s", err, out)})
			bad++
			continue
		}
		var lost, corrupt, back, agentBad, agentFiles, agentCut, agentConflicts int
		for rel, want := range b.user {
			got, err := os.ReadFile(filepath.Join(b.ws, rel))
			switch {
			case err != nil:
				lost++
			case string(got) != want:
				corrupt++
			}
		}
		for rel := range b.deleted {
			if _, err := os.Stat(filepath.Join(b.ws, rel)); err == nil {
				back++
			}
		}
		files, _ := filepath.Glob(filepath.Join(b.ws, "agent", "e*", "d*", "f*"))
		for _, f := range files {
			if strings.Contains(filepath.Base(f), ".sandbox-conflict-") {
				// The guest's version of a file whose host copy is newer
				// than what the guest's disk kept after the crash: kept
				// beside it, by design (the host's is checked below).
				agentConflicts++
				continue
			}
			agentFiles++
			var epoch, n int
			rel, _ := filepath.Rel(b.ws, f)
			if _, err := fmt.Sscanf(filepath.ToSlash(rel), "agent/e%d/", &epoch); err != nil {
				agentBad++
				continue
			}
			fmt.Sscanf(filepath.Base(f), "f%d", &n)
			got, _ := os.ReadFile(f)
			want := strings.Repeat(fmt.Sprintf("%d-%d\n", epoch, n), 1+n%300)
			switch {
			case string(got) == want:
			case len(got) < len(want) && strings.HasPrefix(want, string(got)):
				// Cut short (empty, most often): the guest's unflushed
				// writes died with it, as on any machine's power cut;
				// the host holds what the guest's disk kept.
				agentCut++
			default:
				agentBad++
			}
		}
		bad += lost + corrupt + agentBad
		rows = append(rows, row{b.name, fmt.Sprintf("user files lost %d, corrupted %d; agent files corrupted %d", lost, corrupt, agentBad), string(accel),
			fmt.Sprintf("%d kills; %d user files kept, %d the user deleted came back; %d agent files on the host, %d cut short by a crash (unflushed in the guest), %d guest versions kept beside as conflicts",
				b.kills, len(b.user), back, agentFiles, agentCut, agentConflicts)})
	}
	for _, b := range boxes {
		kosa8("rm", "-f", b.name)
	}
	rows = append(rows, row{"files lost or corrupted, sandboxes stuck (must be 0)", fmt.Sprint(bad), string(accel),
		fmt.Sprintf("%d supervisors killed in %v across %d sandboxes of %s", kills, *soakFor, *soakN, *soakMem)})
	printTable("soak with kills: sandboxes writing and deleting while their supervisors are killed", rows, accel)
	if bad > 0 {
		os.Exit(1)
	}
}
