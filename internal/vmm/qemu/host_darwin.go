package qemu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// DetectHost reports this machine's accelerators.
func DetectHost() Host {
	v, err := unix.SysctlUint32("kern.hv_support")
	return Host{GOOS: "darwin", Arch: vmspec.HostArch(), HVFUsable: err == nil && v == 1}
}

// bootID names this boot of the host: its boot time.
func bootID() string {
	tv, err := unix.SysctlTimeval("kern.boottime")
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d.%06d", tv.Sec, tv.Usec)
}

func procAttr() *syscall.SysProcAttr {
	// macOS has no parent-death signal: a watchdog (lifetime.go) kills
	// QEMU when its supervisor ends.
	return &syscall.SysProcAttr{Setpgid: true}
}

func parentDeathSignal() bool { return false }

func defaultRAMDir() string {
	return filepath.Join(os.TempDir(), "kosa8-"+strconv.Itoa(os.Getuid()))
}

// ramPath: macOS has no /proc/self/fd, so QEMU opens the file by name.
func ramPath(_ int, f *os.File) string { return f.Name() }

func createRAMFile(dir, name string, size int64) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// Unique in this process: a rewind starts its QEMU before the old one
	// has gone, and QEMU opens the file by this name.
	p := filepath.Join(dir, fmt.Sprintf("%s-%d.%d.ram", name, ramSeq.Add(1), os.Getpid()))
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create RAM file: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(p)
		return nil, err
	}
	return f, nil
}

var ramSeq atomic.Int64

// closeRAMFile closes a RAM file once no QEMU uses it, and removes its
// name, which macOS's QEMU needed to open it.
func closeRAMFile(f *os.File) {
	_ = os.Remove(f.Name())
	f.Close()
}

// ramAhead: not here. QEMU opens the RAM file by its name, which Start
// removes only for the files it made itself (closeRAMFile); macOS's
// rewinds are to clone the checkpoint's RAM instead (README, "Guest RAM
// on macOS").
const ramAhead = false
