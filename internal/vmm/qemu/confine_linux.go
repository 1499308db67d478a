package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// QEMU is confined on Linux in two layers, each where the host allows it:
//
//   - Run by root, QEMU gets a uid and gid of its own (confineIDBase plus
//     the supervisor's pid: one per sandbox, so that QEMUs cannot signal or
//     trace each other or anything else; and a QEMU started while another
//     of the supervisor may still run gets the other of the pid's uid and
//     its twin, a bit above pid_max (twins.go), so that the QEMU a rewind
//     starts while the old one still runs, on layers already handed to it,
//     is out of the old one's reach), no supplementary group but
//     /dev/kvm's, and one capability, CAP_DAC_READ_SEARCH, so that it can
//     read its image and frozen disk layers under root's private home. What
//     it writes (the RAM file, the active disk layers, the console log, the
//     directory a checkpoint's new layers go to) is chowned to it.
//   - For every user: no_new_privs and a Landlock domain in which QEMU may
//     read and execute the system (/usr, the loader's cache), read its
//     image, kernel and disk layers, write only its own files, /dev/null
//     and /dev/kvm, and read /dev/urandom; where the kernel's Landlock has
//     them, no TCP at all (QEMU's sockets are all inherited descriptors),
//     and no signal or abstract unix socket outside its domain.
//
// no_new_privs and the Landlock domain are put on the OS thread that
// forks QEMU (Start keeps it for QEMU's whole life and Go runs nothing
// else on it), and the child inherits them.

// confineIDBase starts the uids and gids QEMU runs as under root: far
// from regular users (1000+) and the usual subordinate ranges (100000+,
// 65536 each), below 2^31.
const confineIDBase = 0x7a000000

type confinePlan struct {
	uid, gid int // -1: QEMU keeps the user's
	groups   []uint32
	ruleset  int // Landlock ruleset descriptor, -1: none
	abi      int
	// rwFiles are what QEMU writes: chowned to it under root. rwDirs are
	// where they live: the supervisor's (root's) own, QEMU reads them
	// (CAP_DAC_READ_SEARCH) and creates nothing there.
	rwFiles, rwDirs []string
}

// landlockABI is the kernel's Landlock version, 0 without Landlock.
func landlockABI() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0
	}
	return int(v)
}

// Landlock rights, as sets.
const (
	llFileRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	llRead  = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	llExec  = llRead | unix.LANDLOCK_ACCESS_FS_EXECUTE
	llWrite = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE
)

// llHandled is every filesystem right the kernel's Landlock version knows:
// all of them are denied but where a rule allows them.
func llHandled(abi int) uint64 {
	h := uint64(0x1fff) // version 1: EXECUTE … MAKE_SYM
	if abi >= 2 {
		h |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		h |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 5 {
		h |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	return h
}

// confineTwin sets the twin uid apart (see above): above
// the largest pid Linux hands out (2^22), and with confineIDBase still
// below 2^31.
const confineTwin = 1 << 22

// runsAsOwnUID tells whether QEMU confined by c runs as a uid of its own
// (twins.go picks which).
func runsAsOwnUID(c *Confinement) bool { return c != nil && os.Geteuid() == 0 }

// planConfinement decides how QEMU for spec is confined and prepares the
// Landlock ruleset; twin (0 or 1) is the start's uid slot (twins.go). A
// nil c: not confined.
func planConfinement(c *Confinement, binary string, ram *os.File, ramReadOnly bool, spec *vmspec.Spec, accel vmm.Accel, twin int) (*confinePlan, error) {
	if c == nil {
		return nil, nil
	}
	p := &confinePlan{uid: -1, gid: -1, ruleset: -1}
	if os.Geteuid() == 0 {
		id := confineIDBase + os.Getpid() + (twin&1)*confineTwin
		p.uid, p.gid = id, id
		if accel == vmm.KVM {
			var st unix.Stat_t
			switch {
			case unix.Stat("/dev/kvm", &st) != nil:
			case st.Mode&0o006 == 0o006:
			case st.Mode&0o060 == 0o060 && st.Gid != 0:
				p.groups = []uint32{st.Gid}
			default:
				// Only root may open /dev/kvm here: QEMU keeps root's uid
				// (Landlock still applies).
				p.uid, p.gid = -1, -1
			}
		}
	}
	for _, d := range spec.Disks {
		if !d.ReadOnly {
			p.rwFiles = append(p.rwFiles, d.Path)
		}
	}
	for _, dir := range c.ReadWrite {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		p.rwDirs = append(p.rwDirs, dir)
	}
	p.abi = landlockABI()
	if p.abi <= 0 {
		return p, nil
	}
	if err := p.buildRuleset(c, binary, ram, ramReadOnly, spec, accel); err != nil {
		p.close()
		return nil, fmt.Errorf("confine QEMU (Landlock): %w", err)
	}
	return p, nil
}

func (p *confinePlan) buildRuleset(c *Confinement, binary string, ram *os.File, ramReadOnly bool, spec *vmspec.Spec, accel vmm.Accel) error {
	handled := llHandled(p.abi)
	attr := unix.LandlockRulesetAttr{Handled_access_fs: handled}
	if p.abi >= 4 {
		attr.Handled_access_net = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
	}
	if p.abi >= 6 {
		attr.Scoped = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
	}
	// The first three fields: what every version after 6 reads; older
	// ones accept the longer struct as long as what they do not know is 0.
	fd, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), 24, 0)
	if e != 0 {
		return fmt.Errorf("create ruleset: %w", e)
	}
	p.ruleset = int(fd)
	// follow: system paths may be links (/lib -> usr/lib); the sandbox's
	// own are never followed.
	add := func(path string, access uint64, follow, optional bool) error {
		flags := unix.O_PATH | unix.O_CLOEXEC
		if !follow {
			flags |= unix.O_NOFOLLOW
		}
		pfd, err := unix.Open(path, flags, 0)
		if err != nil {
			if optional && errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		defer unix.Close(pfd)
		var st unix.Stat_t
		if err := unix.Fstat(pfd, &st); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFREG, unix.S_IFCHR:
			access &= llFileRights
		default:
			return fmt.Errorf("%s: not a file or directory", path)
		}
		rule := unix.LandlockPathBeneathAttr{Allowed_access: access & handled, Parent_fd: int32(pfd)}
		if _, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(p.ruleset), unix.LANDLOCK_RULE_PATH_BENEATH,
			uintptr(unsafe.Pointer(&rule)), 0, 0, 0); e != 0 {
			return fmt.Errorf("rule for %s: %w", path, e)
		}
		return nil
	}
	system := []string{"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache"}
	// QEMU installed elsewhere (KOSA8_QEMU, e.g. /opt/qemu10/usr/bin): its
	// whole prefix, where its libraries and data files live beside it.
	if real, err := filepath.EvalSymlinks(binary); err == nil {
		system = append(system, filepath.Dir(real), filepath.Dir(filepath.Dir(real)))
	}
	for _, path := range system {
		if err := add(path, llExec, true, true); err != nil {
			return err
		}
	}
	ro := append([]string{spec.Kernel, spec.Initrd}, c.ReadOnly...)
	for _, d := range spec.Disks {
		if d.ReadOnly {
			ro = append(ro, d.Path)
		}
	}
	for _, path := range ro {
		if path == "" {
			continue
		}
		if err := add(path, llRead, true, false); err != nil {
			return err
		}
	}
	for _, path := range p.rwFiles {
		if err := add(path, llWrite, false, false); err != nil {
			return err
		}
	}
	for _, dir := range p.rwDirs {
		if err := add(dir, llRead|llWrite, false, false); err != nil {
			return err
		}
	}
	// The RAM file, which QEMU opens again through /proc/self/fd: that
	// file alone, by its inode (it is unlinked), not the folder it was
	// made in, which every sandbox of the user shares: there another's
	// new RAM file has a guessable name until it is unlinked. A template
	// (a checkpoint's RAM that forks map copy-on-write) is read only.
	ramAccess := uint64(llWrite)
	if ramReadOnly {
		ramAccess = llRead
	}
	if err := add(fdPath(ram), ramAccess, true, false); err != nil {
		return err
	}
	if err := add("/dev/null", llWrite, true, false); err != nil {
		return err
	}
	if err := add("/dev/urandom", unix.LANDLOCK_ACCESS_FS_READ_FILE, true, false); err != nil {
		return err
	}
	// Without a /dev/kvm there is nothing to allow: QEMU then fails with
	// its own message ("Could not access KVM kernel module"), which the
	// fallback to TCG reads, rather than with ours.
	if accel == vmm.KVM && unix.Access("/dev/kvm", unix.F_OK) == nil {
		if err := add("/dev/kvm", llWrite|unix.LANDLOCK_ACCESS_FS_IOCTL_DEV, true, false); err != nil {
			return err
		}
	}
	return nil
}

// prepare hands QEMU what it writes, when it runs as its own uid: not a
// RAM file it only reads (a template: a checkpoint's, which other
// machines map too), which it reads through CAP_DAC_READ_SEARCH.
func (p *confinePlan) prepare(ram *os.File, ramReadOnly bool) error {
	if p == nil || p.uid < 0 {
		return nil
	}
	if !ramReadOnly {
		if err := ram.Chown(p.uid, p.gid); err != nil {
			return fmt.Errorf("hand the RAM file to QEMU's uid: %w", err)
		}
	}
	for _, path := range p.rwFiles {
		if err := p.handOver(path); err != nil {
			return err
		}
	}
	// Older kosa8 handed QEMU the folder too: taken back.
	for _, dir := range p.rwDirs {
		if err := unix.Fchownat(unix.AT_FDCWD, dir, os.Geteuid(), os.Getegid(), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("take %s back from QEMU's uid: %w", dir, err)
		}
	}
	return nil
}

// handOver gives path, a file QEMU writes, to QEMU's uid when it runs as
// its own; never through a symlink.
func (p *confinePlan) handOver(path string) error {
	if p == nil || p.uid < 0 {
		return nil
	}
	if err := unix.Fchownat(unix.AT_FDCWD, path, p.uid, p.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("hand %s to QEMU's uid: %w", path, err)
	}
	return nil
}

// apply sets QEMU's credentials on its process attributes.
func (p *confinePlan) apply(attr *syscall.SysProcAttr) {
	if p == nil || p.uid < 0 {
		return
	}
	attr.Credential = &syscall.Credential{Uid: uint32(p.uid), Gid: uint32(p.gid), Groups: p.groups}
	attr.AmbientCaps = []uintptr{unix.CAP_DAC_READ_SEARCH}
}

// enterThread puts no_new_privs and the Landlock domain on the calling OS
// thread, which must be locked and must fork QEMU and nothing else.
func (p *confinePlan) enterThread() error {
	if p == nil {
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if p.ruleset < 0 {
		return nil
	}
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(p.ruleset), 0, 0); e != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", e)
	}
	return nil
}

func (p *confinePlan) close() {
	if p != nil && p.ruleset >= 0 {
		unix.Close(p.ruleset)
		p.ruleset = -1
	}
}

// String says how QEMU is confined, for the log and status.
func (p *confinePlan) String() string {
	if p == nil {
		return "none"
	}
	var parts []string
	if p.uid >= 0 {
		parts = append(parts, fmt.Sprintf("uid %d", p.uid))
	}
	parts = append(parts, "no_new_privs")
	if p.abi > 0 {
		parts = append(parts, fmt.Sprintf("landlock v%d", p.abi))
	}
	return strings.Join(parts, ", ")
}
