package image

import (
	"bytes"
	"io"
	"os/exec"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/kosa8/kosa8/internal/vmspec"
)

func TestCPIOIsReadableByCpio(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio(1) not installed: the format is still checked by TestCPIOLayout")
	}
	var buf bytes.Buffer
	c := newCPIOWriter(&buf)
	c.Dir("dev", 0o755)
	c.CharDevice("dev/console", 0o600, 5, 1)
	c.File("init", 0o755, []byte("#!/bin/sh\n"))
	c.Symlink("sbin", "bin")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cpio", "-itv")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio: %v\n%s", err, out)
	}
	for _, want := range []string{"dev/console", "init", "sbin -> bin", "crw-------"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio listing lacks %q:\n%s", want, out)
		}
	}
}

func TestCPIOLayout(t *testing.T) {
	var buf bytes.Buffer
	c := newCPIOWriter(&buf)
	c.File("a", 0o644, []byte("xyz"))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if !bytes.HasPrefix(b, []byte("070701")) || len(b)%4 != 0 {
		t.Fatalf("not newc or not 4-aligned: %q", b[:min(len(b), 16)])
	}
	if !bytes.Contains(b, []byte("TRAILER!!!\x00")) {
		t.Fatal("no trailer")
	}
	bad := newCPIOWriter(io.Discard)
	bad.File("/abs", 0o644, nil)
	if bad.Close() == nil {
		t.Fatal("absolute name accepted")
	}
}

func TestParseModinfoDepends(t *testing.T) {
	data := []byte("license=GPL\x00depends=virtio_ring,virtio,net-failover\x00name=virtio_net\x00vermagic=6.1\x00")
	got := parseModinfoDepends(data)
	want := []string{"virtio_ring", "virtio", "net_failover"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("depends = %v, want %v", got, want)
	}
	if d := parseModinfoDepends([]byte("depends=\x00")); len(d) != 0 {
		t.Fatalf("empty depends = %v", d)
	}
}

func TestResolveOrder(t *testing.T) {
	// A module tree whose .ko files are stand-ins: resolve reads their
	// dependencies through modinfo, faked here by a table.
	fsys := fstest.MapFS{
		"modules.builtin":               {Data: []byte("kernel/fs/ext4/ext4.ko\n")},
		"kernel/drivers/virtio/a.ko":    {},
		"kernel/drivers/virtio/b.ko":    {},
		"kernel/drivers/char/c-dash.ko": {},
	}
	tree, err := loadModuleTree(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if tree.paths["c_dash"] == "" || !tree.builtin["ext4"] {
		t.Fatalf("index: %+v", tree)
	}
	// Stand-in .ko files are not ELF: resolving them must fail with the
	// module's name, not panic.
	_, err = tree.resolve([]string{"a"})
	if err == nil || !strings.Contains(err.Error(), "module a") {
		t.Fatalf("err = %v", err)
	}
	if order, err := tree.resolve([]string{"ext4"}); err != nil || len(order) != 0 {
		t.Fatalf("built-in module: %v %v", order, err)
	}
	if _, err := tree.resolve([]string{"missing"}); err == nil || !strings.Contains(err.Error(), "missing not found") {
		t.Fatalf("missing module: %v", err)
	}
}

func TestRecipeKey(t *testing.T) {
	a := DefaultRecipe(vmspec.AMD64)
	b := DefaultRecipe(vmspec.AMD64)
	b.Mirrors = []string{"deb http://elsewhere/debian bookworm main"}
	if a.Key() != b.Key() {
		t.Error("the mirror changed the key")
	}
	if a.Key() == DefaultRecipe(vmspec.ARM64).Key() {
		t.Error("arm64 and amd64 share a key")
	}
	if a.Key() == a.WithPackages("vim").Key() {
		t.Error("an extra package did not change the key")
	}
	reordered := a
	reordered.Packages = append([]string{"npm"}, a.Packages...)
	if reordered.Key() != a.Key() {
		t.Error("package order or a duplicate changed the key")
	}
}

func TestLookupMissing(t *testing.T) {
	_, err := Store{Dir: t.TempDir()}.Lookup(DefaultRecipe(vmspec.AMD64))
	if err == nil || !strings.Contains(err.Error(), "kosa8 setup") {
		t.Fatalf("err = %v", err)
	}
}

func TestSandboxModulesLeaveOutVirtioFS(t *testing.T) {
	// fuse and virtiofs serve the benchmark's comparison VM only; a
	// sandbox's initramfs must not carry them (nor anything they pull in
	// by name).
	for _, m := range GuestModules {
		for _, v := range append(VirtioFSModules, "virtio_fs", "cuse") {
			if moduleName(m) == moduleName(v) {
				t.Errorf("GuestModules carries %s", m)
			}
		}
	}
	if len(VirtioFSModules) == 0 {
		t.Fatal("no modules for the benchmark's virtiofs VM")
	}
}

// The builder installs the packages in a chroot of the new filesystem
// and leaves no package, list or build user behind; it shrinks the disk.
func TestBuilderStages(t *testing.T) {
	for _, want := range []string{"mke2fs", "tar -x", "chroot /mnt /bin/sh -c \"$(cat /kosa8/install.sh)\"", "umount -R /mnt", "e2fsck -f -y", "resize2fs -M", "sync"} {
		if !strings.Contains(builderShell, want) {
			t.Errorf("the builder does not %q", want)
		}
	}
	for _, want := range []string{" apt bash coreutils ", "apt-mark auto", "dpkg --force-depends", "dpkg --configure -a", "dpkg --audit", "rm -f /var/cache/apt/archives/*.deb", "userdel -r " + firstBootUser, "rm -f /etc/sudoers.d/kosa8", "sync"} {
		if !strings.Contains(firstBootShell(DefaultPackages), want) {
			t.Errorf("the first boot does not %q", want)
		}
	}
	if Foreign(vmspec.HostArch()) {
		t.Error("the host's own architecture is foreign")
	}
	for _, a := range []vmspec.Arch{vmspec.AMD64, vmspec.ARM64} {
		want := "kosa8 setup"
		if a != vmspec.HostArch() {
			want += " --arch " + string(a)
		}
		if got := vmspec.SetupCommand(a); got != want || Foreign(a) != (a != vmspec.HostArch()) {
			t.Errorf("%s: SetupCommand %q, Foreign %v", a, got, Foreign(a))
		}
	}
}

func TestRunLogged(t *testing.T) {
	var log strings.Builder
	var lines []string
	err := runLogged(exec.Command("sh", "-c", "echo one; echo two >&2; printf three"), &log, func(l string) { lines = append(lines, l) })
	if err != nil || log.String() != "one\ntwo\nthree\n" || strings.Join(lines, ",") != "one,two,three" {
		t.Fatalf("err %v, log %q, lines %q", err, log.String(), lines)
	}
	log.Reset()
	err = runLogged(exec.Command("sh", "-c", "for i in $(seq 1 20); do echo line$i; done; exit 3"), &log, func(string) {})
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "line6\n") ||
		strings.Contains(err.Error(), "line5\n") || !strings.HasSuffix(err.Error(), "line20") {
		t.Fatalf("want the exit status and the last 15 lines, got %v", err)
	}
}
