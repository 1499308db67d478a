package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/sdk"
)

// Attacks on `kosa8 mcp` as a model makes them (issue 28): the official
// MCP client, over the newline-delimited JSON of stdio (two pipes), against
// the server of a home holding the user's sandboxes, some of them on
// folders outside the server's. The sandboxes are fakes that look running:
// their supervisors are HTTP servers that record every request, so a test
// sees whether anything reached a sandbox the model may not touch.

// calls records the requests a fake supervisor got.
type calls struct {
	mu   sync.Mutex
	list []string
}

func (c *calls) add(s string) { c.mu.Lock(); c.list = append(c.list, s); c.mu.Unlock() }
func (c *calls) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.list...)
}

// attackRig is a state directory and the folders of the attacks:
//
//	top/A            the server's folder (--folder)
//	top/A/proj/sub   a project in it, with sandbox "mine" on top/A/proj
//	top/A/in         -> proj/sub, a link the sync made from a guest
//	top/A/S          a folder inside A named like the one beside it
//	top/S            beside A: the user's sandbox "other" syncs it
//	top/home         $HOME
type attackRig struct {
	home, top, a, s string
	calls           map[string]*calls // by sandbox name
	stop            map[string]func()
}

func newAttackRig(t *testing.T) *attackRig {
	t.Helper()
	home, err := os.MkdirTemp("", "k8m-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	t.Setenv("KOSA8_HOME", home)
	t.Setenv("KOSA8_CONFIG", filepath.Join(home, "config"))
	t.Setenv("KOSA8_CACHE", filepath.Join(home, "cache"))
	top, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &attackRig{home: home, top: top, a: filepath.Join(top, "A"), s: filepath.Join(top, "S"), calls: map[string]*calls{}, stop: map[string]func(){}}
	for _, d := range []string{"A/proj/sub", "A/S", "S", "home/.ssh"} {
		if err := os.MkdirAll(filepath.Join(top, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(top, "S", "id_rsa"), []byte("PRIVATE KEY"), 0o600)
	if err := os.Symlink("proj/sub", filepath.Join(r.a, "in")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", filepath.Join(top, "home"))
	r.running(t, "mine", "id-mine-1", filepath.Join(r.a, "proj"))
	r.running(t, "other", "id-other", r.s)
	return r
}

// running makes a sandbox that looks running, its supervisor a recorder
// that answers every request with an empty JSON object.
func (r *attackRig) running(t *testing.T, name, id, ws string) *sandbox.Sandbox {
	t.Helper()
	dir := filepath.Join(r.home, "sandboxes", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := sandbox.Config{ID: id, Name: name, Arch: "amd64", CPUs: 1, MemoryMiB: 512, DiskGiB: 8, User: "kosa8", UID: 1000, GID: 1000,
		Created: time.Now().UTC()}
	if ws != "" {
		cfg.Workspace = &sandbox.WorkspaceConfig{Path: ws}
	}
	writeJSON(t, filepath.Join(dir, "sandbox.json"), cfg)
	writeJSON(t, filepath.Join(dir, "state.json"), api.Status{State: api.Running})
	sb := &sandbox.Sandbox{Dir: dir, Config: cfg}
	lock, err := os.OpenFile(sb.Path("supervisor.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sb.Path(sandbox.APISocket))
	if err != nil {
		t.Fatal(err)
	}
	rec := &calls{}
	r.calls[name] = rec
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec.add(req.Method + " " + req.URL.Path + " id=" + req.Header.Get(api.SandboxIDHeader))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{}")
	})}
	go srv.Serve(l)
	// The listener is closed here, not only by srv: a Serve that had not
	// started yet would close it (unlinking its socket path) only once it
	// runs, maybe after a sandbox re-created under the name listens there.
	stop := func() { srv.Close(); l.Close(); lock.Close() }
	r.stop[name] = stop
	t.Cleanup(stop)
	return sb
}

// remove takes a sandbox away as 'kosa8 rm -f' would.
func (r *attackRig) remove(t *testing.T, name string) {
	t.Helper()
	r.stop[name]()
	if err := os.RemoveAll(filepath.Join(r.home, "sandboxes", name)); err != nil {
		t.Fatal(err)
	}
}

// session starts the MCP server on roots and connects the official client
// to it over stdio's framing.
func (r *attackRig) session(t *testing.T, roots ...string) *mcp.ClientSession {
	t.Helper()
	c, err := sdk.New(sdk.WithHome(r.home))
	if err != nil {
		t.Fatal(err)
	}
	var paths []folder.Path
	for _, root := range roots {
		p, err := folder.Resolve(root)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return stdioSession(t, newMCPServer(c, slog.New(slog.NewTextHandler(io.Discard, nil)), paths...))
}

// stdioSession connects the official MCP client to srv through two pipes
// carrying stdio's newline-delimited JSON, as `kosa8 mcp` is spoken to.
func stdioSession(t *testing.T, srv *mcp.Server) *mcp.ClientSession {
	t.Helper()
	toServer, fromClient, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	toClient, fromServer, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ss, err := srv.Connect(ctx, &mcp.IOTransport{Reader: toServer, Writer: fromServer}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "attacker", Version: "1"}, nil).Connect(ctx, &mcp.IOTransport{Reader: toClient, Writer: fromClient}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callTool calls a tool and returns its structured answer (JSON) or its
// error text.
func callTool(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (out string, toolErr string) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: %v", tool, args, err)
	}
	if res.IsError {
		return "", textOf(res)
	}
	b, _ := json.Marshal(res.StructuredContent)
	return string(b), ""
}

// pickOK picks a folder and returns the sandbox's name and workspace.
func pickOK(t *testing.T, cs *mcp.ClientSession, folder string) PickOut {
	t.Helper()
	out, e := callTool(t, cs, "sandbox_create_or_pick", map[string]any{"folder": folder})
	if e != "" {
		t.Fatalf("pick %s: %s", folder, e)
	}
	var p PickOut
	json.Unmarshal([]byte(out), &p)
	return p
}

// argsFor are arguments every tool on a sandbox accepts, aimed at the
// sandbox named; a tool added without an entry here fails the test that
// walks them, so each new tool is attacked too.
func argsFor(tool, sandbox, outside string) map[string]any {
	m := map[string]map[string]any{
		"run":                  {"command": "cat " + outside + "/id_rsa"},
		"read_file":            {"path": outside + "/id_rsa"},
		"write_file":           {"path": outside + "/authorized_keys", "content": "ssh-ed25519 AAAA attacker"},
		"list_dir":             {"path": outside},
		"checkpoint":           {"message": "m"},
		"rewind":               {"id": "cp1"},
		"checkpoints":          {},
		"net_blocked":          {},
		"net_request_approval": {"host": "example.com", "reason": "x"},
		"fork":                 {"count": 2, "command": "cat " + outside + "/id_rsa"},
		"forks":                {},
	}[tool]
	if m == nil {
		return nil
	}
	m["sandbox"] = sandbox
	return m
}

// 1. Any sandbox by name: every tool, given the user's other sandbox
// (running, its folder outside the server's), is refused by the rule, and
// nothing reaches that sandbox's supervisor or its state directory.
func TestMCPAttackOtherSandboxByName(t *testing.T) {
	r := newAttackRig(t)
	cs := r.session(t, r.a)
	pickOK(t, cs, filepath.Join(r.a, "proj"))
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tried := 0
	for _, tool := range list.Tools {
		if tool.Name == "sandbox_create_or_pick" {
			continue
		}
		args := argsFor(tool.Name, "other", r.s)
		if args == nil {
			t.Errorf("tool %s has no attack arguments in argsFor: add them", tool.Name)
			continue
		}
		tried++
		out, e := callTool(t, cs, tool.Name, args)
		if e == "" {
			t.Errorf("%s on sandbox other (folder %s, outside %s) answered %s", tool.Name, r.s, r.a, out)
		} else if !strings.Contains(e, "only on sandboxes it created or picked") {
			t.Errorf("%s on other: the error does not name the rule: %s", tool.Name, e)
		}
	}
	if tried < 9 {
		t.Errorf("only %d tools tried", tried)
	}
	if got := r.calls["other"].all(); len(got) > 0 {
		t.Errorf("the other sandbox's supervisor was asked: %v", got)
	}
	if _, err := os.Stat(filepath.Join(r.home, "sandboxes", "other", "net-requests.jsonl")); err == nil {
		t.Error("a request was recorded in the other sandbox's state directory")
	}
	if _, err := os.Stat(filepath.Join(r.s, "authorized_keys")); err == nil {
		t.Error("a file landed in the other sandbox's folder")
	}
	// The picked sandbox still works, named or not, and its requests name
	// its identity.
	for _, args := range []map[string]any{{"command": "true"}, {"command": "true", "sandbox": "mine"}} {
		if _, e := callTool(t, cs, "run", args); strings.Contains(e, "not allowed") || strings.Contains(e, "only on sandboxes") {
			t.Errorf("run %v in the picked sandbox: %s", args, e)
		}
	}
	if got := r.calls["mine"].all(); len(got) == 0 || !strings.HasSuffix(got[0], "id=id-mine-1") {
		t.Errorf("the picked sandbox's supervisor got %v", got)
	}
}

// Before any pick, a sandbox of the server's own folders is refused too:
// the session acts on what it picked, not on a name it guessed; one the
// user gave it (--sandbox) it may use, if its folder is among the
// server's.
func TestMCPAttackUnpickedSandboxInsideTheFolders(t *testing.T) {
	r := newAttackRig(t)
	cs := r.session(t, r.a)
	_, e := callTool(t, cs, "write_file", map[string]any{"sandbox": "mine", "path": "x", "content": "y"})
	if !strings.Contains(e, "only on sandboxes it created or picked") {
		t.Errorf("write_file in an unpicked sandbox: %q", e)
	}
	if got := r.calls["mine"].all(); len(got) > 0 {
		t.Errorf("its supervisor was asked: %v", got)
	}

	c, err := sdk.New(sdk.WithHome(r.home))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := folder.Resolve(r.a)
	srv, s := newMCPSession(c, slog.New(slog.NewTextHandler(io.Discard, nil)), a)
	if err := s.give([]string{"other"}); err == nil || !strings.Contains(err.Error(), "outside the folders") {
		t.Errorf("--sandbox other (outside): %v", err)
	}
	if err := s.give([]string{"mine"}); err != nil {
		t.Fatal(err)
	}
	cs = stdioSession(t, srv)
	if _, e := callTool(t, cs, "checkpoints", map[string]any{}); e != "" {
		t.Errorf("checkpoints in the sandbox given with --sandbox: %s", e)
	}
	if _, e := callTool(t, cs, "checkpoints", map[string]any{"sandbox": "other"}); !strings.Contains(e, "only on sandboxes") {
		t.Errorf("checkpoints in other: %q", e)
	}
	if got := r.calls["other"].all(); len(got) > 0 {
		t.Errorf("the other sandbox's supervisor was asked: %v", got)
	}
}

// 2. ".." after a link: A/in -> proj/sub, so A/in/../../S is A/S (the
// parent of A/proj/sub is A/proj, its parent A), never S beside A, which
// the user's sandbox "other" syncs.
func TestMCPAttackDotDotAfterALink(t *testing.T) {
	r := newAttackRig(t)
	r.running(t, "inner", "id-inner", filepath.Join(r.a, "S"))
	cs := r.session(t, r.a)
	p := pickOK(t, cs, r.a+"/in/../../S")
	if p.Sandbox != "inner" || p.Workspace != filepath.Join(r.a, "S") {
		t.Fatalf("A/in/../../S picked %+v: want inner on %s", p, filepath.Join(r.a, "S"))
	}
	// Without A/S, the same path is a folder that does not exist: refused,
	// not read as S beside A.
	r.remove(t, "inner")
	os.Remove(filepath.Join(r.a, "S"))
	cs = r.session(t, r.a)
	_, e := callTool(t, cs, "sandbox_create_or_pick", map[string]any{"folder": r.a + "/in/../../S"})
	if e == "" || !strings.Contains(e, "does not exist") {
		t.Errorf("A/in/../../S without A/S: %q", e)
	}
	if got := r.calls["other"].all(); len(got) > 0 {
		t.Errorf("the other sandbox's supervisor was asked: %v", got)
	}
}

// ".." in every path argument of every tool: a folder argument is read as
// the file system reads it and checked as such; a path in the sandbox is
// the guest's (the host never opens it: the sandbox's supervisor gets it
// as given).
func TestMCPAttackDotDotInEveryPath(t *testing.T) {
	r := newAttackRig(t)
	cs := r.session(t, r.a)
	for _, f := range []string{
		r.a + "/..",
		r.a + "/../S",
		r.a + "/proj/../../S",
		r.a + "/in/../../../S",
		r.a + "/in/../../..",
		r.a + "/proj/sub/../../../../../../..",
		r.a + "/../A/../S",
	} {
		_, e := callTool(t, cs, "sandbox_create_or_pick", map[string]any{"folder": f})
		if !strings.Contains(e, "outside the folders this server may use") {
			t.Errorf("pick %s: %q", f, e)
		}
	}
	// A folder inside the picked sandbox's (through the link) is not a
	// second sandbox's: two syncs of one folder would fight.
	if _, e := callTool(t, cs, "sandbox_create_or_pick", map[string]any{"folder": r.a + "/in"}); !strings.Contains(e, "synced by sandbox mine") {
		t.Errorf("pick A/in (A/proj/sub, inside mine's A/proj): %q", e)
	}
	pickOK(t, cs, r.a+"/in/../../proj/./")
	dots := "../../../../../../../../.." + r.s
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"read_file", map[string]any{"path": dots + "/id_rsa"}},
		{"write_file", map[string]any{"path": dots + "/authorized_keys", "content": "x"}},
		{"list_dir", map[string]any{"path": dots}},
		{"run", map[string]any{"command": "true", "workdir": dots}},
	} {
		callTool(t, cs, tc.tool, tc.args)
	}
	if _, err := os.Stat(filepath.Join(r.s, "authorized_keys")); err == nil {
		t.Error("write_file with .. reached the host folder S")
	}
	if got := r.calls["other"].all(); len(got) > 0 {
		t.Errorf("the other sandbox's supervisor was asked: %v", got)
	}
	// The sandbox name is a name, never a path.
	for _, name := range []string{"../other", "mine/../other", "./other", "/other", "other/", ".."} {
		_, e := callTool(t, cs, "run", map[string]any{"sandbox": name, "command": "true"})
		if e == "" {
			t.Errorf("sandbox %q accepted", name)
		}
	}
	if got := r.calls["other"].all(); len(got) > 0 {
		t.Errorf("the other sandbox's supervisor was asked: %v", got)
	}
}

// A folder that is itself a link to $HOME (or above it) is the home
// directory, refused as a pick and as the server's folder.
func TestMCPAttackLinkToHome(t *testing.T) {
	r := newAttackRig(t)
	home := filepath.Join(r.top, "home")
	os.Symlink(home, filepath.Join(r.a, "h"))
	os.Symlink("../..", filepath.Join(r.a, "proj", "up"))
	cs := r.session(t, r.a)
	for _, f := range []string{r.a + "/h", r.a + "/h/.ssh", r.a + "/proj/up/home"} {
		_, e := callTool(t, cs, "sandbox_create_or_pick", map[string]any{"folder": f})
		if !strings.Contains(e, "outside the folders") {
			t.Errorf("pick %s (%s): %q", f, home, e)
		}
	}
	for _, roots := range [][]string{{r.a + "/h"}, {home}, {r.top}, {r.a + "/proj/up/.."}, {"/"}} {
		if got, err := mcpRoots(roots); err == nil || !strings.Contains(err.Error(), "keys and credentials") {
			t.Errorf("--folder %v: %v %v", roots, got, err)
		}
	}
	if got, err := mcpRoots([]string{r.a + "/in"}); err != nil || len(got) != 1 || got[0].String() != r.a+"/proj/sub" {
		t.Errorf("--folder A/in: %v %v", got, err)
	}
}

// A sandbox removed and made again under the same name between two calls
// is another sandbox: the session's pick does not carry over to it, by
// name or by default, even on the same folder.
func TestMCPAttackRecreatedUnderTheSameName(t *testing.T) {
	r := newAttackRig(t)
	cs := r.session(t, r.a)
	pickOK(t, cs, filepath.Join(r.a, "proj"))
	if _, e := callTool(t, cs, "checkpoints", map[string]any{}); strings.Contains(e, "only on sandboxes") {
		t.Fatalf("checkpoints in the picked sandbox: %s", e)
	}
	before := len(r.calls["mine"].all())
	r.remove(t, "mine")
	r.running(t, "mine", "id-mine-2", r.s) // now on the folder outside
	for _, args := range []map[string]any{{}, {"sandbox": "mine"}} {
		_, e := callTool(t, cs, "checkpoints", args)
		if !strings.Contains(e, "not the sandbox this session picked") {
			t.Errorf("checkpoints %v in the re-created sandbox: %q", args, e)
		}
	}
	if got := r.calls["mine"].all(); len(got) > 0 {
		t.Errorf("the new sandbox's supervisor was asked: %v (the old one was asked %d times)", got, before)
	}
	// Made again on the same folder: still another sandbox, until picked.
	r.remove(t, "mine")
	r.running(t, "mine", "id-mine-3", filepath.Join(r.a, "proj"))
	if _, e := callTool(t, cs, "checkpoints", map[string]any{}); !strings.Contains(e, "not the sandbox this session picked") {
		t.Errorf("checkpoints in the re-created sandbox on the same folder: %q", e)
	}
	pickOK(t, cs, filepath.Join(r.a, "proj"))
	if _, e := callTool(t, cs, "checkpoints", map[string]any{}); e != "" && strings.Contains(e, "only on sandboxes") {
		t.Errorf("checkpoints after picking it: %q", e)
	}
}

// Unicode look-alikes: a sandbox name is ASCII (another name is refused,
// not folded onto a sandbox), and a folder named with a Cyrillic "о" is
// another folder, outside.
func TestMCPAttackLookAlikes(t *testing.T) {
	r := newAttackRig(t)
	look := filepath.Join(r.top, "A\u0301") // A + combining acute: not A
	os.MkdirAll(filepath.Join(r.top, "pr\u043ej"), 0o755)
	os.MkdirAll(look, 0o755)
	cs := r.session(t, r.a)
	pickOK(t, cs, filepath.Join(r.a, "proj"))
	for _, name := range []string{"m\u0456ne", "oth\u0435r", "mine\u200b", "mine "} {
		_, e := callTool(t, cs, "run", map[string]any{"sandbox": name, "command": "true"})
		if e == "" {
			t.Errorf("sandbox %q accepted", name)
		}
	}
	for _, f := range []string{filepath.Join(r.top, "pr\u043ej"), look} {
		_, e := callTool(t, cs, "sandbox_create_or_pick", map[string]any{"folder": f})
		if !strings.Contains(e, "outside the folders") {
			t.Errorf("pick %q: %q", f, e)
		}
	}
	if got := r.calls["other"].all(); len(got) > 0 {
		t.Errorf("the other sandbox's supervisor was asked: %v", got)
	}
}

// A pick does not start a stopped sandbox whose folder is inside (or
// above) a running sandbox's: two syncs of one folder would fight over
// its files, the second taking the first one's guest's writes for the
// user's. Every face's create refuses such a folder, and so does the
// CLI's start; the pick started it. Here the user made "sub" on A/proj/sub
// earlier, while "mine" (on A/proj) was stopped.
func TestMCPAttackPickStartsASandboxInsideARunningOnes(t *testing.T) {
	r := newAttackRig(t)
	sub := filepath.Join(r.a, "proj", "sub")
	dir := filepath.Join(r.home, "sandboxes", "sub")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(dir, "sandbox.json"), sandbox.Config{ID: "id-sub", Name: "sub", Arch: "amd64", CPUs: 1, MemoryMiB: 512, DiskGiB: 8,
		User: "kosa8", UID: 1000, GID: 1000, Created: time.Now().UTC(), Workspace: &sandbox.WorkspaceConfig{Path: sub}})
	writeJSON(t, filepath.Join(dir, "state.json"), api.Status{State: api.Stopped})
	// A kosa8 that records being started (and fails), so nothing real runs.
	bins := t.TempDir()
	bin := filepath.Join(bins, "kosa8")
	started := filepath.Join(t.TempDir(), "started")
	os.WriteFile(bin, []byte("#!/bin/sh\ntouch "+started+"\nexit 1\n"), 0o755)
	t.Setenv("KOSA8_AGENT", "")
	if self, err := os.Executable(); err == nil { // an ELF of this machine's arch
		os.Symlink(self, filepath.Join(bins, "kosa8-agent"))
	}
	c, err := sdk.New(sdk.WithHome(r.home), sdk.WithBinary(bin))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := folder.Resolve(r.a)
	cs := stdioSession(t, newMCPServer(c, slog.New(slog.NewTextHandler(io.Discard, nil)), a))
	_, e := callTool(t, cs, "sandbox_create_or_pick", map[string]any{"folder": sub})
	if !strings.Contains(e, "synced by sandbox mine") {
		t.Errorf("pick %s (inside mine's running %s): %q", sub, filepath.Join(r.a, "proj"), e)
	}
	if _, err := os.Stat(started); err == nil {
		t.Error("the sandbox inside the running one's folder was started")
	}
}

// A sandbox made before kosa8 gave sandboxes an ID is granted by its
// identity all the same (the instant it was made), and its requests name
// that identity: else a sandbox made under its name between the check and
// the request (its socket at the same path) would take them.
func TestMCPAttackSandboxWithoutIDNamesItsIdentity(t *testing.T) {
	r := newAttackRig(t)
	r.remove(t, "mine")
	sb := r.running(t, "mine", "", filepath.Join(r.a, "proj"))
	cs := r.session(t, r.a)
	pickOK(t, cs, filepath.Join(r.a, "proj"))
	_, e := callTool(t, cs, "run", map[string]any{"command": "true"})
	got := r.calls["mine"].all()
	if len(got) == 0 {
		t.Fatalf("the picked sandbox's supervisor was not asked: %s", e)
	}
	for _, c := range got {
		if !strings.HasSuffix(c, " id="+sb.Identity()) {
			t.Errorf("request %q does not name the sandbox's identity %s", c, sb.Identity())
		}
	}
}
