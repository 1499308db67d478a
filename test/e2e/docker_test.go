package e2e

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Containers inside (issue 31): a sandbox made with --docker runs Debian's
// Docker on its own kernel. Under TCG every container start costs tens of
// seconds (each of docker, containerd's shim and runc is a Go program
// that starts slowly under emulation), so these tests run from 'make
// test-docker', not from CI (docs/containers.md has their times).

// dockerEnv is what a test of containers inside needs on the host: the
// registry holding the test image, a plain-HTTP host the guest may reach,
// and the environment that points the sandbox's names at them.
type dockerEnv struct {
	reg     *testRegistry
	allowed int // allowed.test's port
	env     []string
	ws      string // the workspace: the app, a compose file, Dockerfiles
}

func requireDockerTests(t *testing.T) {
	t.Helper()
	requireNativeGuest(t, "the test image is an amd64 program")
	if os.Getenv("KOSA8_DOCKER_TESTS") != "1" {
		t.Skip("containers inside take minutes under TCG: run them with 'make test-docker' (KOSA8_DOCKER_TESTS=1)")
	}
}

func newDockerEnv(t *testing.T) *dockerEnv {
	t.Helper()
	app := buildDockerApp(t)
	reg := startRegistry(t)
	reg.pushImage(t, "hello", "1", app)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "fetched %s from allowed.test\n", r.URL.Path)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	e := &dockerEnv{reg: reg, allowed: l.Addr().(*net.TCPAddr).Port, ws: t.TempDir()}
	e.env = []string{
		"KOSA8_SECRET_BACKEND=file",
		"KOSA8_UPSTREAM_CA=" + reg.caFile,
		"KOSA8_NET_OVERRIDES=" + registryName + "=" + reg.ip + ",allowed.test=127.0.0.1,refused.test=127.0.0.1",
	}
	files := map[string]string{
		"dockerapp": string(app),
		"compose.yaml": `services:
  web:
    image: registry.test/hello:1
    command: ["serve", ":8080", "web"]
    ports: ["18080:8080"]
  api:
    image: registry.test/hello:1
    command: ["serve", ":8080", "api"]
`,
		"Dockerfile": fmt.Sprintf(`FROM registry.test/hello:1
RUN ["/app", "get", "http://allowed.test:%d/during-build"]
RUN ["/app", "get", "http://refused.test/during-build"]
`, e.allowed),
		".dockerignore": "dockerapp\n",
	}
	for n, b := range files {
		mode := os.FileMode(0o644)
		if n == "dockerapp" {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(e.ws, n), []byte(b), mode); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// sandbox creates and starts a --docker sandbox on the workspace, bound to
// a registry login (registry:USER) for the test registry, and removes both
// when the test ends.
func (e *dockerEnv) sandbox(t *testing.T, name string) {
	t.Helper()
	secret := "REG_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	cmd := kosa8Cmd(t.Context(), "secret", "add", secret, "--host", registryName, "--format", "registry:"+e.reg.user)
	cmd.Env = append(cmd.Env, e.env...)
	cmd.Stdin = strings.NewReader(e.reg.pass + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("secret add: %v %s", err, out)
	}
	t.Cleanup(func() { invocation{env: e.env}.run(t, "secret", "rm", secret) })
	t0 := time.Now()
	e.kosa8(t, 20*time.Minute, "create", name, "--docker", "--secret", secret,
		"--allow", fmt.Sprintf("allowed.test:%d", e.allowed), "--workspace", e.ws)
	t.Cleanup(func() { invocation{env: e.env}.run(t, "rm", "-f", name) })
	phase(t, "create (the docker image built if missing)", t0)
	t0 = time.Now()
	e.kosa8(t, 6*time.Minute, "start", name)
	phase(t, "start: boot and the engine ready", t0)
}

// kosa8 runs kosa8 with the test's environment, failing the test unless
// it exits 0.
func (e *dockerEnv) kosa8(t *testing.T, timeout time.Duration, args ...string) string {
	t.Helper()
	r := invocation{env: e.env, timeout: timeout, dir: e.ws}.run(t, args...)
	if r.code != 0 {
		t.Fatalf("kosa8 %s failed:\n%s", strings.Join(args, " "), r)
	}
	return r.stdout + r.stderr
}

// guest runs a shell script in the sandbox as its user, in the workspace,
// and returns what it printed (stdout and stderr); a script that fails
// fails the test.
func (e *dockerEnv) guest(t *testing.T, name string, timeout time.Duration, script string) string {
	t.Helper()
	return e.kosa8(t, timeout, "exec", name, "--", "sh", "-c", "set -e\n"+script)
}

// phase logs how long a part of a test took.
func phase(t *testing.T, what string, start time.Time) {
	t.Logf("%-55s %6.1f s", what, time.Since(start).Seconds())
}

// TestDockerInside: in a sandbox made with --docker, as the sandbox's user:
// a pull from a registry that takes a login (the guest holds a
// placeholder, the broker sends the login), a run, a pull from a registry
// the allow-list refuses (its error says why and how to allow it), a
// Testcontainers-style program (start a container over the Docker socket,
// wait for its published port, connect), a build whose RUN fetches from an
// allowed and then a refused host, and a two-service compose stack whose
// one service calls the other, reached from the host only through a kosa8
// port forward. Then a checkpoint while the stack runs, a change (a
// service's state, the other service stopped), a rewind: the stack runs
// again and the change is gone; after a pause and a resume it still runs,
// and after a stop and a start the engine comes up again on its disk.
func TestDockerInside(t *testing.T) {
	requireDockerTests(t)
	e := newDockerEnv(t)
	name := "dk-inside"
	e.sandbox(t, name)

	t0 := time.Now()
	out := e.guest(t, name, 5*time.Minute, `
cat ~/.docker/config.json
docker pull -q registry.test/hello:1
docker run --rm registry.test/hello:1
docker pull refused.test/x:1 2>&1 && echo UNEXPECTED-PULL || echo refused-pull-failed
`)
	phase(t, "pull with a login, run, a refused pull", t0)
	if !strings.Contains(out, "hello from a container") {
		t.Fatalf("docker run:\n%s", out)
	}
	if !strings.Contains(out, "refused-pull-failed") || !strings.Contains(out, "kosa8: refused.test was refused") ||
		!strings.Contains(out, "kosa8 net allow "+name+" refused.test") {
		t.Fatalf("a refused pull does not say why:\n%s", out)
	}
	// The guest's login holds the placeholder; the registry got the real
	// password (the pull worked), which is nowhere in the guest's files.
	login := base64.StdEncoding.EncodeToString([]byte(e.reg.user + ":kosa8-ph-"))
	if !strings.Contains(out, login[:len(login)-4]) || strings.Contains(out, e.reg.pass) {
		t.Fatalf("the guest's docker login is not the placeholder:\n%s", out)
	}
	if r := (invocation{env: e.env, timeout: 3 * time.Minute}).run(t, "exec", "-u", "root", name, "--",
		"grep", "-rsl", e.reg.pass, "/root", "/home", "/etc", "/var/lib/docker", "/tmp"); r.code != 1 {
		t.Fatalf("the registry's password is in the guest (grep exit %d):\n%s", r.code, r)
	}

	t0 = time.Now()
	out = e.guest(t, name, 5*time.Minute, `./dockerapp tc registry.test/hello:1`)
	phase(t, "Testcontainers-style: start, wait for the port, connect", t0)
	if !strings.Contains(out, "testcontainers: container") {
		t.Fatalf("testcontainers flow:\n%s", out)
	}

	t0 = time.Now()
	out = e.guest(t, name, 6*time.Minute, `docker build -t built:1 . 2>&1 && echo UNEXPECTED-BUILD || echo build-failed`)
	phase(t, "docker build: RUN from an allowed, then a refused host", t0)
	if !strings.Contains(out, "fetched /during-build from allowed.test") || !strings.Contains(out, "build-failed") ||
		!strings.Contains(out, "refused.test") {
		t.Fatalf("docker build:\n%s", out)
	}
	if blocked := e.kosa8(t, time.Minute, "net", "blocked", name); !strings.Contains(blocked, "refused.test") {
		t.Fatalf("net blocked does not list refused.test:\n%s", blocked)
	}

	t0 = time.Now()
	out = e.guest(t, name, 8*time.Minute, `
docker compose up -d --quiet-pull 2>&1
for i in $(seq 120); do curl -sf 'localhost:18080/call?url=http://api:8080/' && break; sleep 1; done
`)
	phase(t, "compose up (two services, one calls the other)", t0)
	if !strings.Contains(out, "web got: hello from api") {
		t.Fatalf("compose:\n%s", out)
	}
	hostPort := freePort(t)
	e.kosa8(t, time.Minute, "port", name, fmt.Sprintf("%d:18080", hostPort))
	if body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/call?url=http://api:8080/", hostPort)); !strings.Contains(body, "web got: hello from api") {
		t.Fatalf("the published port through kosa8's forward: %q", body)
	}

	t0 = time.Now()
	cp := e.kosa8(t, 3*time.Minute, "checkpoint", name, "-m", "compose running", "--json")
	phase(t, "checkpoint with the stack running", t0)
	id := jsonField(t, cp, "id")
	out = e.guest(t, name, 3*time.Minute, `
curl -sf localhost:18080/set?v=changed
docker compose stop api 2>&1
curl -sf localhost:18080/state
curl -s 'localhost:18080/call?url=http://api:8080/' || true
`)
	if !strings.Contains(out, "state=changed") || strings.Contains(out, "web got: hello from api") {
		t.Fatalf("the change:\n%s", out)
	}
	t0 = time.Now()
	e.kosa8(t, 5*time.Minute, "rewind", name, id)
	phase(t, "rewind", t0)
	t0 = time.Now()
	out = e.guest(t, name, 3*time.Minute, `
curl -sf localhost:18080/state
curl -sf 'localhost:18080/call?url=http://api:8080/'
docker compose ps --services --filter status=running
`)
	phase(t, "after the rewind: the stack answers", t0)
	if !strings.Contains(out, "state=orig") || !strings.Contains(out, "web got: hello from api") ||
		!strings.Contains(out, "api") || !strings.Contains(out, "web") {
		t.Fatalf("after the rewind the stack should run as checkpointed:\n%s", out)
	}
	if body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/state", hostPort)); !strings.Contains(body, "state=orig") {
		t.Fatalf("the port forward after the rewind: %q", body)
	}

	// Paused (written out, the host's memory freed) and resumed: the
	// stack goes on where it was.
	t0 = time.Now()
	e.kosa8(t, 5*time.Minute, "pause", name)
	e.kosa8(t, 5*time.Minute, "resume", name)
	phase(t, "pause and resume", t0)
	if body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/call?url=http://api:8080/", hostPort)); !strings.Contains(body, "web got: hello from api") {
		t.Fatalf("after pause and resume: %q", body)
	}
	// Stopped and booted again: the engine starts again on its disk,
	// which kept the image and the stack's containers (stopped now).
	t0 = time.Now()
	e.kosa8(t, 3*time.Minute, "stop", name)
	e.kosa8(t, 6*time.Minute, "start", name)
	phase(t, "stop and start: the engine again, on its kept disk", t0)
	out = e.guest(t, name, 3*time.Minute, `
docker image inspect registry.test/hello:1 >/dev/null && echo image-kept
docker compose ps -a --services
`)
	if !strings.Contains(out, "image-kept") || !strings.Contains(out, "web") {
		t.Fatalf("after a stop and a start the engine's disk should hold the image and the containers:\n%s", out)
	}
}

// TestDockerAttackPrivilegedContainers: a container started --privileged,
// on the host's network (the guest's) or on Docker's bridge, is as closed
// as the sandbox: a host the allow-list refuses and an address no rule
// names stay unreachable (the refusal is kosa8's, on the host), and the
// machine it sees has the sandbox's disks only (root, workspace, the
// engine's), no shared folder of the host.
func TestDockerAttackPrivilegedContainers(t *testing.T) {
	requireDockerTests(t)
	e := newDockerEnv(t)
	name := "dk-attack"
	// A file beside the workspace, on the host: nothing inside may see it.
	outside := filepath.Join(filepath.Dir(e.ws), "outside-"+filepath.Base(e.ws))
	if err := os.WriteFile(outside, []byte("host file beside the workspace"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(outside) })
	e.sandbox(t, name)
	t0 := time.Now()
	urls := fmt.Sprintf("http://refused.test/ http://203.0.113.7/ http://allowed.test:%d/ok", e.allowed)
	out := e.guest(t, name, 8*time.Minute, `
docker pull -q registry.test/hello:1 >/dev/null
for net in host bridge; do
  echo "== --privileged --net=$net"
  docker run --rm --privileged --net=$net registry.test/hello:1 attack `+urls+`
done
`)
	phase(t, "two privileged containers (host and bridge networks)", t0)
	for _, net := range []string{"host", "bridge"} {
		_, part, _ := strings.Cut(out, "== --privileged --net="+net)
		part, _, _ = strings.Cut(part, "== --privileged")
		for _, want := range []string{
			"fetch http://refused.test/: failed", "kosa8: refused.test was refused", // kosa8's refusal page, from the host
			"fetch http://203.0.113.7/: failed", "kosa8: 203.0.113.7 was refused", // the host's refusal, with its reason
			fmt.Sprintf("fetch http://allowed.test:%d/ok: ok: fetched /ok from allowed.test", e.allowed), // the same container reaches what is allowed
			"serial=root", "serial=ws", "serial=docker", "found /compose.yaml",
		} {
			if !strings.Contains(part, want) {
				t.Errorf("--net=%s: %q missing in:\n%s", net, want, part)
			}
		}
		for _, bad := range []string{"outside-", "type=0x0009", "type=0x001a", "share "} {
			if strings.Contains(part, bad) {
				t.Errorf("--net=%s: %q in:\n%s", net, bad, part)
			}
		}
		for _, l := range strings.Split(part, "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "block" && strings.HasPrefix(f[1], "vd") &&
				f[2] != "serial=root" && f[2] != "serial=ws" && f[2] != "serial=docker" {
				t.Errorf("--net=%s: a disk that is not the sandbox's: %s", net, l)
			}
		}
	}
	if t.Failed() {
		t.Logf("the containers printed:\n%s", out)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 60 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func jsonField(t *testing.T, out, field string) string {
	t.Helper()
	i := strings.Index(out, `"`+field+`"`)
	if i < 0 {
		t.Fatalf("no %s in %s", field, out)
	}
	rest := out[i+len(field)+2:]
	rest = rest[strings.Index(rest, `"`)+1:]
	return rest[:strings.Index(rest, `"`)]
}
