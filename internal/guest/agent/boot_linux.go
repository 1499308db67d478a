package agent

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RootInitramfs as kosa8.root keeps the initramfs as the root: the image
// builder's VM, whose initramfs holds the few programs that make the
// image's filesystem (a host without mkfs builds images that way).
const RootInitramfs = "initramfs"

// Params come from the kernel command line (kosa8.KEY=VALUE), set by the host.
type Params struct {
	User     string // default user's name
	UID, GID int
	Hostname string
	Root     string // root disk, e.g. vda
	Port     string // virtio-serial port name of the channel
	// Env entries are exported to every process (placeholders, CA paths…).
	Env []string
	// Net, when set, configures eth0.
	Net *NetConfig
	// RootGrown is closed once the root filesystem fills its disk: it
	// grows in the background while the boot goes on (Config.RootGrown).
	RootGrown <-chan struct{}
}

// DefaultPortName is the virtio-serial port the host serves the channel on.
const DefaultPortName = "org.kosa8.agent"

// ParseCmdline reads kosa8.* parameters from a kernel command line.
func ParseCmdline(cmdline string) Params {
	p := Params{User: "kosa8", UID: 1000, GID: 1000, Hostname: "kosa8", Root: "vda", Port: DefaultPortName}
	for _, f := range strings.Fields(cmdline) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(k, "kosa8.") {
			continue
		}
		switch strings.TrimPrefix(k, "kosa8.") {
		case "user":
			p.User = v
		case "uid":
			if n, err := strconv.Atoi(v); err == nil {
				p.UID = n
			}
		case "gid":
			if n, err := strconv.Atoi(v); err == nil {
				p.GID = n
			}
		case "hostname":
			p.Hostname = v
		case "root":
			p.Root = v
		case "port":
			p.Port = v
		case "ip":
			if a, err := netip.ParsePrefix(v); err == nil && a.Addr().Is4() {
				if p.Net == nil {
					p.Net = &NetConfig{}
				}
				p.Net.Addr = a
			}
		case "mtu":
			if n, err := strconv.Atoi(v); err == nil && n >= 576 && n <= 65535 {
				if p.Net == nil {
					p.Net = &NetConfig{}
				}
				p.Net.MTU = n
			}
		case "gw":
			if a, err := netip.ParseAddr(v); err == nil && a.Is4() {
				if p.Net == nil {
					p.Net = &NetConfig{}
				}
				p.Net.Gateway = a
			}
		}
	}
	return p
}

// Boot brings the guest up from the initramfs: modules, root disk, the
// switch into it (staying PID 1), the usual mounts, hostname and user.
func Boot(log *slog.Logger) (Params, error) {
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
	} {
		if err := mount(m.src, m.dst, m.fs, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil && m.fs != "devtmpfs" {
			return Params{}, err
		}
	}
	raw, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return Params{}, err
	}
	p := ParseCmdline(string(raw))
	t := time.Now()
	if err := loadModules(log); err != nil {
		return p, err
	}
	log.Info("modules loaded", "ms", time.Since(t).Milliseconds())
	if p.Root != RootInitramfs {
		dev, err := findDisk("/sys/block", RootSerial, p.Root, 10*time.Second)
		if err != nil {
			return p, fmt.Errorf("root disk: %w", err)
		}
		// So that the mounted root can take the sandbox's own UUID when
		// the host names it (one image, and one template, serve many).
		if err := ensureCsumSeed(dev); err != nil {
			log.Warn("root filesystem: its UUID stays the image's", "err", err)
		}
		if err := mount(dev, "/newroot", "ext4", unix.MS_NOATIME, ""); err != nil {
			return p, err
		}
		p.RootGrown = growFS(dev, "/newroot", log)
		if err := switchRoot("/newroot"); err != nil {
			return p, err
		}
	} else if err := mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return p, err
	}
	if err := afterSwitch(); err != nil {
		return p, err
	}
	if err := setHostname(p.Hostname); err != nil {
		log.Warn("hostname", "err", err)
	}
	if err := loopbackUp(); err != nil {
		log.Warn("loopback", "err", err)
	}
	if p.Net != nil && p.Net.Addr.IsValid() && p.Net.Gateway.IsValid() {
		if err := configureNet(*p.Net); err != nil {
			log.Error("network", "err", err)
		}
	}
	name, err := userDB{etc: "/etc"}.ensureUser(p.User, p.UID, p.GID)
	if err != nil {
		return p, fmt.Errorf("create user %s: %w", p.User, err)
	}
	p.User = name
	os.Setenv("PATH", defaultPath)
	// Modes the host asks for are meant exactly; processes the agent starts
	// get the usual 022 back (exec sets it).
	unix.Umask(0)
	return p, nil
}

func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mount %s on %s: %w", fstype, dst, err)
	}
	return nil
}

// loadModules loads the modules the initramfs lists, in order.
func loadModules(log *slog.Logger) error {
	kver, err := os.ReadFile("/kosa8/kernel-version")
	if err != nil {
		return err
	}
	base := "/lib/modules/" + strings.TrimSpace(string(kver))
	list, err := os.Open("/kosa8/modules")
	if err != nil {
		return err
	}
	defer list.Close()
	s := bufio.NewScanner(list)
	for s.Scan() {
		rel := strings.TrimSpace(s.Text())
		if rel == "" {
			continue
		}
		f, err := os.Open(filepath.Join(base, rel))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", rel, err)
		}
	}
	return s.Err()
}

// Serial numbers the host gives the disks (QEMU's virtio-blk serial=, the
// disk's id in vmspec), by which the agent finds them.
const (
	RootSerial      = "root"
	WorkspaceSerial = "ws"
)

// findDisk returns the /dev path of the virtio disk whose serial number is
// serial, waiting up to timeout for it. The names the kernel gives (vda,
// vdb) follow the order it probes the devices in, which is not the order
// of QEMU's command line everywhere: on arm64's virt machine the last disk
// given came first. A disk without a serial number (from a host that set
// none) is found by its name, fallback, instead.
func findDisk(sysBlock, serial, fallback string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		name, legacy := diskBySerial(sysBlock, serial)
		if name == "" && legacy {
			if _, err := os.Stat(filepath.Join(sysBlock, fallback)); err == nil {
				name = fallback
			}
		}
		if name != "" {
			return "/dev/" + name, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no disk with serial number %q appeared within %s", serial, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// diskBySerial looks in sysBlock (/sys/block) for the virtio disk whose
// serial number is serial; legacy reports a virtio disk without one.
func diskBySerial(sysBlock, serial string) (name string, legacy bool) {
	ents, _ := os.ReadDir(sysBlock)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "vd") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "serial"))
		got := strings.TrimSpace(string(b))
		switch {
		case err == nil && got == serial:
			return e.Name(), false
		case err != nil || got == "":
			legacy = true
		}
	}
	return "", legacy
}

// growFS grows the ext4 filesystem on dev (mounted at mnt) to fill the
// disk, in the background: the returned channel is closed once it is done
// (or failed, or had nothing to do). The shared base image is only as large
// as its contents; each sandbox's overlay disk is larger, and the first
// boot claims the difference (about 190 ms under TCG, which the rest of
// the boot no longer waits for).
func growFS(dev, mnt string, log *slog.Logger) <-chan struct{} {
	done := make(chan struct{})
	d, want, from, err := growNeeded(dev, mnt)
	if err != nil || d == nil {
		if err != nil {
			log.Warn("could not grow the root filesystem", "err", err)
		}
		close(done)
		return done
	}
	// d stays open on the filesystem's root across the switch into it.
	go func() {
		defer close(done)
		defer d.Close()
		t := time.Now()
		const ext4IocResizeFS = 0x40086610 // _IOW('f', 16, __u64)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.Fd(), ext4IocResizeFS, uintptr(unsafe.Pointer(&want))); e != 0 {
			log.Warn("could not grow the root filesystem", "err", e)
			return
		}
		log.Info("root filesystem grown", "from_blocks", from, "to_blocks", want, "ms", time.Since(t).Milliseconds())
	}()
	return done
}

// growNeeded reads the ext4 superblock on dev: when the filesystem is
// worth growing it returns mnt opened and the disk's size in blocks, else
// a nil file.
func growNeeded(dev, mnt string) (d *os.File, want, blocks uint64, err error) {
	f, err := os.Open(dev)
	if err != nil {
		return nil, 0, 0, err
	}
	defer f.Close()
	size, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
	if err != nil {
		return nil, 0, 0, err
	}
	var sb [1024]byte
	if _, err := f.ReadAt(sb[:], 1024); err != nil {
		return nil, 0, 0, err
	}
	if binary.LittleEndian.Uint16(sb[0x38:]) != 0xEF53 {
		return nil, 0, 0, errors.New("not an ext4 superblock")
	}
	blocks = uint64(binary.LittleEndian.Uint32(sb[4:]))
	if binary.LittleEndian.Uint32(sb[0x60:])&0x80 != 0 { // INCOMPAT_64BIT
		blocks |= uint64(binary.LittleEndian.Uint32(sb[0x150:])) << 32
	}
	bsize := uint64(1024) << binary.LittleEndian.Uint32(sb[24:])
	want = size / bsize
	if want <= blocks+bsize { // nothing worth growing
		return nil, 0, 0, nil
	}
	d, err = os.Open(mnt)
	if err != nil {
		return nil, 0, 0, err
	}
	return d, want, blocks, nil
}

// switchRoot makes newroot the root, keeping this process as PID 1, and
// frees the initramfs. The agent's binary is kept at /run/kosa8/agent.
func switchRoot(newroot string) error {
	if err := mount("tmpfs", newroot+"/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return err
	}
	if err := os.MkdirAll(newroot+"/run/kosa8", 0o755); err != nil {
		return err
	}
	if err := copyFile("/init", newroot+"/run/kosa8/agent", 0o755); err != nil {
		return err
	}
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		if err := os.MkdirAll(newroot+m, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m, newroot+m, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", m, err)
		}
	}
	freeInitramfs()
	if err := unix.Chdir(newroot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	return unix.Chdir("/")
}

// freeInitramfs removes the initramfs's files (it lives in RAM) without
// crossing into the mounts below it.
func freeInitramfs() {
	var root unix.Stat_t
	if unix.Lstat("/", &root) != nil {
		return
	}
	var walk func(dir string)
	walk = func(dir string) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			var st unix.Stat_t
			if unix.Lstat(p, &st) != nil || st.Dev != root.Dev {
				continue
			}
			if e.IsDir() {
				walk(p)
				_ = unix.Rmdir(p)
			} else {
				_ = unix.Unlink(p)
			}
		}
	}
	walk("/")
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// afterSwitch mounts what a Debian userland expects in the new root.
func afterSwitch() error {
	mounts := []struct {
		src, dst, fs string
		flags        uintptr
		data         string
	}{
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"tmpfs", "/run/lock", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "mode=1777,size=5m"},
	}
	for _, m := range mounts {
		if err := mount(m.src, m.dst, m.fs, m.flags, m.data); err != nil {
			return err
		}
	}
	_ = os.Remove("/dev/ptmx")
	links := map[string]string{
		"/dev/ptmx": "pts/ptmx", "/dev/fd": "/proc/self/fd",
		"/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	}
	for l, t := range links {
		_ = os.Symlink(t, l)
	}
	return nil
}

// takeHostname names the guest as the host asks after a boot or a
// restore (empty: unchanged). The host derives it from a sandbox name;
// anything else is refused rather than written into /etc/hosts.
func takeHostname(name string) error {
	if name == "" {
		return nil
	}
	if !validHostname(name) {
		return fmt.Errorf("hostname %q refused: 1–63 of a-z, 0-9 and '-'", name)
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil && unix.ByteSliceToString(u.Nodename[:]) == name {
		return nil
	}
	if err := setHostname(name); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	return nil
}

// validHostname: what sandbox.Hostname makes, one DNS label.
func validHostname(name string) bool {
	if len(name) == 0 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' {
		return false
	}
	for _, r := range name {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

func setHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return err
	}
	_ = os.WriteFile("/etc/hostname", []byte(name+"\n"), 0o644)
	hosts := "127.0.0.1\tlocalhost\n127.0.1.1\t" + name + "\n"
	return os.WriteFile("/etc/hosts", []byte(hosts), 0o644)
}

// loopbackUp sets lo up; the kernel assigns 127.0.0.1 itself.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
