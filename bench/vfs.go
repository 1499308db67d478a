package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/supervisor"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// virtiofsd is the daemon QEMU 7.2 ships in Debian (newer Debian has it as
// a package of its own, at /usr/libexec/virtiofsd).
func virtiofsdPath() string {
	for _, p := range []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// vfsMachine is a VM like a sandbox's (same kernel, initramfs, agent and
// root disk) with dir shared over virtiofs instead of a workspace disk.
type vfsMachine struct {
	m      *qemu.Machine
	client *guest.Client
	fsd    *exec.Cmd
	tmp    string
}

func startVFS(dir string) (*vfsMachine, error) {
	bin := virtiofsdPath()
	if bin == "" {
		return nil, fmt.Errorf("virtiofsd not found (Debian's qemu-system-common ships it)")
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("virtiofsd needs root here")
	}
	paths, err := sandbox.DefaultPaths()
	if err != nil {
		return nil, err
	}
	img, err := image.Store{Dir: paths.Cache}.Lookup(image.DefaultRecipe(vmspec.HostArch()))
	if err != nil {
		return nil, err
	}
	// This VM alone mounts virtiofs: its initramfs adds fuse and virtiofs
	// to a sandbox's modules.
	initrd, err := img.InitramfsWith(filepath.Join(*binDir, "kosa8-agent"), append(slices.Clone(image.GuestModules), image.VirtioFSModules...))
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "kosa8-bench-vfs-")
	if err != nil {
		return nil, err
	}
	v := &vfsMachine{tmp: tmp}
	root := filepath.Join(tmp, "root.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", img.RootFS(), "-F", "raw", root).CombinedOutput(); err != nil {
		v.stop()
		return nil, fmt.Errorf("qemu-img: %v: %s", err, out)
	}
	sock := filepath.Join(tmp, "vfs.sock")
	v.fsd = exec.Command(bin, "--socket-path="+sock, "-o", "source="+dir, "-o", "cache=auto", "-o", "log_level=warn")
	v.fsd.Stderr = os.Stderr
	if err := v.fsd.Start(); err != nil {
		v.stop()
		return nil, err
	}
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 500 {
			v.stop()
			return nil, fmt.Errorf("virtiofsd made no socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	drv, err := qemu.New(qemu.Config{Arch: vmspec.HostArch(), Accel: hostAccel()})
	if err != nil {
		v.stop()
		return nil, err
	}
	cfg := &sandbox.Config{Name: "bench-vfs", User: "kosa8", UID: 1000, GID: 1000}
	if u, err := user.Current(); err == nil && u.Uid != "0" {
		cfg.User = u.Username
		cfg.UID, _ = strconv.Atoi(u.Uid)
		cfg.GID, _ = strconv.Atoi(u.Gid)
	}
	spec := &vmspec.Spec{
		Name: "bench-vfs", Arch: vmspec.HostArch(), CPUs: 2, MemoryMiB: 1024,
		Kernel: img.Kernel().Image, Initrd: initrd, Cmdline: supervisor.Cmdline(cfg),
		AgentPort: "org.kosa8.agent",
		Disks:     []vmspec.Disk{{ID: "root", Path: root, Format: "qcow2"}},
		VirtioFS:  []vmspec.VirtioFS{{Tag: "bench", Socket: sock}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mach, err := drv.Start(ctx, spec, vmm.StartOptions{})
	if err != nil {
		v.stop()
		return nil, err
	}
	v.m = mach.(*qemu.Machine)
	if v.client, err = guest.Connect(ctx, v.m.Agent()); err != nil {
		v.stop()
		return nil, err
	}
	if _, err := v.run("root", "mkdir -p /mnt/vfs && mount -t virtiofs bench /mnt/vfs"); err != nil {
		v.stop()
		return nil, err
	}
	return v, nil
}

// run runs a shell command in the VM and returns its output.
func (v *vfsMachine) run(user, script string) (string, error) {
	conn, _, err := v.client.Exec(context.Background(), &guest.ExecRequest{Argv: []string{"sh", "-c", script}, User: user})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var out, errb bytes.Buffer
	st, err := guest.Pump(conn, guest.StdIO{Stdout: &out, Stderr: &errb})
	if err != nil {
		return "", err
	}
	if st.Code != 0 {
		return "", fmt.Errorf("%q exited %d: %s", script, st.Code, errb.String())
	}
	return out.String(), nil
}

func (v *vfsMachine) stop() {
	if v.client != nil {
		v.client.Close()
	}
	if v.m != nil {
		_ = v.m.Kill()
	}
	if v.fsd != nil && v.fsd.Process != nil {
		_ = v.fsd.Process.Kill()
		_ = v.fsd.Wait()
	}
	os.RemoveAll(v.tmp)
}

// timed wraps a shell command so that it prints its own run time in ns.
func timed(script string) string {
	return fmt.Sprintf("s=$(date +%%s%%N); %s; e=$(date +%%s%%N); echo $((e-s))", script)
}

func parseNS(out string) time.Duration {
	lines := strings.Fields(out)
	if len(lines) == 0 {
		must(fmt.Errorf("no timing in %q", out))
	}
	ns, err := strconv.ParseInt(lines[len(lines)-1], 10, 64)
	must(err)
	return time.Duration(ns)
}

// makePyProject writes a package of n modules for python3 -m compileall to
// build: the stand-in for "a small project's build" (the guest image has
// no Go toolchain).
func makePyProject(dir string, n int) {
	must(os.MkdirAll(dir, 0o755))
	must(os.WriteFile(filepath.Join(dir, "__init__.py"), nil, 0o644))
	for i := 0; i < n; i++ {
		var b strings.Builder
		for j := 0; j < 40; j++ {
			fmt.Fprintf(&b, "def f%d(x, y=%d):\n    z = [x * k + y for k in range(%d)]\n    return sum(z) // (len(z) or 1)\n\n", j, j, j+3)
		}
		must(os.WriteFile(filepath.Join(dir, fmt.Sprintf("m%03d.py", i)), []byte(b.String()), 0o644))
	}
}
