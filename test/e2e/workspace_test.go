package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// waitHost waits until cond holds for the host folder.
func waitHost(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < 20*time.Second {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within 20 s", what)
	return 0
}

func fileIs(path, content string) func() bool {
	return func() bool {
		b, err := os.ReadFile(path)
		return err == nil && string(b) == content
	}
}

func gone(path string) func() bool {
	return func() bool {
		_, err := os.Lstat(path)
		return os.IsNotExist(err)
	}
}

func TestWorkspace(t *testing.T) {
	base, err := os.MkdirTemp(home, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(base, "project")
	os.MkdirAll(filepath.Join(ws, "src"), 0o755)
	os.WriteFile(filepath.Join(ws, "src", "main.go"), []byte("package main\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "README.md"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "run.sh"), []byte("#!/bin/sh\necho run\n"), 0o755)
	// A secret next to the workspace, as ~/.ssh would be.
	marker := filepath.Join(base, "id_rsa")
	os.WriteFile(marker, []byte("HOST-PRIVATE-KEY-MARKER"), 0o600)

	name := "ws"
	must(t, "create", name, "--workspace", ws)
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	sh := func(script string) result {
		t.Helper()
		r := run(t, "", "exec", name, "--", "sh", "-c", script)
		return r
	}

	t.Run("copied in at the same path", func(t *testing.T) {
		r := sh("pwd; cat src/main.go; ./run.sh; stat -c '%U' README.md")
		if r.code != 0 || !strings.Contains(r.stdout, ws+"\n") || !strings.Contains(r.stdout, "package main") || !strings.Contains(r.stdout, "run\n") {
			t.Fatalf("inside: %s", r)
		}
		if !strings.Contains(r.stdout, guestUser()) {
			t.Fatalf("files not owned by the guest user: %s", r)
		}
	})
	t.Run("guest to host and back", func(t *testing.T) {
		sh("echo made-inside > new.txt")
		d := waitHost(t, "a file made inside", fileIs(filepath.Join(ws, "new.txt"), "made-inside\n"))
		t.Logf("guest → host: %s", d)
		os.WriteFile(filepath.Join(ws, "from-host.txt"), []byte("made-on-host\n"), 0o644)
		start := time.Now()
		for {
			if r := sh("cat from-host.txt"); r.stdout == "made-on-host\n" {
				break
			}
			if time.Since(start) > 20*time.Second {
				t.Fatal("a host file never appeared inside")
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("host → guest: %s", time.Since(start))
		sh("mv new.txt renamed.txt && rm README.md")
		waitHost(t, "rename inside", fileIs(filepath.Join(ws, "renamed.txt"), "made-inside\n"))
		waitHost(t, "delete inside", gone(filepath.Join(ws, "README.md")))
		waitHost(t, "rename's old name", gone(filepath.Join(ws, "new.txt")))
		os.Rename(filepath.Join(ws, "from-host.txt"), filepath.Join(ws, "moved-on-host.txt"))
		start = time.Now()
		for sh("test -e moved-on-host.txt && ! test -e from-host.txt").code != 0 {
			if time.Since(start) > 20*time.Second {
				t.Fatal("a host rename never reached the guest")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	t.Run("link to a host secret exposes nothing", func(t *testing.T) {
		r := sh("ln -s " + marker + " leak; ln -s ../id_rsa leak2; cat leak 2>&1; cat " + marker + " 2>&1; ls " + base)
		if strings.Contains(r.stdout, "HOST-PRIVATE-KEY-MARKER") {
			t.Fatalf("the host file is readable inside: %s", r)
		}
		must(t, "sync", "now", name)
		for _, l := range []string{"leak", "leak2"} {
			if _, err := os.Lstat(filepath.Join(ws, l)); err == nil {
				t.Fatalf("the link %s was created on the host", l)
			}
		}
		out := must(t, "held", name).stdout
		if !strings.Contains(out, "leak") || !strings.Contains(out, "leaves the folder") {
			t.Fatalf("held: %q", out)
		}
		if b, _ := os.ReadFile(marker); string(b) != "HOST-PRIVATE-KEY-MARKER" {
			t.Fatal("the host file changed")
		}
		r = sh("find / -xdev -name id_rsa 2>/dev/null; grep -rl HOST-PRIVATE-KEY-MARKER /home /root /tmp /mnt /media " + filepath.Dir(ws) + " 2>/dev/null | head")
		if strings.Contains(r.stdout, "HOST-PRIVATE") || strings.Contains(r.stdout, marker) {
			t.Fatalf("the host secret is reachable inside: %s", r)
		}
	})
	t.Run("git hook is held until approved", func(t *testing.T) {
		// A repository made inside is held whole (a new .git folder); one
		// the user made syncs in, and only its hooks are held.
		if out, err := exec.Command("git", "init", "-q", ws).CombinedOutput(); err != nil {
			t.Fatalf("git init on the host: %v %s", err, out)
		}
		start := time.Now()
		for sh("test -f .git/HEAD").code != 0 {
			if time.Since(start) > 20*time.Second {
				t.Fatal("the host's repository never reached the guest")
			}
			time.Sleep(100 * time.Millisecond)
		}
		sh("printf '#!/bin/sh\\necho pwned\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit")
		must(t, "sync", "now", name)
		if _, err := os.Stat(filepath.Join(ws, ".git", "hooks", "pre-commit")); err == nil {
			t.Fatal("a git hook written inside reached the host")
		}
		must(t, "approve", name, ".git/hooks/pre-commit")
		if b, _ := os.ReadFile(filepath.Join(ws, ".git", "hooks", "pre-commit")); !strings.Contains(string(b), "pwned") {
			t.Fatal("approve did not write the hook")
		}
	})
	t.Run("conflict keeps both", func(t *testing.T) {
		os.WriteFile(filepath.Join(ws, "shared.txt"), []byte("v1\n"), 0o644)
		start := time.Now()
		for sh("cat shared.txt").stdout != "v1\n" {
			if time.Since(start) > 20*time.Second {
				t.Fatal("shared.txt never reached the guest")
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Both change it before a sync can run between the two edits.
		must(t, "exec", name, "--", "sh", "-c", "echo agent > shared.txt")
		os.WriteFile(filepath.Join(ws, "shared.txt"), []byte("user\n"), 0o644)
		must(t, "sync", "now", name)
		if b, _ := os.ReadFile(filepath.Join(ws, "shared.txt")); string(b) != "user\n" {
			// The agent's edit may have synced first; then the user's is the
			// newer change and must win anyway.
			t.Fatalf("the user's edit was lost: %q", b)
		}
		copies, _ := filepath.Glob(filepath.Join(ws, "shared.txt.sandbox-conflict-*"))
		st := must(t, "sync", "status", name).stdout
		if len(copies) == 1 {
			if b, _ := os.ReadFile(copies[0]); string(b) != "agent\n" || !strings.Contains(st, "conflict") {
				t.Fatalf("conflict copy %q, status %s", b, st)
			}
		}
	})
	t.Run("stopped, edited on the host, started", func(t *testing.T) {
		must(t, "stop", name)
		os.WriteFile(filepath.Join(ws, "while-stopped.txt"), []byte("offline edit\n"), 0o644)
		os.Remove(filepath.Join(ws, "renamed.txt"))
		must(t, "start", name)
		r := sh("cat while-stopped.txt; test -e renamed.txt && echo still-there")
		if r.stdout != "offline edit\n" {
			t.Fatalf("after restart: %s", r)
		}
		if _, err := os.Stat(filepath.Join(ws, "while-stopped.txt")); err != nil {
			t.Fatal("the offline edit was lost")
		}
	})
}

func TestReviewMode(t *testing.T) {
	ws, err := os.MkdirTemp(home, "review-")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ws, "app.py"), []byte("print(1)\n"), 0o644)
	name := "review"
	must(t, "create", name, "--workspace", ws, "--review")
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	must(t, "start", name)
	must(t, "exec", name, "--", "sh", "-c", "echo 'print(2)' > app.py; echo new > added.txt")
	must(t, "sync", "now", name)
	if b, _ := os.ReadFile(filepath.Join(ws, "app.py")); string(b) != "print(1)\n" {
		t.Fatal("review mode wrote to the host")
	}
	if _, err := os.Stat(filepath.Join(ws, "added.txt")); err == nil {
		t.Fatal("review mode created a file on the host")
	}
	d := must(t, "diff", name).stdout
	if !strings.Contains(d, "M app.py") || !strings.Contains(d, "+print(2)") || !strings.Contains(d, "A added.txt") {
		t.Fatalf("diff: %s", d)
	}
	must(t, "apply", name, "app.py")
	if b, _ := os.ReadFile(filepath.Join(ws, "app.py")); string(b) != "print(2)\n" {
		t.Fatal("apply did not write")
	}
	must(t, "discard", name)
	if r := run(t, "", "exec", name, "--", "test", "-e", "added.txt"); r.code == 0 {
		t.Fatal("discard left the file inside")
	}
}

// TestHostLogWhileRunning: a file the host appends to while a sandbox runs
// in its folder (`kosa8 run claude | tee log.txt`) reaches the guest and
// makes no conflict copies: only the host wrote it.
func TestHostLogWhileRunning(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log.txt")
	stop := make(chan struct{})
	wrote := make(chan int)
	go func() {
		n := 0
		defer func() { wrote <- n }()
		f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return
		}
		defer f.Close()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				n++
				fmt.Fprintf(f, "line %d\n", n)
			}
		}
	}()
	r := invocation{dir: dir}.run(t, "run", "--rm", "--", "sh", "-c", "sleep 8; test -s log.txt && echo guest-sees-log")
	close(stop)
	n := <-wrote
	if r.code != 0 || !strings.Contains(r.stdout, "guest-sees-log") {
		t.Fatalf("run: %s", r)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.Contains(e.Name(), "sandbox-conflict") {
			t.Errorf("a conflict copy of a file only the host wrote: %s", e.Name())
		}
	}
	if b, _ := os.ReadFile(log); bytes.Count(b, []byte("\n")) != n {
		t.Errorf("the host's log has %d lines, the host wrote %d", bytes.Count(b, []byte("\n")), n)
	}
}
