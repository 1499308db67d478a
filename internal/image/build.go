package image

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// BuildOptions control a build.
type BuildOptions struct {
	// Progress is told each step as it starts (one short line).
	Progress func(step string)
	// Count, when set, is told how far a step with a count has come (the
	// packages downloaded, then unpacked and set up in the builder VM).
	Count func(done, total int)
	// Waiting, when set, is called when another build of this image holds
	// its lock, and its result once this one has the lock: the caller shows
	// the wait (else Progress is told).
	Waiting func() (stop func())
	// Log receives everything the build tools print; LogPath names it,
	// for whoever finds the build under way (Store.BuildingNow).
	Log     io.Writer
	LogPath string
	// Rebuild builds even when the image exists.
	Rebuild bool
	// Agent is kosa8-agent for the image's architecture. A build for an
	// architecture other than the host's needs it: that image's packages
	// are installed in a first boot of the image itself (firstboot.go).
	Agent string
	// Accel forces the first boot's acceleration (empty: the best there
	// is; a foreign guest is always emulated).
	Accel vmm.Accel
	// NewDriver makes the VMM driver of the first boot (the caller names
	// the VMM: this package does not, as the supervisor does not).
	NewDriver func(arch vmspec.Arch, accel vmm.Accel) (vmm.Driver, error)
}

// hookScript runs inside mmdebstrap's customize stage with the finished
// chroot as $1. It unpacks the kernel package without installing it (no
// initramfs-tools run, no bootloader), drops apt's caches and writes the
// root filesystem image. mkfs.ext4 -d copies a plain bind mount of the
// chroot: mmdebstrap has /proc, /sys and /dev mounted inside it, and a
// non-recursive bind leaves them out.
const hookScript = hookHead + `chroot "$root" sh -eu -c '
  pkg=$(apt-cache depends "$0" | awk "/Depends: linux-image-[0-9]/{print \$2; exit}")
  if [ -z "$pkg" ]; then echo "kosa8: no kernel package behind $0" >&2; exit 1; fi
  echo "kosa8: kernel package $pkg"
  mkdir -p /var/tmp/kosa8-kernel && cd /var/tmp/kosa8-kernel
  apt-get download -q -o APT::Sandbox::User=root "$pkg"
  dpkg-deb -x ./*.deb x
' "$kpkg"
` + hookKernel + hookNote + `echo "kosa8: step clean"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/log/*.log
` + hookRootFS

const hookHead = `#!/bin/sh
set -eu
root="$1"
out="$KOSA8_IMAGE_OUT"
kpkg="$KOSA8_KERNEL_PACKAGE"
echo "kosa8: step kernel"
`

// hookKernel copies the kernel unpacked under $root/var/tmp/kosa8-kernel/x.
const hookKernel = `k="$root/var/tmp/kosa8-kernel/x"
mkdir -p "$out/kernel"
cp "$k"/boot/vmlinuz-* "$out/kernel/vmlinuz"
# Debian 13 ships the module tree under usr/ (merged /usr).
mods="$k/lib/modules"
[ -d "$mods" ] || mods="$k/usr/lib/modules"
ls "$mods" > "$out/kernel/version"
cp -a "$mods"/* "$out/kernel/"
# Debian 13 ships modules compressed; the initramfs builder reads their
# .modinfo and the agent loads them with finit_module, so unpack them here.
find "$out/kernel" -name '*.ko.xz' -exec xz -d {} +
find "$out/kernel" -name '*.ko.zst' -exec zstd -q -d --rm {} +
rm -rf "$root/var/tmp/kosa8-kernel"
`

// hookNote writes the network note: an agent refused a connection reads
// why, and what to tell its user (the presets point their agents' memory
// files at it too).
const hookNote = `mkdir -p "$root/etc/kosa8" "$root/etc/profile.d"
printf '%s' "$KOSA8_NETWORK_NOTE" > "$root/etc/kosa8/network.md"
cp "$root/etc/kosa8/network.md" "$root/etc/motd"
printf '%s\n' 'case $- in *i*) [ -r /etc/motd ] && cat /etc/motd ;; esac' > "$root/etc/profile.d/kosa8-motd.sh"
`

const hookRootFS = `echo "kosa8: step rootfs"
mnt=$(mktemp -d)
mount --bind "$root" "$mnt"
size=$(du -sxk "$mnt" | cut -f1)
size=$(( size + size / 4 + 131072 ))
mkfs.ext4 -q -F -L kosa8-root -b 4096 -m 0 -d "$mnt" "$out/rootfs.ext4" "${size}k"
umount "$mnt"
rmdir "$mnt"
`

// Tools lists the host programs a build needs, with the Debian package of each.
var Tools = map[string]string{
	"mmdebstrap": "mmdebstrap",
	"mkfs.ext4":  "e2fsprogs",
	"dpkg-deb":   "dpkg",
	"gpg":        "gpg", // mmdebstrap reads the archive keyring with it
	"xz":         "xz-utils",
	"zstd":       "zstd", // the kernel's modules come compressed with one of them
}

// MissingTools returns the packages to install for the build tools not found.
func MissingTools() []string {
	var pkgs []string
	for tool, pkg := range Tools {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat(filepath.Join("/sbin", tool)); err == nil {
				continue
			}
			pkgs = append(pkgs, pkg)
		}
	}
	return pkgs
}

// Build builds r's image unless it exists, and returns it.
func (s Store) Build(ctx context.Context, r Recipe, opts BuildOptions) (*Image, error) {
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	if !opts.Rebuild {
		if img, err := s.Lookup(r); err == nil {
			return img, nil
		}
	}
	method, err := Method(r.Arch)
	if err != nil {
		return nil, err
	}
	if missing := MissingTools(); method == MethodHostTools && len(missing) > 0 {
		return nil, fmt.Errorf("building the guest image with %s=%s needs %s: run 'kosa8 setup' or apt-get install %s (or unset it: the default build needs only QEMU)",
			MethodEnv, MethodHostTools, strings.Join(missing, ", "), strings.Join(missing, " "))
	}
	archDir := s.archDir(r.Arch)
	if err := os.MkdirAll(archDir, 0o755); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(archDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		stop := func() {}
		if opts.Waiting != nil {
			stop = opts.Waiting()
		} else {
			progress("waiting for another image build to finish")
		}
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX)
		stop()
		if err != nil {
			return nil, err
		}
	}
	recordBuilding(lock, opts.LogPath)
	if !opts.Rebuild {
		if img, err := s.Lookup(r); err == nil {
			return img, nil // built while we waited
		}
	}
	sweepBuilds(archDir)

	work, err := os.MkdirTemp(archDir, ".build-"+r.Key()+"-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(work)
		}
	}()
	if method == MethodPortable {
		out := filepath.Join(work, "out")
		if err := os.Mkdir(out, 0o755); err != nil {
			return nil, err
		}
		start := time.Now()
		kver, err := buildPortable(ctx, r, filepath.Join(archDir, "debs"), work, out, opts, progress, logw)
		if err != nil {
			return nil, fmt.Errorf("building the %s image after %s: %w", r.Arch, time.Since(start).Round(time.Second), err)
		}
		if err := s.finish(r, archDir, out, kver, start, progress); err != nil {
			return nil, err
		}
		// Read by 'bench image' as the local build's figure.
		fmt.Fprintf(logw, "kosa8: image ready in %s (%s build)\n", time.Since(start).Round(time.Second), method)
		ok = true
		os.RemoveAll(work)
		return s.Lookup(r)
	}
	hook := filepath.Join(work, "hook.sh")
	if err := os.WriteFile(hook, []byte(hookScript), 0o755); err != nil {
		return nil, err
	}
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, err
	}
	mode := "root"
	if os.Geteuid() != 0 {
		mode = "unshare"
	}
	args := []string{"--mode=" + mode, "--format=null", "--architectures=" + debArch(r.Arch),
		"--variant=minbase", "--include=" + strings.Join(r.Packages, ","), "--customize-hook=" + hook}
	args = append(args, r.Suite, "/dev/null")
	args = append(args, r.Mirrors...)
	progress(fmt.Sprintf("bootstrapping Debian %s for %s (%s mode; about 2 minutes)", r.Suite, r.Arch, mode))
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = append(os.Environ(), "KOSA8_IMAGE_OUT="+out, "KOSA8_KERNEL_PACKAGE="+r.KernelPackage(),
		"KOSA8_NETWORK_NOTE="+agent.NetworkNote)
	start := time.Now()
	if err := runLogged(cmd, logw, func(line string) {
		if step, ok := strings.CutPrefix(line, "kosa8: step "); ok {
			progress(map[string]string{"kernel": "unpacking the kernel", "clean": "cleaning apt caches", "rootfs": "writing the root filesystem image"}[step])
		} else if msg, ok := strings.CutPrefix(line, "I: "); ok && isPhase(msg) {
			progress(strings.TrimSuffix(msg, "..."))
		}
	}); err != nil {
		return nil, fmt.Errorf("mmdebstrap failed after %s: %w", time.Since(start).Round(time.Second), err)
	}
	kv, err := os.ReadFile(filepath.Join(out, "kernel", "version"))
	if err != nil {
		return nil, fmt.Errorf("kernel version: %w", err)
	}
	kver := strings.TrimSpace(string(kv))
	if kver == "" || strings.ContainsAny(kver, "/\n") {
		return nil, fmt.Errorf("unexpected kernel module directories %q", kv)
	}
	if err := s.finish(r, archDir, out, kver, start, progress); err != nil {
		return nil, err
	}
	fmt.Fprintf(logw, "kosa8: image ready in %s (%s build)\n", time.Since(start).Round(time.Second), method)
	ok = true
	os.RemoveAll(work)
	return s.Lookup(r)
}

// finish checks the built image in out (its kernel's modules must hold
// what the initramfs needs), freezes its root disk and installs it.
func (s Store) finish(r Recipe, archDir, out, kver string, start time.Time, progress func(string)) error {
	tree, err := loadModuleTree(os.DirFS(filepath.Join(out, "kernel", kver)))
	if err != nil {
		return err
	}
	if _, err := tree.resolve(GuestModules); err != nil {
		return err
	}
	rootfs := filepath.Join(out, "rootfs.ext4")
	st, err := os.Stat(rootfs)
	if err != nil {
		return err
	}
	_ = os.Chmod(rootfs, 0o444) // shared by every sandbox: nothing may write it
	m := Manifest{Key: r.Key(), Recipe: r, KernelVersion: kver, Built: time.Now().UTC(), RootFSBytes: st.Size()}
	if _, err := install(out, archDir, m); err != nil {
		return err
	}
	progress(fmt.Sprintf("image ready in %s", time.Since(start).Round(time.Second)))
	return nil
}

// How an image is built.
const (
	// MethodPortable builds in a builder VM from packages kosa8 fetches
	// and checks itself (portable.go): the host needs only QEMU.
	MethodPortable = "portable"
	// MethodHostTools builds with the host's mmdebstrap (root or subuids,
	// Linux, the host's own architecture only).
	MethodHostTools = "mmdebstrap"
	// MethodEnv chooses one; the default is MethodPortable.
	MethodEnv = "KOSA8_IMAGE_BUILDER"
)

// Method returns how an image for a is built here.
func Method(a vmspec.Arch) (string, error) {
	switch m := os.Getenv(MethodEnv); m {
	case "", MethodPortable:
		return MethodPortable, nil
	case MethodHostTools:
		if Foreign(a) || runtime.GOOS != "linux" {
			return "", fmt.Errorf("%s=%s builds only the host's own architecture on Linux: unset it to build the %s image", MethodEnv, m, a)
		}
		return m, nil
	default:
		return "", fmt.Errorf("%s=%q: use %q (the default, needs only QEMU) or %q (the host's mmdebstrap)", MethodEnv, m, MethodPortable, MethodHostTools)
	}
}

func debArch(a vmspec.Arch) string { return string(a) } // Go and Debian agree for amd64 and arm64

// Foreign reports whether an image for a cannot be built by running its
// programs on this host, and so is finished in a first boot of its own.
func Foreign(a vmspec.Arch) bool { return a != vmspec.HostArch() }

func isPhase(msg string) bool {
	for _, p := range []string{"downloading packages", "extracting archives", "installing essential", "installing remaining", "running apt-get update", "cleaning"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// runLogged runs cmd with its output copied to log, line by line to onLine.
// On failure the error carries the last lines.
func runLogged(cmd *exec.Cmd, log io.Writer, onLine func(string)) error {
	l := newLineLog(log, onLine)
	cmd.Stdout, cmd.Stderr = l, l
	err := cmd.Run()
	last := l.Close()
	if err != nil {
		return fmt.Errorf("%w\n%s", err, last)
	}
	return nil
}

// lineLog copies what is written to it to a log, each line to onLine, and
// keeps the last lines for an error.
type lineLog struct {
	pw   *io.PipeWriter
	done chan struct{}
	last []string
}

func newLineLog(log io.Writer, onLine func(string)) *lineLog {
	pr, pw := io.Pipe()
	l := &lineLog{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, line)
			onLine(line)
			l.last = append(l.last, vmspec.ClipLine(line))
			if len(l.last) > 15 {
				l.last = l.last[1:]
			}
		}
		io.Copy(io.Discard, pr)
	}()
	return l
}

func (l *lineLog) Write(b []byte) (int, error) { return l.pw.Write(b) }

// Close ends the log and returns its last lines.
func (l *lineLog) Close() string {
	l.pw.Close()
	<-l.done
	return strings.Join(l.last, "\n")
}

// sweepBuilds removes build directories a killed build left behind.
func sweepBuilds(archDir string) {
	dirs, _ := filepath.Glob(filepath.Join(archDir, ".build-*"))
	for _, d := range dirs {
		_ = os.RemoveAll(d) // we hold the lock: no build is running
	}
}

// install writes m as out's manifest and moves out into archDir under a
// new name, returning it. A new directory per build: sandboxes whose disks
// sit on an older build of the same recipe keep it until 'kosa8 image
// prune'.
func install(out, archDir string, m Manifest) (string, error) {
	mb, _ := json.MarshalIndent(m, "", "  ")
	if err := writeFileAtomic(filepath.Join(out, "manifest.json"), 0o644, func(w io.Writer) error {
		_, err := w.Write(mb)
		return err
	}); err != nil {
		return "", err
	}
	dst := filepath.Join(archDir, m.Key+"-"+time.Now().UTC().Format("20060102T150405"))
	if err := os.Rename(out, dst); err != nil {
		return "", fmt.Errorf("install image: %w", err)
	}
	return dst, nil
}
