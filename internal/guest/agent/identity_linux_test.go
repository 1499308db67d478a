package agent

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// combined runs a command that may run twice (these all may) for its
// output and status. An agent another test of this package started keeps
// a reaper, as PID 1 must, that waits for every child of the process: it
// can take the command's exit status first (ECHILD), and the command runs
// again rather than the test guessing how it ended.
func combined(name string, args ...string) ([]byte, error) {
	for i := 0; ; i++ {
		out, err := exec.Command(name, args...).CombinedOutput()
		if !errors.Is(err, syscall.ECHILD) || i == 9 {
			return out, err
		}
	}
}

// mkfs makes an ext4 image as the host makes a workspace disk and the
// image build the root (metadata checksums on, e2fsprogs' defaults).
func mkfs(t *testing.T, extra ...string) string {
	t.Helper()
	for _, tool := range []string{"mkfs.ext4", "e2fsck", "dumpe2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (e2fsprogs)", tool)
		}
	}
	img := filepath.Join(t.TempDir(), "fs.img")
	args := append([]string{"-q", "-F", "-b", "4096"}, extra...)
	args = append(args, img, "64M")
	if out, err := combined("mkfs.ext4", args...); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	return img
}

func dumpe2fs(t *testing.T, img string) string {
	t.Helper()
	out, err := combined("dumpe2fs", "-h", img)
	if err != nil {
		t.Fatalf("dumpe2fs: %v\n%s", err, out)
	}
	return string(out)
}

func fsck(t *testing.T, img string) {
	t.Helper()
	if out, err := combined("e2fsck", "-fn", img); err != nil {
		t.Fatalf("e2fsck finds the filesystem damaged: %v\n%s", err, out)
	}
}

// ensureCsumSeed turns on metadata_csum_seed with the seed the UUID gave,
// so every checksum still verifies (e2fsck -f reads them all), the UUID
// is unchanged, and a second call changes nothing; afterwards the UUID
// can change without rewriting any checksum.
func TestEnsureCsumSeed(t *testing.T) {
	img := mkfs(t)
	before := dumpe2fs(t, img)
	if strings.Contains(before, "metadata_csum_seed") || !strings.Contains(before, "metadata_csum") {
		t.Fatalf("the test's filesystem should have metadata_csum and not its seed:\n%s", before)
	}
	if err := ensureCsumSeed(img); err != nil {
		t.Fatal(err)
	}
	fsck(t, img)
	after := dumpe2fs(t, img)
	if !strings.Contains(after, "metadata_csum_seed") {
		t.Fatalf("no metadata_csum_seed after:\n%s", after)
	}
	uuid := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if v, ok := strings.CutPrefix(l, "Filesystem UUID:"); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	if uuid(before) == "" || uuid(before) != uuid(after) {
		t.Fatalf("UUID %q became %q", uuid(before), uuid(after))
	}
	b1, _ := os.ReadFile(img)
	if err := ensureCsumSeed(img); err != nil {
		t.Fatal(err)
	}
	if b2, _ := os.ReadFile(img); !bytes.Equal(b1, b2) {
		t.Fatal("a second call changed the filesystem")
	}
	// The seed is what the kernel would have derived: with it recorded,
	// a new UUID leaves every checksum valid.
	if tune, err := exec.LookPath("tune2fs"); err == nil {
		u := fsUUID(strings.Repeat("ab", 16), "root")
		if out, err := combined(tune, "-U", formatUUID(u), img); err != nil {
			t.Fatalf("tune2fs -U: %v\n%s", err, out)
		}
		fsck(t, img)
		if got := uuid(dumpe2fs(t, img)); got != formatUUID(u) {
			t.Fatalf("UUID %s after tune2fs -U %s", got, formatUUID(u))
		}
	}
	// Without metadata checksums there is nothing to do.
	plain := mkfs(t, "-O", "^metadata_csum")
	if err := ensureCsumSeed(plain); err != nil {
		t.Fatal(err)
	}
	fsck(t, plain)
	if err := ensureCsumSeed(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing device was accepted")
	}
	junk := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(junk, make([]byte, 4096), 0o600)
	if err := ensureCsumSeed(junk); err == nil || !strings.Contains(err.Error(), "no ext4") {
		t.Fatalf("not ext4: %v", err)
	}
}

func formatUUID(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// fsUUIDs are version 4 UUIDs, one per sandbox and filesystem.
func TestFSUUID(t *testing.T) {
	a, b := strings.Repeat("0a", 16), strings.Repeat("0b", 16)
	seen := map[[16]byte]bool{}
	for _, id := range []string{a, b} {
		for _, which := range []string{"root", "ws"} {
			u := fsUUID(id, which)
			if seen[u] || u[6]>>4 != 4 || u[8]>>6 != 2 {
				t.Errorf("fsUUID(%s, %s) = %x", id, which, u)
			}
			seen[u] = true
		}
	}
	if fsUUID(a, "root") != fsUUID(a, "root") {
		t.Error("not stable")
	}
}

// The machine-id the host names is written as machine-id(5) has it; text
// that is not one is refused, never written.
func TestTakeMachineID(t *testing.T) {
	etc := t.TempDir()
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil)), users: userDB{etc: etc}}
	os.WriteFile(filepath.Join(etc, "machine-id"), []byte("image0000000000000000000000000000\n"), 0o444)
	id := strings.Repeat("5e", 16)
	if err := a.takeMachineID(id); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(etc, "machine-id")); string(b) != id+"\n" || a.machineID != id {
		t.Fatalf("machine-id %q, agent's %q", b, a.machineID)
	}
	for _, bad := range []string{"x", strings.Repeat("5E", 16), strings.Repeat("5e", 16) + "\n", "../../../etc/passwd00000000000000"} {
		if err := a.takeMachineID(bad); err == nil {
			t.Errorf("machine-id %q accepted", bad)
		}
	}
	if err := a.takeMachineID(""); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(etc, "machine-id")); string(b) != id+"\n" {
		t.Fatalf("machine-id changed to %q", b)
	}
}

// setFSUUID renames a mounted filesystem whose checksum seed was recorded
// (as the agent does to the root of a sandbox started from a template),
// and the checksums stay valid. Needs root and a loop device (skipped
// without: the VM test TestNewSandboxesStartFromATemplate checks it in a
// real guest).
func TestSetFSUUIDMounted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a filesystem image needs root")
	}
	img := mkfs(t)
	if err := ensureCsumSeed(img); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput()
	if errors.Is(err, syscall.ECHILD) { // its status reaped (see combined): mounted if mnt is another filesystem now
		var a, b syscall.Stat_t
		if syscall.Stat(mnt, &a) == nil && syscall.Stat(filepath.Dir(mnt), &b) == nil && a.Dev != b.Dev {
			err = nil
		}
	}
	if err != nil {
		t.Skipf("cannot loop-mount here: %v: %s", err, out)
	}
	mounted := true
	umount := func() {
		if mounted {
			exec.Command("umount", mnt).Run()
			mounted = false
		}
	}
	t.Cleanup(umount)
	os.WriteFile(filepath.Join(mnt, "f"), []byte("data"), 0o644)
	u := fsUUID(strings.Repeat("cd", 16), "ws")
	if err := setFSUUID(mnt, u); err != nil {
		t.Fatal(err)
	}
	if err := setFSUUID(mnt, u); err != nil { // already so: nothing to do
		t.Fatal(err)
	}
	umount()
	fsck(t, img)
	if !strings.Contains(dumpe2fs(t, img), "Filesystem UUID:          "+formatUUID(u)) {
		t.Fatalf("UUID not %s:\n%s", formatUUID(u), dumpe2fs(t, img))
	}
	// Not an ext4 filesystem (procfs here; the initramfs, a tmpfs, in a
	// guest): left alone. (Never a folder of the host's own filesystems:
	// on this machine's ext4 root that would rename it.)
	if err := setFSUUID("/proc", u); err != nil {
		t.Fatalf("on procfs: %v", err)
	}
}
