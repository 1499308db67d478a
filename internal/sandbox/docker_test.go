package sandbox

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestCreateDockerDisk: a sandbox made with a container engine gets its own
// ext4 disk of the size asked for (sparse), recorded with the others so
// that checkpoints layer over it, and Remove frees it with the sandbox.
func TestCreateDockerDisk(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		if _, err := os.Stat("/sbin/mkfs.ext4"); err != nil {
			t.Skip("mkfs.ext4 not installed (e2fsprogs)")
		}
	}
	m := newManager(t)
	cfg := validConfig("dk")
	cfg.Docker = &DockerConfig{DiskGiB: 3}
	sb, err := m.Create(context.Background(), cfg, fakeImage(t))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sb.Path(DockerDisk))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 3<<30 {
		t.Fatalf("docker disk is %d bytes, want 3 GiB", fi.Size())
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 256<<20 {
		t.Fatalf("a new docker disk takes %d MiB: it should be sparse", used>>20)
	}
	if out, err := exec.Command("dumpe2fs", "-h", sb.Path(DockerDisk)).CombinedOutput(); err == nil && !strings.Contains(string(out), "kosa8-docker") {
		t.Fatalf("docker disk label: %s", out)
	}
	d := sb.ActiveDisks()
	if d["docker"].Path != DockerDisk || d["docker"].Format != "raw" || d["root"].Path != RootDisk {
		t.Fatalf("active disks: %+v", d)
	}
	if err := m.Remove("dk"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sb.Path(DockerDisk)); !os.IsNotExist(err) {
		t.Fatalf("rm left the docker disk: %v", err)
	}
	// Without --docker: no such disk, none recorded.
	sb, err = m.Create(context.Background(), validConfig("plain"), fakeImage(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sb.ActiveDisks()["docker"]; ok {
		t.Fatal("a sandbox without docker records a docker disk")
	}
	if _, err := os.Stat(sb.Path(DockerDisk)); !os.IsNotExist(err) {
		t.Fatalf("a sandbox without docker has a docker disk: %v", err)
	}
}

func TestConfigValidateDockerDisk(t *testing.T) {
	for _, gib := range []int{0, 1, 5000} {
		c := validConfig("x")
		c.Docker = &DockerConfig{DiskGiB: gib}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--docker-disk") {
			t.Errorf("docker disk %d GiB: %v", gib, err)
		}
	}
}
