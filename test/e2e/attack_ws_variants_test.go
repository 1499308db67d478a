package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The variants of TestAttackWorkspace that the wsync unit tests cover
// (TestHostGitConfigNamesHeld, TestHostGitConfigIndirect,
// TestDeletingWhatGitNamesHeld, TestGrowingFileKeepsQuota), attacked from a
// root guest against a host repository that uses them: includes and
// includeIf (in the repository's config and in the user's global one), a
// linked worktree with its own config.worktree and a relative hooksPath,
// the user's own link from .git/hooks into the folder.

// userGit runs git on the host in dir as a user whose global config is
// global.
func userGit(t *testing.T, global, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=u", "-c", "user.email=u@example.com"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Dir(global), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+global, "GIT_PAGER=cat")
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// duKiB is what dir takes on disk, in KiB.
func duKiB(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			if s, ok := fi.Sys().(*syscall.Stat_t); ok {
				total += s.Blocks * 512
			}
		}
		return nil
	})
	return total >> 10
}

func TestAttackWorkspaceVariants(t *testing.T) {
	base := attackBase(t, "atkv-")
	ws := filepath.Join(base, "project")
	marker := filepath.Join(base, "pwned")
	global := filepath.Join(base, "global.gitconfig")
	write := func(p, content string, mode os.FileMode) {
		t.Helper()
		p = filepath.Join(ws, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	// The user's global config pulls in a team config from the folder
	// for repositories under it (the supervisor reads GIT_CONFIG_GLOBAL).
	os.MkdirAll(ws, 0o755)
	os.WriteFile(global, []byte(fmt.Sprintf("[includeIf \"gitdir:%s/\"]\n\tpath = %s/team/inc.cfg\n", ws, ws)), 0o644)
	git := func(dir string, args ...string) string {
		t.Helper()
		return userGit(t, global, filepath.Join(ws, dir), args...)
	}
	write("README.md", "hi\n", 0o644)
	git(".", "init", "-q", "-b", "main")
	git(".", "add", "README.md")
	git(".", "commit", "-q", "-m", "first")
	// The repository's config includes x/inc.cfg (which includes
	// x/nested.cfg) and, on branch main, y/inc.cfg; neither y/inc.cfg nor
	// x/nested.cfg is on the host yet.
	git(".", "config", "include.path", "../x/inc.cfg")
	git(".", "config", "includeIf.onbranch:main.path", "../y/inc.cfg")
	write("x/inc.cfg", "[include]\n\tpath = nested.cfg\n", 0o644)
	// A linked worktree with a config of its own that runs hooks from a
	// folder of its work tree.
	git(".", "worktree", "add", "-q", "wt1", "-b", "wt1")
	git(".", "config", "extensions.worktreeConfig", "true")
	git("wt1", "config", "--worktree", "core.hooksPath", "wthooks")
	write("wt1/wthooks/post-commit", "#!/bin/sh\nexit 0\n", 0o755)
	// The user's own hook is a link to a script of the folder.
	write("scripts/precommit.sh", "#!/bin/sh\nexit 0\n", 0o755)
	if err := os.Symlink("../../scripts/precommit.sh", filepath.Join(ws, ".git/hooks/pre-commit")); err != nil {
		t.Fatal(err)
	}
	if out := git(".", "commit", "-q", "--allow-empty", "-m", "hooks work"); out != "" {
		t.Fatalf("host git before the sandbox: %s", out)
	}
	orig := map[string]string{}
	for _, p := range []string{".git/config", ".git/worktrees/wt1/config.worktree", "wt1/.git", "x/inc.cfg",
		"wt1/wthooks/post-commit", "scripts/precommit.sh"} {
		b, err := os.ReadFile(filepath.Join(ws, p))
		if err != nil {
			t.Fatal(err)
		}
		orig[p] = string(b)
	}
	pwned := func() []string {
		m, _ := filepath.Glob(marker + "*")
		return m
	}
	// hostChecks runs host git where the guest's files would make it run
	// something: status (fsmonitor, includes) and commit (hooks) in both
	// work trees; then nothing of the guest's may have run, nor any of the
	// host's files named above have changed.
	hostChecks := func(t *testing.T, what string) {
		t.Helper()
		for _, dir := range []string{".", "wt1"} {
			git(dir, "status")
			git(dir, "commit", "-q", "--allow-empty", "-m", what)
		}
		if m := pwned(); len(m) > 0 {
			t.Fatalf("%s: the guest's code ran on the host: %v", what, m)
		}
		for p, want := range orig {
			if b, err := os.ReadFile(filepath.Join(ws, p)); err != nil || string(b) != want {
				t.Errorf("%s: the host's %s changed: %q (%v)", what, p, b, err)
			}
		}
	}
	// mustHold checks that each path is held and that the host has
	// nothing of the guest's there (its own file, if any, unchanged).
	mustHold := func(t *testing.T, st syncStatus, paths ...string) {
		t.Helper()
		held := heldPaths(st)
		for _, p := range paths {
			if _, ok := held[p]; !ok {
				t.Errorf("%s is not reported held (held: %v)", p, held)
			}
			if _, mine := orig[p]; mine {
				continue // hostChecks compares it
			}
			if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
				t.Errorf("%s reached the host", p)
			}
		}
	}

	name := "atkv"
	env := []string{"GIT_CONFIG_GLOBAL=" + global}
	if r := runWith(t, env, "create", name, "--workspace", ws); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	const quota = 8 << 20
	setWorkspaceConfig(t, name, map[string]any{"quota_bytes": quota})
	if r := runWith(t, env, "start", name); r.code != 0 {
		t.Fatalf("start: %s", r)
	}
	root := func(t *testing.T, script string) result {
		t.Helper()
		script = strings.ReplaceAll(script, "M-", marker+"-")
		r := run(t, "", "exec", "-u", "root", name, "--", "sh", "-c", "set -e; cd "+ws+"; "+gitAnyOwner+script)
		if r.code != 0 {
			t.Fatalf("inside: %s", r)
		}
		return r
	}
	hostChecks(t, "before the attacks")

	t.Run("configs the host's configs include", func(t *testing.T) {
		root(t, `
			printf '[core]\n\tfsmonitor = touch M-include\n' > x/inc.cfg
			printf '[core]\n\tfsmonitor = touch M-nested\n' > x/nested.cfg
			mkdir -p y team
			printf '[core]\n\tfsmonitor = touch M-includeif\n' > y/inc.cfg
			printf '[core]\n\tfsmonitor = touch M-global\n' > team/inc.cfg
		`)
		st := syncNow(t, name)
		mustHold(t, st, "x/inc.cfg", "x/nested.cfg", "y/inc.cfg", "team/inc.cfg")
		hostChecks(t, "includes")
	})

	t.Run("linked worktree", func(t *testing.T) {
		root(t, `
			printf '[core]\n\tfsmonitor = touch M-wtconfig\n' >> .git/worktrees/wt1/config.worktree
			mkdir -p wt1/wthooks; printf '#!/bin/sh\ntouch M-wthook\n' > wt1/wthooks/pre-commit; chmod +x wt1/wthooks/pre-commit
			echo "gitdir: $PWD/evilgd" > wt1/.git
			mkdir -p .git/worktrees/wt2; printf '[core]\n\tfsmonitor = touch M-wt2\n' > .git/worktrees/wt2/config.worktree
		`)
		st := syncNow(t, name)
		mustHold(t, st, ".git/worktrees/wt1/config.worktree", "wt1/wthooks/pre-commit", "wt1/.git", ".git/worktrees/wt2/config.worktree")
		hostChecks(t, "linked worktree")
	})

	t.Run("deleted, then made again", func(t *testing.T) {
		root(t, `rm wt1/wthooks/post-commit x/inc.cfg`)
		st := syncNow(t, name)
		held := heldPaths(st)
		for _, p := range []string{"wt1/wthooks/post-commit", "x/inc.cfg"} {
			if !strings.Contains(held[p], "deletes") {
				t.Errorf("the deletion of %s is not held: %q", p, held[p])
			}
		}
		hostChecks(t, "deleted")
		root(t, `
			printf '#!/bin/sh\ntouch M-recreated\n' > wt1/wthooks/post-commit; chmod +x wt1/wthooks/post-commit
			printf '[core]\n\tfsmonitor = touch M-reincluded\n' > x/inc.cfg
		`)
		st = syncNow(t, name)
		mustHold(t, st, "wt1/wthooks/post-commit", "x/inc.cfg")
		hostChecks(t, "made again")
	})

	t.Run("hooks as links", func(t *testing.T) {
		root(t, `
			mkdir -p scripts/evilhooks
			printf '#!/bin/sh\ntouch M-linked\n' > scripts/evil.sh; chmod +x scripts/evil.sh
			cp scripts/evil.sh scripts/evilhooks/post-commit
			ln -s ../../scripts/evil.sh .git/hooks/post-commit
			ln -s ../../scripts/evil.sh wt1/wthooks/pre-push
			printf '#!/bin/sh\ntouch M-usertarget\n' > scripts/precommit.sh
		`)
		st := syncNow(t, name)
		mustHold(t, st, ".git/hooks/post-commit", "wt1/wthooks/pre-push", "scripts/precommit.sh")
		hostChecks(t, "hooks as links")
		// The hooks folder itself, a link to the guest's.
		root(t, `mv wt1/wthooks wt1/wthooks.old; ln -s ../scripts/evilhooks wt1/wthooks`)
		st = syncNow(t, name)
		if _, ok := heldPaths(st)["wt1/wthooks"]; !ok {
			t.Errorf("the link in place of the hooks folder is not reported held")
		}
		if fi, err := os.Lstat(filepath.Join(ws, "wt1/wthooks")); err != nil || !fi.IsDir() {
			t.Errorf("the hooks folder on the host is no longer the host's: %v %v", fi, err)
		}
		hostChecks(t, "hooks folder as a link")
	})

	t.Run("sparse and growing files and the quota", func(t *testing.T) {
		before := duKiB(t, ws)
		// 24M, not 1000M: the guest hashes the zeros of a file over the
		// quota too, at ~15 MB/s under TCG (1000M: 68 s).
		root(t, `truncate -s 24M sparse`)
		st := syncNow(t, name)
		if _, err := os.Lstat(filepath.Join(ws, "sparse")); err == nil {
			t.Error("a 24M sparse file reached the host over an 8 MiB quota")
		}
		if st.Quota.Refused == 0 {
			t.Errorf("quota refusal not reported: %+v", st.Quota)
		}
		// A file that grows while the sync scans and copies it: the host
		// never holds more of it than the quota, whenever it looks. Not
		// zeros: the host would keep those as holes, and du see nothing.
		done := make(chan result, 1)
		go func() {
			done <- run(t, "", "exec", "-u", "root", name, "--", "sh", "-c",
				"cd "+ws+" && for i in $(seq 1 16); do tr '\\0' x < /dev/zero | head -c 1048576 >> grow; sleep 0.1; done")
		}()
		var maxSize int64
		passes := 0
		for grown := false; !grown; {
			select {
			case r := <-done:
				if r.code != 0 {
					t.Fatalf("the growing guest: %s", r)
				}
				grown = true
			default:
			}
			st = syncNow(t, name)
			passes++
			if fi, err := os.Stat(filepath.Join(ws, "grow")); err == nil && fi.Size() > maxSize {
				maxSize = fi.Size()
			}
			if st.Quota.Bytes > quota {
				t.Fatalf("quota bytes %d over the quota %d", st.Quota.Bytes, quota)
			}
		}
		used := duKiB(t, ws) - before
		t.Logf("%d passes while the file grew to 16 MiB: the host held at most %d bytes of it; the folder grew by %d KiB", passes, maxSize, used)
		if maxSize > quota {
			t.Errorf("the host got %d bytes of a growing file over an %d-byte quota", maxSize, quota)
		}
		if used > quota>>10+1024 {
			t.Errorf("the host folder grew by %d KiB under an %d-byte quota", used, quota)
		}
		root(t, `rm -f sparse grow`)
		syncNow(t, name)
	})
}

// The folder is a linked worktree of a repository elsewhere on the host
// (a worktree per agent): git in the folder obeys that repository's
// config, which the guest cannot touch, but whose relative hooksPath and
// fsmonitor name files of the folder.
func TestAttackWorkspaceLinkedWorktree(t *testing.T) {
	base := attackBase(t, "atkwt-")
	repo, ws, marker := filepath.Join(base, "main"), filepath.Join(base, "agent"), filepath.Join(base, "pwned")
	os.MkdirAll(repo, 0o755)
	hostGit(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "README.md"), []byte("hi\n"), 0o644)
	hostGit(t, repo, "add", "README.md")
	hostGit(t, repo, "commit", "-q", "-m", "first")
	hostGit(t, repo, "config", "core.hooksPath", "tools/hooks")
	hostGit(t, repo, "config", "core.fsmonitor", "scripts/fsmon.sh")
	hostGit(t, repo, "worktree", "add", "-q", ws, "-b", "agent")
	if _, err := os.Stat(filepath.Join(ws, ".git")); err != nil {
		t.Fatalf("git worktree add: %v", err)
	}
	name := "atkwt"
	must(t, "create", name, "--workspace", ws)
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	script := strings.ReplaceAll(`set -e; cd `+ws+`
		mkdir -p tools/hooks scripts
		printf '#!/bin/sh\ntouch M-hook\n' > tools/hooks/pre-commit; chmod +x tools/hooks/pre-commit
		printf '#!/bin/sh\ntouch M-fsmonitor\n' > scripts/fsmon.sh; chmod +x scripts/fsmon.sh
		echo fine > notes.txt`, "M-", marker+"-")
	if r := run(t, "", "exec", "-u", "root", name, "--", "sh", "-c", script); r.code != 0 {
		t.Fatalf("inside: %s", r)
	}
	st := syncNow(t, name)
	held := heldPaths(st)
	for _, p := range []string{"tools/hooks/pre-commit", "scripts/fsmon.sh"} {
		if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
			t.Errorf("%s reached the host (held: %v)", p, held)
		}
		if _, ok := held[p]; !ok {
			t.Errorf("%s is not reported held", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "notes.txt")); string(b) != "fine\n" {
		t.Errorf("an ordinary file did not cross: %q", b)
	}
	hostGit(t, ws, "status")
	hostGit(t, ws, "commit", "-q", "--allow-empty", "-m", "on the host")
	if m, _ := filepath.Glob(marker + "*"); len(m) > 0 {
		t.Fatalf("the guest's code ran on the host through the main repository's config: %v", m)
	}
}
