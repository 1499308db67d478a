package qemu

import (
	"fmt"
	"unsafe"
)

const (
	kvmSetRegs  = 0x4090AE82 // _IOW(0xAE, 0x82, struct kvm_regs), 144 bytes
	kvmGetSregs = 0x8138AE83 // _IOR(0xAE, 0x83, struct kvm_sregs), 312 bytes
	kvmSetSregs = 0x4138AE84 // _IOW(0xAE, 0x84, struct kvm_sregs)
)

// probeCode runs at probeAddr, in real mode and again in long mode (the
// bytes mean the same in both): mov al, 0x42; out 0x10, al; hlt.
var probeCode = []byte{0xB0, 0x42, 0xE6, 0x10, 0xF4}

const (
	probeAddr = 0x1000
	probePort = 0x10
	probeByte = 0x42
	// Long mode's page tables, identity-mapping the first 2 MiB with one
	// large page: PML4, PDPT and page directory, one page each.
	pml4Addr = 0x2000
	pdptAddr = 0x3000
	pdAddr   = 0x4000
)

// probeGuest runs probeCode in real mode, then in 64-bit long mode with
// paging, each in a fresh VM. Some nested hosts run the first and hang in
// the second, as a Linux kernel hangs right after it leaves real mode.
func probeGuest(kvm int) error {
	if err := probeMode(kvm, false); err != nil {
		return fmt.Errorf("real mode: %w", err)
	}
	if err := probeMode(kvm, true); err != nil {
		return fmt.Errorf("long mode: %w", err)
	}
	return nil
}

// kvm_segment offsets in struct kvm_sregs: {u64 base; u32 limit; u16
// selector; u8 type, present, dpl, db, s, l, g, avl, unusable, padding}.
type segment struct {
	base                                uint64
	limit                               uint32
	selector                            uint16
	typ, present, dpl, db, s, l, g, avl uint8
}

func putSegment(b []byte, sg segment) {
	*(*uint64)(unsafe.Pointer(&b[0])) = sg.base
	*(*uint32)(unsafe.Pointer(&b[8])) = sg.limit
	*(*uint16)(unsafe.Pointer(&b[12])) = sg.selector
	b[14], b[15], b[16], b[17], b[18], b[19], b[20], b[21], b[22] = sg.typ, sg.present, sg.dpl, sg.db, sg.s, sg.l, sg.g, sg.avl, 0
}

func probeMode(kvm int, long bool) error {
	v, err := newVM(kvm, probeCode, probeAddr, 0x10000)
	if err != nil {
		return err
	}
	defer v.close()
	var sregs [312]byte
	if _, err := ioctl(v.vcpu, kvmGetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return fmt.Errorf("KVM_GET_SREGS: %w", err)
	}
	if !long {
		// Real mode, code segment at 0.
		*(*uint64)(unsafe.Pointer(&sregs[0])) = 0  // cs.base
		*(*uint16)(unsafe.Pointer(&sregs[12])) = 0 // cs.selector
	} else {
		mem := v.mem
		put := func(at int, val uint64) { *(*uint64)(unsafe.Pointer(&mem[at])) = val }
		const present, writable, large = 1, 2, 0x80
		put(pml4Addr-probeAddr, pdptAddr|present|writable)
		put(pdptAddr-probeAddr, pdAddr|present|writable)
		put(pdAddr-probeAddr, present|writable|large)
		code := segment{limit: 0xffffffff, selector: 8, typ: 11, present: 1, s: 1, l: 1, g: 1}
		data := segment{limit: 0xffffffff, selector: 16, typ: 3, present: 1, s: 1, db: 1, g: 1}
		putSegment(sregs[0:], code) // cs
		for i := 1; i < 6; i++ {    // ds, es, fs, gs, ss
			putSegment(sregs[24*i:], data)
		}
		const (
			cr0PE, cr0MP, cr0ET, cr0NE, cr0WP, cr0AM, cr0PG = 1, 2, 0x10, 0x20, 0x10000, 0x40000, 0x80000000
			cr4PAE                                          = 0x20
			eferLME, eferLMA                                = 0x100, 0x400
		)
		// After the 8 segments and the gdt and idt tables: cr0, cr2, cr3,
		// cr4, cr8, efer.
		ctl := (*[6]uint64)(unsafe.Pointer(&sregs[224]))
		ctl[0] = cr0PE | cr0MP | cr0ET | cr0NE | cr0WP | cr0AM | cr0PG
		ctl[2] = pml4Addr
		ctl[3] = cr4PAE
		ctl[5] = eferLME | eferLMA
	}
	if _, err := ioctl(v.vcpu, kvmSetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return fmt.Errorf("KVM_SET_SREGS: %w", err)
	}
	// struct kvm_regs: rax..r15 (16), rip, rflags; bit 1 of rflags is
	// always set.
	var regs [18]uint64
	regs[16], regs[17] = probeAddr, 0x2
	regs[6] = probeAddr // rsp, unused
	if _, err := ioctl(v.vcpu, kvmSetRegs, uintptr(unsafe.Pointer(&regs[0]))); err != nil {
		return fmt.Errorf("KVM_SET_REGS: %w", err)
	}
	r, err := v.runOnce()
	if err != nil {
		return err
	}
	if r != kvmExitIO {
		return fmt.Errorf("the test guest stopped with %s instead of writing to an I/O port", exitName(r))
	}
	// kvm_run.io at offset 32: direction u8, size u8, port u16, count u32,
	// data_offset u64 (from the start of kvm_run).
	port := *(*uint16)(unsafe.Pointer(&v.run[34]))
	off := *(*uint64)(unsafe.Pointer(&v.run[40]))
	if port != probePort || off >= uint64(len(v.run)) || v.run[off] != probeByte {
		return fmt.Errorf("the test guest's I/O exit is wrong (port %#x)", port)
	}
	if r, err = v.runOnce(); err != nil {
		return err
	}
	if r != kvmExitHLT {
		return fmt.Errorf("the test guest stopped with %s instead of halting", exitName(r))
	}
	return nil
}
