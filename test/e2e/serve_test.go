package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	asb "sigs.k8s.io/agent-sandbox/clients/go/sandbox"

	"github.com/kosa8/kosa8/internal/serve/servetest"
)

// servePod is one `kosa8 serve` run as a pod's container would run it: its
// state directory is the pod's volume (a folder kept between pods), its
// config directory a fresh memory-backed emptyDir, its secrets a mounted
// Secret's files.
type servePod struct {
	cmd    *exec.Cmd
	url    string
	log    *bytes.Buffer
	exited chan error
}

const serveToken = "e2e-serve-token-0123456789abcdef0123456789abcdef"

// startServePod starts serve on volume and waits (with progress) until
// its readiness probe answers, as a kubelet's would.
func startServePod(t *testing.T, volume, secretsDir, tokenFile string, extraEnv ...string) (*servePod, time.Duration) {
	t.Helper()
	port := freePort(t)
	cfg := t.TempDir() // the emptyDir of medium Memory: new for each pod
	cmd := exec.Command(filepath.Join(binDir, "kosa8"), "serve",
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--name", "e2e-serve",
		"--token-file", tokenFile, "--allow", "example.org", "--memory", "1G")
	cmd.Env = append(os.Environ(), "KOSA8_HOME="+volume, "KOSA8_CONFIG="+cfg, "KOSA8_SECRET_BACKEND=file",
		"KOSA8_SECRETS_DIR="+secretsDir, "KOSA8_SECRET_TEST_KEY_HOSTS=api.example.com")
	cmd.Env = append(cmd.Env, extraEnv...)
	p := &servePod{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d", port), log: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			fmt.Fprintf(os.Stderr, "---- kosa8 serve's log\n%s\n----\n", p.log.String())
			dirs, _ := filepath.Glob(filepath.Join(volume, "sandboxes", "*"))
			for _, d := range dirs {
				printLogs(d)
			}
		}
	})
	deadline := time.Now().Add(4 * time.Minute)
	next := time.Now().Add(3 * time.Second)
	for {
		resp, err := http.Get(p.url + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, time.Since(start)
			}
		}
		select {
		case err := <-p.exited:
			t.Fatalf("kosa8 serve exited before it was ready: %v\n%s", err, p.log.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(next) {
			t.Logf("waiting for serve's readiness probe (%s)", time.Since(start).Round(time.Second))
			next = time.Now().Add(10 * time.Second)
		}
		if time.Now().After(deadline) {
			t.Fatalf("kosa8 serve not ready after %s\n%s", time.Since(start), p.log.String())
		}
	}
}

// term sends SIGTERM as the kubelet does when the Sandbox is suspended,
// and waits for serve to end.
func (p *servePod) term(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("kosa8 serve ended with %v after SIGTERM\n%s", err, p.log.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("kosa8 serve still runs 3 minutes after SIGTERM\n%s", p.log.String())
	}
	return time.Since(start)
}

func runOK(t *testing.T, sb *asb.Sandbox, command string) string {
	t.Helper()
	res, err := sb.Run(context.Background(), command)
	if err != nil {
		t.Fatalf("run %q: %v", command, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("run %q: exit %d: %s", command, res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

func rulesOf(t *testing.T, url string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/kosa8/v1/net", nil)
	req.Header.Set("Authorization", "Bearer "+serveToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("kosa8's API through serve: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// TestServeSuspendResume is the pod's life under agent-sandbox: served,
// driven through agent-sandbox's own Go client, suspended by SIGTERM (the
// Sandbox's operatingMode set to Suspended deletes the pod), then a new
// pod on the same volume. A process counting in the guest continues from
// where it was, and the allow-list and the secret's placeholder are the
// same; the secret's value is on the volume nowhere.
func TestServeSuspendResume(t *testing.T) {
	volume := t.TempDir()
	secretsDir, tokenFile := t.TempDir(), filepath.Join(t.TempDir(), "token")
	const keyValue = "sk-e2e-serve-real-key-0123456789"
	if err := os.WriteFile(filepath.Join(secretsDir, "TEST_KEY"), []byte(keyValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte(serveToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	pod, ready1 := startServePod(t, volume, secretsDir, tokenFile)
	t.Logf("pod 1: start to ready %s (a new sandbox)", ready1.Round(time.Millisecond))
	sb := servetest.Open(t, pod.url, "e2e-serve", serveToken)
	runOK(t, sb, `(nohup sh -c 'echo $$ > /tmp/counter.pid; n=0; while :; do n=$((n+1)); echo $n > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.2; done' >/dev/null 2>&1 &)`)
	pid1 := runOK(t, sb, `for i in $(seq 100); do [ -s /tmp/count ] && break; sleep 0.1; done; cat /tmp/counter.pid`)
	ph := runOK(t, sb, `echo "$TEST_KEY"`)
	if !strings.HasPrefix(ph, "kosa8-ph-") {
		t.Fatalf("the guest sees TEST_KEY=%q, not a placeholder", ph)
	}
	if !strings.Contains(rulesOf(t, pod.url), "example.org") {
		t.Fatal("the allow-list lacks example.org")
	}
	if err := sb.Write(context.Background(), "kept.txt", []byte("kept across the suspend")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	before, _ := strconv.Atoi(runOK(t, sb, "cat /tmp/count"))

	suspend := pod.term(t)
	t.Logf("suspend (SIGTERM to serve's end, the checkpoint written): %s", suspend.Round(time.Millisecond))
	var st struct {
		State      string `json:"state"`
		Checkpoint string `json:"checkpoint"`
	}
	b, err := os.ReadFile(filepath.Join(volume, "sandboxes", "e2e-serve", "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil || st.State != "paused" || st.Checkpoint == "" {
		t.Fatalf("state after the suspend: %s", b)
	}
	t.Logf("volume after the suspend: %s", duSummary(volume))
	// The spare RAM files (each the guest's RAM size) do not stay on the
	// volume.
	if spares, _ := filepath.Glob(filepath.Join(volume, "sandboxes", "e2e-serve", "checkpoints", ".spare-ram*")); len(spares) != 0 {
		t.Fatalf("spare RAM files left on the volume: %v", spares)
	}

	pod2, ready2 := startServePod(t, volume, secretsDir, tokenFile)
	t.Logf("pod 2: start to ready %s (resumed from the volume)", ready2.Round(time.Millisecond))
	sb2 := servetest.Open(t, pod2.url, "e2e-serve", serveToken)
	after, _ := strconv.Atoi(runOK(t, sb2, "cat /tmp/count"))
	time.Sleep(time.Second)
	later, _ := strconv.Atoi(runOK(t, sb2, "cat /tmp/count"))
	if after < before || later <= after || after > before+25 {
		t.Fatalf("the count went %d (before the suspend), %d, %d (after): it must continue where it was", before, after, later)
	}
	if pid2 := runOK(t, sb2, `p=$(cat /tmp/counter.pid); kill -0 "$p" && echo "$p"`); pid2 != pid1 {
		t.Fatalf("the counting process is %s after the resume, %s before", pid2, pid1)
	}
	if got := runOK(t, sb2, `echo "$TEST_KEY"`); got != ph {
		t.Fatalf("the placeholder changed across the suspend: %q, then %q", ph, got)
	}
	if !strings.Contains(rulesOf(t, pod2.url), "example.org") {
		t.Fatal("the allow-list lost example.org across the suspend")
	}
	if got, err := sb2.Read(context.Background(), "kept.txt"); err != nil || string(got) != "kept across the suspend" {
		t.Fatalf("kept.txt after the resume: %q, %v", got, err)
	}
	pod2.term(t)
	// The key's value was only ever in the config directories (memory);
	// the volume, checkpoint and RAM included, holds it nowhere.
	if f := findBytes(t, volume, []byte(keyValue)); f != "" {
		t.Fatalf("the secret's value is on the volume, in %s", f)
	}
}

// duSummary is the volume's size on disk and its largest files.
func duSummary(dir string) string {
	out, _ := exec.Command("du", "-sh", dir).Output()
	return strings.TrimSpace(string(out))
}

// findBytes returns a file under dir that holds b, or "".
func findBytes(t *testing.T, dir string, b []byte) string {
	t.Helper()
	found := ""
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || found != "" || !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		buf := make([]byte, 4<<20)
		var carry []byte
		for {
			n, err := f.Read(buf)
			chunk := append(carry, buf[:n]...)
			if bytes.Contains(chunk, b) {
				found = p
				return filepath.SkipAll
			}
			if len(chunk) >= len(b) {
				carry = append([]byte(nil), chunk[len(chunk)-len(b)+1:]...)
			}
			if err != nil {
				return nil
			}
		}
	})
	return found
}
