package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// A foreign-architecture image (arm64 on an x86-64 host) is built in two
// stages, because nothing of that architecture runs on the host (no
// qemu-user, no binfmt_misc):
//
//  1. On the host, mmdebstrap's extract variant downloads the same package
//     set as a native build (minbase plus the recipe's packages) and unpacks
//     it; the extract hook takes the kernel out and writes rootfs.ext4 with
//     the downloaded packages still in /var/cache/apt/archives.
//  2. The image boots once, under emulation, with that root disk writable
//     and kosa8-agent as init, and installs those packages properly with
//     dpkg inside (maintainer scripts, alternatives, triggers), then drops
//     them. Every program the scripts call is already on the disk, unpacked
//     in stage 1, as in debootstrap's second stage.
//
// The result has the layout of a native build: the same kernel/ tree,
// rootfs.ext4 and manifest.

// firstBootUser is the agent's default user during the first boot (the
// agent needs one); it is removed before the image is frozen.
const (
	firstBootPort = "org.kosa8.agent" // the agent's default port name
	firstBootUser = "kosa8build"
	firstBootUID  = 64055
)

// firstBootShell installs the unpacked packages inside the guest. dpkg
// sees files it does not know yet on the disk, the same as its own, and
// replaces them; the packages' own conffiles are kept. Then apt is told
// which were installed only as dependencies, as apt-get install would have
// left them in a native build (there mmdebstrap installs the essential set
// and what it needs with dpkg, and the rest with apt-get): everything but
// that set, the required ones and requested.
func firstBootShell(requested []string) string {
	return `set -eu
export DEBIAN_FRONTEND=noninteractive DEBCONF_NONINTERACTIVE_SEEN=true LC_ALL=C.UTF-8
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd /var/cache/apt/archives
echo "kosa8: step install $(ls ./*.deb | wc -l)"
dpkg --force-depends --force-confdef --force-confold --install ./*.deb
echo "kosa8: step configure"
dpkg --configure -a
left=$(dpkg --audit)
if [ -n "$left" ]; then echo "$left" >&2; echo "kosa8: packages left unconfigured" >&2; exit 1; fi
keep=" apt ` + strings.Join(requested, " ") + ` "
ess=$(dpkg-query -W -f '${Package} ${Essential}\n' | awk '$2 == "yes" {print $1}')
keep="$keep $(apt-cache depends --recurse --installed --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances $ess | grep -v '^ \|<' | tr '\n' ' ') "
apt-mark auto $(dpkg-query -W -f '${Package} ${Priority}\n' | awk -v keep="$keep" '$2 != "required" && index(keep, " " $1 " ") == 0 {print $1}') >/dev/null
echo "kosa8: step clean"
rm -f /var/cache/apt/archives/*.deb
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/log/*.log /var/log/apt/* /tmp/* /var/tmp/*
userdel -r ` + firstBootUser + ` 2>/dev/null || true
groupdel ` + firstBootUser + ` 2>/dev/null || true
rm -f /etc/sudoers.d/kosa8 /etc/shadow-
# Backups that still name the build user; a conffile dpkg found unpacked.
for f in passwd group gshadow; do [ ! -e /etc/$f- ] || cp -p /etc/$f /etc/$f-; done
find /etc -name '*.dpkg-old' -delete
sync
`
}

// Deadlines of the first boot under emulation: on an x86-64 host with 2
// cores shared with two other VMs, the arm64 kernel reached the agent in
// 3-5 s under TCG, and installing 583 packages took 20-23 minutes
// (unpacking them about 15 of those).
const (
	firstBootTimeout    = 5 * time.Minute
	firstInstallTimeout = 75 * time.Minute
	firstStopTimeout    = 2 * time.Minute
)

// firstBoot boots the image whose kernel is k and root disk rootfs (raw
// ext4, written in place), runs firstBootShell (packages are the recipe's) as root, powers the guest
// off and checks and shrinks the filesystem. work holds the temporary
// initramfs and the console log.
func firstBoot(ctx context.Context, arch vmspec.Arch, packages []string, k Kernel, rootfs, work string, opts BuildOptions, progress func(string), logw io.Writer) (err error) {
	initrd := filepath.Join(work, "firstboot.cpio")
	if err := BuildInitramfs(initrd, opts.Agent, k, GuestModules); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if opts.NewDriver == nil {
		return fmt.Errorf("building a %s image on this host boots it once, and no VMM driver was given", arch)
	}
	drv, err := opts.NewDriver(arch, opts.Accel)
	if err != nil {
		return err
	}
	console := filepath.Join(work, "console.log")
	spec := &vmspec.Spec{
		Name: "image-firstboot", Arch: arch, CPUs: 1, MemoryMiB: 1024,
		Kernel: k.Image, Initrd: initrd,
		Cmdline: fmt.Sprintf("panic=-1 loglevel=4 kosa8.user=%s kosa8.uid=%d kosa8.gid=%d kosa8.hostname=kosa8-build",
			firstBootUser, firstBootUID, firstBootUID),
		ConsoleLog: console,
		AgentPort:  firstBootPort,
		Disks:      []vmspec.Disk{{ID: "root", Path: rootfs, Format: "raw"}},
	}
	progress(fmt.Sprintf("booting the %s image once to install its packages (%s; a few minutes)", arch, drv.Accel()))
	start := time.Now()
	bootCtx, cancel := context.WithTimeout(ctx, firstBootTimeout)
	defer cancel()
	m, err := drv.Start(bootCtx, spec, vmm.StartOptions{Stderr: logw})
	if err != nil {
		return err
	}
	defer func() {
		select {
		case <-m.Done():
		default:
			_ = m.Kill()
		}
		if err != nil {
			err = fmt.Errorf("%w%s", err, consoleLines(console, 15))
		}
	}()
	c, err := connect(bootCtx, m)
	if err != nil {
		return fmt.Errorf("the guest's agent did not answer within %s: %w", firstBootTimeout, err)
	}
	defer c.Close()
	fmt.Fprintf(logw, "kosa8: first boot: agent up after %s\n", time.Since(start).Round(time.Second))
	runCtx, cancelRun := context.WithTimeout(ctx, firstInstallTimeout)
	defer cancelRun()
	if err := firstBootRun(runCtx, c, firstBootShell(packages), progress, logw); err != nil {
		return err
	}
	fmt.Fprintf(logw, "kosa8: first boot: packages installed after %s\n", time.Since(start).Round(time.Second))
	stopCtx, cancelStop := context.WithTimeout(ctx, firstStopTimeout)
	defer cancelStop()
	_ = c.Poweroff(stopCtx) // the guest synced its disk: a kill below loses nothing
	if err := m.Wait(stopCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(logw, "kosa8: first boot: %v\n", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	progress("checking and shrinking the root filesystem")
	_, err = shrinkExt4(ctx, rootfs, logw)
	return err
}

// connect waits for the agent, or for QEMU to end first.
func connect(ctx context.Context, m vmm.Machine) (*guest.Client, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := guest.Connect(ctx, m.Agent())
	if err != nil {
		select {
		case <-m.Done():
			return nil, fmt.Errorf("the guest stopped before its agent answered: %w", m.Wait(context.Background()))
		default:
		}
	}
	return c, err
}

// firstBootRun runs the first boot's script and reports its steps.
func firstBootRun(ctx context.Context, c *guest.Client, script string, progress func(string), logw io.Writer) error {
	conn, _, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, User: "root", Dir: "/"})
	if err != nil {
		return fmt.Errorf("start the package installation: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	l := newLineLog(logw, func(line string) {
		if step, ok := strings.CutPrefix(line, "kosa8: step "); ok {
			what, n, _ := strings.Cut(step, " ")
			progress(map[string]string{
				"install":   "installing " + n + " packages in the guest (under emulation: tens of minutes)",
				"configure": "configuring what is left",
				"clean":     "cleaning up",
			}[what])
		}
	})
	st, err := guest.Pump(conn, guest.StdIO{Stdout: l, Stderr: l})
	last := l.Close()
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("package installation: %w", err)
	}
	if st.Code != 0 || st.Error != "" {
		return fmt.Errorf("package installation failed with exit status %d%s:\n%s", st.Code, st.Error, last)
	}
	return nil
}

// shrinkExt4 checks the filesystem in p and shrinks it, and the file, to
// its contents (each sandbox grows its disk on first boot), and returns
// the new size.
func shrinkExt4(ctx context.Context, p string, logw io.Writer) (int64, error) {
	run := func(name string, args ...string) error {
		b, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		logw.Write(b)
		// e2fsck exits 1 when it fixed something (a clean poweroff leaves
		// nothing to fix, but an orphan list is not an error).
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && name == "e2fsck" && ee.ExitCode() == 1 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(lastLines(string(b), 5)))
		}
		return nil
	}
	if err := run("e2fsck", "-f", "-y", p); err != nil {
		return 0, err
	}
	if err := run("resize2fs", "-M", p); err != nil {
		return 0, err
	}
	size, err := ext4Size(p)
	if err != nil {
		return 0, err
	}
	return size, os.Truncate(p, size)
}

// consoleLines returns the console log's last n lines for an error.
func consoleLines(p string, n int) string {
	b, err := os.ReadFile(p)
	if err != nil || len(b) == 0 {
		return ""
	}
	return "\nlast console lines:\n" + lastLines(string(b), n)
}
