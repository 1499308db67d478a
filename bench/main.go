// Command bench measures a sandbox's life: create-to-first-exec, cold boot,
// exec round trip and host memory, beside bare QEMU booting the same kernel
// and initramfs, and prints a table. Every figure names the acceleration it
// ran under. Run it with 'make bench'.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

var (
	binDir = flag.String("bin", "bin", "directory with kosa8 and kosa8-agent")
	runs   = flag.Int("n", 5, "boots per measurement")
	execs  = flag.Int("execs", 300, "exec round trips")
	cpu    = flag.String("cpuprofile", "", "write a CPU profile of the benchmark process here")
)

type row struct {
	what, value, accel, note string
}

func main() {
	flag.Parse()
	if *cpu != "" {
		f, err := os.Create(*cpu)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	switch flag.Arg(0) {
	case "", "boot":
		benchBoot()
	case "net":
		benchNet()
	case "ws":
		benchWS()
	case "cp":
		benchCP()
	case "soak":
		benchSoak()
	case "agents":
		benchAgents()
	case "ramclone":
		benchRAMClone()
	case "mem":
		benchMem()
	case "image":
		benchImage()
	case "fork":
		benchFork()
	case "k8s":
		benchK8s()
	case "docker":
		benchDocker()
	default:
		must(fmt.Errorf("unknown benchmark %q: use boot, net, ws, cp, soak, agents, ramclone, mem, image, fork, k8s or docker", flag.Arg(0)))
	}
}

// setupHome points kosa8 at a throw-away state directory.
func setupHome() (string, func()) {
	abs, err := filepath.Abs(*binDir)
	must(err)
	*binDir = abs
	home, err := os.MkdirTemp("", "kosa8-bench-")
	must(err)
	os.Setenv("KOSA8_HOME", home)
	os.Setenv("KOSA8_CONFIG", filepath.Join(home, "config"))
	// Sandboxes made without --workspace take the current folder: an
	// empty one, not whatever folder the benchmark was started in (the
	// repository, whose first copy would be timed as boot).
	cwd := filepath.Join(home, "empty-project")
	must(os.MkdirAll(cwd, 0o755))
	must(os.Chdir(cwd))
	cleanup := func() {
		// Sandboxes a failed step left running go too: their QEMUs would
		// hold gigabytes and slow every later run.
		ents, _ := os.ReadDir(filepath.Join(home, "sandboxes"))
		for _, e := range ents {
			_ = exec.Command(filepath.Join(*binDir, "kosa8"), "rm", "-f", e.Name()).Run()
		}
		os.RemoveAll(home)
	}
	benchCleanup = cleanup
	if a := hostAccel(); a != vmm.TCG {
		// One boot says whether the accelerator the probe passed boots a
		// sandbox: if not, the supervisor falls back to TCG and records
		// it in this home, and hostAccel says tcg from then on.
		fmt.Fprintln(os.Stderr, "checking that", a, "boots a sandbox...")
		if out, err := exec.Command(filepath.Join(*binDir, "kosa8"), "run", "--rm", "--", "true").CombinedOutput(); err != nil {
			// No image yet (the image benchmark builds its own): the
			// tables name the probe's choice, as the first boot may not.
			fmt.Fprintf(os.Stderr, "could not check it (%v); the tables say %s, which a first boot may not confirm:\n%s\n", err, a, out)
		}
	}
	return home, cleanup
}

// benchCleanup, once a benchmark made its home, undoes it when must
// ends the run.
var benchCleanup func()

// hostAccel is the acceleration the benchmark's sandboxes run under: the
// best the host offers, less one that failed to boot a sandbox in this
// boot of the host (recorded in KOSA8_HOME, as the supervisor records it;
// setupHome boots one sandbox to find out). A /dev/kvm that passes the
// probe but cannot boot Linux made the tables say kvm beside TCG figures.
func hostAccel() vmm.Accel {
	accel, err := qemu.ChooseAccel(qemu.DetectHostIn(os.Getenv("KOSA8_HOME")), vmspec.HostArch(), vmm.Accel(os.Getenv("KOSA8_ACCEL")))
	must(err)
	return accel
}

func printTable(title string, rows []row, accel vmm.Accel) {
	fmt.Printf("\n%s — %s, %d CPUs, accel %s, QEMU %s\n\n", title, time.Now().UTC().Format(time.RFC3339), nproc(), accel, qemuVersion())
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEASURE\tVALUE\tACCEL\tNOTE")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.what, r.value, r.accel, r.note)
	}
	tw.Flush()
	if accel == vmm.TCG {
		fmt.Println("\nTCG emulates the CPU: absolute figures are far above what KVM or HVF give; the ratios to the baselines are the comparable part.")
	}
}

func benchBoot() {
	_, cleanup := setupHome()
	defer cleanup()
	accel := hostAccel()
	a := string(accel)
	paths, err := sandbox.DefaultPaths()
	must(err)
	img, err := image.Store{Dir: paths.Cache}.Lookup(image.DefaultRecipe(vmspec.HostArch()))
	must(err)
	initrd, err := img.Initramfs(filepath.Join(*binDir, "kosa8-agent"))
	must(err)

	var rows []row
	fmt.Fprintf(os.Stderr, "bare QEMU boots (%d)...\n", *runs)
	bare := measure(*runs, func() time.Duration { return bareBoot(img, initrd, accel) })
	rows = append(rows, row{"bare QEMU: start to first userspace line", ms(median(bare)), a, "same kernel+initramfs, no disk, no agent channel; baseline"})

	fmt.Fprintf(os.Stderr, "kosa8 cold boots (%d)...\n", *runs)
	// Booted, not started from a template (KOSA8_TEMPLATES=0 reaches the
	// supervisor through kosa8's environment). Each is then paused and
	// resumed: a start that restores its own machine.
	os.Setenv("KOSA8_TEMPLATES", "0")
	var resumed, resumeWall []time.Duration
	ready, startWall := newStarts(paths, "bench-boot", *runs, func(name string, sb *sandbox.Sandbox) {
		kosa8("pause", name)
		t0 := time.Now()
		kosa8("start", name)
		resumeWall = append(resumeWall, time.Since(t0))
		resumed = append(resumed, time.Duration(sb.Status().BootMillis*float64(time.Millisecond)))
	})
	rows = append(rows,
		row{"kosa8: supervisor start to agent ready", ms(median(ready)), a, ratio(median(ready), median(bare))},
		row{"kosa8 start (CLI wall time)", ms(median(startWall)), a, ratio(median(startWall), median(bare))},
		row{"kosa8 start of a paused sandbox: supervisor start to agent ready", ms(median(resumed)), a,
			ratio(median(resumed), median(bare)) + "; restored from its checkpoint, not booted"},
		row{"kosa8 start of a paused sandbox (CLI wall time)", ms(median(resumeWall)), a, ratio(median(resumeWall), median(bare))},
	)

	fmt.Fprintf(os.Stderr, "create-to-first-exec, booted (%d)...\n", *runs)
	firstCold := measure(*runs, firstOutput)
	if other, why := foreignBoots(paths, *runs); len(other) > 0 {
		rows = append(rows, row{"kosa8 " + string(foreignArch()) + " guest: supervisor start to agent ready", ms(median(other)), string(vmm.TCG),
			fmt.Sprintf("emulated; %.2fx this host's own guest (%s)", float64(median(other))/float64(median(ready)), a)})
	} else {
		fmt.Fprintf(os.Stderr, "no %s guest boots: %s\n", foreignArch(), why)
	}

	rows = append(rows, archesSideBySide(paths)...)

	os.Unsetenv("KOSA8_TEMPLATES")
	rows = append(rows, row{"kosa8 run --rm -- echo: to first output, booted", ms(median(firstCold)), a, ratio(median(firstCold), median(bare)) + "; KOSA8_TEMPLATES=0"})

	// A new sandbox's first start from the template of its shape: the
	// first boot of the shape makes it (its pause for the copy in the
	// log), the later ones restore it.
	fmt.Fprintf(os.Stderr, "kosa8 starts from a template (1 to make it, %d timed)...\n", *runs)
	kosa8("create", "bench-tpl-make")
	kosa8("start", "bench-tpl-make")
	kosa8("rm", "-f", "bench-tpl-make")
	fromTpl, fromTplWall := newStarts(paths, "bench-tpl", *runs, func(name string, sb *sandbox.Sandbox) {
		if sb.Status().Template == "" {
			must(fmt.Errorf("%s did not start from a template: see its supervisor.log", name))
		}
	})
	rows = append(rows,
		row{"kosa8 start of a new sandbox from a template: supervisor start to agent ready", ms(median(fromTpl)), a,
			ratio(median(fromTpl), median(bare)) + "; restored, the workspace copied and the CA installed after"},
		row{"kosa8 start of a new sandbox from a template (CLI wall time)", ms(median(fromTplWall)), a, ratio(median(fromTplWall), median(bare))},
	)

	fmt.Fprintf(os.Stderr, "create-to-first-exec (%d)...\n", *runs)
	first := measure(*runs, firstOutput)
	rows = append(rows, row{"kosa8 run --rm -- echo: to first output, from a template", ms(median(first)), a, ratio(median(first), median(bare))})

	fmt.Fprintf(os.Stderr, "exec round trips (%d)...\n", *execs)
	kosa8("create", "bench-exec")
	kosa8("start", "bench-exec")
	sb := open(paths, "bench-exec")
	rt := execRoundTrips(sb, *execs)
	rows = append(rows,
		row{"exec round trip of `true`, API p50", ms(pct(rt, 50)), a, fmt.Sprintf("p99 %s, n=%d", ms(pct(rt, 99)), len(rt))},
	)
	var cli []time.Duration
	for i := 0; i < 20; i++ {
		t0 := time.Now()
		kosa8("exec", "bench-exec", "--", "true")
		cli = append(cli, time.Since(t0))
	}
	rows = append(rows, row{"kosa8 exec -- true (CLI wall) p50", ms(pct(cli, 50)), a, fmt.Sprintf("p99 %s, n=%d", ms(pct(cli, 99)), len(cli))})

	time.Sleep(3 * time.Second)
	st := sb.Status()
	sup, qemuRSS := rssKiB(st.SupervisorPID), rssKiB(st.QEMUPID)
	rows = append(rows, row{"host RSS, idle sandbox (supervisor + QEMU)", fmt.Sprintf("%d MiB", (sup.total+qemuRSS.total)>>10), a,
		fmt.Sprintf("supervisor %d MiB, QEMU %d MiB of which guest RAM (shmem) %d MiB; guest has %d MiB", sup.total>>10, qemuRSS.total>>10, qemuRSS.shmem>>10, sb.Config.MemoryMiB)})
	kosa8("rm", "-f", "bench-exec")

	printTable("kosa8 boot and exec", rows, accel)
}

// newStarts creates and starts n sandboxes (prefix-0, …) one after the
// other and returns each start's time to ready (the supervisor's) and its
// CLI wall time; then runs after each start, before the sandbox is
// removed.
func newStarts(paths sandbox.Paths, prefix string, n int, then func(name string, sb *sandbox.Sandbox)) (ready, wall []time.Duration) {
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		kosa8("create", name)
		t0 := time.Now()
		kosa8("start", name)
		wall = append(wall, time.Since(t0))
		sb := open(paths, name)
		ready = append(ready, time.Duration(sb.Status().BootMillis*float64(time.Millisecond)))
		if then != nil {
			then(name, sb)
		}
		kosa8("rm", "-f", name)
	}
	return ready, wall
}

// foreignArch is the guest architecture this host emulates.
func foreignArch() vmspec.Arch {
	if vmspec.HostArch() == vmspec.ARM64 {
		return vmspec.AMD64
	}
	return vmspec.ARM64
}

// archReady says why sandboxes of arch cannot run here (its QEMU or its
// image missing), or nil.
func archReady(paths sandbox.Paths, arch vmspec.Arch) error {
	if _, err := qemu.FindBinary(arch, ""); err != nil {
		return err
	}
	_, err := (image.Store{Dir: paths.Cache}).Lookup(image.DefaultRecipe(arch))
	return err
}

// foreignBoots boots sandboxes of the other architecture (emulated, TCG)
// n times and returns their times to agent ready, or why it could not.
func foreignBoots(paths sandbox.Paths, n int) ([]time.Duration, string) {
	arch := foreignArch()
	if err := archReady(paths, arch); err != nil {
		return nil, err.Error()
	}
	fmt.Fprintf(os.Stderr, "kosa8 %s cold boots (%d)...\n", arch, n)
	var ready []time.Duration
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("bench-boot-%s-%d", arch, i)
		kosa8("create", "--arch", string(arch), "--accel", string(vmm.TCG), name)
		kosa8("start", name)
		ready = append(ready, time.Duration(open(paths, name).Status().BootMillis*float64(time.Millisecond)))
		kosa8("rm", "-f", name)
	}
	return ready, ""
}

// archesSideBySide runs a 1 GiB sandbox of this host's architecture and
// one of the emulated one, both under TCG, one after the other in the
// same run: exec round trip and a checkpoint's pause beside QEMU's plain
// migrate of the same machine. A foreign arch without its QEMU or image
// is left out, with the reason on stderr.
func archesSideBySide(paths sandbox.Paths) []row {
	var rows []row
	for _, arch := range []vmspec.Arch{vmspec.HostArch(), foreignArch()} {
		if err := archReady(paths, arch); err != nil {
			fmt.Fprintf(os.Stderr, "no %s guest beside: %v\n", arch, err)
			continue
		}
		fmt.Fprintf(os.Stderr, "%s guest under tcg: exec, checkpoint, plain migrate...\n", arch)
		name := "bench-arch-" + string(arch)
		kosa8("create", "--arch", string(arch), "--accel", string(vmm.TCG), "--memory", "1G", "--no-workspace", name)
		kosa8("start", name)
		time.Sleep(3 * time.Second) // past the guest's own start-up work
		rt := execRoundTrips(open(paths, name), *execs)
		var cp cpOut
		kosa8JSON(&cp, "checkpoint", name, "--json")
		pm := plainMigrate(name)
		kosa8("rm", "-f", name)
		a := string(arch) + " guest (tcg)"
		rows = append(rows,
			row{a + ": exec round trip, API p50", ms(pct(rt, 50)), string(vmm.TCG), fmt.Sprintf("p99 %s, n=%d", ms(pct(rt, 99)), len(rt))},
			row{a + ": checkpoint pause, 1 GiB", fmt.Sprintf("%.0f ms", cp.PauseMillis), string(vmm.TCG),
				fmt.Sprintf("plain migrate of the same machine %.0f ms (%.1fx); %d MiB of RAM in use", pm.PauseMillis, pm.PauseMillis/max(cp.PauseMillis, 1), cp.RAMBytes>>20)},
		)
	}
	return rows
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		if c := benchCleanup; c != nil {
			benchCleanup = nil // a failure during the cleanup ends here
			c()
		}
		os.Exit(1)
	}
}

func kosa8(args ...string) string {
	out, err := exec.Command(filepath.Join(*binDir, "kosa8"), args...).CombinedOutput()
	if err != nil {
		must(fmt.Errorf("kosa8 %v: %v\n%s", args, err, out))
	}
	return string(out)
}

func open(p sandbox.Paths, name string) *sandbox.Sandbox {
	sb, err := (&sandbox.Manager{Paths: p, Disks: qemu.Layers{}}).Open(name)
	must(err)
	return sb
}

func measure(n int, f func() time.Duration) []time.Duration {
	var out []time.Duration
	for i := 0; i < n; i++ {
		out = append(out, f())
	}
	return out
}

// bareBoot starts QEMU with the image's kernel and initramfs and returns the
// time to the agent's first line on the serial console.
func bareBoot(img *image.Image, initrd string, accel vmm.Accel) time.Duration {
	machine := "microvm,acpi=on,rtc=on"
	accelArg := string(accel)
	appendLine := "console=ttyS0 panic=-1 loglevel=4"
	if accel == vmm.TCG {
		machine += ",pit=on"
		// As kosa8 runs it: one thread for both vCPUs (see cmdline.go).
		accelArg += ",tb-size=" + strconv.Itoa(qemu.DefaultTBMiB) + ",thread=single"
		appendLine += " tsc_early_khz=" + strconv.Itoa(qemu.HostTSCkHz())
	}
	cpu := "max"
	if accel != vmm.TCG {
		cpu = "host"
	}
	// The QEMU kosa8 runs (KOSA8_QEMU), with the same data folders and
	// firmware, so the baseline differs from a sandbox only in what kosa8 adds.
	inst := benchQEMU()
	args := []string{"-nodefaults", "-no-user-config", "-display", "none",
		"-no-reboot", "-accel", accelArg, "-machine", machine, "-cpu", cpu, "-smp", "2", "-m", "1024M",
		"-kernel", img.Kernel().Image, "-initrd", initrd, "-append", appendLine, "-serial", "stdio"}
	for _, d := range inst.DataDirs {
		args = append(args, "-L", d)
	}
	if inst.Firmware != "" {
		args = append(args, "-bios", inst.Firmware)
	}
	cmd := exec.Command(inst.Binary, args...)
	out, err := cmd.StdoutPipe()
	must(err)
	t0 := time.Now()
	must(cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	found := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "kosa8-agent starting") {
				found <- time.Since(t0)
				break
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case d := <-found:
		return d
	case <-time.After(60 * time.Second):
		must(fmt.Errorf("bare QEMU never reached userspace"))
	}
	return 0
}

// firstOutput times `kosa8 run --rm -- echo ready` up to its output.
func firstOutput() time.Duration {
	cmd := exec.Command(filepath.Join(*binDir, "kosa8"), "run", "--rm", "--", "echo", "ready")
	out, err := cmd.StdoutPipe()
	must(err)
	t0 := time.Now()
	must(cmd.Start())
	line, _ := bufio.NewReader(out).ReadString('\n')
	d := time.Since(t0)
	must(cmd.Wait())
	if strings.TrimSpace(line) != "ready" {
		must(fmt.Errorf("unexpected output %q", line))
	}
	return d
}

func execRoundTrips(sb *sandbox.Sandbox, n int) []time.Duration {
	c := sb.Client()
	var out []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		conn, err := c.Exec(context.Background(), &guest.ExecRequest{Argv: []string{"true"}})
		must(err)
		st, err := guest.Pump(conn, guest.StdIO{})
		must(err)
		conn.Close()
		if st.Code != 0 {
			must(fmt.Errorf("true exited %d", st.Code))
		}
		out = append(out, time.Since(t0))
	}
	return out
}

type rss struct{ total, shmem int }

func rssKiB(pid int) rss {
	total, shmem := procKiB(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:", "RssShmem:")
	return rss{total, shmem}
}

// procKiB reads two "Key: N kB" fields of a /proc file (0 when absent).
func procKiB(path, a, b string) (int, int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0
	}
	var va, vb int
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case a:
			va = v
		case b:
			vb = v
		}
	}
	return va, vb
}

func median(d []time.Duration) time.Duration { return pct(d, 50) }

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func ratio(a, b time.Duration) string {
	return fmt.Sprintf("%.2fx bare QEMU", float64(a)/float64(b))
}

func nproc() int {
	out, _ := exec.Command("nproc").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// benchQEMU is the QEMU under test: KOSA8_QEMU, else the one in PATH.
func benchQEMU() qemu.Install {
	bin, err := qemu.FindBinary(vmspec.HostArch(), "")
	must(err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	inst, err := qemu.Probe(ctx, bin, vmspec.HostArch())
	must(err)
	return inst
}

func qemuVersion() string {
	return benchQEMU().Version.String()
}
