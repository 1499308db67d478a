package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLogsReadable: 'kosa8 logs' prints the console as a person reads it:
// no line ends in "?" (the serial console's carriage return, shown by the
// terminal filter), and a sandbox started from a boot template shows none
// of the lines that template's guest wrote before the sandbox existed.
func TestLogsReadable(t *testing.T) {
	cache := privateCache(t) // no template of any shape yet
	env := []string{"KOSA8_CACHE=" + cache}
	k := func(args ...string) result {
		t.Helper()
		r := runEnv(t, env, 3*time.Minute, args...)
		if r.code != 0 {
			t.Fatalf("kosa8 %v:\n%s", args, r)
		}
		return r
	}
	// The first boot of its shape makes a template (published in the
	// background); the next sandbox of that shape starts from it.
	t.Cleanup(func() { runEnv(t, env, time.Minute, "rm", "-f", "logs-first", "logs-next") })
	k("run", "--name", "logs-first", "--no-workspace", "--", "true")
	deadline := time.Now().Add(time.Minute)
	for {
		if tpls, _ := filepath.Glob(filepath.Join(cache, "templates", "*", "*")); len(tpls) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no boot template was made in a minute")
		}
		time.Sleep(time.Second)
	}
	k("run", "--name", "logs-next", "--no-workspace", "--", "echo", "hello-console")
	var info []struct {
		Dir    string `json:"dir"`
		Config struct {
			Created time.Time `json:"created"`
		} `json:"config"`
		Status struct {
			Template string `json:"template"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(k("inspect", "logs-next").stdout), &info); err != nil || len(info) != 1 {
		t.Fatalf("inspect: %v", err)
	}
	next := info[0]
	if next.Status.Template == "" {
		t.Logf("logs-next booted instead of starting from the template: its logs:")
		printLogs(next.Dir)
		t.Fatal("logs-next did not start from the template logs-first made")
	}
	for _, name := range []string{"logs-first", "logs-next"} {
		out := k("logs", name).stdout
		if !strings.Contains(out, "power off") {
			t.Fatalf("kosa8 logs %s lacks the guest's last lines:\n%s", name, out)
		}
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			if strings.HasSuffix(l, "?") || strings.Contains(l, "\r") {
				t.Fatalf("kosa8 logs %s: a line ends in '?' or a carriage return: %q", name, l)
			}
		}
	}
	// Lines stamped before logs-next existed: in its console.log (when the
	// template's guest had some left to send), never in 'kosa8 logs'.
	stale := func(text string) (n int) {
		for _, l := range strings.Split(text, "\n") {
			stamp, ok := strings.CutPrefix(l, "time=")
			if !ok {
				continue
			}
			stamp, _, _ = strings.Cut(stamp, " ")
			if ts, err := time.Parse(time.RFC3339Nano, stamp); err == nil && ts.Before(next.Config.Created.Add(-time.Second)) {
				n++
			}
		}
		return n
	}
	raw, _ := os.ReadFile(filepath.Join(next.Dir, "console.log"))
	if n := stale(k("logs", "logs-next").stdout); n > 0 {
		t.Fatalf("kosa8 logs logs-next shows %d lines from before it was created", n)
	}
	t.Logf("console.log of logs-next holds %d lines from before it existed; kosa8 logs shows none", stale(string(raw)))
}
