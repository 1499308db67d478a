package qemu

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// Options are the host-side facts the command line needs besides the spec.
type Options struct {
	Accel vmm.Accel
	// RAMPath is the file guest RAM lives in (memory-backend-file,share=on).
	// On Linux it names a descriptor of a file on tmpfs: /proc/self/fd/N.
	RAMPath string
	// RAMTemplate: RAMPath is a file to start from, opened read-only and
	// mapped copy-on-write (share=off,readonly=on,rom=off: QEMU 8.2 and
	// later), its pages shared with every other machine mapping it until
	// the guest writes them (vmm.StartOptions.RAMTemplate).
	RAMTemplate bool
	// File descriptors QEMU inherits: connected stream sockets.
	QMPFd, AgentFd int
	NetFd          int // 0: no NIC
	// ConsoleFd is the serial console's socket: the driver copies what
	// the guest prints from it into spec.ConsoleLog, bounded (console.go).
	// 0: no console.
	ConsoleFd int
	// Incoming, when set, starts QEMU waiting for a migration stream
	// ("defer": the stream is given over QMP later).
	Incoming string
	// TSCkHz is the host's TSC rate, passed to an x86 guest under TCG so
	// that its kernel skips calibrating against the emulated PIT (which
	// failed, and then hung the boot, in some TCG boots here).
	TSCkHz int
	// Version is the QEMU that will run the command line.
	Version Version
	// DataDirs go to -L, ahead of QEMU's own data folders (see Install).
	DataDirs []string
	// Firmware, when set, is the x86 microvm firmware (-bios).
	Firmware string
}

// ramSharing is how the RAM file is mapped: shared (the host copies it
// for checkpoints), or a template mapped private and writable, opened
// read-only so that no write of this QEMU reaches it.
func ramSharing(template bool) string {
	if template {
		return ",share=off,readonly=on,rom=off"
	}
	return ",share=on"
}

// seccompPolicy is QEMU's own sandbox: it may start no helper program
// (migration streams come as file descriptors over QMP, never exec:),
// never gain privileges, change resource limits or use obsolete calls.
const seccompPolicy = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// Binary names the QEMU program for a guest architecture.
func Binary(arch vmspec.Arch) string {
	if arch == vmspec.ARM64 {
		return "qemu-system-aarch64"
	}
	return "qemu-system-x86_64"
}

// consoleDevice is the serial console's name in the guest kernel.
func consoleDevice(arch vmspec.Arch) string {
	if arch == vmspec.ARM64 {
		return "ttyAMA0"
	}
	return "ttyS0"
}

func kernelCmdline(s *vmspec.Spec, o Options) string {
	c := "console=" + consoleDevice(s.Arch)
	if s.Arch == vmspec.AMD64 && o.Accel == vmm.TCG && o.TSCkHz > 0 {
		// Emulated vCPUs read the host's TSC, but the kernel's sync check
		// between them fails under TCG, marks the TSC unstable and falls
		// back to jiffies: a clock that lost half a second per minute of
		// load. The microvm has no HPET or PM timer to fall back on.
		c += " tsc_early_khz=" + strconv.Itoa(o.TSCkHz) + " tsc=reliable"
	}
	return strings.TrimSpace(c + " " + s.Cmdline)
}

// tcgCPU is the emulated CPU for arch. On arm64 a fixed model, not "max":
// max gains features with each QEMU release (a checkpoint saved under one
// would not load under another), and its pointer authentication and SVE
// cost time in every emulated function call and copy. A Neoverse N1
// (Armv8.2 with LSE atomics) runs what Debian's arm64 build targets.
func tcgCPU(arch vmspec.Arch) string {
	if arch == vmspec.ARM64 {
		return "neoverse-n1"
	}
	return "max"
}

// Args translates a spec into QEMU's arguments. It is a pure function so
// that the command line for every platform and acceleration is unit-tested
// here, including the ones this machine cannot run.
func Args(s *vmspec.Spec, o Options) ([]string, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if o.RAMPath == "" {
		return nil, fmt.Errorf("qemu: no RAM file")
	}
	if o.QMPFd <= 2 || o.AgentFd <= 2 {
		return nil, fmt.Errorf("qemu: QMP and agent descriptors must be inherited ones (>2)")
	}
	if strings.ContainsAny(o.RAMPath, ",") {
		return nil, fmt.Errorf("qemu: RAM path %q contains a comma", o.RAMPath)
	}
	mem := strconv.Itoa(s.MemoryMiB) + "M"
	a := []string{
		"-name", "kosa8-" + s.Name + ",debug-threads=on",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-no-reboot", // a guest reboot or panic ends QEMU; the supervisor decides what next
		"-sandbox", seccompPolicy,
	}
	for _, d := range o.DataDirs {
		if strings.Contains(d, ",") {
			return nil, fmt.Errorf("qemu: data folder %q contains a comma", d)
		}
		a = append(a, "-L", d)
	}

	var machine []string
	switch s.Arch {
	case vmspec.AMD64:
		// microvm: no PCI, no firmware; devices are virtio-mmio, found
		// through ACPI (the Debian kernel has no virtio_mmio.device= support).
		machine = []string{"microvm", "acpi=on", "rtc=on"}
		if o.Accel == vmm.TCG {
			// Without a PIT the kernel hung at TSC calibration in a third of
			// TCG boots.
			machine = append(machine, "pit=on")
		}
		// The firmware is chosen, not left to the installation: a guest of
		// exactly 2 GiB did not boot under Debian's QEMU 10.0 ("virtio-blk
		// missing headers", then a module of the initramfs failing its
		// signature check), and the cause is the firmware, not QEMU 10.
		// Debian's QEMU 7.2 makes bios-microvm.bin a link to qboot, which
		// loads the kernel and initrd itself and reserves nothing at the top
		// of RAM. Debian's QEMU 10 drops that link, so bios-microvm.bin is
		// SeaBIOS's (package seabios), which keeps the last 12 KiB of low RAM
		// for itself (e820 reserved 0x7fffd000-0x7fffffff at 2 GiB) and boots
		// the kernel through QEMU's linuxboot_dma option ROM. QEMU puts the
		// initrd at the very top of low RAM on microvm (which keeps no ACPI
		// area there), capped by the kernel's initrd_addr_max (0x7fffffff).
		// The option ROM moves it down, under the top of RAM the BIOS
		// reports (int 15h e801, without SeaBIOS's area), unless the initrd
		// ends on the page of initrd_addr_max, which it reads as "placed by
		// the kernel's limit, not at the end of RAM". At exactly 2 GiB both
		// are the same page, so the initrd is left on SeaBIOS's reserved
		// area, and the last pages of the cpio (the last modules in it)
		// and SeaBIOS's data there overwrite each other: the guest showed
		// "RAMDISK: [mem 0x7fb76000-0x7fffffff]" beside that e820 entry, and
		// QEMU's "virtio-blk missing headers" is SeaBIOS's own disk request
		// gone bad. Below 2 GiB the option ROM moves the initrd down; above
		// it the initrd ends at 0x7fffffff, far below the top of RAM.
		// QEMU 7.2 with SeaBIOS's bios-microvm.bin failed the same way, and
		// QEMU 10 with qboot boots 2 GiB.
		// Upstream QEMU installs qboot.rom (Debian's 7.2 and 10.0 do too), so
		// it is named here; where it is missing QEMU's default stays and
		// doctor says so.
		if o.Firmware != "" {
			if strings.Contains(o.Firmware, ",") {
				return nil, fmt.Errorf("qemu: firmware path %q contains a comma", o.Firmware)
			}
			a = append(a, "-bios", o.Firmware)
		}
	case vmspec.ARM64:
		// virt: a PL011 serial port (ttyAMA0), a GIC, the generic timer and
		// PL031 clock, and 32 virtio-mmio slots that the device tree QEMU
		// writes for a -kernel boot describes, so the same virtio-*-device
		// models as on x86's microvm plug in, found without ACPI or PCI.
		// No firmware: QEMU loads the kernel's Image itself.
		gic := "gic-version=3"
		if o.Accel == vmm.KVM {
			// The host's own GIC (some arm64 hosts have only a GICv2).
			gic = "gic-version=host"
		}
		// Under TCG and HVF the GICv3 is QEMU's own (HVF has no in-kernel
		// GIC); named rather than "max", which picks a GICv4 under TCG in
		// newer QEMU: a checkpoint is restored only into the same GIC.
		machine = []string{"virt", gic}
	}
	machine = append(machine, "memory-backend=ram")
	cpu := tcgCPU(s.Arch)
	if o.Accel == vmm.KVM || o.Accel == vmm.HVF {
		cpu = "host"
	}
	accel := string(o.Accel)
	if o.Accel == vmm.TCG {
		// The translation cache defaults to 1 GiB and fills up as the guest
		// runs new code: an idle sandbox's QEMU grew past 700 MiB after a few
		// hundred execs. 64 MiB bounds it (KOSA8_TCG_TB_MIB changes it);
		// see DefaultTBMiB.
		tb, err := tbSizeMiB()
		if err != nil {
			return nil, err
		}
		accel += ",tb-size=" + strconv.Itoa(tb)
		// One thread runs every vCPU in turn. With a thread per vCPU
		// (QEMU's default for x86 on x86) the Debian kernel now and then
		// died at boot with "Oops: int3" in code it was patching live
		// (text_poke's breakpoints, seen in CI and here: about 1 boot in
		// 100); the single thread serializes what the kernel's patching
		// assumes is serialized. KOSA8_TCG_THREADS=multi restores QEMU's
		// default (faster for parallel work, at that risk).
		if s.CPUs > 1 && os.Getenv("KOSA8_TCG_THREADS") != "multi" {
			accel += ",thread=single"
		}
	}
	a = append(a,
		"-accel", accel,
		"-machine", strings.Join(machine, ","),
		"-cpu", cpu,
		"-smp", strconv.Itoa(s.CPUs),
		"-m", mem,
		"-object", "memory-backend-file,id=ram,size="+mem+",mem-path="+o.RAMPath+ramSharing(o.RAMTemplate),
		"-kernel", s.Kernel,
		"-initrd", s.Initrd,
		"-append", kernelCmdline(s, o),
		"-chardev", "socket,id=qmp,fd="+strconv.Itoa(o.QMPFd),
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "socket,id=agent,fd="+strconv.Itoa(o.AgentFd),
		"-device", "virtio-serial-device,max_ports=2",
		"-device", "virtserialport,chardev=agent,name="+s.AgentPort,
	)
	if o.ConsoleFd > 2 {
		// A socket, not a file QEMU appends to: the guest decides how much
		// it prints, and the host side bounds what it keeps.
		a = append(a, "-chardev", "socket,id=console,fd="+strconv.Itoa(o.ConsoleFd), "-serial", "chardev:console")
	} else {
		a = append(a, "-serial", "none")
	}
	for _, d := range s.Disks {
		if strings.Contains(d.Path, ",") {
			return nil, fmt.Errorf("qemu: disk path %q contains a comma", d.Path)
		}
		// werror/rerror=report: a write that fails on the host (a full disk
		// under a checkpoint) is an I/O error in the guest. QEMU's default,
		// enospc, stops the whole VM until someone sends "cont", and a
		// stopped guest answers no agent call: the supervisor hung there.
		drive := "id=" + d.ID + ",file=" + d.Path + ",format=" + d.Format + ",if=none,discard=unmap,detect-zeroes=unmap,werror=report,rerror=report"
		if d.ReadOnly {
			drive += ",read-only=on"
		}
		if d.Scratch {
			drive += ",cache=unsafe" // every dpkg fsync was a host fsync
		}
		// The id is the disk's serial number too: the agent finds its disks
		// by it, as their names (vda, vdb) follow the kernel's probe order,
		// which on arm64's virt is the reverse of the command line's.
		a = append(a, "-drive", drive, "-device", "virtio-blk-device,drive="+d.ID+",serial="+d.ID)
	}
	if len(s.VirtioFS) > 0 {
		// virtiofsd speaks only modern virtio; virtio-mmio is legacy unless
		// told otherwise.
		a = append(a, "-global", "virtio-mmio.force-legacy=false")
	}
	for i, fs := range s.VirtioFS {
		if strings.ContainsAny(fs.Socket+fs.Tag, ",=") || fs.Tag == "" || fs.Socket == "" {
			return nil, fmt.Errorf("qemu: virtiofs tag %q / socket %q: empty or with ',' or '='", fs.Tag, fs.Socket)
		}
		id := "vfs" + strconv.Itoa(i)
		a = append(a, "-chardev", "socket,id="+id+",path="+fs.Socket,
			"-device", "vhost-user-fs-device,chardev="+id+",tag="+fs.Tag)
	}
	if s.Net != nil && o.NetFd > 2 {
		a = append(a,
			"-netdev", "stream,id=net0,server=off,addr.type=fd,addr.str="+strconv.Itoa(o.NetFd),
			"-device", "virtio-net-device,netdev=net0,mac="+s.Net.MAC,
		)
	}
	a = append(a,
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng0",
		// Free page reporting hands pages the guest frees back to the host,
		// which keeps the RAM file sparse and checkpoints small.
		"-device", "virtio-balloon-device,free-page-reporting=on",
	)
	if o.Incoming != "" {
		a = append(a, "-incoming", o.Incoming)
	}
	return a, nil
}

// TBSizeEnv sets the TCG translation cache's size in MiB: memory against
// speed, as a guest whose code no longer fits is translated again.
const TBSizeEnv = "KOSA8_TCG_TB_MIB"

// DefaultTBMiB is the translation cache's size unless TBSizeEnv says.
// Measured with `go run ./bench mem` (a 1 GiB guest running ls -lR,
// Python imports, tar and gzip, apt-cache, gcc -O2 and node, three times
// and once more; TCG, 2 cores, QEMU 7.2): QEMU beyond guest RAM took 779 /
// 356 / 208 / 127 MiB with 1024 / 256 / 128 / 64 MiB, and the workload ran
// 36.6 / 37.1 / 36.7 / 36.1 s: translating again after the cache fills
// costs less than the noise, holding what was translated once costs
// memory.
const DefaultTBMiB = 64

func tbSizeMiB() (int, error) {
	v := os.Getenv(TBSizeEnv)
	if v == "" {
		return DefaultTBMiB, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 16 || n > 2048 {
		return 0, fmt.Errorf("%s=%q: want the TCG translation cache's size in MiB, 16 to 2048 (default %d)", TBSizeEnv, v, DefaultTBMiB)
	}
	return n, nil
}
