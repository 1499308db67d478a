package main

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
)

var k8sMemory = flag.String("k8s-memory", "2G", "bench k8s: the guest memory of a pod's sandbox (deploy/kubernetes's template: 2G)")

// servePod is `kosa8 serve` as a pod's container runs it, its volume a
// folder.
type benchPod struct {
	cmd  *exec.Cmd
	url  string
	done chan error
	log  bytes.Buffer
}

func startBenchPod(volume string, env ...string) (*benchPod, time.Duration) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	addr := ln.Addr().String()
	ln.Close()
	token := filepath.Join(volume, "..", filepath.Base(volume)+".token")
	must(os.WriteFile(token, []byte("bench-token-0123456789abcdef0123456789abcdef\n"), 0o600))
	cfg, err := os.MkdirTemp(filepath.Dir(volume), "config-") // removed with the benchmark's home
	must(err)
	p := &benchPod{url: "http://" + addr, done: make(chan error, 1)}
	p.cmd = exec.Command(filepath.Join(*binDir, "kosa8"), "serve", "--listen", addr, "--name", "bench-pod",
		"--token-file", token, "--memory", *k8sMemory)
	p.cmd.Env = append(append(os.Environ(), "KOSA8_HOME="+volume, "KOSA8_CONFIG="+cfg, "KOSA8_SECRETS_DIR="), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	t0 := time.Now()
	must(p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	for {
		if resp, err := http.Get(p.url + "/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, time.Since(t0)
			}
		}
		select {
		case err := <-p.done:
			must(fmt.Errorf("kosa8 serve ended before ready: %v\n%s", err, p.log.String()))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Since(t0) > 5*time.Minute {
			must(fmt.Errorf("kosa8 serve not ready after 5 min\n%s", p.log.String()))
		}
	}
}

func (p *benchPod) exec(command string) {
	req, _ := http.NewRequest("POST", p.url+"/execute", strings.NewReader(fmt.Sprintf(`{"command": %q}`, command)))
	req.Header.Set("Authorization", "Bearer bench-token-0123456789abcdef0123456789abcdef")
	resp, err := http.DefaultClient.Do(req)
	must(err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		must(fmt.Errorf("execute %q: %s", command, resp.Status))
	}
}

// term is SIGTERM (the pod deleted, the Sandbox suspended) to serve's end.
func (p *benchPod) term() time.Duration {
	t0 := time.Now()
	must(p.cmd.Process.Signal(syscall.SIGTERM))
	if err := <-p.done; err != nil {
		must(fmt.Errorf("kosa8 serve after SIGTERM: %v\n%s", err, p.log.String()))
	}
	return time.Since(t0)
}

// allocated is the disk space files under dir take (sparse files count
// what they hold).
func allocated(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// printLarge lists the files of 10 MiB or more under dir, allocated size.
func printLarge(dir string) {
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks*512 >= 10<<20 {
				rel, _ := filepath.Rel(dir, p)
				fmt.Fprintf(os.Stderr, "  %s: %s on disk (%s apparent)\n", rel, mib64(st.Blocks*512), mib64(fi.Size()))
			}
		}
		return nil
	})
}

func mib64(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// benchK8s: a pod's life under agent-sandbox, with kosa8 serve on a
// folder as the pod's volume: start to ready for a new sandbox booted
// cold and from a boot template, suspend (SIGTERM to the machine written)
// and resume (a new pod on the volume to ready), the checkpoint's size on
// the volume, and from one running pod's memory, how many fit a 24 GiB
// node.
func benchK8s() {
	home, cleanup := setupHome()
	defer cleanup()
	a := string(hostAccel())
	var rows []row
	newVolume := func(name string) string {
		d := filepath.Join(home, "volumes", name)
		must(os.MkdirAll(d, 0o755))
		return d
	}
	paths, err := sandbox.DefaultPaths()
	must(err)
	// what a pod's sandbox ran under, and the template it started from.
	status := func(vol string) (string, string) {
		st := open(sandbox.Paths{Home: vol, Cache: paths.Cache, Config: paths.Config}, "bench-pod").Status()
		return st.Accel, st.Template
	}
	var cold, warm []time.Duration
	for i := 0; i < *runs; i++ {
		fmt.Fprintf(os.Stderr, "pod %d/%d: booted (KOSA8_TEMPLATES=0)...\n", i+1, *runs)
		vol := newVolume(fmt.Sprintf("cold-%d", i))
		p, d := startBenchPod(vol, "KOSA8_TEMPLATES=0")
		cold = append(cold, d)
		a, _ = status(vol)
		p.term()
	}
	// The first pod of the shape makes the template; the later ones use it.
	p, _ := startBenchPod(newVolume("template-maker"))
	time.Sleep(15 * time.Second) // the template is synced and published after the start
	p.term()
	for i := 0; i < *runs; i++ {
		fmt.Fprintf(os.Stderr, "pod %d/%d: from a boot template...\n", i+1, *runs)
		vol := newVolume(fmt.Sprintf("warm-%d", i))
		p, d := startBenchPod(vol)
		warm = append(warm, d)
		if _, tpl := status(vol); tpl == "" {
			fmt.Fprintf(os.Stderr, "  (this pod's sandbox booted: no template was used)\n")
		}
		p.term()
	}
	rows = append(rows,
		row{"new pod, sandbox booted: serve's start to ready", ms(median(cold)), a, fmt.Sprintf("median of %d; guest %s", len(cold), *k8sMemory)},
		row{"new pod, sandbox from a boot template: start to ready", ms(median(warm)), a, fmt.Sprintf("median of %d; %.2fx the booted one", len(warm), float64(median(warm))/float64(median(cold)))})

	var susp, resume []time.Duration
	var cpSize, volSize int64
	var memKiB int
	vol := newVolume("suspend")
	p, _ = startBenchPod(vol)
	p.exec("head -c 200M /dev/urandom > /dev/shm/touched; python3 -c 'print(1)'")
	st := open(sandbox.Paths{Home: vol, Cache: paths.Cache, Config: paths.Config}, "bench-pod").Status()
	memKiB = procMem(st.SupervisorPID).rss + procMem(st.QEMUPID).rss + rssKiB(p.cmd.Process.Pid).total
	for i := 0; i < *runs; i++ {
		fmt.Fprintf(os.Stderr, "suspend and resume %d/%d...\n", i+1, *runs)
		susp = append(susp, p.term())
		if i == 0 {
			cps := filepath.Join(vol, "sandboxes", "bench-pod", "checkpoints")
			cpSize, volSize = allocated(cps), allocated(vol)
			printLarge(cps)
		}
		var d time.Duration
		p, d = startBenchPod(vol)
		resume = append(resume, d)
		p.exec("true")
	}
	p.term()
	rows = append(rows,
		row{"suspend: SIGTERM to the machine on the volume", ms(median(susp)), a, fmt.Sprintf("median of %d; 200 MiB touched in the guest", len(susp))},
		row{"resume: a new pod on the volume to ready", ms(median(resume)), a, fmt.Sprintf("median of %d; %.2fx a new booted pod", len(resume), float64(median(resume))/float64(median(cold)))},
		row{"checkpoints on the volume after the first suspend", mib64(cpSize), a, "RAM in use (sparse), device state, disk layers"},
		row{"the whole volume after the first suspend", mib64(volSize), a, "the sandbox's disks, checkpoints and logs"})
	used := int64(memKiB) << 10
	const node, reserved = int64(24) << 30, int64(2) << 30
	request := int64(2560) << 20
	rows = append(rows,
		row{"one running pod's host memory (serve + supervisor + QEMU RSS)", mib64(used), a, "guest RAM in use included"},
		row{"sandboxes per 24 GiB node, by the template's request (2,560 MiB)", fmt.Sprint((node - reserved) / request), a, "2 GiB kept for the node"},
		row{"sandboxes per 24 GiB node, by what a pod uses here", fmt.Sprint((node - reserved) / used), a, "memory only: under TCG the CPU runs out first (2 cores here)"})
	printTable("kosa8 serve: a pod's start, suspend and resume (volume: a local folder)", rows, vmm.Accel(a))
}
