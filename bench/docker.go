package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
)

// benchDocker measures containers inside (issue 31), each beside a
// baseline from the same run:
//   - start (create to ready) of a --docker sandbox, against a plain one:
//     the boot-time cost of the engine (its modules, no boot template, and
//     dockerd's start);
//   - `docker run --rm` of a static program on scratch, inside, against
//     running the same program in the guest directly;
//   - a compose test's wall time (up two services, one calls the other,
//     down) in a sandbox without checkpoints and in one taking a
//     checkpoint every 20 s (--checkpoint-every), and a checkpoint's pause
//     with the stack running;
//   - what the engine costs on disk: the image beside the base, and the
//     engine's disk after the image is built.
//
// The image is built inside from the program (docker build, FROM
// scratch): no registry is needed.
func benchDocker() {
	root := repoRoot() // before setupHome moves into its empty folder
	home, cleanup := setupHome()
	defer cleanup()
	accel := hostAccel()
	a := string(accel)
	work := filepath.Join(home, "docker-project")
	must(os.MkdirAll(work, 0o755))
	app := filepath.Join(work, "app")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", app, "./test/e2e/testdata/dockerapp")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	build.Dir = root
	out, err := build.CombinedOutput()
	must(errWith(err, out))
	files := map[string]string{
		"Dockerfile":    "FROM scratch\nCOPY app /app\nENTRYPOINT [\"/app\"]\n",
		".dockerignore": "compose.yaml\n",
		"compose.yaml": `services:
  web:
    image: bench-app
    command: ["serve", ":8080", "web"]
    ports: ["18080:8080"]
  api:
    image: bench-app
    command: ["serve", ":8080", "api"]
`,
	}
	for n, b := range files {
		must(os.WriteFile(filepath.Join(work, n), []byte(b), 0o644))
	}
	kosa8 := func(args ...string) string {
		cmd := exec.Command(filepath.Join(*binDir, "kosa8"), args...)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		must(errWith(err, out))
		return string(out)
	}
	timed := func(args ...string) time.Duration {
		t0 := time.Now()
		kosa8(args...)
		return time.Since(t0)
	}
	var rows []row
	add := func(r ...row) {
		for _, x := range r {
			fmt.Fprintf(os.Stderr, "  %s: %s (%s) %s\n", x.what, x.value, x.accel, x.note)
		}
		rows = append(rows, r...)
	}

	// The image first (built once, outside the timings).
	fmt.Fprintln(os.Stderr, "the docker image (built if missing)...")
	kosa8("create", "dk-img", "--docker", "--workspace", work)
	kosa8("rm", "-f", "dk-img")

	fmt.Fprintf(os.Stderr, "start, plain and --docker (%d each)...\n", *runs)
	var plain, withDocker []time.Duration
	for i := 0; i < *runs; i++ {
		kosa8("create", "plain", "--no-workspace")
		plain = append(plain, timed("start", "plain"))
		if i == 0 {
			// What the sandbox ran under: a host whose KVM fails to boot
			// one falls back to TCG, whatever the host's probe says.
			accel = sandboxAccel(kosa8("ls", "--json"), "plain", accel)
			a = string(accel)
		}
		kosa8("rm", "-f", "plain")
		kosa8("create", "dk", "--docker", "--no-workspace")
		withDocker = append(withDocker, timed("start", "dk"))
		kosa8("rm", "-f", "dk")
	}
	add(
		row{"start: create to ready, plain sandbox", secs(median(plain)), a, "baseline (from a boot template after the first)"},
		row{"start: create to ready, --docker (engine answering)", secs(median(withDocker)), a, times(median(withDocker), median(plain))})

	fmt.Fprintln(os.Stderr, "container start inside...")
	kosa8("create", "dk", "--docker", "--workspace", work)
	kosa8("start", "dk")
	guestMS := func(script string) []time.Duration {
		out := kosa8("exec", "dk", "--", "sh", "-c", "set -e; ms(){ echo $(( ($(date +%s%N)-$1)/1000000 )); }\n"+script)
		var d []time.Duration
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, "MS "); ok {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				must(err)
				d = append(d, time.Duration(n)*time.Millisecond)
			}
		}
		if len(d) == 0 {
			must(fmt.Errorf("no timing in:\n%s", out))
		}
		return d
	}
	buildT := guestMS("s=$(date +%s%N); docker build -q -t bench-app . >/dev/null; echo MS $(ms $s)")
	add(row{"docker build (FROM scratch, COPY of an 8 MB program)", secs(buildT[0]), a, "inside"})
	loop := func(cmd string) string {
		return fmt.Sprintf("for i in $(seq %d); do s=$(date +%%s%%N); ", *runs) + cmd + " >/dev/null; echo MS $(ms $s); done"
	}
	direct := guestMS(loop("./app"))
	ctr := guestMS(loop("docker run --rm bench-app"))
	nonet := guestMS(loop("docker run --rm --network none bench-app"))
	add(
		row{"the program run directly in the guest", ms(median(direct)), a, "baseline"},
		row{"docker run --rm of it (bridge network)", secs(median(ctr)), a, times(median(ctr), median(direct))},
		row{"docker run --rm --network none", secs(median(nonet)), a, times(median(nonet), median(direct))},
	)
	du := kosa8("exec", "-u", "root", "dk", "--", "du", "-sm", "/var/lib/docker")
	composeScript := `s=$(date +%s%N)
docker compose up -d --quiet-pull >/dev/null 2>&1
for i in $(seq 300); do curl -sf 'localhost:18080/call?url=http://api:8080/' >/dev/null && break; sleep 0.5; done
docker compose down >/dev/null 2>&1
echo MS $(ms $s)`
	fmt.Fprintln(os.Stderr, "compose, no checkpoints...")
	compose := guestMS(composeScript)
	add(row{"compose: up 2 services, one calls the other, down", secs(compose[0]), a, "no checkpoints: baseline"})
	fmt.Fprintln(os.Stderr, "a checkpoint with the stack up...")
	guestMS("s=$(date +%s%N); docker compose up -d >/dev/null 2>&1; echo MS $(ms $s)")
	var cp struct {
		PauseMS float64 `json:"pause_ms"`
		TotalMS float64 `json:"total_ms"`
	}
	must(json.Unmarshal([]byte(lastJSON(kosa8("checkpoint", "dk", "--json"))), &cp))
	guestMS("s=$(date +%s%N); docker compose down >/dev/null 2>&1; echo MS $(ms $s)")
	kosa8("rm", "-f", "dk")
	add(row{"checkpoint with the stack running: pause", ms(time.Duration(cp.PauseMS * float64(time.Millisecond))), a,
		fmt.Sprintf("total %.1f s", cp.TotalMS/1000)})

	fmt.Fprintln(os.Stderr, "compose, a checkpoint every 20 s...")
	kosa8("create", "dkcp", "--docker", "--workspace", work, "--checkpoint-every", "20s")
	kosa8("start", "dkcp")
	dk := func(script string) []time.Duration {
		out := kosa8("exec", "dkcp", "--", "sh", "-c", "set -e; ms(){ echo $(( ($(date +%s%N)-$1)/1000000 )); }\n"+script)
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, "MS "); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return []time.Duration{time.Duration(n) * time.Millisecond}
			}
		}
		must(fmt.Errorf("no timing in:\n%s", out))
		return nil
	}
	count := func() int {
		var l struct {
			Checkpoints []json.RawMessage `json:"checkpoints"`
		}
		must(json.Unmarshal([]byte(lastJSON(kosa8("checkpoints", "dkcp", "--json"))), &l))
		return len(l.Checkpoints)
	}
	dk("s=$(date +%s%N); docker build -q -t bench-app . >/dev/null; echo MS $(ms $s)")
	before := count()
	withCP := dk(composeScript)
	during := count() - before
	kosa8("rm", "-f", "dkcp")
	add(row{"compose, with --checkpoint-every 20s", secs(withCP[0]), a,
		fmt.Sprintf("%s; %d checkpoints taken during it", times(withCP[0], compose[0]), during)})

	base, derived := imageSizes()
	add(
		row{"image: base rootfs.ext4", fmt.Sprintf("%d MiB", base>>20), "-", ""},
		row{"image: with docker.io, docker-cli, docker-compose", fmt.Sprintf("%d MiB", derived>>20), "-", fmt.Sprintf("+%d MiB", (derived-base)>>20)},
		row{"engine's disk after the build (du /var/lib/docker)", strings.Fields(du + " ?")[0] + " MiB", "-", fmt.Sprintf("docker.img is %d GiB sparse by default", sandbox.DefaultDockerDiskGiB)},
	)
	printTable("containers inside (--docker)", rows, accel)
}

// sandboxAccel is the accelerator sandbox name runs under, from 'kosa8 ls
// --json' (def when it does not say).
func sandboxAccel(lsJSON, name string, def vmm.Accel) vmm.Accel {
	var list []struct {
		Name   string `json:"name"`
		Status struct {
			Accel string `json:"accel"`
		} `json:"status"`
	}
	if json.Unmarshal([]byte(lastJSON(lsJSON)), &list) != nil {
		return def
	}
	for _, e := range list {
		if e.Name == name && e.Status.Accel != "" {
			return vmm.Accel(e.Status.Accel)
		}
	}
	return def
}

// lastJSON is the JSON document at the end of kosa8's output (warnings
// may come first, on stderr, which the bench reads with it).
func lastJSON(out string) string {
	for _, start := range []string{"{", "["} {
		if strings.HasPrefix(out, start) {
			return out
		}
		if i := strings.Index(out, "\n"+start); i >= 0 {
			return out[i+1:]
		}
	}
	return out
}

// imageSizes are the sizes of the newest base image and of the newest
// docker image on it, in the cache.
func imageSizes() (base, derived int64) {
	paths, err := sandbox.DefaultPaths()
	must(err)
	if c := os.Getenv("KOSA8_CACHE"); c != "" {
		paths.Cache = c
	}
	dirs, _ := filepath.Glob(filepath.Join(paths.Cache, "images", "*", "*", "manifest.json"))
	var baseT, derT time.Time
	for _, m := range dirs {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var mf struct {
			Built   time.Time `json:"built"`
			Bytes   int64     `json:"rootfs_bytes"`
			Derived *struct {
				Packages []string `json:"packages"`
			} `json:"derived"`
		}
		if json.Unmarshal(b, &mf) != nil {
			continue
		}
		switch {
		case mf.Derived == nil && strings.HasPrefix(filepath.Base(filepath.Dir(m)), "o-"):
		case mf.Derived == nil && mf.Built.After(baseT):
			base, baseT = mf.Bytes, mf.Built
		case mf.Derived != nil && strings.Join(mf.Derived.Packages, " ") == "docker.io docker-cli docker-compose" && mf.Built.After(derT):
			derived, derT = mf.Bytes, mf.Built
		}
	}
	return base, derived
}

// repoRoot is the repository the bench runs from (go run ./bench), as
// the go tool finds its module.
func repoRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	must(err)
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		must(fmt.Errorf("run the docker bench from the repository (go run ./bench docker)"))
	}
	return filepath.Dir(mod)
}
