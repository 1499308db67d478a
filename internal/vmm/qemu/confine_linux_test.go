package qemu

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// startConfined starts cmd as Start starts QEMU: from a locked thread
// that carries the plan's no_new_privs and Landlock domain, with its
// credentials, and kept until cmd ends (its parent-death signal).
func startConfined(t *testing.T, p *confinePlan, cmd *exec.Cmd) (wait func() (string, error)) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = procAttr()
	p.apply(cmd.SysProcAttr)
	started, done := make(chan error, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := p.enterThread(); err != nil {
			started <- err
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	return func() (string, error) {
		select {
		case err := <-done:
			return out.String(), err
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v did not end", cmd.Args)
			return "", nil
		}
	}
}

func runConfined(t *testing.T, p *confinePlan, cmd *exec.Cmd) (string, error) {
	return startConfined(t, p, cmd)()
}

// confinedSetup lays out a sandbox-like tree and a file outside it.
func confinedSetup(t *testing.T) (dir string, c *Confinement, spec *vmspec.Spec, outside string) {
	dir = t.TempDir()
	os.Chmod(dir, 0o755)
	for _, d := range []string{"image", "sb/disks", "ram"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) string {
		p = filepath.Join(dir, p)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	spec = &vmspec.Spec{
		Kernel: write("image/kernel", "k"), Initrd: write("image/initrd", "i"),
		ConsoleLog: filepath.Join(dir, "sb/console.log"),
		Disks:      []vmspec.Disk{{ID: "root", Path: write("sb/root.qcow2", "r"), Format: "raw"}},
	}
	write("image/rootfs", "base")
	outside = write("secret", "host secret")
	c = &Confinement{ReadWrite: []string{filepath.Join(dir, "sb/disks")}, ReadOnly: []string{filepath.Join(dir, "image")}}
	return dir, c, spec, outside
}

func requireLandlock(t *testing.T) {
	if landlockABI() <= 0 {
		t.Skip("this kernel has no Landlock: QEMU is confined by its uid only (under root), or not at all")
	}
}

// A process under the plan reads and writes what it is given and nothing
// else, cannot gain privileges, and under root runs as its own uid with
// one capability.
func TestConfinementLimitsFiles(t *testing.T) {
	requireLandlock(t)
	dir, c, spec, outside := confinedSetup(t)
	// Its RAM file, unlinked as createRAMFile leaves it, and another
	// sandbox's in the same folder, not yet unlinked.
	ram, err := os.Create(filepath.Join(dir, "ram", "x.ram"))
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	os.Remove(ram.Name())
	neighbour := filepath.Join(dir, "ram", "other-1.1.ram")
	if err := os.WriteFile(neighbour, []byte("another sandbox's RAM"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := planConfinement(c, "/bin/sh", ram, false, spec, vmm.TCG, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if err := p.prepare(ram, false); err != nil {
		t.Fatal(err)
	}
	// A checkpoint's new layer, handed over as SnapshotDisk does, and the
	// layer it froze.
	handed := filepath.Join(dir, "sb/disks/next.qcow2")
	for _, f := range []string{handed, filepath.Join(dir, "sb/disks/frozen.qcow2")} {
		if err := os.WriteFile(f, []byte("layer"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.handOver(handed); err != nil {
		t.Fatal(err)
	}
	probes := []struct {
		cmd  string
		want string
	}{
		{"cat " + spec.Kernel, "ok"},                                                     // its kernel
		{"cat " + filepath.Join(dir, "image/rootfs"), "ok"},                              // its image
		{"echo x >> " + handed, "ok"},                                                    // a layer handed to it
		{"cat " + filepath.Join(dir, "sb/disks/frozen.qcow2"), "ok"},                     // a layer below it
		{"cp " + spec.Kernel + " " + filepath.Join(dir, "sb/disks/new.qcow2"), "denied"}, // a file of its own making there
		{"ln -s " + outside + " " + filepath.Join(dir, "sb/disks/link.qcow2"), "denied"}, // a link planted there
		{"mv " + handed + " " + filepath.Join(dir, "sb/disks/moved.qcow2"), "denied"},    // a layer renamed
		{"rm -f " + filepath.Join(dir, "sb/disks/frozen.qcow2"), "denied"},               // a layer removed
		{"echo x >> " + spec.Disks[0].Path, "ok"},                                        // its disk
		{"echo x >> " + spec.ConsoleLog, "denied"},                                       // its console: the driver writes it
		{"cat " + outside, "denied"},                                                     // a host file
		{"echo x >> " + spec.Kernel, "denied"},                                           // the image, written
		{"cp " + spec.Kernel + " " + filepath.Join(dir, "sb/planted"), "denied"},         // beside its files
		{"echo x >> /proc/self/fd/3", "ok"},                                              // its RAM, as QEMU opens it
		{"cat " + neighbour, "denied"},                                                   // another sandbox's RAM
		{"cp " + spec.Kernel + " " + filepath.Join(dir, "ram/planted.ram"), "denied"},    // a file in the RAM folder
		{"cat /etc/hostname", "denied"},
		{"ls /root", "denied"},
	}
	script := ""
	for _, pr := range probes {
		script += "if (" + pr.cmd + ") >/dev/null 2>&1; then echo ok; else echo denied; fi\n"
	}
	sh := exec.Command("/bin/sh", "-c", script)
	sh.ExtraFiles = []*os.File{ram} // fd 3, as QEMU gets it
	out, err := runConfined(t, p, sh)
	if err != nil {
		t.Fatalf("confined shell: %v\n%s", err, out)
	}
	lines := strings.Fields(out)
	if len(lines) != len(probes) {
		t.Fatalf("output:\n%s", out)
	}
	for i, pr := range probes {
		if lines[i] != pr.want {
			t.Errorf("%s: %s, want %s", pr.cmd, lines[i], pr.want)
		}
	}

	// Its credentials, seen from outside (its own /proc is out of reach).
	sleep := exec.Command("/bin/sleep", "30")
	wait := startConfined(t, p, sleep)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(sleep.Process.Pid) + "/status")
	sleep.Process.Kill()
	wait()
	if err != nil {
		t.Fatal(err)
	}
	status := string(b)
	if !strings.Contains(status, "NoNewPrivs:\t1") {
		t.Errorf("no_new_privs is not set:\n%s", status)
	}
	if os.Geteuid() == 0 {
		want := "Uid:\t" + strconv.Itoa(p.uid) + "\t"
		if !strings.Contains(status, want) || !strings.Contains(status, "CapEff:\t0000000000000004") || p.uid == 0 {
			t.Errorf("under root the confined process must run as its own uid with CAP_DAC_READ_SEARCH only:\n%s", status)
		}
	}
}

// QEMU itself, confined as Start confines it, cannot open a host file
// outside its set (a disk it is told to open), and opens one inside it.
func TestConfinedQEMUCannotOpenOutside(t *testing.T) {
	requireLandlock(t)
	bin, err := FindBinary(vmspec.HostArch(), "")
	if err != nil {
		t.Skipf("QEMU is not installed: %v", err)
	}
	dir, c, spec, outside := confinedSetup(t)
	open := func(path string) string {
		ram, err := os.CreateTemp(filepath.Join(dir, "ram"), "*.ram")
		if err != nil {
			t.Fatal(err)
		}
		defer ram.Close()
		p, err := planConfinement(c, bin, ram, false, spec, vmm.TCG, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer p.close()
		cmd := exec.Command(bin, "-M", "none", "-nodefaults", "-display", "none", "-S", "-qmp", "stdio",
			"-drive", "id=d,if=none,format=raw,read-only=on,file="+path)
		cmd.Stdin = strings.NewReader(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"quit"}` + "\n")
		out, _ := runConfined(t, p, cmd)
		return out
	}
	if out := open(filepath.Join(dir, "image/rootfs")); !strings.Contains(out, `"return"`) || strings.Contains(out, "denied") {
		t.Fatalf("confined QEMU could not open a disk inside its set:\n%s", out)
	}
	if out := open(outside); !strings.Contains(out, "Permission denied") {
		t.Fatalf("confined QEMU opened %s, outside its set:\n%s", outside, out)
	}
}

// Under root every other start of one driver runs as another uid: the
// QEMU a rewind starts while the old one still runs gets its layers
// before the old one is killed, and the old one (the guest may own it)
// must not write them, though both may write their own files in the
// sandbox's disks folder.
func TestNextQEMUOutOfTheOldOnesReach(t *testing.T) {
	requireLandlock(t)
	if os.Geteuid() != 0 {
		t.Skip("QEMU runs as a uid of its own only under root")
	}
	dir, c, spec, _ := confinedSetup(t)
	plan := func(twin int, layer string) *confinePlan {
		t.Helper()
		ram, err := os.CreateTemp(filepath.Join(dir, "ram"), "x-*.ram")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ram.Close() })
		os.Remove(ram.Name())
		s := *spec
		s.Disks = []vmspec.Disk{{ID: "root", Path: layer, Format: "qcow2"}}
		if err := os.WriteFile(layer, []byte("layer"), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := planConfinement(c, "/bin/sh", ram, false, &s, vmm.TCG, twin)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.close)
		if err := p.prepare(ram, false); err != nil {
			t.Fatal(err)
		}
		return p
	}
	oldLayer, newLayer := filepath.Join(dir, "sb/disks/old.qcow2"), filepath.Join(dir, "sb/disks/new.qcow2")
	old, next := plan(1, oldLayer), plan(0, newLayer)
	if old.uid == next.uid || old.uid <= 0 || next.uid <= 0 || next.uid >= 1<<31 {
		t.Fatalf("consecutive starts run as uids %d and %d", old.uid, next.uid)
	}
	script := "for f in " + oldLayer + " " + newLayer + "; do if (echo x >> $f) 2>/dev/null; then echo ok; else echo denied; fi; done"
	out, err := runConfined(t, old, exec.Command("/bin/sh", "-c", script))
	if err != nil {
		t.Fatalf("confined shell: %v\n%s", err, out)
	}
	if got := strings.Fields(out); len(got) != 2 || got[0] != "ok" || got[1] != "denied" {
		t.Errorf("the old QEMU writing its own layer, then the next one's: %v, want ok denied", got)
	}
}
