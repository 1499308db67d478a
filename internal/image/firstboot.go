package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// firstBootUser is the agent's default user in the builder VM (the agent
// needs one); the image never has it.
const (
	firstBootPort = "org.kosa8.agent" // the agent's default port name
	firstBootUser = "kosa8build"
	firstBootUID  = 64055
)

// firstBootShell installs the unpacked packages in the new root filesystem
// (the builder VM runs it chrooted there, portable.go). dpkg
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
dpkg --force-depends --force-confdef --force-confold --force-unsafe-io --install ./*.deb
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

// firstBootRun runs the first boot's script and reports its steps, and
// while dpkg installs the packages, how many it has unpacked and set up.
func firstBootRun(ctx context.Context, c *guest.Client, script string, progress func(string), count func(done, total int), logw io.Writer) error {
	conn, _, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, User: "root", Dir: "/"})
	if err != nil {
		return fmt.Errorf("start the package installation: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// Each step's start is logged with the time since the script began,
	// so that a slow build shows where its time went.
	start := time.Now()
	var d dpkgCount
	l := newLineLog(logw, func(line string) {
		if s := builderStep(line); s != "" {
			fmt.Fprintf(logw, "kosa8: builder VM: %s, at %s\n", s, time.Since(start).Round(time.Second))
			progress(s)
		}
		if phase, done, total, ok := d.line(line); ok {
			if phase != "" {
				progress(phase)
			}
			if count != nil {
				count(done, total)
			}
			if done == total || done%max(total/10, 1) == 0 {
				fmt.Fprintf(logw, "kosa8: builder VM: %s: %d of %d, at %s\n", d.phase, done, total, time.Since(start).Round(time.Second))
			}
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

// dpkgCount follows dpkg's output while it installs the packages: it
// unpacks each ("Unpacking NAME ..."), then sets each up ("Setting up NAME
// ..."). Only the lines' first words are read, and the counts stop at the
// number of packages the script announced, so a guest that prints such
// lines itself can move the count but show nothing of its own.
type dpkgCount struct {
	total, done int
	phase       string
}

// line takes one line of the build's output. ok: the count moved; phase,
// when set, is the new phase's progress line.
func (d *dpkgCount) line(line string) (phase string, done, total int, ok bool) {
	if n, isStep := strings.CutPrefix(line, "kosa8: step install "); isStep {
		if v, err := strconv.Atoi(n); err == nil && v > 0 && v < 1e6 {
			d.total, d.done, d.phase = v, 0, ""
		}
		return "", 0, 0, false
	}
	if d.total == 0 {
		return "", 0, 0, false
	}
	var next string
	switch {
	case strings.HasPrefix(line, "Unpacking "):
		next = "unpacking"
	case strings.HasPrefix(line, "Setting up "):
		next = "setting up"
	default:
		return "", 0, 0, false
	}
	if next != d.phase {
		d.phase, d.done = next, 0
		phase = fmt.Sprintf("installing %d packages in the guest: %s (under emulation: tens of minutes)", d.total, next)
	}
	if d.done < d.total {
		d.done++
	}
	return phase, d.done, d.total, true
}

// builderStep returns the progress line for a line the builder VM printed,
// or "". Anything in the guest can print "kosa8: step ..." (a maintainer
// script too), so only fixed text and a package count reach the progress
// line, never the guest's own words.
func builderStep(line string) string {
	step, ok := strings.CutPrefix(line, "kosa8: step ")
	if !ok {
		return ""
	}
	what, n, _ := strings.Cut(step, " ")
	if what == "install" {
		if n == "" || len(n) > 6 || strings.Trim(n, "0123456789") != "" {
			n = "the"
		}
		return "installing " + n + " packages in the guest (under emulation: tens of minutes)"
	}
	return map[string]string{
		"mkfs":      "making the root filesystem",
		"unpack":    "unpacking the packages' files",
		"configure": "configuring what is left",
		"clean":     "cleaning up",
		"shrink":    "checking and shrinking the root filesystem",
	}[what]
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
	if _, err := exec.LookPath("resize2fs"); err != nil {
		// A host without e2fsprogs (a Mac) keeps the filesystem's size:
		// the file is sparse, so only its apparent size is larger.
		fmt.Fprintf(logw, "kosa8: no e2fsck/resize2fs on this host: the image's filesystem is not checked or shrunk\n")
		return ext4Size(p)
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
	l := vmspec.ConsoleTail(p, n)
	if l == nil {
		return ""
	}
	return "\nlast console lines:\n" + strings.Join(l, "\n")
}
