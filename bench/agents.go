package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/sandbox"
)

var agentName = flag.String("agent", "claude", "the agent preset 'bench agents' runs and 'bench image' builds a derived image of")

// benchAgents times `kosa8 run --agent NAME -- NAME --version` to the
// agent's first output line: the first run builds the derived image (in a
// cache of its own, the base image hard-linked in), later runs start from
// it. The baseline, `kosa8 run --rm -- true`, runs in the same process.
// --version is the agent's own start-up without its API, which the bench
// cannot reach.
func benchAgents() {
	home, cleanup := setupHome()
	defer cleanup()
	accel := hostAccel()
	a := string(accel)
	p, err := agent.Get(*agentName)
	must(err)
	paths, err := sandbox.DefaultPaths()
	must(err)
	os.Setenv("KOSA8_CACHE", privateCache(paths.Cache, filepath.Join(home, "cache")))
	os.Setenv("KOSA8_SECRET_BACKEND", "file")
	// A placeholder key: the agent only has to start, never to reach its API.
	add := exec.Command(filepath.Join(*binDir, "kosa8"), p.Secrets[0].AddArgs()...)
	add.Stdin = strings.NewReader("bench-not-a-key\n")
	out, err := add.CombinedOutput()
	must(errWith(err, out))

	var rows []row
	fmt.Fprintf(os.Stderr, "kosa8 run --rm -- true (%d)...\n", *runs)
	base := measure(*runs, func() time.Duration { return timeToLine("run", "--rm", "--", "echo", "ready") })
	rows = append(rows, row{"kosa8 run --rm -- echo ready: to first output", ms(median(base)), a, "baseline"})

	argv := append([]string{"run", "--rm", "--agent", p.Name, "--"}, p.Command...)
	argv = append(argv, "--version")
	fmt.Fprintf(os.Stderr, "first kosa8 run --agent %s (the image build included)...\n", p.Name)
	first := timeToLine(argv...)
	rows = append(rows, row{fmt.Sprintf("first run --agent %s: to `%s --version`", p.Name, p.Command[0]), secs(first), a,
		fmt.Sprintf("derived image built (%s), %s", p.InstallLine(), times(first, median(base)))})
	fmt.Fprintf(os.Stderr, "later runs (%d)...\n", *runs)
	later := measure(*runs, func() time.Duration { return timeToLine(argv...) })
	rows = append(rows, row{fmt.Sprintf("later runs --agent %s: to `%s --version`", p.Name, p.Command[0]), ms(median(later)), a,
		fmt.Sprintf("image cached, %s", times(median(later), median(base)))})
	printTable("kosa8 run --agent "+p.Name, rows, accel)
}

// timeToLine runs kosa8 with args and returns the time to its first
// non-empty line on stdout.
func timeToLine(args ...string) time.Duration {
	cmd := exec.Command(filepath.Join(*binDir, "kosa8"), args...)
	out, err := cmd.StdoutPipe()
	must(err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	must(cmd.Start())
	var d time.Duration
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if d == 0 && strings.TrimSpace(sc.Text()) != "" {
			d = time.Since(t0)
		}
	}
	must(errWith(cmd.Wait(), []byte(stderr.String())))
	if d == 0 {
		must(fmt.Errorf("kosa8 %v printed nothing:\n%s", args, stderr.String()))
	}
	return d
}

// privateCache makes dir an image cache holding hard links to shared's
// base images, so the derived image this bench builds goes with it.
func privateCache(shared, dir string) string {
	archs, _ := filepath.Glob(filepath.Join(shared, "images", "*"))
	for _, arch := range archs {
		dst := filepath.Join(dir, "images", filepath.Base(arch))
		must(os.MkdirAll(dst, 0o755))
		imgs, _ := filepath.Glob(filepath.Join(arch, "[0-9a-f]*"))
		for _, img := range imgs {
			if strings.HasPrefix(filepath.Base(img), "d-") {
				continue // a derived image: the bench builds its own
			}
			out, err := exec.Command("cp", "-al", img, dst+"/").CombinedOutput()
			must(errWith(err, out))
		}
	}
	return dir
}

func errWith(err error, out []byte) error {
	if err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	return nil
}

func times(a, b time.Duration) string {
	return fmt.Sprintf("%.2fx the baseline", float64(a)/float64(b))
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
