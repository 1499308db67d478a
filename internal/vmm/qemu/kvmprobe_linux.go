package qemu

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The KVM ioctls the probe uses (linux/kvm.h). Their numbers are the same on
// every architecture Linux runs KVM on.
const (
	kvmGetAPIVersion       = 0xAE00
	kvmCreateVM            = 0xAE01
	kvmGetVCPUMmapSize     = 0xAE04
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46 // _IOW(0xAE, 0x46, struct kvm_userspace_memory_region)
	kvmRun                 = 0xAE80
)

// kvm_run exit reasons.
const (
	kvmExitIO        = 2
	kvmExitHLT       = 5
	kvmExitShutdown  = 8
	kvmExitFailEntry = 9
	kvmExitInternal  = 17
)

// ProbeKVM proves that KVM runs a guest: it opens /dev/kvm, creates a VM
// with one page of memory and one vCPU, and runs a few real-mode
// instructions through KVM_RUN that write a byte to an I/O port and halt.
// /dev/kvm opening and answering API version 12 is not enough: nested,
// paravirtualized hosts (common among cloud VMs and CI runners) expose a
// /dev/kvm that creates VMs but cannot run a standard guest. It takes a
// few milliseconds. A nil error means the instructions ran and the exits
// came back as expected.
func ProbeKVM() error {
	kvm, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return errors.New("/dev/kvm does not exist (no KVM module loaded, or virtualization is off)")
		}
		return fmt.Errorf("open /dev/kvm: %w", err)
	}
	defer unix.Close(kvm)
	v, err := ioctl(kvm, kvmGetAPIVersion, 0)
	if err != nil || v != 12 {
		return fmt.Errorf("/dev/kvm answers API version %d (%v), not 12", v, err)
	}
	return probeGuest(kvm)
}

// Any but KVM_RUN is tried again when a signal interrupts it (the Go
// runtime's preemption signal made KVM_CREATE_VM fail with EINTR on a
// loaded host, and the probe then reported KVM unusable); KVM_RUN's EINTR
// is the probe's own timeout (runGuarded).
func ioctl(fd int, req, arg uintptr) (uintptr, error) {
	for tries := 0; ; tries++ {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
		if errno == unix.EINTR && req != kvmRun && tries < 100 {
			continue
		}
		if errno != 0 {
			return r, errno
		}
		return r, nil
	}
}

// kvmUserspaceMemoryRegion is struct kvm_userspace_memory_region.
type kvmUserspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

// vm is a probe VM: memory, one vCPU and its kvm_run page.
type vm struct {
	fd, vcpu int
	mem, run []byte
	stuck    bool // a vCPU thread may still be inside KVM_RUN: leak, never unmap
}

// newVM makes a VM whose memory is size bytes at guestAddr, starting with
// code.
func newVM(kvm int, code []byte, guestAddr uint64, size int) (*vm, error) {
	v := &vm{fd: -1, vcpu: -1}
	fd, err := ioctl(kvm, kvmCreateVM, 0)
	if err != nil {
		return nil, fmt.Errorf("KVM_CREATE_VM: %w", err)
	}
	v.fd = int(fd)
	unix.CloseOnExec(v.fd)
	v.mem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		v.close()
		return nil, fmt.Errorf("guest memory: %w", err)
	}
	copy(v.mem, code)
	region := kvmUserspaceMemoryRegion{
		GuestPhysAddr: guestAddr,
		MemorySize:    uint64(len(v.mem)),
		UserspaceAddr: uint64(uintptr(unsafe.Pointer(&v.mem[0]))),
	}
	if _, err := ioctl(v.fd, kvmSetUserMemoryRegion, uintptr(unsafe.Pointer(&region))); err != nil {
		v.close()
		return nil, fmt.Errorf("KVM_SET_USER_MEMORY_REGION: %w", err)
	}
	runtime.KeepAlive(&region)
	cpu, err := ioctl(v.fd, kvmCreateVCPU, 0)
	if err != nil {
		v.close()
		return nil, fmt.Errorf("KVM_CREATE_VCPU: %w", err)
	}
	v.vcpu = int(cpu)
	unix.CloseOnExec(v.vcpu)
	runSize, err := ioctl(kvm, kvmGetVCPUMmapSize, 0)
	if err != nil || runSize < 0x100 {
		v.close()
		return nil, fmt.Errorf("KVM_GET_VCPU_MMAP_SIZE: %d %v", runSize, err)
	}
	v.run, err = unix.Mmap(v.vcpu, 0, int(runSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		v.close()
		return nil, fmt.Errorf("map kvm_run: %w", err)
	}
	return v, nil
}

// exitReason reads kvm_run.exit_reason (after two bytes of requests and
// six of padding).
func (v *vm) exitReason() uint32 { return *(*uint32)(unsafe.Pointer(&v.run[8])) }

// probeRunTimeout bounds one entry into the test guest: its few
// instructions take microseconds, so a vCPU still inside after this is hung.
const probeRunTimeout = 2 * time.Second

// runOnce enters the guest and returns the exit reason. A vCPU that does
// not come back within probeRunTimeout is kicked out (immediate_exit and a
// signal to its thread, which makes KVM_RUN return EINTR) and reported.
func (v *vm) runOnce() (uint32, error) {
	type result struct {
		reason uint32
		err    error
	}
	done := make(chan result, 1)
	var tid atomic.Int32
	go func() {
		// KVM_RUN must stay on one thread, which the timeout below signals.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid.Store(int32(unix.Gettid()))
		for {
			_, err := ioctl(v.vcpu, kvmRun, 0)
			if errors.Is(err, unix.EINTR) && v.run[1] == 0 {
				continue // a signal meant for something else
			}
			if err != nil {
				done <- result{err: fmt.Errorf("KVM_RUN: %w", err)}
				return
			}
			done <- result{reason: v.exitReason()}
			return
		}
	}()
	select {
	case r := <-done:
		return r.reason, r.err
	case <-time.After(probeRunTimeout):
	}
	v.run[1] = 1 // kvm_run.immediate_exit
	for range 100 {
		if t := tid.Load(); t != 0 {
			_ = unix.Tgkill(unix.Getpid(), int(t), unix.SIGURG) // Go's runtime ignores it
		}
		select {
		case <-done:
			return 0, fmt.Errorf("the test guest did not finish within %v (hung vCPU)", probeRunTimeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
	v.stuck = true
	return 0, fmt.Errorf("the test guest did not finish within %v, and its vCPU could not be stopped", probeRunTimeout)
}

func (v *vm) close() {
	if v.stuck {
		return
	}
	if v.run != nil {
		_ = unix.Munmap(v.run)
	}
	if v.vcpu >= 0 {
		unix.Close(v.vcpu)
	}
	if v.mem != nil {
		_ = unix.Munmap(v.mem)
	}
	if v.fd >= 0 {
		unix.Close(v.fd)
	}
}

func exitName(r uint32) string {
	switch r {
	case kvmExitIO:
		return "I/O"
	case kvmExitHLT:
		return "HLT"
	case kvmExitShutdown:
		return "shutdown (triple fault)"
	case kvmExitFailEntry:
		return "failed VM entry"
	case kvmExitInternal:
		return "internal error"
	}
	return fmt.Sprintf("exit reason %d", r)
}

// kvmUsable reports whether KVM runs a guest, and why not when it does not.
func kvmUsable() (bool, string) {
	if err := ProbeKVM(); err != nil {
		return false, err.Error()
	}
	return true, ""
}
