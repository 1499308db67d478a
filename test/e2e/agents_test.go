package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The image tests build derived images from a project's [image] table in
// a sandbox of the base image. The real agents run against local fakes of
// their APIs in agents_real_test.go.

// agentsCmdWait bounds one kosa8 command of these tests.
const agentsCmdWait = 30 * time.Minute

// agentProject is a project folder the agent tests run kosa8 in.
type agentProject struct {
	t   *testing.T
	dir string
	env []string
}

func (p *agentProject) run(stdin string, args ...string) result {
	p.t.Helper()
	return invocation{dir: p.dir, env: p.env, stdin: stdin, timeout: agentsCmdWait}.run(p.t, args...)
}

// TestImageSetupConfined: a setup line in a project's [image] runs in a
// build sandbox that reaches only the package sources; reaching anything
// else fails the build, naming the host. (A refused name resolves to
// kosa8's refusal page, which answers 403: curl -f fails on it.)
func TestImageSetupConfined(t *testing.T) {
	p := &agentProject{t: t, dir: t.TempDir()}
	toml := "[image]\nsetup = [\"curl -fsS -m 20 -o /dev/null https://example.com/\"]\n"
	if err := os.WriteFile(filepath.Join(p.dir, "kosa8.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := p.run("", "trust"); r.code != 0 {
		t.Fatalf("trust: %s", r)
	}
	r := p.run("", "run", "--rm", "--", "true")
	if r.code == 0 {
		t.Fatalf("a setup line reaching example.com built an image:\n%s", r)
	}
	for _, want := range []string{"step 1 failed", "curl -fsS -m 20", "it tried to reach example.com"} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("error lacks %q:\n%s", want, r)
		}
	}
}

// TestImageDerived: a project's [image] builds once into a read-only image
// that later runs start from; changing the recipe builds a new one.
func TestImageDerived(t *testing.T) {
	// A cache of its own (the base image hard-linked in), so the image this
	// test builds goes away with it.
	p := &agentProject{t: t, dir: t.TempDir(), env: []string{"KOSA8_CACHE=" + privateCache(t)}}
	mark := fmt.Sprintf("e2e-%d", time.Now().UnixNano())
	toml := fmt.Sprintf("[image]\nsetup = [\"echo %s > /etc/kosa8-e2e-mark\", \"test -s /etc/kosa8/network.md\"]\n", mark)
	if err := os.WriteFile(filepath.Join(p.dir, "kosa8.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := p.run("", "trust"); r.code != 0 {
		t.Fatalf("trust: %s", r)
	}
	start := time.Now()
	r := p.run("", "run", "--rm", "--", "sh", "-c", "cat /etc/kosa8-e2e-mark; ls /etc/sudoers.d/ /usr/local/share/ca-certificates/; id kosa8build 2>&1 || echo no-build-user")
	t.Logf("first run (derived image build included): %s", time.Since(start).Round(time.Second))
	if r.code != 0 || !strings.Contains(r.stdout, mark) || !strings.Contains(r.stdout, "no-build-user") {
		t.Fatalf("the derived image lacks the setup's file or kept the build user:\n%s", r)
	}
	if !strings.Contains(r.stderr, "building image d-") {
		t.Fatalf("no build progress shown:\n%s", r.stderr)
	}
	r = p.run("", "image", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "derived: project") {
		t.Fatalf("image ls does not list the derived image:\n%s", r)
	}
	r = p.run("", "run", "--rm", "--", "cat", "/etc/kosa8-e2e-mark")
	if r.code != 0 || !strings.Contains(r.stdout, mark) || strings.Contains(r.stderr, "building image") {
		t.Fatalf("the second run should start from the cached image:\n%s", r)
	}
}

// privateCache returns an image cache holding hard links to the shared
// cache's base images.
func privateCache(t *testing.T) string {
	shared := os.Getenv("KOSA8_CACHE")
	if shared == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		shared = filepath.Join(c, "kosa8")
	}
	dir := t.TempDir()
	archs, _ := filepath.Glob(filepath.Join(shared, "images", "*"))
	for _, a := range archs {
		dst := filepath.Join(dir, "images", filepath.Base(a))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		imgs, _ := filepath.Glob(filepath.Join(a, "[0-9a-f]*"))
		for _, img := range imgs {
			if strings.HasPrefix(filepath.Base(img), "d-") {
				continue // a derived image ("d" is a hex digit): built by the test
			}
			if out, err := exec.Command("cp", "-al", img, dst+"/").CombinedOutput(); err != nil {
				t.Fatalf("link %s into a private cache: %v %s", img, err, out)
			}
		}
	}
	return dir
}
