package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// call calls an MCP tool and decodes its structured result into out; a
// tool error fails the test.
func call(t *testing.T, ctx context.Context, s *mcp.ClientSession, tool string, args map[string]any, out any) {
	t.Helper()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %s", tool, toolText(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v in %s", tool, err, b)
	}
}

func toolText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

var mcpTools = []string{"sandbox_create_or_pick", "run", "read_file", "write_file", "list_dir", "checkpoint", "rewind", "checkpoints", "net_blocked", "net_request_approval"}

// TestMCPServer drives `kosa8 mcp` with the official Go SDK's client, as
// an agent would: pick a sandbox for a folder, run commands, checkpoint,
// rewind, and ask for a host, which stays refused.
func TestMCPServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ws, _ := os.MkdirTemp(home, "mcp-ws-")
	os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("original\n"), 0o644)

	client := mcp.NewClient(&mcp.Implementation{Name: "kosa8-e2e", Version: "1"}, nil)
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: kosa8Cmd(ctx, "mcp", "--folder", ws)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	list, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil {
			t.Errorf("tool %s has no description or schema", tool.Name)
		}
	}
	for _, want := range mcpTools {
		if !slices.Contains(names, want) {
			t.Errorf("tool %s missing from %v", want, names)
		}
	}

	// Nothing is picked yet: the tools say what to do.
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{"command": "true"}})
	if err != nil || !res.IsError || !strings.Contains(toolText(res), "sandbox_create_or_pick") {
		t.Fatalf("run before a pick: %v %+v", err, res)
	}

	var pick struct {
		Sandbox string `json:"sandbox"`
		Created bool   `json:"created"`
		Started bool   `json:"started"`
	}
	call(t, ctx, s, "sandbox_create_or_pick", map[string]any{"folder": ws, "memory": "512M"}, &pick)
	t.Cleanup(func() { run(t, "", "rm", "-f", pick.Sandbox) })
	if !pick.Created || !pick.Started || pick.Sandbox == "" {
		t.Fatalf("pick: %+v", pick)
	}

	type runOut struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		TimedOut bool   `json:"timed_out"`
	}
	var r runOut
	call(t, ctx, s, "run", map[string]any{"command": "cat hello.txt; echo oops >&2; exit 4"}, &r)
	if r.ExitCode != 4 || r.Stdout != "original\n" || r.Stderr != "oops\n" {
		t.Fatalf("run: %+v", r)
	}
	start := time.Now()
	call(t, ctx, s, "run", map[string]any{"command": "sleep 600", "timeout_seconds": 2}, &r)
	if !r.TimedOut || r.ExitCode != 137 || time.Since(start) > time.Minute {
		t.Fatalf("run past its time limit: %+v after %v", r, time.Since(start))
	}

	var cp struct {
		ID string `json:"id"`
	}
	call(t, ctx, s, "checkpoint", map[string]any{"message": "before the change"}, &cp)
	var w struct{ Bytes int }
	call(t, ctx, s, "write_file", map[string]any{"path": "hello.txt", "content": "changed\n"}, &w)
	var rd struct {
		Content string `json:"content"`
	}
	call(t, ctx, s, "read_file", map[string]any{"path": "hello.txt"}, &rd)
	if rd.Content != "changed\n" {
		t.Fatalf("read after write: %q", rd.Content)
	}
	var rw struct {
		To    string              `json:"to"`
		Saved struct{ ID string } `json:"saved"`
	}
	call(t, ctx, s, "rewind", map[string]any{"id": cp.ID}, &rw)
	call(t, ctx, s, "read_file", map[string]any{"path": "hello.txt"}, &rd)
	if rw.To != cp.ID || rd.Content != "original\n" {
		t.Fatalf("rewind %+v, then hello.txt is %q", rw, rd.Content)
	}
	var cps struct {
		Checkpoints []struct{ ID string } `json:"checkpoints"`
	}
	call(t, ctx, s, "checkpoints", nil, &cps)
	if len(cps.Checkpoints) != 2 {
		t.Fatalf("checkpoints: %+v", cps)
	}
	var ls struct {
		Entries []struct{ Name, Type string } `json:"entries"`
	}
	call(t, ctx, s, "list_dir", nil, &ls)
	if !slices.ContainsFunc(ls.Entries, func(e struct{ Name, Type string }) bool { return e.Name == "hello.txt" && e.Type == "file" }) {
		t.Fatalf("list_dir: %+v", ls)
	}

	// The network refuses example.com, and says so to the model on its
	// refusal page; asking for it allows nothing.
	call(t, ctx, s, "run", map[string]any{"command": "curl -sS -m 20 https://example.com/"}, &r)
	if !strings.Contains(r.Stdout, "example.com was refused") || !strings.Contains(r.Stdout, "kosa8 net allow "+pick.Sandbox+" example.com") {
		t.Fatalf("example.com in a closed sandbox: %+v", r)
	}
	var bl struct {
		Blocked []struct{ Rule string } `json:"blocked"`
	}
	call(t, ctx, s, "net_blocked", nil, &bl)
	if len(bl.Blocked) == 0 || bl.Blocked[0].Rule != "example.com" {
		t.Fatalf("net_blocked: %+v", bl)
	}
	var ap struct {
		Approved bool   `json:"approved"`
		Command  string `json:"command"`
	}
	call(t, ctx, s, "net_request_approval", map[string]any{"host": "example.com", "reason": "docs"}, &ap)
	if ap.Approved || ap.Command != fmt.Sprintf("kosa8 net allow %s example.com", pick.Sandbox) {
		t.Fatalf("approval: %+v", ap)
	}
	if rules := must(t, "net", "ls", pick.Sandbox, "--json").stdout; strings.Contains(rules, "example.com") {
		t.Fatalf("a request widened the network: %s", rules)
	}
	call(t, ctx, s, "run", map[string]any{"command": "curl -sS -m 20 https://example.com/"}, &r)
	if !strings.Contains(r.Stdout, "example.com was refused") {
		t.Fatal("example.com reachable after a request the user did not grant")
	}

	// The same folder picks the same sandbox.
	call(t, ctx, s, "sandbox_create_or_pick", map[string]any{"folder": ws}, &pick)
	if pick.Created || pick.Started {
		t.Fatalf("second pick: %+v", pick)
	}
}

// TestMCPInspector lists the tools and calls run and checkpoint through
// the MCP Inspector's command-line mode, a client that is not ours, from
// the npm registry.
func TestMCPInspector(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("npm is not installed on this host")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	probe, pcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer pcancel()
	if out, err := exec.CommandContext(probe, npm, "view", "@modelcontextprotocol/inspector", "version").CombinedOutput(); err != nil {
		t.Skipf("the npm registry is not reachable from here: %v: %s", err, out)
	}
	// Installed into a folder of this test's own (not npx's shared cache,
	// which an interrupted install leaves broken); npm's download cache
	// makes later runs quick.
	prefix := t.TempDir()
	install, icancel := context.WithTimeout(ctx, 20*time.Minute)
	defer icancel()
	if out, err := exec.CommandContext(install, npm, "install", "--no-audit", "--no-fund", "--prefix", prefix, "@modelcontextprotocol/inspector").CombinedOutput(); err != nil {
		t.Fatalf("npm install @modelcontextprotocol/inspector: %v\n%s", err, out)
	}
	inspector := filepath.Join(prefix, "node_modules", ".bin", "mcp-inspector")
	kosa8 := filepath.Join(binDir, "kosa8")
	// The inspector starts its server with a minimal environment: pass
	// this run's state directory explicitly.
	// Each call is a server of its own (a session): the sandbox the first
	// one picks, the later ones are given with --sandbox, as a user would.
	inspectRaw := func(sandbox string, args ...string) (string, error) {
		t.Helper()
		full := []string{"--cli", "-e", "KOSA8_HOME=" + home, "-e", "KOSA8_CONFIG=" + filepath.Join(home, "config")}
		if a := os.Getenv("KOSA8_ACCEL"); a != "" {
			// The inspector takes only key=value with a value.
			full = append(full, "-e", "KOSA8_ACCEL="+a)
		}
		full = append(full, kosa8, "mcp", "--folder", home)
		if sandbox != "" {
			full = append(full, "--sandbox", sandbox)
		}
		out, err := exec.CommandContext(ctx, inspector, append(full, args...)...).CombinedOutput()
		return string(out), err
	}
	inspect := func(sandbox string, args ...string) string {
		t.Helper()
		out, err := inspectRaw(sandbox, args...)
		if err != nil {
			t.Fatalf("inspector %v: %v\n%s", args, err, out)
		}
		return out
	}
	out := inspect("", "--method", "tools/list")
	for _, want := range mcpTools {
		if !strings.Contains(out, `"`+want+`"`) {
			t.Errorf("tools/list lacks %s:\n%s", want, out)
		}
	}
	ws, _ := os.MkdirTemp(home, "inspector-ws-")
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("from the inspector test\n"), 0o644)
	out = inspect("", "--method", "tools/call", "--tool-name", "sandbox_create_or_pick", "--tool-arg", "folder="+ws, "--tool-arg", "memory=512M")
	var pick struct {
		StructuredContent struct {
			Sandbox string `json:"sandbox"`
		} `json:"structuredContent"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &pick); err != nil || pick.StructuredContent.Sandbox == "" {
		t.Fatalf("pick: %v\n%s", err, out)
	}
	name := pick.StructuredContent.Sandbox
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	// Not given to this session, the sandbox is refused; given, it works.
	if out, _ := inspectRaw("", "--method", "tools/call", "--tool-name", "run", "--tool-arg", "sandbox="+name, "--tool-arg", "command=true"); !strings.Contains(out, "only on sandboxes it created or picked") {
		t.Errorf("run in a sandbox another session picked:\n%s", out)
	}
	out = inspect(name, "--method", "tools/call", "--tool-name", "run", "--tool-arg", "sandbox="+name, "--tool-arg", "command=cat a.txt")
	if !strings.Contains(out, `from the inspector test\n`) || !strings.Contains(out, `"exit_code": 0`) {
		t.Fatalf("run:\n%s", out)
	}
	out = inspect(name, "--method", "tools/call", "--tool-name", "checkpoint", "--tool-arg", "sandbox="+name, "--tool-arg", "message=from the inspector")
	if !strings.Contains(out, `"pause_ms"`) || strings.Contains(out, `"isError": true`) {
		t.Fatalf("checkpoint:\n%s", out)
	}
	if cps := must(t, "checkpoints", name, "--json").stdout; !strings.Contains(cps, "from the inspector") {
		t.Fatalf("the checkpoint is not listed: %s", cps)
	}
}
