package qemu

import (
	"slices"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

func spec(arch vmspec.Arch) *vmspec.Spec {
	return &vmspec.Spec{
		Name: "t", Arch: arch, CPUs: 2, MemoryMiB: 1024,
		Kernel: "/img/vmlinuz", Initrd: "/img/initrd", Cmdline: "kosa8.uid=1000",
		Disks:      []vmspec.Disk{{ID: "root", Path: "/sb/root.qcow2", Format: "qcow2"}},
		ConsoleLog: "/sb/console.log", AgentPort: "org.kosa8.agent",
	}
}

func opts(a vmm.Accel) Options {
	return Options{Accel: a, RAMPath: "/proc/self/fd/3", QMPFd: 4, AgentFd: 5, ConsoleFd: 7}
}

// value returns the argument after flag, for the n-th occurrence.
func value(t *testing.T, args []string, flag string, n int) string {
	t.Helper()
	seen := 0
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			if seen == n {
				return args[i+1]
			}
			seen++
		}
	}
	t.Fatalf("%s #%d not in %q", flag, n, args)
	return ""
}

func values(args []string, flag string) []string {
	var out []string
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			out = append(out, args[i+1])
		}
	}
	return out
}

func TestArgsPerPlatform(t *testing.T) {
	cases := []struct {
		name    string
		arch    vmspec.Arch
		accel   vmm.Accel
		accelOp string
		machine string
		cpu     string
		console string
	}{
		{"linux amd64 kvm", vmspec.AMD64, vmm.KVM, "kvm", "microvm,acpi=on,rtc=on,memory-backend=ram", "host", "console=ttyS0"},
		{"linux amd64 tcg", vmspec.AMD64, vmm.TCG, "tcg,tb-size=64,thread=single", "microvm,acpi=on,rtc=on,pit=on,memory-backend=ram", "max", "console=ttyS0"},
		{"darwin arm64 hvf", vmspec.ARM64, vmm.HVF, "hvf", "virt,gic-version=3,memory-backend=ram", "host", "console=ttyAMA0"},
		{"linux arm64 tcg", vmspec.ARM64, vmm.TCG, "tcg,tb-size=64,thread=single", "virt,gic-version=3,memory-backend=ram", "neoverse-n1", "console=ttyAMA0"},
		{"linux arm64 kvm", vmspec.ARM64, vmm.KVM, "kvm", "virt,gic-version=host,memory-backend=ram", "host", "console=ttyAMA0"},
		{"darwin amd64 hvf", vmspec.AMD64, vmm.HVF, "hvf", "microvm,acpi=on,rtc=on,memory-backend=ram", "host", "console=ttyS0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args, err := Args(spec(tc.arch), opts(tc.accel))
			if err != nil {
				t.Fatal(err)
			}
			if got := value(t, args, "-accel", 0); got != tc.accelOp {
				t.Errorf("-accel = %q, want %q", got, tc.accelOp)
			}
			if got := value(t, args, "-machine", 0); got != tc.machine {
				t.Errorf("-machine = %q, want %q", got, tc.machine)
			}
			if got := value(t, args, "-cpu", 0); got != tc.cpu {
				t.Errorf("-cpu = %q, want %q", got, tc.cpu)
			}
			if got := value(t, args, "-append", 0); !strings.HasPrefix(got, tc.console+" ") || !strings.Contains(got, "kosa8.uid=1000") {
				t.Errorf("-append = %q", got)
			}
			if got := value(t, args, "-sandbox", 0); got != "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny" {
				t.Errorf("-sandbox = %q", got)
			}
			if got := value(t, args, "-object", 0); got != "memory-backend-file,id=ram,size=1024M,mem-path=/proc/self/fd/3,share=on" {
				t.Errorf("RAM backend = %q", got)
			}
			for _, want := range []string{"-nodefaults", "-no-user-config", "-no-reboot"} {
				if !slices.Contains(args, want) {
					t.Errorf("missing %s", want)
				}
			}
			joined := strings.Join(args, " ")
			for _, banned := range []string{"user,", "-netdev user", "exec:", "slirp", "-nic", "hostfwd"} {
				if strings.Contains(joined, banned) {
					t.Errorf("command line contains %q: %s", banned, joined)
				}
			}
		})
	}
}

// Under TCG one thread runs every vCPU (the guest kernel's live patching
// raced with a thread per vCPU); KOSA8_TCG_THREADS=multi opts out, and a
// one-vCPU guest needs nothing.
func TestTCGThreads(t *testing.T) {
	sp := spec(vmspec.AMD64)
	t.Setenv("KOSA8_TCG_THREADS", "multi")
	args, err := Args(sp, opts(vmm.TCG))
	if err != nil {
		t.Fatal(err)
	}
	if got := value(t, args, "-accel", 0); got != "tcg,tb-size=64" {
		t.Errorf("KOSA8_TCG_THREADS=multi: -accel = %q", got)
	}
	t.Setenv("KOSA8_TCG_THREADS", "")
	sp.CPUs = 1
	if args, err = Args(sp, opts(vmm.TCG)); err != nil {
		t.Fatal(err)
	}
	if got := value(t, args, "-accel", 0); got != "tcg,tb-size=64" {
		t.Errorf("one vCPU: -accel = %q", got)
	}
}

// The translation cache's size comes from KOSA8_TCG_TB_MIB when set; a
// value that is not a sane size in MiB is refused, saying what is wanted.
func TestTCGTranslationCacheSize(t *testing.T) {
	sp := spec(vmspec.AMD64)
	sp.CPUs = 1
	t.Setenv(TBSizeEnv, "64")
	args, err := Args(sp, opts(vmm.TCG))
	if err != nil {
		t.Fatal(err)
	}
	if got := value(t, args, "-accel", 0); got != "tcg,tb-size=64" {
		t.Errorf("%s=64: -accel = %q", TBSizeEnv, got)
	}
	for _, bad := range []string{"lots", "0", "8", "4096", "64M", "-1"} {
		t.Setenv(TBSizeEnv, bad)
		if _, err := Args(sp, opts(vmm.TCG)); err == nil || !strings.Contains(err.Error(), TBSizeEnv) {
			t.Errorf("%s=%s: error %v, want one naming the setting", TBSizeEnv, bad, err)
		}
	}
	// Not a TCG setting's business under KVM.
	if _, err := Args(sp, opts(vmm.KVM)); err != nil {
		t.Errorf("under KVM a bad %s still failed: %v", TBSizeEnv, err)
	}
}

func TestArgsDevices(t *testing.T) {
	s := spec(vmspec.AMD64)
	s.Disks = append(s.Disks, vmspec.Disk{ID: "base", Path: "/img/base.raw", Format: "raw", ReadOnly: true},
		vmspec.Disk{ID: "scratch", Path: "/img/scratch.raw", Format: "raw", Scratch: true})
	s.Net = &vmspec.Net{MAC: "52:54:00:00:00:01"}
	o := opts(vmm.TCG)
	o.NetFd = 6
	o.Incoming = "defer"
	args, err := Args(s, o)
	if err != nil {
		t.Fatal(err)
	}
	drives := values(args, "-drive")
	if len(drives) != 3 || !strings.Contains(drives[1], "read-only=on") || strings.Contains(drives[0], "read-only") {
		t.Errorf("drives = %q", drives)
	}
	// Only a scratch disk's flushes are ignored: a sandbox's disk keeps them.
	if !strings.Contains(drives[2], ",cache=unsafe") || strings.Contains(drives[0], "cache=") || strings.Contains(drives[1], "cache=") {
		t.Errorf("drives = %q: cache=unsafe on the scratch disk only", drives)
	}
	// A host disk error must reach the guest as an I/O error, never stop
	// the VM (QEMU's default werror=enospc), which hung the supervisor.
	for _, d := range drives {
		if !strings.Contains(d, ",werror=report,") || !strings.HasSuffix(d, ",rerror=report") && !strings.Contains(d, ",rerror=report,") {
			t.Errorf("drive %q does not report errors to the guest", d)
		}
	}
	chardevs := values(args, "-chardev")
	want := []string{"socket,id=qmp,fd=4", "socket,id=agent,fd=5", "socket,id=console,fd=7"}
	if !slices.Equal(chardevs, want) {
		t.Errorf("chardevs = %q, want %q", chardevs, want)
	}
	if got := value(t, args, "-netdev", 0); got != "stream,id=net0,server=off,addr.type=fd,addr.str=6" {
		t.Errorf("-netdev = %q", got)
	}
	devs := strings.Join(values(args, "-device"), " ")
	for _, want := range []string{"virtserialport,chardev=agent,name=org.kosa8.agent", "virtio-net-device,netdev=net0,mac=52:54:00:00:00:01", "virtio-balloon-device,free-page-reporting=on", "virtio-rng-device"} {
		if !strings.Contains(devs, want) {
			t.Errorf("devices lack %q: %s", want, devs)
		}
	}
	if got := value(t, args, "-incoming", 0); got != "defer" {
		t.Errorf("-incoming = %q", got)
	}
}

// An arm64 guest: virt with the kernel loaded by QEMU (no firmware, even
// when an x86 one was found), the PL011 console, and the same virtio-mmio
// devices as on x86, never a PCI one.
func TestArgsARM64(t *testing.T) {
	for _, accel := range []vmm.Accel{vmm.TCG, vmm.KVM, vmm.HVF} {
		s := spec(vmspec.ARM64)
		s.Net = &vmspec.Net{MAC: "52:54:00:00:00:01"}
		o := opts(accel)
		o.NetFd = 6
		o.Firmware = "/usr/share/qemu/qboot.rom"
		o.TSCkHz = 2096016
		args, err := Args(s, o)
		if err != nil {
			t.Fatal(err)
		}
		if got := value(t, args, "-kernel", 0); got != "/img/vmlinuz" {
			t.Errorf("%s: -kernel = %q", accel, got)
		}
		if got := value(t, args, "-initrd", 0); got != "/img/initrd" {
			t.Errorf("%s: -initrd = %q", accel, got)
		}
		for _, banned := range []string{"-bios", "-pflash", "-drive if=pflash"} {
			if slices.Contains(args, banned) {
				t.Errorf("%s: arm64 boots without firmware, got %s: %q", accel, banned, args)
			}
		}
		if got := value(t, args, "-serial", 0); got != "chardev:console" {
			t.Errorf("%s: -serial = %q", accel, got)
		}
		ap := value(t, args, "-append", 0)
		if !strings.HasPrefix(ap, "console=ttyAMA0 ") || strings.Contains(ap, "tsc") {
			t.Errorf("%s: -append = %q", accel, ap)
		}
		devs := values(args, "-device")
		for _, want := range []string{"virtio-serial-device,max_ports=2", "virtio-blk-device,drive=root,serial=root", "virtio-net-device,netdev=net0,mac=52:54:00:00:00:01", "virtio-rng-device,rng=rng0", "virtio-balloon-device,free-page-reporting=on"} {
			if !slices.Contains(devs, want) {
				t.Errorf("%s: devices lack %q: %q", accel, want, devs)
			}
		}
		for _, d := range devs {
			if strings.Contains(d, "-pci") {
				t.Errorf("%s: PCI device %q", accel, d)
			}
		}
	}
}

func TestTSCOnlyUnderTCGOnX86(t *testing.T) {
	for _, tc := range []struct {
		arch  vmspec.Arch
		accel vmm.Accel
		want  bool
	}{{vmspec.AMD64, vmm.TCG, true}, {vmspec.AMD64, vmm.KVM, false}, {vmspec.ARM64, vmm.TCG, false}} {
		o := opts(tc.accel)
		o.TSCkHz = 2096016
		args, err := Args(spec(tc.arch), o)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Contains(value(t, args, "-append", 0), "tsc_early_khz=2096016 tsc=reliable")
		if got != tc.want {
			t.Errorf("%s/%s: tsc_early_khz present = %v, want %v", tc.arch, tc.accel, got, tc.want)
		}
	}
}

func TestHostTSC(t *testing.T) {
	if vmspec.HostArch() != vmspec.AMD64 {
		t.Skip("the TSC is an x86 counter")
	}
	// Any x86-64 machine that runs kosa8 counts between 0.5 and 10 GHz.
	if khz := HostTSCkHz(); khz < 500_000 || khz > 10_000_000 {
		t.Fatalf("measured TSC rate %d kHz is implausible", khz)
	}
}

func TestArgsRejects(t *testing.T) {
	s := spec(vmspec.AMD64)
	s.Disks[0].Path = "/a,b/root.qcow2"
	if _, err := Args(s, opts(vmm.TCG)); err == nil || !strings.Contains(err.Error(), "comma") {
		t.Errorf("comma in a disk path: err = %v", err)
	}
	o := opts(vmm.TCG)
	o.QMPFd = 1
	if _, err := Args(spec(vmspec.AMD64), o); err == nil {
		t.Error("stdout as QMP descriptor accepted")
	}
	bad := spec(vmspec.AMD64)
	bad.CPUs = 0
	if _, err := Args(bad, opts(vmm.TCG)); err == nil {
		t.Error("invalid spec accepted")
	}
}

func TestArgsVirtioFS(t *testing.T) {
	s := spec(vmspec.AMD64)
	if args, _ := Args(s, opts(vmm.TCG)); slices.Contains(values(args, "-device"), "vhost-user-fs-device") {
		t.Fatal("a virtiofs device without asking for one")
	}
	s.VirtioFS = []vmspec.VirtioFS{{Tag: "bench", Socket: "/tmp/vfs.sock"}}
	args, err := Args(s, opts(vmm.TCG))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(values(args, "-chardev"), "socket,id=vfs0,path=/tmp/vfs.sock") ||
		!slices.Contains(values(args, "-device"), "vhost-user-fs-device,chardev=vfs0,tag=bench") ||
		!slices.Contains(values(args, "-global"), "virtio-mmio.force-legacy=false") {
		t.Fatalf("virtiofs args: %q", args)
	}
	for _, bad := range []vmspec.VirtioFS{{Tag: "a,b", Socket: "/s"}, {Tag: "t", Socket: "/s,x=y"}, {Tag: "", Socket: "/s"}} {
		s.VirtioFS = []vmspec.VirtioFS{bad}
		if _, err := Args(s, opts(vmm.TCG)); err == nil {
			t.Errorf("accepted %+v", bad)
		}
	}
}

// The command line and migration transport for each QEMU release kosa8
// supports, as its installation looks where users get it: Debian 12's 7.2,
// Ubuntu 24.04's 8.2, a 9.x, and Debian's 10.0 unpacked under a prefix.
func TestArgsPerQEMUVersion(t *testing.T) {
	base := opts(vmm.TCG)
	base.Version = Version{7, 2, 22}
	base.Firmware = "/usr/share/qemu/qboot.rom"
	want72, err := Args(spec(vmspec.AMD64), base)
	if err != nil {
		t.Fatal(err)
	}
	// The whole 7.2 line, so that any change to it is seen here.
	golden := "-name kosa8-t,debug-threads=on -nodefaults -no-user-config -display none -no-reboot" +
		" -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny" +
		" -bios /usr/share/qemu/qboot.rom -accel tcg,tb-size=64,thread=single -machine microvm,acpi=on,rtc=on,pit=on,memory-backend=ram" +
		" -cpu max -smp 2 -m 1024M -object memory-backend-file,id=ram,size=1024M,mem-path=/proc/self/fd/3,share=on" +
		" -kernel /img/vmlinuz -initrd /img/initrd -append console=ttyS0 kosa8.uid=1000" +
		" -chardev socket,id=qmp,fd=4 -mon chardev=qmp,mode=control -chardev socket,id=agent,fd=5" +
		" -device virtio-serial-device,max_ports=2 -device virtserialport,chardev=agent,name=org.kosa8.agent" +
		" -chardev socket,id=console,fd=7 -serial chardev:console" +
		" -drive id=root,file=/sb/root.qcow2,format=qcow2,if=none,discard=unmap,detect-zeroes=unmap,werror=report,rerror=report -device virtio-blk-device,drive=root,serial=root" +
		" -object rng-random,id=rng0,filename=/dev/urandom -device virtio-rng-device,rng=rng0 -device virtio-balloon-device,free-page-reporting=on"
	if got := strings.Join(want72, " "); got != golden {
		t.Fatalf("7.2 command line:\n got %s\nwant %s", got, golden)
	}
	cases := []struct {
		name      string
		version   Version
		dataDirs  []string
		firmware  string
		extra     []string // arguments beyond the 7.2 line, in order
		transport migrationTransport
		uri       string
	}{
		{"7.2 debian 12", Version{7, 2, 22}, nil, "/usr/share/qemu/qboot.rom", nil, viaFd, "fd:kosa8-migrate"},
		{"8.2 ubuntu 24.04", Version{8, 2, 2}, nil, "/usr/share/qemu/qboot.rom", nil, viaFd, "fd:kosa8-migrate"},
		{"9.0", Version{9, 0, 0}, nil, "/usr/share/qemu/qboot.rom", nil, viaFd, "fd:kosa8-migrate"},
		{"9.2", Version{9, 2, 0}, nil, "/usr/share/qemu/qboot.rom", nil, viaFdset, "file:/dev/fdset/3"},
		{"10.0 under /opt", Version{10, 0, 2}, []string{"/opt/qemu10/usr/share/qemu", "/opt/qemu10/usr/share/seabios"},
			"/opt/qemu10/usr/share/qemu/qboot.rom",
			[]string{"-L", "/opt/qemu10/usr/share/qemu", "-L", "/opt/qemu10/usr/share/seabios"}, viaFdset, "file:/dev/fdset/3"},
		{"10.1 homebrew", Version{10, 1, 0}, nil, "/opt/homebrew/share/qemu/qboot.rom", nil, viaFdset, "file:/dev/fdset/3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := opts(vmm.TCG)
			o.Version, o.DataDirs, o.Firmware = tc.version, tc.dataDirs, tc.firmware
			args, err := Args(spec(vmspec.AMD64), o)
			if err != nil {
				t.Fatal(err)
			}
			if got := value(t, args, "-bios", 0); got != tc.firmware {
				t.Errorf("-bios = %q, want %q", got, tc.firmware)
			}
			// Only -L and the firmware's path may differ from 7.2's line.
			var rest, extra []string
			for i := 0; i < len(args); i++ {
				switch args[i] {
				case "-L":
					extra = append(extra, args[i], args[i+1])
					i++
				case "-bios":
					rest = append(rest, args[i], "FW")
					i++
				default:
					rest = append(rest, args[i])
				}
			}
			if !slices.Equal(extra, tc.extra) {
				t.Errorf("extra arguments = %q, want %q", extra, tc.extra)
			}
			want := strings.Replace(golden, "/usr/share/qemu/qboot.rom", "FW", 1)
			if got := strings.Join(rest, " "); got != want {
				t.Errorf("command line differs from 7.2's beyond -L and -bios:\n got %s\nwant %s", got, want)
			}
			if tr := transportFor(tc.version); tr != tc.transport || migrationURI(tr, 3) != tc.uri {
				t.Errorf("migration: transport %v, uri %q; want %v, %q", tr, migrationURI(tr, 3), tc.transport, tc.uri)
			}
		})
	}
	// No qboot found: QEMU's default firmware, no -bios; arm64 never has one.
	o := opts(vmm.TCG)
	if args, _ := Args(spec(vmspec.AMD64), o); slices.Contains(args, "-bios") {
		t.Errorf("-bios without a firmware: %q", args)
	}
	o.DataDirs = []string{"/a,b"}
	if _, err := Args(spec(vmspec.AMD64), o); err == nil {
		t.Error("a data folder with a comma accepted")
	}
}

func TestSupportedRange(t *testing.T) {
	for _, tc := range []struct {
		v               Version
		tested, allowed bool
	}{
		{Version{7, 1, 0}, false, false},
		{Version{7, 2, 0}, true, true},
		{Version{8, 2, 2}, true, true},
		{Version{9, 2, 3}, true, true},
		{Version{10, 1, 1}, true, true},
		{Version{11, 0, 0}, false, true},
	} {
		i := Install{Binary: "/q", Version: tc.v, VersionLine: "QEMU emulator version " + tc.v.String()}
		if got := tc.v.Tested(); got != tc.tested {
			t.Errorf("%s: Tested = %v", tc.v, got)
		}
		if err := i.Supported(); (err == nil) != tc.allowed {
			t.Errorf("%s: Supported = %v", tc.v, err)
		} else if err != nil && !strings.Contains(err.Error(), "install QEMU 7.2 to 10.x") {
			t.Errorf("%s: error does not say what to do: %v", tc.v, err)
		}
	}
}

// A fork maps its checkpoint's RAM file copy-on-write: opened read-only
// (no write of this QEMU reaches the file other forks map), mapped
// private and writable; every other device is as a normal start's, so
// the checkpoint's device state loads into it.
func TestArgsRAMTemplate(t *testing.T) {
	o := opts(vmm.TCG)
	normal, err := Args(spec(vmspec.AMD64), o)
	if err != nil {
		t.Fatal(err)
	}
	o.RAMTemplate = true
	tpl, err := Args(spec(vmspec.AMD64), o)
	if err != nil {
		t.Fatal(err)
	}
	if got := value(t, tpl, "-object", 0); got != "memory-backend-file,id=ram,size=1024M,mem-path=/proc/self/fd/3,share=off,readonly=on,rom=off" {
		t.Errorf("template RAM: %s", got)
	}
	var diff []string
	for i := range tpl {
		if i >= len(normal) || tpl[i] != normal[i] {
			diff = append(diff, tpl[i])
		}
	}
	if len(tpl) != len(normal) || len(diff) != 1 {
		t.Errorf("a template start differs from a normal one in %q, want the memory backend alone", diff)
	}
	for _, v := range []Version{{7, 2, 22}, {8, 1, 0}} {
		if (&Driver{inst: Install{Version: v}}).CanMapRAMTemplate() {
			t.Errorf("QEMU %s (no rom property) said to map a RAM template", v)
		}
	}
}
