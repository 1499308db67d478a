package checkpoint

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const tmpfsMagic = 0x01021994

// TestCloneTmpfs: tmpfs, where guest RAM lives on Linux, cannot clone:
// the caller is told so by the sentinel and nothing is left behind.
func TestCloneTmpfs(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "kosa8-clone-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var sf unix.Statfs_t
	if err := unix.Statfs(dir, &sf); err != nil || sf.Type != tmpfsMagic {
		t.Skipf("/dev/shm is not tmpfs here (statfs: %v)", err)
	}
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, []byte("guest ram"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = CloneFile(dst, src)
	if !errors.Is(err, ErrCloneUnsupported) {
		t.Fatalf("CloneFile on tmpfs: %v, want ErrCloneUnsupported", err)
	}
	if _, serr := os.Lstat(dst); !os.IsNotExist(serr) {
		t.Errorf("a failed clone left %s behind (%v)", dst, serr)
	}
}

// TestCloneXFS clones a RAM-like file (written through a shared mapping,
// as QEMU's guest writes) on XFS with reflink, made on a loop device.
func TestCloneXFS(t *testing.T) {
	mnt := mountLoopFS(t, "xfs", 512<<20, "-q", "-m", "reflink=1")
	const size = 8 << 20
	srcPath := filepath.Join(mnt, "ram")
	src, err := os.OpenFile(srcPath, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(src.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	// Half the pages, still dirty in the page cache when cloned: FICLONE
	// must write them back first, or the clone would miss them.
	for off := 0; off < size; off += 2 * int(PageSize) {
		copy(mem[off:], []byte{'A', byte(off >> 12), byte(off >> 20)})
	}
	want := bytes.Clone(mem)

	clonePath := filepath.Join(mnt, "checkpoint")
	if err := CloneOpen(clonePath, src); err != nil {
		t.Fatalf("CloneOpen on XFS: %v", err)
	}
	// The guest runs on: through the mapping, and through the descriptor.
	for off := 0; off < size; off += int(PageSize) {
		mem[off] = 'B'
	}
	if _, err := src.WriteAt([]byte("after"), size/2+100); err != nil {
		t.Fatal(err)
	}
	if err := unix.Msync(mem, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(clonePath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the clone is not the source as it was when cloned (first difference at %d)", firstDiff(got, want))
	}
	if st, err := os.Stat(clonePath); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("clone's mode: %v, %v; want 0600", st.Mode(), err)
	}
	// And the other way: the clone of the clone, written, leaves the
	// checkpoint alone (a rewind's RAM file over a checkpoint).
	if err := CloneFile(filepath.Join(mnt, "rewound"), clonePath); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "rewound"), []byte("overwritten"), 0o600); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(clonePath); !bytes.Equal(again, want) {
		t.Fatal("writing a clone of the checkpoint changed the checkpoint")
	}

	if err := CloneFile(clonePath, srcPath); err == nil || errors.Is(err, ErrCloneUnsupported) || !errors.Is(err, os.ErrExist) {
		t.Errorf("CloneFile onto an existing file: %v, want an 'exists' error, not the sentinel", err)
	}
	// Across file systems: the sentinel, so that the caller copies.
	other := filepath.Join(t.TempDir(), "elsewhere")
	if err := CloneOpen(other, src); !errors.Is(err, ErrCloneUnsupported) {
		t.Errorf("CloneOpen from XFS to %s: %v, want ErrCloneUnsupported", filepath.Dir(other), err)
	}
	if _, err := os.Lstat(other); !os.IsNotExist(err) {
		t.Errorf("a failed clone left %s behind", other)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// mountLoopFS makes a file system of type fs (mkfs.FS with args) in a
// sparse file of size, mounts it through a loop device and returns the
// mount point; it skips, saying why, where that cannot be done.
func mountLoopFS(t *testing.T, fs string, size int64, args ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("mounting %s on a loop device needs root", fs)
	}
	mkfs, err := exec.LookPath("mkfs." + fs)
	if err != nil {
		t.Skipf("mkfs.%s not found (Debian: apt-get install xfsprogs or btrfs-progs)", fs)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	dir := t.TempDir()
	img := filepath.Join(dir, fs+".img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, append(args, img)...).CombinedOutput(); err != nil {
		t.Skipf("mkfs.%s: %v: %s", fs, err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", fs, "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("mount %s on a loop device (no loop devices or no %s in this kernel?): %v: %s", fs, fs, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}
