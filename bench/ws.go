package main

import (
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
)

// makeTree writes files files of about size bytes each under dir.
func makeTree(dir string, files, size int) {
	r := rand.New(rand.NewSource(1))
	buf := make([]byte, size)
	for i := 0; i < files; i++ {
		p := filepath.Join(dir, fmt.Sprintf("d%03d", i/100), fmt.Sprintf("f%04d.txt", i))
		must(os.MkdirAll(filepath.Dir(p), 0o755))
		for j := range buf {
			buf[j] = 'a' + byte(r.Intn(26))
		}
		must(os.WriteFile(p, buf, 0o644))
	}
}

func timeCmd(name string, args ...string) time.Duration {
	t0 := time.Now()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		must(fmt.Errorf("%s %v: %v\n%s", name, args, err, out))
	}
	return time.Since(t0)
}

func benchWS() {
	home, cleanup := setupHome()
	defer cleanup()
	accel := string(hostAccel())
	var rows []row
	paths, err := sandbox.DefaultPaths()
	must(err)
	m := &sandbox.Manager{Paths: paths, Disks: qemu.Layers{}}

	// Initial population of a 10,000-file, ~200 MB tree.
	tree := filepath.Join(home, "tree")
	makeTree(tree, 10000, 20000)
	tarDst := filepath.Join(home, "tar-copy")
	must(os.MkdirAll(tarDst, 0o755))
	tarHost := timeCmd("sh", "-c", fmt.Sprintf("tar -C %s -cf - . | tar -C %s -xf -", tree, tarDst))
	os.RemoveAll(tarDst)
	fmt.Fprintln(os.Stderr, "initial population...")
	kosa8("create", "bench-ws", "--workspace", tree)
	kosa8("start", "bench-ws")
	sb, err := m.Open("bench-ws")
	must(err)
	logb, _ := os.ReadFile(sb.Path(sandbox.SupervisorLog))
	var popMS float64
	for _, line := range strings.Split(string(logb), "\n") {
		if i := strings.Index(line, "workspace in step"); i >= 0 {
			fmt.Sscanf(line[strings.Index(line, " ms=")+4:], "%f", &popMS)
		}
	}
	pop := time.Duration(popMS * float64(time.Millisecond))
	tarGuest := timeCmd("sh", "-c", fmt.Sprintf("tar -C %s -cf - . | %s exec -i bench-ws -- sh -c 'mkdir -p /tmp/t && tar -C /tmp/t -xf -'", tree, filepath.Join(*binDir, "kosa8")))
	rows = append(rows,
		row{"10,000 files / 200 MB: tar c | tar x on the host", ms(tarHost), "none", "baseline"},
		row{"10,000 files / 200 MB: tar piped into the guest (tar x inside)", ms(tarGuest), accel, fmt.Sprintf("%.1fx host tar: what the emulated guest alone costs", float64(tarGuest)/float64(tarHost))},
		row{"10,000 files / 200 MB: kosa8 initial population", ms(pop), accel, fmt.Sprintf("%.1fx host tar, %.1fx tar into the guest", float64(pop)/float64(tarHost), float64(pop)/float64(tarGuest))},
	)
	kosa8("rm", "-f", "bench-ws")

	// Propagation latency of one small file, both ways.
	small := filepath.Join(home, "small")
	must(os.MkdirAll(small, 0o755))
	kosa8("create", "bench-lat", "--workspace", small)
	kosa8("start", "bench-lat")
	defer kosa8("rm", "-f", "bench-lat")
	offset, uncertainty := guestClockOffset("bench-lat")
	var toHost, toGuest []time.Duration
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("g%02d.txt", i)
		// Written inside by a command whose own round trip is subtracted:
		// the guest records when it wrote.
		out := kosa8("exec", "bench-lat", "--", "sh", "-c", fmt.Sprintf("echo x > %s && date +%%s.%%N", name))
		var wrote float64
		fmt.Sscanf(strings.TrimSpace(out), "%f", &wrote)
		for {
			if _, err := os.Stat(filepath.Join(small, name)); err == nil {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		toHost = append(toHost, time.Since(time.Unix(0, int64(wrote*1e9)).Add(-offset)))

		hname := fmt.Sprintf("h%02d.txt", i)
		t0 := time.Now()
		must(os.WriteFile(filepath.Join(small, hname), []byte("y"), 0o644))
		// The guest polls for the file and reports when it saw it.
		out = kosa8("exec", "bench-lat", "--", "sh", "-c", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.005; done; date +%%s.%%N", hname))
		var seen float64
		fmt.Sscanf(strings.TrimSpace(out), "%f", &seen)
		toGuest = append(toGuest, time.Unix(0, int64(seen*1e9)).Add(-offset).Sub(t0))
	}
	rows = append(rows,
		row{"one small file, guest → host", "p50 " + ms(pct(toHost, 50)), accel, fmt.Sprintf("p95 %s (guest clock %s off the host's, corrected, ±%s)", ms(pct(toHost, 95)), ms(offset), ms(uncertainty))},
		row{"one small file, host → guest", "p50 " + ms(pct(toGuest, 50)), accel, "p95 " + ms(pct(toGuest, 95))},
	)

	// git status in the workspace vs on the host.
	repo := filepath.Join(small, "repo")
	makeTree(repo, 2000, 2000)
	timeCmd("sh", "-c", fmt.Sprintf("cd %s && git init -q && git add -A && git -c user.email=a@b -c user.name=b commit -qm init", repo))
	kosa8("sync", "now", "bench-lat")
	var gitHost, gitGuest []time.Duration
	for i := 0; i < 5; i++ {
		gitHost = append(gitHost, timeCmd("git", "-C", repo, "status", "--porcelain"))
		out := kosa8("exec", "bench-lat", "--", "sh", "-c", fmt.Sprintf("s=$(date +%%s%%N); git -C %s status --porcelain >/dev/null; e=$(date +%%s%%N); echo $((e-s))", repo))
		var ns int64
		fmt.Sscanf(strings.TrimSpace(out), "%d", &ns)
		gitGuest = append(gitGuest, time.Duration(ns))
	}
	rows = append(rows,
		row{"git status, 2,000-file repo, on the host", ms(pct(gitHost, 50)), "none", "baseline"},
		row{"git status, same repo in the workspace", ms(pct(gitGuest, 50)), accel, fmt.Sprintf("%.1fx host (native ext4 in the guest%s)", float64(pct(gitGuest, 50))/float64(pct(gitHost, 50)), tcgNote(accel))},
	)
	rows = append(rows, compareVirtioFS(small, repo, gitHost, gitGuest, accel)...)
	printTable("kosa8 workspace", rows, hostAccel())
}

// compareVirtioFS runs an untar, git status and a build on the host, in
// the workspace of the sandbox bench-lat (host folder small, which holds
// repo), and in a VM that shares a folder over virtiofs instead.
func compareVirtioFS(small, repo string, gitHost, gitGuest []time.Duration, accel string) []row {
	fmt.Fprintln(os.Stderr, "untar and build: host, workspace disk, virtiofs...")
	work, err := os.MkdirTemp("", "kosa8-bench-work-")
	must(err)
	defer os.RemoveAll(work)
	src := filepath.Join(work, "src")
	makeTree(src, 2000, 10000)
	tarball := filepath.Join(work, "t.tar")
	timeCmd("tar", "-C", src, "-cf", tarball, ".")
	py := filepath.Join(work, "py")
	makePyProject(py, 300)
	const runs = 3
	clearPyc := "find %s -name __pycache__ -prune -exec rm -rf {} +"

	var untarHost, buildHost []time.Duration
	for i := 0; i < runs; i++ {
		dst := filepath.Join(work, fmt.Sprintf("untar%d", i))
		must(os.MkdirAll(dst, 0o755))
		untarHost = append(untarHost, timeCmd("tar", "-C", dst, "-xf", tarball))
		timeCmd("sh", "-c", fmt.Sprintf(clearPyc, py))
		buildHost = append(buildHost, timeCmd("python3", "-m", "compileall", "-q", py))
	}

	// The workspace: the tarball and project reach the guest through the
	// sync; the tarball is read from the guest's own disk, as on the host.
	timeCmd("cp", tarball, filepath.Join(small, "t.tar"))
	timeCmd("cp", "-a", py, filepath.Join(small, "py"))
	kosa8("sync", "now", "bench-lat")
	kosa8("exec", "bench-lat", "--", "cp", filepath.Join(small, "t.tar"), "/var/tmp/t.tar")
	var untarWS, buildWS []time.Duration
	for i := 0; i < runs; i++ {
		dst := filepath.Join(small, fmt.Sprintf("untar%d", i))
		untarWS = append(untarWS, parseNS(kosa8("exec", "bench-lat", "--", "sh", "-c", timed(fmt.Sprintf("mkdir -p %s && tar -C %s -xf /var/tmp/t.tar", dst, dst)))))
		pyDir := filepath.Join(small, "py")
		kosa8("sync", "now", "bench-lat") // each run starts with the sync caught up
		buildWS = append(buildWS, parseNS(kosa8("exec", "bench-lat", "--", "sh", "-c", fmt.Sprintf(clearPyc, pyDir)+"; "+timed("python3 -m compileall -q "+pyDir))))
		kosa8("sync", "now", "bench-lat")
	}
	// The same on the guest's root disk (ext4 on virtio-blk too, not
	// synced): what the disk costs apart from the sync.
	kosa8("exec", "bench-lat", "--", "cp", "-a", filepath.Join(small, "py"), "/var/tmp/py")
	var untarRoot, buildRoot []time.Duration
	for i := 0; i < runs; i++ {
		dst := fmt.Sprintf("/var/tmp/untar%d", i)
		untarRoot = append(untarRoot, parseNS(kosa8("exec", "bench-lat", "--", "sh", "-c", timed(fmt.Sprintf("mkdir -p %s && tar -C %s -xf /var/tmp/t.tar", dst, dst)))))
		buildRoot = append(buildRoot, parseNS(kosa8("exec", "bench-lat", "--", "sh", "-c", fmt.Sprintf(clearPyc, "/var/tmp/py")+"; "+timed("python3 -m compileall -q /var/tmp/py"))))
	}
	rows := []row{
		{"untar 2,000 files / 20 MB, on the host", ms(pct(untarHost, 50)), "none", "baseline"},
		{"untar, on the guest's root disk (not synced)", ms(pct(untarRoot, 50)), accel, xHost(pct(untarRoot, 50), pct(untarHost, 50))},
		{"build, on the guest's root disk (not synced)", ms(pct(buildRoot, 50)), accel, xHost(pct(buildRoot, 50), pct(buildHost, 50))},
		{"untar, in the workspace", ms(pct(untarWS, 50)), accel, xHost(pct(untarWS, 50), pct(untarHost, 50))},
		{"build (python3 -m compileall, 300 modules), on the host", ms(pct(buildHost, 50)), "none", "baseline (no Go toolchain in the guest image)"},
		{"build, in the workspace", ms(pct(buildWS, 50)), accel, xHost(pct(buildWS, 50), pct(buildHost, 50))},
	}

	shared := filepath.Join(work, "shared")
	must(os.MkdirAll(shared, 0o755))
	timeCmd("cp", "-a", repo, filepath.Join(shared, "repo"))
	timeCmd("cp", "-a", py, filepath.Join(shared, "py"))
	timeCmd("cp", tarball, filepath.Join(shared, "t.tar"))
	v, err := startVFS(shared)
	if err != nil {
		fmt.Fprintln(os.Stderr, "virtiofs comparison skipped:", err)
		return append(rows, row{"virtiofs comparison", "not run", accel, err.Error()})
	}
	defer v.stop()
	vrun := func(script string) string {
		out, err := v.run("root", script)
		must(err)
		return out
	}
	// This VM's root disk is the image's, nearly full (a sandbox writes to
	// an overlay disk of its own): the tarball is read from a tmpfs, as
	// from the page cache in the sandbox.
	vrun("mount -t tmpfs -o size=256m tmpfs /var/tmp && cp /mnt/vfs/t.tar /var/tmp/t.tar")
	var untarVFS, buildVFS, gitVFS []time.Duration
	for i := 0; i < runs; i++ {
		dst := fmt.Sprintf("/mnt/vfs/untar%d", i)
		untarVFS = append(untarVFS, parseNS(vrun(timed(fmt.Sprintf("mkdir -p %s && tar -C %s -xf /var/tmp/t.tar", dst, dst)))))
		buildVFS = append(buildVFS, parseNS(vrun(fmt.Sprintf(clearPyc, "/mnt/vfs/py")+"; "+timed("python3 -m compileall -q /mnt/vfs/py"))))
	}
	for i := 0; i < 5; i++ {
		gitVFS = append(gitVFS, parseNS(vrun(timed("git -c safe.directory='*' -C /mnt/vfs/repo status --porcelain >/dev/null"))))
	}
	vs := func(d, ws time.Duration) string {
		return fmt.Sprintf("%.1fx the workspace disk", float64(d)/float64(ws))
	}
	return append(rows,
		row{"untar, in a virtiofs share", ms(pct(untarVFS, 50)), accel, vs(pct(untarVFS, 50), pct(untarWS, 50)) + fmt.Sprintf(", %.1fx the root disk", float64(pct(untarVFS, 50))/float64(pct(untarRoot, 50)))},
		row{"build, in a virtiofs share", ms(pct(buildVFS, 50)), accel, vs(pct(buildVFS, 50), pct(buildWS, 50)) + fmt.Sprintf(", %.1fx the root disk", float64(pct(buildVFS, 50))/float64(pct(buildRoot, 50)))},
		row{"git status, 2,000-file repo, in a virtiofs share", ms(pct(gitVFS, 50)), accel, vs(pct(gitVFS, 50), pct(gitGuest, 50))},
	)
}

func xHost(d, host time.Duration) string {
	return fmt.Sprintf("%.1fx host", float64(d)/float64(host))
}

// guestClockOffset estimates how far the guest's clock is ahead of the
// host's, from the exec round trip with the smallest delay (as NTP does),
// and the uncertainty (half that round trip).
func guestClockOffset(name string) (offset, uncertainty time.Duration) {
	best := time.Duration(1<<63 - 1)
	for i := 0; i < 10; i++ {
		t0 := time.Now()
		out := kosa8("exec", name, "--", "date", "+%s.%N")
		t1 := time.Now()
		var g float64
		fmt.Sscanf(strings.TrimSpace(out), "%f", &g)
		if rtt := t1.Sub(t0); rtt < best {
			best = rtt
			mid := t0.Add(rtt / 2)
			offset = time.Unix(0, int64(g*1e9)).Sub(mid)
		}
	}
	return offset, best / 2
}

// tcgNote is "; the CPU is emulated under tcg" where it is.
func tcgNote(accel string) string {
	if accel == string(vmm.TCG) {
		return "; the CPU is emulated under tcg"
	}
	return ""
}
