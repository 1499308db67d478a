package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestAttackWorkspaceReview: the holes a red-team review of issue 9's
// containment found, each attacked from a root guest. Their unit tests
// (internal/wsync: TestGuestIndexOutsideHeld, TestMiseConfigsHeld,
// TestHarmlessConfigChangeHidesHooksPath) fail without the fixes.
func TestAttackWorkspaceReview(t *testing.T) {
	base := attackBase(t, "atkr-")
	ws := filepath.Join(base, "project")
	marker := filepath.Join(base, "pwned")
	os.MkdirAll(ws, 0o755)
	os.WriteFile(filepath.Join(ws, "README.md"), []byte("hi\n"), 0o644)
	hostGit(t, ws, "init", "-q", "-b", "main")
	hostGit(t, ws, "add", "README.md")
	hostGit(t, ws, "commit", "-q", "-m", "first")
	hostGit(t, ws, "config", "core.hooksPath", "tools/hooks")
	pwned := func() []string {
		m, _ := filepath.Glob(marker + "*")
		return m
	}

	name := "atkr"
	must(t, "create", name, "--workspace", ws)
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	root := func(t *testing.T, script string) {
		t.Helper()
		script = strings.ReplaceAll(script, "M-", marker+"-")
		if r := run(t, "", "exec", "-u", "root", name, "--", "sh", "-c", "set -e; cd "+ws+"; "+gitAnyOwner+script); r.code != 0 {
			t.Fatalf("inside: %s", r)
		}
	}
	mustHold := func(t *testing.T, st syncStatus, paths ...string) {
		t.Helper()
		held := heldPaths(st)
		for _, p := range paths {
			if _, ok := held[p]; !ok {
				t.Errorf("%s is not reported held (held: %v)", p, held)
			}
		}
	}

	t.Run("an index naming paths outside and a hook", func(t *testing.T) {
		// Real git writes the index; its names are then patched, same
		// length and order, to ones git refuses from a tree, and the
		// index's checksum made right again.
		root(t, `
			mkdir -p aa abcd/hooks
			echo x > aa/pwned-index
			printf '#!/bin/sh\ntouch M-index-hook\n' > abcd/hooks/post-checkout; chmod +x abcd/hooks/post-checkout
			rm -f .git/index
			git add aa/pwned-index abcd/hooks/post-checkout
			python3 -c '
import hashlib
p = ".git/index"
b = open(p, "rb").read()[:-20]
b = b.replace(b"aa/pwned-index", b"../pwned-index").replace(b"abcd/hooks/post-checkout", b".git/hooks/post-checkout")
open(p, "wb").write(b + hashlib.sha1(b).digest())
'
			rm -rf aa abcd
		`)
		st := syncNow(t, name)
		// Refused as it is written (the check reads the bytes that would
		// land): a sync error naming the index.
		if !slices.ContainsFunc(st.Errors, func(e string) bool { return strings.Contains(e, ".git/index") }) {
			t.Errorf("no sync error names the refused index: %v", st.Errors)
		}
		// (An index the guest wrote before patching it, naming aa/…, may
		// have crossed: it is a valid one.)
		if files := hostGit(t, ws, "ls-files"); strings.Contains(files, "../") || strings.Contains(files, ".git/") {
			t.Errorf("the host's index names paths git refuses from a tree:\n%s", files)
		}
		hostGit(t, ws, "checkout", "--", ".")
		hostGit(t, ws, "checkout", "-q", "-b", "after-index")
		if m := pwned(); len(m) > 0 {
			t.Fatalf("the guest's index wrote outside the folder or ran a hook: %v", m)
		}
		if _, err := os.Lstat(filepath.Join(ws, ".git/hooks/post-checkout")); err == nil {
			t.Fatal("the guest's index planted .git/hooks/post-checkout")
		}
	})

	t.Run("mise configs", func(t *testing.T) {
		root(t, `
			printf '[hooks]\nenter = "touch M-mise"\n' > mise.toml
			mkdir -p .config/mise; printf '[hooks]\nenter = "touch M-mise2"\n' > .config/mise/config.toml
		`)
		st := syncNow(t, name)
		mustHold(t, st, "mise.toml", ".config/mise/config.toml")
		for _, p := range []string{"mise.toml", ".config/mise/config.toml"} {
			if _, err := os.Lstat(filepath.Join(ws, p)); err == nil {
				t.Errorf("%s reached the host", p)
			}
		}
	})

	t.Run("a harmless config padded past what was read", func(t *testing.T) {
		// Comments only: a change the guest may make. Before the fix the
		// finder read 256 KiB of it, and hooksPath below went unseen.
		root(t, `
			{ head -c 300000 /dev/zero | tr '\0' '#' | fold -w 99; echo; cat .git/config; } > /tmp/c && cat /tmp/c > .git/config
		`)
		syncNow(t, name)
		root(t, `mkdir -p tools/hooks; printf '#!/bin/sh\ntouch M-padded\n' > tools/hooks/pre-commit; chmod +x tools/hooks/pre-commit`)
		st := syncNow(t, name)
		mustHold(t, st, "tools/hooks/pre-commit")
		hostGit(t, ws, "commit", "-q", "--allow-empty", "-m", "padded")
		if m := pwned(); len(m) > 0 {
			t.Fatalf("the guest's hook ran on the host: %v", m)
		}
	})
}
