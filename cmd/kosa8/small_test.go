package main

import (
	"encoding/json"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/sdk"
)

// captureStdout returns what f printed on os.Stdout.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	f()
	os.Stdout = old
	w.Close()
	return <-done
}

// kosa8 version and --version give a semantic version and the commit.
func TestVersion(t *testing.T) {
	semver := regexp.MustCompile(`^kosa8 \d+\.\d+\.\d+ \(commit [^,]+, go[^,]+, [a-z0-9]+/[a-z0-9]+\)\n$`)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, stderr := kosa8(t, args...)
		if code != 0 || !semver.MatchString(stdout) {
			t.Errorf("%v: exit %d, %q %q", args, code, stdout, stderr)
		}
	}
	_, stdout, _ := kosa8(t, "version", "--json")
	var v versionInfo
	if err := json.Unmarshal([]byte(stdout), &v); err != nil || v.Version != release || v.Commit == "" {
		t.Errorf("version --json: %q %v", stdout, err)
	}
}

// resume is listed in the help that pause's help sends one to.
func TestHelpListsResume(t *testing.T) {
	_, stdout, _ := kosa8(t, "--help")
	if !regexp.MustCompile(`(?m)^  resume +Continue paused sandboxes`).MatchString(stdout) {
		t.Fatalf("--help: %s", stdout)
	}
}

// 'kosa8 checkpoint ls NAME' lists checkpoints, and without NAME says
// what it wants, not "no such sandbox named ls"; checkpoints --json
// carries the totals the text view ends with.
func TestCheckpointLsAndTotals(t *testing.T) {
	home := fakeHome(t)
	fakeSandbox(t, home, "dev", "", api.Status{State: api.Stopped})
	code, stdout, stderr := kosa8(t, "checkpoint", "ls", "dev")
	if code != 0 || !strings.Contains(stdout, "no checkpoints") {
		t.Fatalf("checkpoint ls dev: exit %d %q %q", code, stdout, stderr)
	}
	code, _, stderr = kosa8(t, "checkpoint", "ls")
	if code != 125 || strings.Contains(stderr, "no such sandbox") || !strings.Contains(stderr, "accepts 1 arg") {
		t.Fatalf("checkpoint ls: exit %d %q", code, stderr)
	}
	_, stdout, _ = kosa8(t, "checkpoints", "dev", "--json")
	var out struct {
		Checkpoints []json.RawMessage `json:"checkpoints"`
		Totals      map[string]int64  `json:"totals"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || out.Checkpoints == nil || out.Totals == nil {
		t.Fatalf("checkpoints --json: %v %q", err, stdout)
	}
	for _, k := range []string{"count", "checkpoints_bytes", "spare_bytes", "live_disk_bytes", "sandbox_bytes"} {
		if _, ok := out.Totals[k]; !ok {
			t.Errorf("totals lack %s: %q", k, stdout)
		}
	}
}

// image ls has a header and space-aligned columns, as ls has.
func TestImageLsLayout(t *testing.T) {
	var b strings.Builder
	printImages(&b, []*image.Image{
		{Dir: "/c/images/amd64/568dfa691137b60c-20261203T100135", Manifest: image.Manifest{Recipe: image.Recipe{Arch: "amd64", Suite: "trixie"}, KernelVersion: "6.12.118", RootFSBytes: 1026 << 20, Built: time.Now()}},
		{Dir: "/c/images/amd64/d-1234", Manifest: image.Manifest{Recipe: image.Recipe{Arch: "amd64"}, KernelVersion: "6.12.118", RootFSBytes: 2573 << 20, Built: time.Now(),
			Derived: &image.DerivedRecipe{Label: "claude", Base: "568dfa691137b60c0123"}}},
	}, nil)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME ") || strings.Contains(b.String(), "\t") {
		t.Fatalf("%q", b.String())
	}
	col := strings.Index(lines[0], "KIND")
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l[col:], "base") && !strings.HasPrefix(l[col:], "derived: claude on 568dfa691137b60c ") {
			t.Errorf("column KIND misaligned: %q", l)
		}
	}
}

// held says when nothing is held; sync status names the sandbox in its
// hint rather than a literal NAME.
func TestHeldAndSyncStatusTexts(t *testing.T) {
	var b strings.Builder
	printHeld(&b, "dev", nil)
	if b.String() != "(nothing held for approval in dev)\n" {
		t.Errorf("held, nothing: %q", b.String())
	}
	out := captureStdout(t, func() {
		printSyncStatus("dev", &sdk.SyncStatus{Path: "/w", Held: []sdk.SyncChange{{Path: ".envrc", Kind: "modified", Why: "held"}}}, false)
	})
	if !strings.Contains(out, "'kosa8 approve dev PATH'") || strings.Contains(out, "NAME") {
		t.Errorf("sync status: %q", out)
	}
}

// An agent that writes its credentials where a key is stored already is
// told there is nothing to do, not to 'secret add' that key again.
func TestCredentialAdvice(t *testing.T) {
	p, err := agent.Get("claude")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	adviseCredentials(&b, p, []string{".claude/.credentials.json"}, func(n string) bool { return n == "ANTHROPIC_API_KEY" })
	if !strings.Contains(b.String(), "ANTHROPIC_API_KEY is stored on this machine") || strings.Contains(b.String(), "secret add") {
		t.Errorf("stored: %q", b.String())
	}
	b.Reset()
	adviseCredentials(&b, p, []string{".claude/.credentials.json"}, func(string) bool { return false })
	if !strings.Contains(b.String(), "kosa8 secret add ANTHROPIC_API_KEY") {
		t.Errorf("not stored: %q", b.String())
	}
}

// run without --rm says which sandbox it left, and how to remove it, when
// kosa8 chose its name.
func TestRunSaysWhatItKept(t *testing.T) {
	home := fakeHome(t)
	sb := fakeSandbox(t, home, "demo-x1y2", "", api.Status{State: api.Stopped})
	m, _ := manager()
	var b strings.Builder
	keptNote(&b, m, sb, true)
	if !strings.Contains(b.String(), "sandbox demo-x1y2 is kept") || !strings.Contains(b.String(), "'kosa8 rm demo-x1y2'") || !strings.Contains(b.String(), "--rm") {
		t.Errorf("kept: %q", b.String())
	}
	b.Reset()
	keptNote(&b, m, sb, false)
	sb.Config.Ephemeral = true
	keptNote(&b, m, sb, true)
	if b.String() != "" {
		t.Errorf("a named or --rm sandbox: %q", b.String())
	}
}
