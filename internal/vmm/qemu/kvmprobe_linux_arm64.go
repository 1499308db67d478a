package qemu

import (
	"fmt"
	"runtime"
	"unsafe"
)

const (
	kvmArmPreferredTarget = 0x8020AEAF // _IOR(0xAE, 0xaf, struct kvm_vcpu_init)
	kvmArmVCPUInit        = 0x4020AEAE // _IOW(0xAE, 0xae, struct kvm_vcpu_init)
	kvmSetOneReg          = 0x4010AEAC // _IOW(0xAE, 0xac, struct kvm_one_reg)
	// KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE | offsetof(struct
	// kvm_regs, regs.pc)/4: pc follows regs[31] and sp in user_pt_regs.
	kvmRegPC    = 0x6030000000100040
	kvmExitMMIO = 6
)

// probeCode runs at probeAddr: movz x0, #0x1, lsl #16; strb w0, [x0];
// b . — a store to unmapped guest memory, which KVM hands to userspace.
var probeCode = []byte{
	0x20, 0x00, 0xA0, 0xD2,
	0x00, 0x00, 0x00, 0x39,
	0x00, 0x00, 0x00, 0x14,
}

const (
	probeAddr = 0x1000
	probeMMIO = 0x10000
)

// probeGuest runs probeCode in a fresh VM and checks its MMIO exit.
func probeGuest(kvm int) error {
	v, err := newVM(kvm, probeCode, probeAddr, 0x1000)
	if err != nil {
		return err
	}
	defer v.close()
	var init [8]uint32 // struct kvm_vcpu_init {u32 target; u32 features[7]}
	if _, err := ioctl(v.fd, kvmArmPreferredTarget, uintptr(unsafe.Pointer(&init[0]))); err != nil {
		return fmt.Errorf("KVM_ARM_PREFERRED_TARGET: %w", err)
	}
	if _, err := ioctl(v.vcpu, kvmArmVCPUInit, uintptr(unsafe.Pointer(&init[0]))); err != nil {
		return fmt.Errorf("KVM_ARM_VCPU_INIT: %w", err)
	}
	// The register's value is read through a pointer the kernel follows:
	// keep it on the heap, where Go never moves it.
	pc := new(uint64)
	*pc = probeAddr
	reg := [2]uint64{kvmRegPC, uint64(uintptr(unsafe.Pointer(pc)))}
	_, err = ioctl(v.vcpu, kvmSetOneReg, uintptr(unsafe.Pointer(&reg[0])))
	runtime.KeepAlive(pc)
	if err != nil {
		return fmt.Errorf("KVM_SET_ONE_REG pc: %w", err)
	}
	r, err := v.runOnce()
	if err != nil {
		return err
	}
	if r != kvmExitMMIO {
		return fmt.Errorf("the test guest stopped with %s instead of writing to MMIO", exitName(r))
	}
	// kvm_run.mmio at offset 32: phys_addr u64, data [8]u8, len u32, is_write u8.
	if addr := *(*uint64)(unsafe.Pointer(&v.run[32])); addr != probeMMIO || v.run[52] != 1 {
		return fmt.Errorf("the test guest's MMIO exit is wrong (address %#x)", addr)
	}
	return nil
}
