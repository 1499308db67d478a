package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/egress"
)

// The agent tests install the real agents from the npm registry into
// derived images (built once per run: the image cache is shared by the
// tests through KOSA8_CACHE) and run them against local fakes of their
// APIs. The fakes check that the real key arrived in the right header and
// answer with a fixed completion in the API's streaming format.

const (
	agentAnswer  = "KOSA8-FAKE-COMPLETION-42"
	anthropicKey = "sk-ant-e2e-REAL-key-0b1c2d3e4f"
	openaiKey    = "sk-proj-e2e-REAL-key-5a6b7c8d"
	geminiKey    = "AIzaSy-e2e-REAL-key-9e8f7a6b"

	// toolPrompt makes the Anthropic fake ask for a tool call;
	// toolSawPlaceholder is its answer when the tool's output, sent back in
	// the next request, held the key's placeholder.
	toolPrompt         = "KOSA8-RUN-THE-KEY-TOOL"
	toolSawPlaceholder = "TOOL-RESULT-HAD-PLACEHOLDER"
)

// fakeAPI is a local HTTPS stand-in for an agent's API.
type fakeAPI struct {
	port   int
	caFile string
	mu     sync.Mutex
	seen   []string // "METHOD PATH header-value" per request
	bodies []byte
}

// around shows where each of words first occurs in the request bodies.
func (f *fakeAPI) around(words ...string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, w := range words {
		i := bytes.Index(f.bodies, []byte(w))
		if i < 0 {
			fmt.Fprintf(&b, "%s: not in any body\n", w)
			continue
		}
		fmt.Fprintf(&b, "%s: %q\n", w, f.bodies[max(0, i-300):min(len(f.bodies), i+300)])
	}
	return b.String()
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
		Model    string            `json:"model"`
		Stream   bool              `json:"stream"`
		Messages []json.RawMessage `json:"messages"`
		Tools    []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	offersBash := false
	for _, t := range req.Tools {
		offersBash = offersBash || t.Name == "Bash"
	}
	// The conversation so far: the prompt, and the tool's result once the
	// agent ran the tool (messages may end with a system message, so the
	// whole list is searched).
	var prompted, answered, carried bool
	for _, m := range req.Messages {
		prompted = prompted || bytes.Contains(m, []byte(toolPrompt))
		if bytes.Contains(m, []byte(`"tool_result"`)) {
			answered = true
			carried = carried || bytes.Contains(m, []byte("kosa8-ph-"))
		}
	}
	// A prompt naming toolPrompt gets a Bash tool call that prints the key
	// (the placeholder, inside); the tool's result comes back in the next
	// request's body, and the answer says whether it carried the placeholder.
	text, stop := agentAnswer, "end_turn"
	var tool string
	switch {
	case answered && carried:
		text = toolSawPlaceholder
	case answered:
		text = "TOOL-RESULT-WITHOUT-PLACEHOLDER"
	case prompted && offersBash:
		tool, stop = `{"command":"echo key=$ANTHROPIC_API_KEY","description":"print the key"}`, "tool_use"
	}
	usage := `{"input_tokens":12,"output_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}`
	if !req.Stream {
		block := fmt.Sprintf(`{"type":"text","text":%q}`, text)
		if tool != "" {
			block = `{"type":"tool_use","id":"toolu_e2e","name":"Bash","input":` + tool + `}`
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_e2e","type":"message","role":"assistant","model":%q,"content":[%s],"stop_reason":%q,"stop_sequence":null,"usage":%s}`, req.Model, block, stop, usage)
		return
	}
	msg := fmt.Sprintf(`{"id":"msg_e2e","type":"message","role":"assistant","model":%q,"content":[],"stop_reason":null,"stop_sequence":null,"usage":%s}`, req.Model, usage)
	type event struct{ name, data string }
	events := []event{
		{"message_start", `{"type":"message_start","message":` + msg + `}`},
	}
	if tool != "" {
		events = append(events,
			event{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_e2e","name":"Bash","input":{}}}`},
			event{"content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":%q}}`, tool)})
	} else {
		events = append(events,
			event{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
			event{"ping", `{"type":"ping"}`},
			event{"content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, text[:10])},
			event{"content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, text[10:])})
	}
	events = append(events,
		event{"content_block_stop", `{"type":"content_block_stop","index":0}`},
		event{"message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":%q,"stop_sequence":null},"usage":{"output_tokens":6}}`, stop)},
		event{"message_stop", `{"type":"message_stop"}`})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	for _, e := range events {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.name, e.data)
		w.(http.Flusher).Flush()
	}
}

// projectWithFake starts a fake of apiHost's API and returns it with a
// project whose kosa8 runs send apiHost to it (and trust its CA), keeping
// secrets in a file.
func projectWithFake(t *testing.T, apiHost, header string, h http.HandlerFunc) (*fakeAPI, *agentProject) {
	api := startFakeAPI(t, header, h)
	return api, &agentProject{t: t, dir: t.TempDir(), env: []string{
		"KOSA8_SECRET_BACKEND=file",
		"KOSA8_UPSTREAM_CA=" + api.caFile,
		"KOSA8_NET_OVERRIDES=" + apiHost + "=127.0.0.1",
	}}
}

// npmReachable says why the npm registry cannot be reached from here, or "".
func npmReachable() string {
	return registryReachable("https://registry.npmjs.org/@anthropic-ai%2fclaude-code")
}

func TestAgentClaude(t *testing.T) {
	if why := npmReachable(); why != "" {
		t.Skipf("the npm registry is not reachable from this machine (%s): the agent cannot be installed", why)
	}
	api, p := projectWithFake(t, "api.anthropic.com", "x-api-key", anthropicHandler)
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
echo "PRESET-ENV=$DISABLE_TELEMETRY"
# The agent's own conversation carries the placeholder back to its API:
# a tool it runs prints the key, and the session goes on.
claude -p "` + toolPrompt + `" --allowedTools Bash --output-format text
grep -c 'kosa8 net blocked' ~/.claude/CLAUDE.md
grep -c 'allow-listed' /etc/motd
mkdir -p ~/.claude && echo kept > ~/.claude/e2e-marker
echo '{"claudeAiOauth":{"accessToken":"sk-ant-oat-e2e"}}' > ~/.claude/.credentials.json
` + enginesScript("claude")
	start := time.Now()
	r := p.run("", "run", "--rm", "--agent", "claude", "--allow", fmt.Sprintf("api.anthropic.com:%d", api.port),
		"-e", "ANTHROPIC_BASE_URL="+base, "--", "bash", "-c", script)
	t.Logf("first run (image build included): %s", time.Since(start).Round(time.Second))
	if r.code != 0 || !strings.Contains(r.stdout, agentAnswer) {
		t.Fatalf("claude did not print the fake's completion:\n%s\nAPI saw:\n%s", r, api.log())
	}
	if !strings.Contains(r.stdout, toolSawPlaceholder) {
		t.Fatalf("the session should go on after a tool printed the placeholder (want %s):\n%s\nAPI saw:\n%s\n%s", toolSawPlaceholder, r, api.log(), api.around(toolPrompt, `"tools"`, `"Bash"`))
	}
	if !strings.Contains(api.log(), "/v1/messages "+anthropicKey) {
		t.Fatalf("the API never got the real key in x-api-key:\n%s", api.log())
	}
	if !strings.Contains(r.stdout, "KEY=kosa8-ph-") || strings.Contains(r.stdout, anthropicKey) {
		t.Fatalf("the guest should hold only the placeholder:\n%s", r.stdout)
	}
	checkEngines(t, "claude", r.stdout)
	if !strings.Contains(r.stdout, "PRESET-ENV=1") {
		t.Fatalf("the preset's environment (DISABLE_TELEMETRY=1) did not reach the agent:\n%s", r.stdout)
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

// TestAgentKeptSettingsAttack: root in the guest plants, in the agent's
// kept folder, a file the agent's user cannot read, a hard link to
// /etc/shadow, a folder it cannot enter and a 2 GiB sparse file. The save
// skips each, names them in one line, and keeps the rest; the kosa8
// process's memory stays bounded (a 2 GiB sparse file made it reach
// 806 MB, and one unreadable file made the whole save fail). It shares
// the claude image TestAgentClaude builds (built here when run alone).
func TestAgentKeptSettingsAttack(t *testing.T) {
	if why := npmReachable(); why != "" {
		t.Skipf("the npm registry is not reachable from this machine (%s): the agent cannot be installed", why)
	}
	p := &agentProject{t: t, dir: t.TempDir(), env: []string{"KOSA8_SECRET_BACKEND=file"}}
	// --replace: the run's secret store is shared, and TestAgentClaude
	// stored the same key before this test.
	if r := p.run(anthropicKey+"\n", "secret", "add", "--replace", "ANTHROPIC_API_KEY", "--host", "api.anthropic.com", "--header", "x-api-key"); r.code != 0 {
		t.Fatalf("secret add: %s", r)
	}
	script := `set -e
mkdir -p ~/.claude/projects
echo kept > ~/.claude/settings.json
echo history > ~/.claude/projects/session.jsonl
echo '{"kept":1}' > ~/.claude.json
sudo ln /etc/shadow ~/.claude/hard-shadow
sudo sh -c "echo root-secret > $HOME/.claude/root-only && chmod 600 $HOME/.claude/root-only"
sudo sh -c "mkdir $HOME/.claude/root-dir && echo x > $HOME/.claude/root-dir/f && chmod 700 $HOME/.claude/root-dir"
truncate -s 2G ~/.claude/sparse-2g
`
	start := time.Now()
	r := p.run("", "run", "--rm", "--agent", "claude", "--", "bash", "-c", script)
	t.Logf("planting run: %s, kosa8's peak RSS %d MiB", time.Since(start).Round(time.Second), r.maxRSS>>20)
	if r.code != 0 {
		t.Fatalf("run:\n%s", r)
	}
	var line string
	for _, l := range strings.Split(r.stderr, "\n") {
		if strings.Contains(l, "kept claude's settings except") {
			line = l
		}
	}
	for _, want := range []string{"except 4 files", "~/.claude/hard-shadow (unreadable)", "~/.claude/root-only (unreadable)",
		"~/.claude/root-dir (unreadable folder)", "~/.claude/sparse-2g (2.0 GiB, over the limit)", "move it out of ~/.claude"} {
		if !strings.Contains(line, want) {
			t.Fatalf("the save's line lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "not kept (") {
		t.Fatalf("the save failed:\n%s", r.stderr)
	}
	// Bounded: kosa8's own peak was 17-18 MiB in both runs here (3 Dec
	// 2026, TCG); the 2 GiB file took it to 806 MB before.
	if r.maxRSS > 128<<20 {
		t.Fatalf("kosa8 reached %d MiB of resident memory saving the settings", r.maxRSS>>20)
	}
	archives, _ := filepath.Glob(filepath.Join(home, "agent-homes", "*-claude.tar"))
	for _, a := range archives {
		if fi, err := os.Stat(a); err == nil && fi.Size() > 64<<20 {
			t.Fatalf("kept archive %s is %d bytes", a, fi.Size())
		}
	}
	start = time.Now()
	r = p.run("", "run", "--rm", "--agent", "claude", "--", "bash", "-c",
		"cat ~/.claude/settings.json ~/.claude/projects/session.jsonl ~/.claude.json; ls -A ~/.claude")
	t.Logf("second run: %s, kosa8's peak RSS %d MiB", time.Since(start).Round(time.Second), r.maxRSS>>20)
	if r.code != 0 {
		t.Fatalf("second run:\n%s", r)
	}
	for _, want := range []string{"kept\nhistory\n{\"kept\":1}\n", "settings.json", "projects"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("the rest was not kept (want %q):\n%s", want, r)
		}
	}
	for _, gone := range []string{"hard-shadow", "root-only", "root-dir", "sparse-2g", "root-secret"} {
		if strings.Contains(r.stdout, gone) {
			t.Fatalf("%s was kept:\n%s", gone, r.stdout)
		}
	}
}

// openaiResponsesHandler answers OpenAI's Responses API (what codex
// speaks) with a streamed message, only for the real key as a Bearer token.
func openaiResponsesHandler(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+openaiKey {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`)
		return
	}
	if !strings.HasSuffix(r.URL.Path, "/responses") {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	item := fmt.Sprintf(`{"type":"message","id":"msg_e2e","status":"completed","role":"assistant","content":[{"type":"output_text","text":%q,"annotations":[]}]}`, agentAnswer)
	events := []struct{ name, data string }{
		{"response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_e2e","object":"response","status":"in_progress","output":[]}}`},
		{"response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"type":"message","id":"msg_e2e","status":"in_progress","role":"assistant","content":[]}}`},
		{"response.output_text.delta", fmt.Sprintf(`{"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_e2e","output_index":0,"content_index":0,"delta":%q}`, agentAnswer)},
		{"response.output_item.done", `{"type":"response.output_item.done","sequence_number":3,"output_index":0,"item":` + item + `}`},
		{"response.completed", `{"type":"response.completed","sequence_number":4,"response":{"id":"resp_e2e","object":"response","status":"completed","output":[` + item + `],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":6,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":18}}}`},
	}
	for _, e := range events {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.name, e.data)
		w.(http.Flusher).Flush()
	}
}

// geminiHandler answers generateContent and streamGenerateContent (SSE),
// only for the real key in x-goog-api-key.
func geminiHandler(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("x-goog-api-key") != geminiKey {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT"}}`)
		return
	}
	usage := `"usageMetadata":{"promptTokenCount":12,"candidatesTokenCount":6,"totalTokenCount":18}`
	chunk := func(text string) string {
		return fmt.Sprintf(`{"candidates":[{"content":{"parts":[{"text":%q}],"role":"model"},"finishReason":"STOP","index":0}],%s,"modelVersion":"gemini-e2e"}`, text, usage)
	}
	switch {
	case strings.HasSuffix(r.URL.Path, ":countTokens"):
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"totalTokens":12}`)
	case strings.HasSuffix(r.URL.Path, ":streamGenerateContent"):
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\r\n\r\n", chunk(agentAnswer))
		w.(http.Flusher).Flush()
	case strings.HasSuffix(r.URL.Path, ":generateContent"):
		// Side requests (the next-speaker check) want JSON text.
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, chunk(`{"reasoning":"the answer is complete","next_speaker":"user"}`))
	default:
		http.NotFound(w, r)
	}
}

// runAgentAgainstFake installs the preset's agent (its derived image is
// cached across tests and runs), runs script with the fake API's name
// mapped to a local server, and checks the key and the placeholder.
func runAgentAgainstFake(t *testing.T, preset, secret, key, apiHost, header, baseEnv, basePath string, h http.HandlerFunc, add []string, script string) {
	if why := npmReachable(); why != "" {
		t.Skipf("the npm registry is not reachable from this machine (%s): the agent cannot be installed", why)
	}
	api, p := projectWithFake(t, apiHost, header, h)
	if r := p.run(key+"\n", append([]string{"secret", "add", secret}, add...)...); r.code != 0 {
		t.Fatalf("secret add: %s", r)
	}
	base := fmt.Sprintf("https://%s:%d%s", apiHost, api.port, basePath)
	r := p.run("", "run", "--rm", "--agent", preset, "--allow", fmt.Sprintf("%s:%d", apiHost, api.port),
		"-e", baseEnv+"="+base, "--", "bash", "-c", script+"\necho \"KEY=$"+secret+"\"\n"+enginesScript(preset))
	if r.code != 0 || !strings.Contains(r.stdout, agentAnswer) {
		t.Fatalf("%s did not print the fake's completion:\n%s\nAPI saw:\n%s", preset, r, api.log())
	}
	if !strings.Contains(api.log(), key) {
		t.Fatalf("the API never got the real key in %s:\n%s", header, api.log())
	}
	if !strings.Contains(r.stdout, "KEY=kosa8-ph-") || strings.Contains(r.stdout, key) {
		t.Fatalf("the guest should hold only the placeholder:\n%s", r.stdout)
	}
	checkEngines(t, preset, r.stdout)
}

// enginesScript prints the Node the agent runs on and its installed
// package's engines.node.
func enginesScript(preset string) string {
	p, err := agent.Get(preset)
	if err != nil || p.Install.NPM == "" {
		return ""
	}
	return `echo "NODE-VERSION=$(node --version)"
echo "ENGINES-NODE=$(node -p 'require("/usr/local/lib/node_modules/` + p.Install.NPM + `/package.json").engines?.node || ""')"
`
}

var (
	nodeVersionRE = regexp.MustCompile(`NODE-VERSION=v([0-9]+)\.`)
	enginesRE     = regexp.MustCompile(`ENGINES-NODE=(.*)`)
)

// checkEngines compares the guest's node --version with the engines.node
// of the agent's installed package (">=N..."): the image must meet what
// the package asks, not install it with EBADENGINE.
func checkEngines(t *testing.T, preset, out string) {
	t.Helper()
	p, _ := agent.Get(preset)
	if p == nil || p.Install.NPM == "" {
		return
	}
	nv, ev := nodeVersionRE.FindStringSubmatch(out), enginesRE.FindStringSubmatch(out)
	if nv == nil || ev == nil {
		t.Fatalf("%s: no node version or engines in the output:\n%s", preset, out)
	}
	have, _ := strconv.Atoi(nv[1])
	eng := strings.TrimSpace(ev[1])
	need := agent.Runtime{Node: eng}.NodeMajor()
	t.Logf("%s: node v%d in the image, the package asks %q (the preset states %q)", preset, have, eng, p.Runtime.Node)
	if eng != "" && need == 0 {
		t.Errorf("%s: engines.node %q is not a range kosa8 reads: state it in the preset by hand", preset, eng)
	}
	if have < need {
		t.Errorf("%s: the image's Node %d does not meet the package's engines.node %q", preset, have, eng)
	}
	if p.Runtime.NodeMajor() < need {
		t.Errorf("%s: the preset states node %q, and the package now asks %q: update presets/%s.toml", preset, p.Runtime.Node, eng, preset)
	}
}

func TestAgentCodex(t *testing.T) {
	runAgentAgainstFake(t, "codex", "OPENAI_API_KEY", openaiKey, "api.openai.com", "Authorization", "OPENAI_BASE_URL", "/v1",
		openaiResponsesHandler, []string{"--host", "api.openai.com", "--format", "Bearer {value}"},
		// Codex's built-in provider takes no base URL from the environment:
		// a provider of the test's own, on the fake's port, with the key
		// from the same variable.
		`codex exec --skip-git-repo-check -c model_provider=e2e \
  -c "model_providers.e2e={name=\"e2e\",base_url=\"$OPENAI_BASE_URL\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\"}" \
  "Say the magic words." </dev/null`)
}

func TestAgentGemini(t *testing.T) {
	runAgentAgainstFake(t, "gemini", "GEMINI_API_KEY", geminiKey, "generativelanguage.googleapis.com", "x-goog-api-key", "GOOGLE_GEMINI_BASE_URL", "",
		geminiHandler, []string{"--host", "generativelanguage.googleapis.com", "--header", "x-goog-api-key"},
		// A base URL in the environment makes Gemini CLI pick its
		// "gateway" sign-in, which -p refuses: the API key's, in its settings.
		`mkdir -p ~/.gemini && echo '{"security":{"auth":{"selectedType":"gemini-api-key"}}}' > ~/.gemini/settings.json
gemini -p "Say the magic words." </dev/null`)
}

// registryReachable says why url cannot be fetched from here, or "".
func registryReachable(url string) string {
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err.Error()
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.Status
	}
	return ""
}

// TestAgentAider installs aider from PyPI into a derived image and runs it
// against the Anthropic fake. PyPI is not reachable from the machines this
// project is built on, so here it skips, saying so; the preset's data is
// unit-tested in internal/agent.
func TestAgentAider(t *testing.T) {
	if why := registryReachable("https://pypi.org/simple/aider-chat/"); why != "" {
		t.Skipf("PyPI is not reachable from this machine (%s): aider cannot be installed", why)
	}
	api, p := projectWithFake(t, "api.anthropic.com", "x-api-key", anthropicHandler)
	if r := p.run(anthropicKey+"\n", "secret", "add", "ANTHROPIC_API_KEY", "--host", "api.anthropic.com", "--header", "x-api-key"); r.code != 0 {
		t.Fatalf("secret add: %s", r)
	}
	base := fmt.Sprintf("https://api.anthropic.com:%d", api.port)
	r := p.run("", "run", "--rm", "--agent", "aider", "--allow", fmt.Sprintf("api.anthropic.com:%d", api.port),
		"-e", "ANTHROPIC_API_BASE="+base, "--", "bash", "-c",
		`aider --model anthropic/claude-sonnet-4-5 --no-git --yes-always --no-stream --message "Say the magic words." </dev/null; echo "KEY=$ANTHROPIC_API_KEY"`)
	if r.code != 0 || !strings.Contains(r.stdout, agentAnswer) {
		t.Fatalf("aider did not print the fake's completion:\n%s\nAPI saw:\n%s", r, api.log())
	}
	if !strings.Contains(api.log(), anthropicKey) || !strings.Contains(r.stdout, "KEY=kosa8-ph-") || strings.Contains(r.stdout, anthropicKey) {
		t.Fatalf("want the real key at the API and only the placeholder inside:\n%s\nAPI saw:\n%s", r.stdout, api.log())
	}
}
