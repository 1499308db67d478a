package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The attacks of issue 9 on the workspace sync, from a root guest: the
// guest must never get its own code run on the host through the folder,
// nor make a link that leads out of it, nor fill the host's disk.

// hostGit runs git on the host in dir, as a user would, with no user or
// system config of the machine's.
func hostGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=u", "-c", "user.email=u@example.com"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Dir(dir), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_PAGER=cat")
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// setWorkspaceConfig edits the sandbox's stored workspace config (the
// sandbox is stopped).
func setWorkspaceConfig(t *testing.T, name string, set map[string]any) {
	t.Helper()
	p := filepath.Join(ls(t)[name].Dir, "sandbox.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	ws := cfg["workspace"].(map[string]any)
	for k, v := range set {
		ws[k] = v
	}
	b, _ = json.Marshal(cfg)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

type syncStatus struct {
	Held []struct {
		Path string `json:"path"`
		Why  string `json:"why"`
	} `json:"held"`
	Pending []struct {
		Path string `json:"path"`
	} `json:"pending"`
	Skipped []string `json:"skipped"`
	Errors  []string `json:"errors"`
	Quota   struct {
		Bytes    int64 `json:"bytes"`
		MaxBytes int64 `json:"max_bytes"`
		Refused  int   `json:"refused"`
	} `json:"quota"`
}

func syncNow(t *testing.T, name string) syncStatus {
	t.Helper()
	var st syncStatus
	if err := json.Unmarshal([]byte(must(t, "sync", "now", name, "--json").stdout), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func heldPaths(st syncStatus) map[string]string {
	m := map[string]string{}
	for _, h := range st.Held {
		m[h.Path] = h.Why
	}
	return m
}

// linksLeave lists the links in dir that the host's kernel resolves to a
// place outside dir.
func linksLeave(dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			return nil
		}
		if real, err := filepath.EvalSymlinks(p); err == nil && real != dir && !strings.HasPrefix(real, dir+"/") {
			l, _ := os.Readlink(p)
			out = append(out, fmt.Sprintf("%s -> %s (%s)", p, l, real))
		}
		return nil
	})
	return out
}

// attackBase skips where the host has no git (the attacks target it) and
// returns a fresh folder under the run's home for one attack's files.
func attackBase(t *testing.T, prefix string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed on this host: the attacks target host git")
	}
	base, err := os.MkdirTemp(home, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return base
}

// gitAnyOwner lets root's git work in the guest user's repository.
const gitAnyOwner = "export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'; "

func TestAttackWorkspace(t *testing.T) {
	base := attackBase(t, "atk-")
	ws := filepath.Join(base, "project")
	os.MkdirAll(ws, 0o755)
	os.WriteFile(filepath.Join(ws, "README.md"), []byte("hi\n"), 0o644)
	hostGit(t, ws, "init", "-q", "-b", "main")
	hostGit(t, ws, "remote", "add", "origin", "https://example.com/r.git")
	hostGit(t, ws, "add", "README.md")
	hostGit(t, ws, "commit", "-q", "-m", "first")
	// The host repository runs hooks from a folder of the workspace: the
	// guest's files there must be held like .git/hooks.
	hostGit(t, ws, "config", "core.hooksPath", "tools/hooks")
	origConfig, _ := os.ReadFile(filepath.Join(ws, ".git", "config"))
	// Outside the folder: what an escaping link would reach.
	os.WriteFile(filepath.Join(base, "x"), []byte("OUTSIDE\n"), 0o644)
	marker := filepath.Join(base, "pwned")
	pwned := func() []string {
		m, _ := filepath.Glob(marker + "*")
		return m
	}

	name := "atk"
	must(t, "create", name, "--workspace", ws)
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	setWorkspaceConfig(t, name, map[string]any{"quota_bytes": 100 << 20})
	must(t, "start", name)
	root := func(t *testing.T, script string) result {
		t.Helper()
		r := run(t, "", "exec", "-u", "root", name, "--", "sh", "-c", "set -e; cd "+ws+"; "+gitAnyOwner+script)
		if r.code != 0 {
			t.Fatalf("inside: %s", r)
		}
		return r
	}
	hostChecks := func(t *testing.T, what string) {
		t.Helper()
		hostGit(t, ws, "status")
		hostGit(t, ws, "commit", "-q", "--allow-empty", "-m", what)
		hostGit(t, filepath.Join(ws, "sub"), "status")
		hostGit(t, filepath.Join(ws, "newrepo"), "status")
		hostGit(t, filepath.Join(ws, "bare"), "-p", "log")
		if m := pwned(); len(m) > 0 {
			t.Fatalf("%s: the guest's code ran on the host: %v", what, m)
		}
	}

	t.Run("git indirections and held files", func(t *testing.T) {
		root(t, strings.ReplaceAll(`
			printf '#!/bin/sh\ntouch M-hook\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit
			echo 'touch M-envrc' > .envrc
			mkdir -p .vscode; echo '{"tasks":[{"command":"touch M-vscode","runOptions":{"runOn":"folderOpen"}}]}' > .vscode/tasks.json
			mkdir -p other/objects other/refs
			printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch M-commondir\n' > other/config
			echo ../other > .git/commondir
			mkdir -p sub evilgd/objects evilgd/refs
			printf 'gitdir: ../evilgd\n' > sub/.git
			echo 'ref: refs/heads/main' > evilgd/HEAD
			printf '[core]\n\tfsmonitor = touch M-gitdir\n' > evilgd/config
			mkdir -p .git/worktrees/w; echo ../../../other > .git/worktrees/w/commondir
			printf '[core]\n\tfsmonitor = touch M-worktree\n' > .git/worktrees/w/config.worktree
			mkdir -p newrepo; git init -q newrepo
			printf '[core]\n\tfsmonitor = touch M-newrepo\n' >> newrepo/.git/config
			mkdir -p bare/objects bare/refs; echo 'ref: refs/heads/main' > bare/HEAD
			printf '[core]\n\tpager = touch M-bare\n' > bare/config
		`, "M-", marker+"-"))
		st := syncNow(t, name)
		held := heldPaths(st)
		for _, p := range []string{".git/hooks/pre-commit", ".envrc", ".vscode/tasks.json", ".git/commondir", "sub/.git",
			".git/worktrees/w/commondir", "newrepo/.git", "bare/HEAD"} {
			if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
				t.Errorf("%s reached the host", p)
			}
			if _, ok := held[p]; !ok {
				t.Errorf("%s is not reported held", p)
			}
		}
		hostChecks(t, "indirections")
	})

	t.Run("git config", func(t *testing.T) {
		for what, script := range map[string]string{
			"core.hooksPath": `git config -f .git/config core.hooksPath /tmp/evil-hooks`,
			"include":        `printf '[include]\n\tpath = ../other/config\n' >> .git/config`,
			"huge config": `{ cat .git/config; yes '# padding padding padding' | head -n 42000;
				printf '[core]\n\tfsmonitor = touch M-huge\n'; } > /tmp/c && cat /tmp/c > .git/config && test $(stat -c %s .git/config) -gt 1048576`,
		} {
			root(t, "cp .git/config /tmp/orig-config; "+strings.ReplaceAll(script, "M-", marker+"-"))
			st := syncNow(t, name)
			if b, _ := os.ReadFile(filepath.Join(ws, ".git", "config")); string(b) != string(origConfig) {
				t.Errorf("%s: the config reached the host:\n%.300s", what, b)
			}
			if _, ok := heldPaths(st)[".git/config"]; !ok {
				t.Errorf("%s: .git/config not held (held: %d paths)", what, len(st.Held))
			}
			hostChecks(t, what)
			root(t, "cat /tmp/orig-config > .git/config")
		}
	})

	t.Run("what the host's git config names, held folders as links, control characters", func(t *testing.T) {
		root(t, strings.ReplaceAll(`
			mkdir -p tools/hooks; printf '#!/bin/sh\ntouch M-hookspath\n' > tools/hooks/pre-commit; chmod +x tools/hooks/pre-commit
			ln -s tools/hooks .githooks
			echo x > "$(printf 'name\033]0;pwned\007')"
			echo fine > tools/notes.txt
		`, "M-", marker+"-"))
		st := syncNow(t, name)
		held := heldPaths(st)
		for _, p := range []string{"tools/hooks/pre-commit", ".githooks", "name\x1b]0;pwned\x07"} {
			if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
				t.Errorf("%q reached the host", p)
			}
			if _, ok := held[p]; !ok {
				t.Errorf("%q is not reported held (held: %v)", p, held)
			}
		}
		if b, err := os.ReadFile(filepath.Join(ws, "tools", "notes.txt")); err != nil || string(b) != "fine\n" {
			t.Errorf("an ordinary file beside the hooks did not cross: %q %v", b, err)
		}
		hostChecks(t, "hooksPath")
		out := run(t, "", "held", name).stdout
		if strings.ContainsAny(out, "\x1b\x07") {
			t.Errorf("kosa8 held printed the guest's control characters: %q", out)
		}
	})

	t.Run("rewind keeps held files held", func(t *testing.T) {
		cp := checkpointNow(t, name, "with held files")
		root(t, "rm -f .envrc; echo after > after.txt")
		waitHost(t, "after.txt", fileIs(filepath.Join(ws, "after.txt"), "after\n"))
		must(t, "rewind", name, cp.ID)
		st := syncNow(t, name)
		for _, p := range []string{".git/hooks/pre-commit", ".envrc", ".vscode/tasks.json", ".git/commondir", "sub/.git"} {
			if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
				t.Errorf("the rewind wrote %s to the host", p)
			}
		}
		if _, ok := heldPaths(st)[".envrc"]; !ok {
			t.Errorf(".envrc not held after the rewind: %+v", st.Held)
		}
		if _, err := os.Stat(filepath.Join(ws, "after.txt")); err == nil {
			t.Error("the rewind left the agent's later file on the host")
		}
		hostChecks(t, "after the rewind")
	})

	t.Run("link chains", func(t *testing.T) {
		root(t, `mkdir -p a/b/c; ln -s ../.. a/b/c/up; ln -s a/b/c/up/../../x escape`)
		syncNow(t, name)
		// The other order, across two passes: the chain's far end first.
		root(t, `mkdir -p d/e/f; ln -s d/e/f/up/../../x escape2`)
		syncNow(t, name)
		root(t, `ln -s ../.. d/e/f/up`)
		st := syncNow(t, name)
		if out := linksLeave(ws); len(out) > 0 {
			t.Fatalf("links on the host lead out of the folder: %v\nheld: %+v", out, st.Held)
		}
		if b, err := os.ReadFile(filepath.Join(ws, "escape")); err == nil && strings.Contains(string(b), "OUTSIDE") {
			t.Fatal("escape reads outside the folder")
		}
	})

	t.Run("link then folder", func(t *testing.T) {
		root(t, `mkdir -p s/t; ln -s s/t/../../x l`)
		syncNow(t, name)
		root(t, `rm -rf s/t; mkdir -p s/u/v; ln -s u/v s/t`)
		syncNow(t, name)
		if out := linksLeave(ws); len(out) > 0 {
			t.Fatalf("links on the host lead out of the folder: %v", out)
		}
	})

	t.Run("sparse files and the quota", func(t *testing.T) {
		// 64M, not 1000M: under TCG on a loaded machine the guest hashes
		// and streams the zeros at a few MB/s (the agent does not send
		// holes); what matters here is what the host keeps of them, the
		// same at any size (the unit tests copy 120 MiB of holes).
		start := time.Now()
		root(t, `truncate -s 64M big1`)
		st := syncNow(t, name)
		took := time.Since(start)
		var s syscall.Stat_t
		if err := syscall.Stat(filepath.Join(ws, "big1"), &s); err != nil {
			t.Fatalf("big1 not on the host: %v (status %+v)", err, st)
		}
		t.Logf("64M sparse file synced in %s; on the host: size %d, %d bytes allocated (accel %s)", took, s.Size, s.Blocks*512, ls(t)[name].Status.Accel)
		if s.Size != 64<<20 || s.Blocks*512 > 16<<20 {
			t.Fatalf("the sparse file cost the host %d bytes", s.Blocks*512)
		}
		root(t, `truncate -s 64M big2`)
		st = syncNow(t, name)
		if _, err := os.Stat(filepath.Join(ws, "big2")); err == nil {
			t.Fatal("the quota did not stop big2")
		}
		if st.Quota.Refused == 0 || !strings.Contains(strings.Join(st.Skipped, "\n"), "sync quota") {
			t.Fatalf("quota not reported: %+v", st)
		}
		out := must(t, "sync", "status", name).stdout
		if !strings.Contains(out, "quota") || !strings.Contains(out, "refused") {
			t.Fatalf("sync status does not say the quota was reached:\n%s", out)
		}
		root(t, `rm -f big1 big2`)
		syncNow(t, name)
	})
}

// A rewind in review mode writes nothing of the agent's to the host
// without apply.
func TestAttackReviewRewind(t *testing.T) {
	ws, err := os.MkdirTemp(home, "atk-review-")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ws, "app.py"), []byte("print(1)\n"), 0o644)
	name := "atkreview"
	must(t, "create", name, "--workspace", ws, "--review")
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	must(t, "exec", "-u", "root", name, "--", "sh", "-c", "cd "+ws+" && echo agent > new.txt && echo 'touch /tmp/x' > .envrc")
	syncNow(t, name)
	cp := checkpointNow(t, name, "review")
	must(t, "exec", name, "--", "sh", "-c", "cd "+ws+" && echo later > later.txt")
	syncNow(t, name)
	must(t, "rewind", name, cp.ID)
	st := syncNow(t, name)
	for _, p := range []string{"new.txt", ".envrc", "later.txt"} {
		if _, err := os.Stat(filepath.Join(ws, p)); err == nil {
			t.Errorf("%s reached the host in review mode", p)
		}
	}
	pending := map[string]bool{}
	for _, p := range st.Pending {
		pending[p.Path] = true
	}
	if !pending["new.txt"] {
		t.Fatalf("new.txt not pending after the rewind: %+v", st)
	}
	must(t, "apply", name, "new.txt")
	if b, _ := os.ReadFile(filepath.Join(ws, "new.txt")); string(b) != "agent\n" {
		t.Fatal("apply after the rewind did not write")
	}
}
