package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/wsync"
	"github.com/kosa8/kosa8/sdk"
)

// mcpSession connects a client to the server over a state directory
// holding one stopped sandbox, "s", on a folder of its own, which the
// session picked.
func mcpSession(t *testing.T) (*mcp.ClientSession, string) {
	t.Helper()
	home := t.TempDir()
	dir := filepath.Join(home, "sandboxes", "s")
	os.MkdirAll(dir, 0o700)
	cfg, _ := json.Marshal(map[string]any{"name": "s", "id": "id-s", "cpus": 2, "memory_mib": 1024, "disk_gib": 16, "workspace": map[string]any{"path": resolved(t, t.TempDir())}})
	os.WriteFile(filepath.Join(dir, "sandbox.json"), cfg, 0o600)
	os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"state":"stopped"}`), 0o600)
	return mcpSessionAt(t, home, "s"), dir
}

func resolved(t *testing.T, name string) string {
	t.Helper()
	p, err := folder.Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	return p.String()
}

// mcpSessionAt connects a client, over stdio's framing, to the server over
// the state directory home, whose folders are those of the sandboxes
// picked (as if sandbox_create_or_pick had picked them), or a new one.
func mcpSessionAt(t *testing.T, home string, picked ...string) *mcp.ClientSession {
	t.Helper()
	c, err := sdk.New(sdk.WithHome(home))
	if err != nil {
		t.Fatal(err)
	}
	var roots []folder.Path
	var sbs []*sdk.Sandbox
	for _, name := range picked {
		sb, err := c.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		root, err := folder.Resolve(sb.Info().Workspace)
		if err != nil {
			t.Fatal(err)
		}
		roots, sbs = append(roots, root), append(sbs, sb)
	}
	if len(roots) == 0 {
		root, err := folder.Resolve(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		roots = append(roots, root)
	}
	srv, s := newMCPSession(c, slog.New(slog.NewTextHandler(io.Discard, nil)), roots...)
	for _, sb := range sbs {
		if err := s.scope.Grant(target(sb)); err != nil {
			t.Fatal(err)
		}
	}
	return stdioSession(t, srv)
}

func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestMCPTools(t *testing.T) {
	cs, _ := mcpSession(t)
	ctx := context.Background()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.Tool{}
	for _, tool := range list.Tools {
		got[tool.Name] = tool
	}
	for _, name := range []string{"sandbox_create_or_pick", "run", "read_file", "write_file", "list_dir", "checkpoint", "rewind", "checkpoints", "net_blocked", "net_request_approval"} {
		if got[name] == nil {
			t.Errorf("no tool %s", name)
		}
	}
	// The pick cannot carry network rules or secrets: only the user widens
	// what a sandbox may reach.
	schema, _ := json.Marshal(got["sandbox_create_or_pick"].InputSchema)
	for _, field := range []string{"allow", "secret", "preset"} {
		if strings.Contains(string(schema), `"`+field) {
			t.Errorf("sandbox_create_or_pick takes %q: %s", field, schema)
		}
	}
	// Without a pick, a tool says what to do.
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{"command": "true"}})
	if err != nil || !res.IsError || !strings.Contains(textOf(res), "sandbox_create_or_pick") {
		t.Fatalf("run without a pick: %v %+v", err, res)
	}
	// A stopped sandbox says it must be started.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{"sandbox": "s", "command": "true"}})
	if err != nil || !res.IsError || !strings.Contains(textOf(res), "not running") {
		t.Fatalf("run in a stopped sandbox: %v %+v", err, res)
	}
	// A folder outside the server's roots (a key folder, say) is refused.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_create_or_pick", Arguments: map[string]any{"folder": "/etc"}})
	if err != nil || !res.IsError || !strings.Contains(textOf(res), "outside the folders this server may use") {
		t.Fatalf("a folder outside the roots: %v %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_create_or_pick", Arguments: map[string]any{"folder": "relative/dir"}})
	if err != nil || !res.IsError || !strings.Contains(textOf(res), "absolute") {
		t.Fatalf("relative folder: %v %+v", err, res)
	}
}

// The checkpoint tools' answers pass their own output schemas (the MCP
// SDK checks them): a checkpoint without disks, a rewind that saved no
// state before it.
func TestMCPCheckpointOutputs(t *testing.T) {
	var saved *checkpoint.Meta
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(checkpoint.Meta{ID: "cp1", Kind: "manual"})
	})
	mux.HandleFunc("POST /v1/rewind", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.RewindResult{To: "cp1", Saved: saved, Conflicts: []wsync.Conflict{{Path: "a"}}})
	})
	sb := fakeRunning(t, "m", resolved(t, t.TempDir()), mux)
	cs := mcpSessionAt(t, filepath.Dir(filepath.Dir(sb.Dir)), "m")
	ctx := context.Background()
	for _, tc := range []struct {
		tool  string
		args  map[string]any
		saved *checkpoint.Meta
	}{
		{"checkpoint", map[string]any{"sandbox": "m", "message": "x"}, nil},
		{"rewind", map[string]any{"sandbox": "m", "id": "cp1"}, nil},
		{"rewind", map[string]any{"sandbox": "m", "id": "cp1"}, &checkpoint.Meta{ID: "cp2", Kind: "pre-rewind"}},
	} {
		saved = tc.saved
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tc.tool, Arguments: tc.args})
		if err != nil {
			t.Errorf("%s (saved %v): %v", tc.tool, tc.saved, err)
		} else if res.IsError {
			t.Errorf("%s (saved %v): %s", tc.tool, tc.saved, textOf(res))
		}
	}
}

func TestMCPApprovalNeverApproves(t *testing.T) {
	cs, dir := mcpSession(t)
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "net_request_approval", Arguments: map[string]any{"sandbox": "s", "host": "*.Example.com", "reason": "docs\x1b[2J"}})
	if err != nil || res.IsError {
		t.Fatalf("%v %s", err, textOf(res))
	}
	var out ApprovalOut
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &out)
	if out.Approved || out.Rule != "*.example.com" || out.Command != "kosa8 net allow s '*.example.com'" || !strings.Contains(out.Message, "Not approved") {
		t.Fatalf("approval: %+v", out)
	}
	// Recorded for the user, and nothing allowed.
	rec, err := os.ReadFile(filepath.Join(dir, "net-requests.jsonl"))
	if err != nil || !strings.Contains(string(rec), `"rule":"*.example.com"`) {
		t.Fatalf("record: %q %v", rec, err)
	}
	c, _ := sdk.New(sdk.WithHome(filepath.Dir(filepath.Dir(dir))))
	sb, _ := c.Open("s")
	if rules, _ := sb.Rules(ctx); len(rules) != 0 {
		t.Fatalf("rules after a request: %v", rules)
	}
	// Rules that would open everything, or are not rules, are refused.
	// A pin whose addresses the model names (an internal address of its
	// choosing) is refused too: a pin holds what the name resolves to.
	for _, host := range []string{"*", "*.com", "exa mple.com", "$(reboot)", "pin:registry.npmjs.org=10.0.0.5"} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "net_request_approval", Arguments: map[string]any{"sandbox": "s", "host": host, "reason": "x"}})
		if err != nil || !res.IsError {
			t.Errorf("request for %q accepted: %v %s", host, err, textOf(res))
		}
	}
}

func TestHeadTail(t *testing.T) {
	h := newHeadTail(16)
	io.WriteString(h, "0123")
	io.WriteString(h, "456789abcdefghijklmnop")
	s := h.String()
	if s != "0123\n[... 10 bytes cut ...]\nefghijklmnop" || h.cut != 10 {
		t.Fatalf("%q cut %d", s, h.cut)
	}
	small := newHeadTail(16)
	io.WriteString(small, "abc")
	if small.String() != "abc" || small.cut != 0 {
		t.Fatalf("%q", small.String())
	}
}
