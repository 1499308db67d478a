package qemu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// DetectHost reports this machine's accelerators. KVM counts as usable
// only when a test guest ran under it (ProbeKVM, a few milliseconds).
//
// KOSA8_TEST_ASSUME_KVM=1 skips the probe and counts KVM as usable: tests
// use it to drive the fallback with a QEMU that fails under KVM on hosts
// that have none. It can only make kosa8 try KVM first, never loosen the
// sandbox.
func DetectHost() Host {
	if os.Getenv("KOSA8_TEST_ASSUME_KVM") == "1" {
		return Host{GOOS: "linux", Arch: vmspec.HostArch(), KVMUsable: true}
	}
	ok, why := kvmUsable()
	return Host{GOOS: "linux", Arch: vmspec.HostArch(), KVMUsable: ok, KVMReason: why}
}

// bootID names this boot of the host.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func procAttr() *syscall.SysProcAttr {
	// QEMU gets SIGKILL when the supervisor's thread that started it dies,
	// and its own process group so a terminal's ^C does not reach it.
	if !parentDeathSignal() {
		return &syscall.SysProcAttr{Setpgid: true}
	}
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// parentDeathSignal tells whether QEMU dies with its supervisor by the
// kernel's parent-death signal; if not, a watchdog does it (lifetime.go),
// as on macOS. KOSA8_TEST_NO_PDEATHSIG=1 switches the signal off, so that
// the macOS mechanism is tested here.
func parentDeathSignal() bool { return os.Getenv("KOSA8_TEST_NO_PDEATHSIG") != "1" }

func defaultRAMDir() string {
	return filepath.Join("/dev/shm", "kosa8-"+strconv.Itoa(os.Getuid()))
}

// ramPath names the RAM file by QEMU's own descriptor: the file is already
// unlinked, so nothing is left behind on tmpfs if everything is killed.
func ramPath(fd int, _ *os.File) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

const tmpfsMagic = 0x01021994

// createRAMFile makes the file guest RAM lives in: on tmpfs (a RAM file on a
// disk would be written back all the time), sized, unlinked at once.
func createRAMFile(dir, name string, size int64) (*os.File, error) {
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("create RAM directory: %w", err)
	}
	// /dev/shm is shared by all users: the directory must be ours, private,
	// and not a link someone planted.
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("RAM directory %s is not a private directory owned by you: remove it", dir)
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(dir, &sf); err != nil {
		return nil, err
	}
	if sf.Type != tmpfsMagic {
		return nil, fmt.Errorf("RAM directory %s is not on tmpfs: guest RAM on a disk would be written back all the time", dir)
	}
	free := int64(sf.Bavail) * sf.Bsize
	if free < size {
		return nil, fmt.Errorf("not enough memory: the sandbox needs %d MiB of shared memory, %s has %d MiB free: use --memory with less, or stop other sandboxes", size>>20, filepath.Dir(dir), free>>20)
	}
	sweepRAMFiles(dir)
	// Unique in this process: a RAM file made ahead (NewRAMFile) may be
	// created while a start makes its own.
	p := filepath.Join(dir, fmt.Sprintf("%s-%d.%d.ram", name, ramSeq.Add(1), os.Getpid()))
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create RAM file: %w", err)
	}
	_ = unix.Unlink(p)
	f := os.NewFile(uintptr(fd), p)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("size RAM file: %w", err)
	}
	return f, nil
}

// sweepRAMFiles removes RAM files whose supervisor no longer runs: a file
// is unlinked right after creation, so only a crash in between leaves one.
func sweepRAMFiles(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		parts := strings.Split(e.Name(), ".")
		if len(parts) < 3 || parts[len(parts)-1] != "ram" {
			continue
		}
		pid, err := strconv.Atoi(parts[len(parts)-2])
		if err != nil {
			continue
		}
		if unix.Kill(pid, 0) == unix.ESRCH {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

var ramSeq atomic.Int64

// closeRAMFile closes a RAM file once no QEMU uses it: it has no name.
func closeRAMFile(f *os.File) { f.Close() }

// ramAhead: a RAM file may be made ahead of its start (NewRAMFile): it is
// unlinked, so two of one sandbox never meet by name.
const ramAhead = true
