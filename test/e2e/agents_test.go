package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/egress"
)

// The agent tests install the real agents from the npm registry into
// derived images (built once per run: the image cache is shared by the
// tests through KOSA8_CACHE) and run them against local fakes of their
// APIs. The fakes check that the real key arrived in the right header and
// answer with a fixed completion in the API's streaming format.

const (
	agentAnswer   = "KOSA8-FAKE-COMPLETION-42"
	anthropicKey  = "sk-ant-e2e-REAL-key-0b1c2d3e4f"
	agentTimeout  = 40 * time.Minute
	agentsCmdWait = 30 * time.Minute
)

// fakeAPI is a local HTTPS stand-in for an agent's API.
type fakeAPI struct {
	port   int
	caFile string
	mu     sync.Mutex
	seen   []string // "METHOD PATH header-value" per request
	bodies []byte
}

func (f *fakeAPI) log() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.seen, "\n")
}

func startFakeAPI(t *testing.T, header string, h http.HandlerFunc) *fakeAPI {
	dir := t.TempDir()
	ca, err := egress.LoadOrCreateCA(dir, "e2e-agents-upstream")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAPI{caFile: filepath.Join(dir, egress.CACertFile)}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
			r.Body = io.NopCloser(bytes.NewReader(body))
			f.mu.Lock()
			f.seen = append(f.seen, r.Method+" "+r.URL.Path+" "+r.Header.Get(header))
			f.bodies = append(f.bodies, body...)
			f.mu.Unlock()
			h(w, r)
		}),
		TLSConfig: &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) }},
	}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	f.port = l.Addr().(*net.TCPAddr).Port
	return f
}

// anthropicHandler answers the Messages API, streaming (SSE) or not, with
// agentAnswer, and only when the real key came in x-api-key.
func anthropicHandler(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("x-api-key") != anthropicKey {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`)
		return
	}
	if !strings.HasPrefix(r.URL.Path, "/v1/messages") || r.Method != http.MethodPost {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"type":"error","error":{"type":"not_found_error","message":"not here"}}`)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/count_tokens") {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"input_tokens":12}`)
		return
	}
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	usage := `{"input_tokens":12,"output_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}`
	msg := fmt.Sprintf(`{"id":"msg_e2e","type":"message","role":"assistant","model":%q,"content":[],"stop_reason":null,"stop_sequence":null,"usage":%s}`, req.Model, usage)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_e2e","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":%q}],"stop_reason":"end_turn","stop_sequence":null,"usage":%s}`, req.Model, agentAnswer, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	events := []struct{ name, data string }{
		{"message_start", `{"type":"message_start","message":` + msg + `}`},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
		{"ping", `{"type":"ping"}`},
		{"content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, agentAnswer[:10])},
		{"content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, agentAnswer[10:])},
		{"content_block_stop", `{"type":"content_block_stop","index":0}`},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":6}}`},
		{"message_stop", `{"type":"message_stop"}`},
	}
	for _, e := range events {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.name, e.data)
		w.(http.Flusher).Flush()
	}
}

// npmReachable says why the npm registry cannot be reached from here, or "".
func npmReachable() string {
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Get("https://registry.npmjs.org/@anthropic-ai%2fclaude-code")
	if err != nil {
		return err.Error()
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.Status
	}
	return ""
}

// agentProject is a project folder the agent tests run kosa8 in.
type agentProject struct {
	t   *testing.T
	dir string
	env []string
}

func (p *agentProject) run(stdin string, args ...string) result {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), agentsCmdWait)
	defer cancel()
	cmd := kosa8Cmd(ctx, args...)
	cmd.Dir = p.dir
	cmd.Env = append(cmd.Env, p.env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		p.t.Fatalf("kosa8 %v: %v", args, err)
	}
	return result{out.String(), errb.String(), code}
}

func TestAgentClaude(t *testing.T) {
	if why := npmReachable(); why != "" {
		t.Skipf("the npm registry is not reachable from this machine (%s): the agent cannot be installed", why)
	}
	api := startFakeAPI(t, "x-api-key", anthropicHandler)
	p := &agentProject{t: t, dir: t.TempDir(), env: []string{
		"KOSA8_SECRET_BACKEND=file",
		"KOSA8_UPSTREAM_CA=" + api.caFile,
		"KOSA8_NET_OVERRIDES=api.anthropic.com=127.0.0.1",
	}}
	if r := p.run("", "run", "--rm", "claude"); r.code == 0 || !strings.Contains(r.stderr, "kosa8 secret add ANTHROPIC_API_KEY --host api.anthropic.com --header x-api-key") {
		t.Fatalf("without a key, run claude should name the 'kosa8 secret add' line:\n%s", r)
	}
	if r := p.run(anthropicKey+"\n", "secret", "add", "ANTHROPIC_API_KEY", "--host", "api.anthropic.com", "--header", "x-api-key"); r.code != 0 {
		t.Fatalf("secret add: %s", r)
	}
	// The fake listens on a port of its own: the preset allows 443, the
	// user's --allow adds the fake's port (preset and user rules combine).
	base := fmt.Sprintf("https://api.anthropic.com:%d", api.port)
	script := `set -e
claude -p "Say the magic words." --output-format text
echo "KEY=$ANTHROPIC_API_KEY"
grep -c 'kosa8 net blocked' ~/.claude/CLAUDE.md
grep -c 'allow-listed' /etc/motd
mkdir -p ~/.claude && echo kept > ~/.claude/e2e-marker
echo '{"claudeAiOauth":{"accessToken":"sk-ant-oat-e2e"}}' > ~/.claude/.credentials.json
`
	start := time.Now()
	r := p.run("", "run", "--rm", "--agent", "claude", "--allow", fmt.Sprintf("api.anthropic.com:%d", api.port),
		"-e", "ANTHROPIC_BASE_URL="+base, "--", "bash", "-c", script)
	t.Logf("first run (image build included): %s", time.Since(start).Round(time.Second))
	if r.code != 0 || !strings.Contains(r.stdout, agentAnswer) {
		t.Fatalf("claude did not print the fake's completion:\n%s\nAPI saw:\n%s", r, api.log())
	}
	if !strings.Contains(api.log(), "/v1/messages "+anthropicKey) {
		t.Fatalf("the API never got the real key in x-api-key:\n%s", api.log())
	}
	if !strings.Contains(r.stdout, "KEY=kosa8-ph-") || strings.Contains(r.stdout, anthropicKey) {
		t.Fatalf("the guest should hold only the placeholder:\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr, ".claude/.credentials.json; they are not kept") {
		t.Fatalf("the credential file should be held back with a message:\n%s", r.stderr)
	}

	// Second --rm run: settings kept, credential file not; the image is cached.
	start = time.Now()
	r = p.run("", "run", "--rm", "--agent", "claude", "--", "bash", "-c",
		"cat ~/.claude/e2e-marker; test ! -e ~/.claude/.credentials.json && echo no-credentials; grep -c 'kosa8 net blocked' ~/.claude/CLAUDE.md")
	t.Logf("second run (image cached): %s", time.Since(start).Round(time.Second))
	if r.code != 0 || !strings.Contains(r.stdout, "kept") || !strings.Contains(r.stdout, "no-credentials") || !strings.HasSuffix(strings.TrimSpace(r.stdout), "\n1") {
		t.Fatalf("second run should see the kept settings (one network note), no credentials:\n%s", r)
	}
	if strings.Contains(r.stderr, "building image") {
		t.Fatalf("the derived image was built again:\n%s", r.stderr)
	}
}

// TestImageSetupConfined: a setup line in a project's [image] runs in a
// build sandbox that reaches only the package sources; reaching anything
// else fails the build, naming the host.
func TestImageSetupConfined(t *testing.T) {
	p := &agentProject{t: t, dir: t.TempDir()}
	toml := "[image]\nsetup = [\"curl -sS -m 20 -o /dev/null https://example.com/\"]\n"
	if err := os.WriteFile(filepath.Join(p.dir, "kosa8.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := p.run("", "trust"); r.code != 0 {
		t.Fatalf("trust: %s", r)
	}
	r := p.run("", "run", "--rm", "--", "true")
	if r.code == 0 {
		t.Fatalf("a setup line reaching example.com built an image:\n%s", r)
	}
	for _, want := range []string{"step 1 failed", "curl -sS -m 20", "it tried to reach example.com"} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("error lacks %q:\n%s", want, r)
		}
	}
}

// TestImageDerived: a project's [image] builds once into a read-only image
// that later runs start from; changing the recipe builds a new one.
func TestImageDerived(t *testing.T) {
	// A cache of its own (the base image hard-linked in), so the image this
	// test builds goes away with it.
	p := &agentProject{t: t, dir: t.TempDir(), env: []string{"KOSA8_CACHE=" + privateCache(t)}}
	mark := fmt.Sprintf("e2e-%d", time.Now().UnixNano())
	toml := fmt.Sprintf("[image]\nsetup = [\"echo %s > /etc/kosa8-e2e-mark\", \"test -s /etc/kosa8/network.md\"]\n", mark)
	if err := os.WriteFile(filepath.Join(p.dir, "kosa8.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := p.run("", "trust"); r.code != 0 {
		t.Fatalf("trust: %s", r)
	}
	start := time.Now()
	r := p.run("", "run", "--rm", "--", "sh", "-c", "cat /etc/kosa8-e2e-mark; ls /etc/sudoers.d/ /usr/local/share/ca-certificates/; id kosa8build 2>&1 || echo no-build-user")
	t.Logf("first run (derived image build included): %s", time.Since(start).Round(time.Second))
	if r.code != 0 || !strings.Contains(r.stdout, mark) || !strings.Contains(r.stdout, "no-build-user") {
		t.Fatalf("the derived image lacks the setup's file or kept the build user:\n%s", r)
	}
	if !strings.Contains(r.stderr, "building image d-") {
		t.Fatalf("no build progress shown:\n%s", r.stderr)
	}
	r = p.run("", "image", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "derived: project") {
		t.Fatalf("image ls does not list the derived image:\n%s", r)
	}
	r = p.run("", "run", "--rm", "--", "cat", "/etc/kosa8-e2e-mark")
	if r.code != 0 || !strings.Contains(r.stdout, mark) || strings.Contains(r.stderr, "building image") {
		t.Fatalf("the second run should start from the cached image:\n%s", r)
	}
}

// privateCache returns an image cache holding hard links to the shared
// cache's base images.
func privateCache(t *testing.T) string {
	shared := os.Getenv("KOSA8_CACHE")
	if shared == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		shared = filepath.Join(c, "kosa8")
	}
	dir := t.TempDir()
	archs, _ := filepath.Glob(filepath.Join(shared, "images", "*"))
	for _, a := range archs {
		dst := filepath.Join(dir, "images", filepath.Base(a))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		imgs, _ := filepath.Glob(filepath.Join(a, "[0-9a-f]*"))
		for _, img := range imgs {
			if out, err := exec.Command("cp", "-al", img, dst+"/").CombinedOutput(); err != nil {
				t.Fatalf("link %s into a private cache: %v %s", img, err, out)
			}
		}
	}
	return dir
}
