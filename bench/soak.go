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
	"time"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
)

var (
	soakN      = flag.Int("sandboxes", 6, "soak: sandboxes at once")
	soakMem    = flag.String("memory", "384M", "soak: memory of each sandbox")
	soakFor    = flag.Duration("duration", 10*time.Minute, "soak: how long each sandbox works")
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
