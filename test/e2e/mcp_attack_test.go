package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPFolderAttackFromTheGuest is issue 28's second reproduction, made
// by a model through `kosa8 mcp` and the official MCP client over stdio:
// the guest makes the link A/in -> proj/sub and the folder A/S in its
// workspace A, the sync brings both to the host, and the model asks for
// the folder A/in/../../S. The file system reads that as A/S (links
// before ".."), inside the running sandbox's folder, so it is refused;
// never S beside A, where the user keeps a key and a sandbox of theirs
// (created, never started). The model's other ways out of A fail too: a
// path of ".." in the guest stays in the guest, and the user's sandbox
// by name is not the session's. (The rest of issue 28's attacks run
// without a VM: cmd/kosa8/mcp_attack_test.go.)
func TestMCPFolderAttackFromTheGuest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	top, err := os.MkdirTemp(home, "mcp-attack-")
	if err != nil {
		t.Fatal(err)
	}
	top, _ = filepath.EvalSymlinks(top)
	a, s := filepath.Join(top, "A"), filepath.Join(top, "S")
	for _, d := range []string{a, s} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(s, "id_rsa"), []byte("PRIVATE KEY of S\n"), 0o600)
	must(t, "create", "--workspace", s, "mcp-user-s")
	t.Cleanup(func() { run(t, "", "rm", "-f", "mcp-user-s") })

	client := mcp.NewClient(&mcp.Implementation{Name: "kosa8-e2e-attacker", Version: "1"}, nil)
	sess, err := client.Connect(ctx, &mcp.CommandTransport{Command: kosa8Cmd(ctx, "mcp", "--folder", a)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var pick struct {
		Sandbox string `json:"sandbox"`
	}
	call(t, ctx, sess, "sandbox_create_or_pick", map[string]any{"folder": a, "memory": "512M"}, &pick)
	t.Cleanup(func() { run(t, "", "rm", "-f", pick.Sandbox) })

	// The guest makes the link and the folder; the sync brings them out.
	var r struct {
		ExitCode int    `json:"exit_code"`
		Stderr   string `json:"stderr"`
	}
	call(t, ctx, sess, "run", map[string]any{"command": "mkdir -p proj/sub S && ln -s proj/sub in"}, &r)
	if r.ExitCode != 0 {
		t.Fatalf("in the guest: %+v", r)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		target, err := os.Readlink(filepath.Join(a, "in"))
		fi, serr := os.Stat(filepath.Join(a, "S"))
		if err == nil && target == "proj/sub" && serr == nil && fi.IsDir() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest's link and folder did not reach the host: %q %v %v", target, err, serr)
		}
		time.Sleep(200 * time.Millisecond)
	}

	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_create_or_pick", Arguments: map[string]any{"folder": a + "/in/../../S"}})
	if err != nil {
		t.Fatal(err)
	}
	if msg := toolText(res); !res.IsError || !strings.Contains(msg, filepath.Join(a, "S")) || !strings.Contains(msg, "synced by sandbox "+pick.Sandbox) {
		t.Errorf("A/in/../../S: %v %s", res.IsError, msg)
	}
	if st := ls(t)["mcp-user-s"].State; st != "created" {
		t.Errorf("the user's sandbox on S is %s after the pick", st)
	}

	// ".." in the guest's paths reaches the guest's own file system (where
	// the guest user may not even make S's path: either way, not the
	// host's S).
	dots := strings.Repeat("../", 12) + strings.TrimPrefix(s, "/")
	if _, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"path": dots + "/authorized_keys", "content": "ssh-ed25519 AAAA attacker\n"}}); err != nil {
		t.Fatal(err)
	}
	res, err = sess.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": dots + "/id_rsa"}})
	if err != nil || strings.Contains(toolText(res), "PRIVATE KEY") {
		t.Errorf("read_file %s/id_rsa: %v %s", dots, err, toolText(res))
	}
	// The user's sandbox, by name, is not this session's.
	res, err = sess.CallTool(ctx, &mcp.CallToolParams{Name: "checkpoints", Arguments: map[string]any{"sandbox": "mcp-user-s"}})
	if err != nil || !res.IsError || !strings.Contains(toolText(res), "only on sandboxes it created or picked") {
		t.Errorf("checkpoints of the user's sandbox: %v %s", err, toolText(res))
	}
	// Give the sync a moment: nothing reaches S on the host.
	call(t, ctx, sess, "run", map[string]any{"command": "sync"}, &r)
	time.Sleep(2 * time.Second)
	entries, _ := os.ReadDir(s)
	if len(entries) != 1 {
		t.Errorf("S on the host holds %v, want id_rsa alone", entries)
	}
}
