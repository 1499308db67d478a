package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ulikunitz/xz"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/image/debian"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// The portable build needs nothing on the host but QEMU (a Mac has no
// apt, dpkg, mkfs or root), and is the same for every guest architecture:
//
//  1. On the host, in Go (package debian): the mirror's InRelease is
//     checked against the Debian archive keys built into kosa8, the package
//     index against the signed Release, each .deb against the index. The
//     package set is what mmdebstrap's minbase gives (Essential, Priority
//     required, apt) plus the recipe's packages, with their dependencies.
//  2. Still in Go: the kernel package is unpacked into kernel/ (vmlinuz and
//     its modules, uncompressed); every other package's files are written,
//     merged-/usr as Debian lays them out, into one tar with the .debs
//     themselves in var/cache/apt/archives.
//  3. A builder VM boots that kernel with an initramfs holding the agent
//     and a few packages' programs (sh, coreutils, tar, mount, e2fsprogs)
//     and two disks: the tar, read-only, and a blank raw file that becomes
//     rootfs.ext4. Inside, as root: mke2fs, unpack the tar, then dpkg
//     installs every package properly in a chroot of the new filesystem
//     (maintainer scripts, alternatives, triggers), as debootstrap's second
//     stage does; then e2fsck and resize2fs -M shrink it to its contents.
//
// Nothing of the build runs on the host but kosa8 and QEMU, so the host
// needs no root, subuids or Debian tools, and an arm64 image is built the
// same way on an x86-64 host (the builder VM is emulated) as on a Mac.

// builderPackages are the programs the builder VM runs: its initramfs holds
// them and what they depend on.
var builderPackages = []string{"dash", "coreutils", "tar", "mount", "e2fsprogs"}

// Deadlines of the builder VM. Installing the default recipe's ~580
// packages under TCG took 20-23 minutes for arm64 on a 2-core x86-64 host.
const (
	builderBootTimeout  = 5 * time.Minute
	builderRunTimeout   = 90 * time.Minute
	builderStopTimeout  = 2 * time.Minute
	builderMemoryMiB    = 1024
	builderTreeSerial   = "tree"
	maxKernelMemberSize = 256 << 20
)

// maxKernelTotal bounds the module tree unpackKernel writes (Debian's
// cloud kernel's is about 150 MiB uncompressed); a variable so that the
// test of the bound need not write gigabytes.
var maxKernelTotal int64 = 4 << 30

// buildPortable builds r's image into out (kernel/, rootfs.ext4) and returns
// the kernel version. work holds the temporary files; downloaded packages
// are kept in debs for the next build.
func buildPortable(ctx context.Context, r Recipe, debs, work, out string, opts BuildOptions, progress func(string), logw io.Writer) (string, error) {
	if opts.Agent == "" {
		return "", fmt.Errorf("building the %s image boots a builder VM: kosa8-agent for %s is needed ('make build')", r.Arch, r.Arch)
	}
	if opts.NewDriver == nil {
		return "", errors.New("building an image boots a builder VM, and no VMM driver was given")
	}
	var sources []debian.Source
	for _, l := range r.Mirrors {
		src, err := debian.ParseSource(l)
		if err != nil {
			return "", fmt.Errorf("mirror %q: %w", l, err)
		}
		sources = append(sources, src)
	}
	logf := func(msg string) { fmt.Fprintln(logw, "kosa8: "+msg) }
	progress(fmt.Sprintf("reading Debian %s's package index for %s (checked against the Debian archive keys)", r.Suite, r.Arch))
	ix, err := debian.Open(ctx, sources, debArch(r.Arch), debian.Options{CacheDir: debs, Log: logf})
	if err != nil {
		return "", err
	}
	kpkg, err := kernelPackage(ix, r.KernelPackage())
	if err != nil {
		return "", err
	}
	pkgs, err := ix.Resolve(append(append(ix.Required(), "apt"), r.Packages...))
	if err != nil {
		return "", fmt.Errorf("the image's packages: %w", err)
	}
	builder, err := ix.Resolve(builderPackages)
	if err != nil {
		return "", fmt.Errorf("the builder's packages: %w", err)
	}
	all := slices.Clone(pkgs)
	for _, p := range append(builder, kpkg) {
		if !slices.ContainsFunc(all, func(q *debian.Package) bool { return q.Name == p.Name }) {
			all = append(all, p)
		}
	}
	var total int64
	for _, p := range all {
		total += p.Size
	}
	progress(fmt.Sprintf("downloading %d packages (%d MiB; kept for the next build)", len(all), total>>20))
	last := time.Now()
	files, err := ix.Download(ctx, all, func(done, n int, bytes int64) {
		if opts.Count != nil {
			opts.Count(done, n)
		}
		if time.Since(last) > 5*time.Second || done == n {
			last = time.Now()
			fmt.Fprintf(logw, "kosa8: downloaded %d of %d packages\n", done, n)
		}
	})
	if err != nil {
		return "", err
	}
	file := map[string]string{}
	for i, p := range all {
		file[p.Name] = files[i]
	}

	progress("unpacking the kernel " + kpkg.Name)
	kver, err := unpackKernel(file[kpkg.Name], filepath.Join(out, "kernel"))
	if err != nil {
		return "", fmt.Errorf("kernel package %s: %w", kpkg.Name, err)
	}
	k := Kernel{Image: filepath.Join(out, "kernel", "vmlinuz"), Modules: filepath.Join(out, "kernel", kver), Version: kver}

	progress(fmt.Sprintf("writing the file tree of %d packages", len(pkgs)))
	tree := filepath.Join(work, "tree.tar")
	treeSize, err := writeTree(tree, r, pkgs, file)
	if err != nil {
		return "", fmt.Errorf("file tree: %w", err)
	}
	initrd := filepath.Join(work, "builder.cpio")
	var builderFiles []string
	for _, p := range builder {
		builderFiles = append(builderFiles, file[p.Name])
	}
	if err := buildInitramfs(initrd, opts.Agent, k, GuestModules, func(c *cpioWriter) error {
		return addBuilderFiles(c, r.Arch, builderFiles, firstBootShell(r.Packages))
	}); err != nil {
		return "", fmt.Errorf("builder initramfs: %w", err)
	}
	// Room for the tree and the .debs beside it while dpkg installs them;
	// the file is sparse, and shrunk to the filesystem's contents after.
	rootfs := filepath.Join(out, "rootfs.ext4")
	if err := makeSparse(rootfs, treeSize+treeSize/2+512<<20); err != nil {
		return "", err
	}
	if err := runBuilder(ctx, r.Arch, k, initrd, rootfs, tree, opts, progress, logw); err != nil {
		return "", err
	}
	size, err := ext4Size(rootfs)
	if err != nil {
		return "", fmt.Errorf("the builder's root filesystem: %w", err)
	}
	if err := os.Truncate(rootfs, size); err != nil {
		return "", err
	}
	return kver, nil
}

// kernelPackage finds the versioned kernel package behind the metapackage
// meta (linux-image-cloud-amd64 depends on linux-image-6.12.x-cloud-amd64).
func kernelPackage(ix *debian.Index, meta string) (*debian.Package, error) {
	m := ix.Lookup(meta)
	if m == nil {
		return nil, fmt.Errorf("the mirror has no kernel package %s", meta)
	}
	for _, group := range m.Depends {
		for _, d := range group {
			if strings.HasPrefix(d.Name, "linux-image-") && len(d.Name) > 12 && d.Name[12] >= '0' && d.Name[12] <= '9' {
				if p := ix.Lookup(d.Name); p != nil {
					return p, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no kernel package behind %s", meta)
}

// debPath returns where a .deb member lands on a merged-/usr system
// (bin/x is usr/bin/x), relative, or "" for the root itself. Names that
// climb out, are absolute or are not clean are refused.
func debPath(name string) (string, error) {
	p := strings.TrimPrefix(name, "./")
	p = strings.TrimSuffix(p, "/")
	if p == "" || p == "." {
		return "", nil
	}
	if !fs.ValidPath(p) {
		return "", fmt.Errorf("package member %q is not a clean relative path", name)
	}
	top, rest, _ := strings.Cut(p, "/")
	if slices.Contains(mergedDirs, top) {
		if rest == "" {
			return "", nil // the link to usr/ (base-files ships it too)
		}
		return path.Join("usr", top, rest), nil
	}
	return p, nil
}

// mergedDirs are the top-level directories that live under /usr in Debian
// since bookworm, reached through symlinks.
var mergedDirs = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// mergedLinks are the symlinks a merged-/usr root has for arch.
func mergedLinks(arch vmspec.Arch) []string {
	if arch == vmspec.AMD64 {
		return []string{"bin", "sbin", "lib", "lib64"}
	}
	return []string{"bin", "sbin", "lib"}
}

var kernelImageRE = regexp.MustCompile(`^boot/vmlinuz-([0-9][A-Za-z0-9.+_-]*)$`)

// unpackKernel writes the kernel package's vmlinuz to dir/vmlinuz and its
// modules, uncompressed, under dir/VERSION, and returns VERSION. dir must
// not exist: made here, it holds no link that a write could follow (the
// module tree's directories are made with MkdirAll, which follows them).
func unpackKernel(deb, dir string) (string, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	kver := ""
	left := maxKernelTotal
	err := debian.DebData(deb, func(h *tar.Header, r io.Reader) error {
		p, err := debPath(h.Name)
		if err != nil || p == "" {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		if h.Size > maxKernelMemberSize {
			return fmt.Errorf("%s: %d bytes", p, h.Size)
		}
		if m := kernelImageRE.FindStringSubmatch(p); m != nil {
			kver = m[1]
			return writeNew(filepath.Join(dir, "vmlinuz"), r)
		}
		rel, ok := strings.CutPrefix(p, "usr/lib/modules/")
		if !ok || !strings.Contains(rel, "/") {
			return nil
		}
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		switch {
		case strings.HasSuffix(rel, ".ko.xz"):
			xr, err := xz.NewReader(r)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			r, dst = io.LimitReader(xr, maxKernelMemberSize), strings.TrimSuffix(dst, ".xz")
		case strings.HasSuffix(rel, ".ko.zst"):
			return fmt.Errorf("%s: zstd-compressed modules are not supported", p)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		// An .ko.xz of a few KiB may unpack to maxKernelMemberSize: the
		// data.tar's own bound does not hold what is written here.
		n, err := writeNewMax(dst, r, left)
		if left -= n; err == nil && left < 0 {
			err = fmt.Errorf("the kernel's modules come to more than %d MiB", maxKernelTotal>>20)
		}
		return err
	})
	if err != nil {
		return "", err
	}
	if kver == "" {
		return "", errors.New("no boot/vmlinuz-VERSION in the package")
	}
	if fi, err := os.Stat(filepath.Join(dir, kver)); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("no modules for kernel %s in the package", kver)
	}
	return kver, writeNew(filepath.Join(dir, "version"), strings.NewReader(kver+"\n"))
}

// writeNew writes r to a new file p (never through a link there).
func writeNew(p string, r io.Reader) error {
	_, err := writeNewMax(p, r, -1)
	return err
}

// writeNewMax is writeNew of at most max+1 bytes (max < 0: no bound),
// returning how many were written: more than max means r had more.
func writeNewMax(p string, r io.Reader, max int64) (int64, error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	if max >= 0 {
		r = io.LimitReader(r, max+1)
	}
	n, err := io.Copy(f, r)
	if err != nil {
		f.Close()
		return n, err
	}
	return n, f.Close()
}

func makeSparse(p string, size int64) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeTree writes the image's file tree as a tar to dst: the merged-/usr
// links, dpkg's empty database, every package's files in order (a later
// package's file replaces an earlier one's, as the tar is unpacked), the
// .debs for dpkg to install, the network note and apt's sources. It
// returns the tar's size, padded for use as a raw disk.
func writeTree(dst string, r Recipe, pkgs []*debian.Package, file map[string]string) (int64, error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	now := time.Now().UTC().Truncate(time.Second)
	dirs := map[string]bool{}
	dir := func(p string, mode int64) error {
		if dirs[p] {
			return nil
		}
		dirs[p] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode, ModTime: now, Format: tar.FormatPAX})
	}
	mkdirs := func(p string) error {
		for _, d := range parents(p) {
			if err := dir(d, 0o755); err != nil {
				return err
			}
		}
		return nil
	}
	regular := func(p string, mode int64, data []byte) error {
		if err := mkdirs(p); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(data)), ModTime: now, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := dir("usr", 0o755); err != nil {
		return 0, err
	}
	for _, l := range mergedLinks(r.Arch) {
		if err := dir("usr/"+l, 0o755); err != nil {
			return 0, err
		}
		dirs[l] = true // a member naming the directory itself keeps the link
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: l, Linkname: "usr/" + l, Mode: 0o777, ModTime: now, Format: tar.FormatPAX}); err != nil {
			return 0, err
		}
	}
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/lib/dpkg/alternatives", "var/lib/dpkg/parts", "var/cache/apt/archives/partial"} {
		if err := mkdirs(d); err != nil {
			return 0, err
		}
		if err := dir(d, 0o755); err != nil {
			return 0, err
		}
	}
	for _, name := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := regular(name, 0o644, nil); err != nil {
			return 0, err
		}
	}
	for _, p := range pkgs {
		if err := debian.DebData(file[p.Name], func(h *tar.Header, rd io.Reader) error {
			name, err := debPath(h.Name)
			if err != nil || name == "" {
				return err
			}
			if err := mkdirs(name); err != nil {
				return err
			}
			if h.Typeflag == tar.TypeDir {
				// Written again when it exists: the package's mode and
				// owner win over the 0755 an earlier member implied.
				dirs[name] = true
			}
			nh := &tar.Header{Typeflag: h.Typeflag, Name: name, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid,
				Uname: h.Uname, Gname: h.Gname, ModTime: h.ModTime, Format: tar.FormatPAX}
			switch h.Typeflag {
			case tar.TypeDir:
				nh.Name += "/"
			case tar.TypeReg:
				nh.Size = h.Size
			case tar.TypeSymlink:
				nh.Linkname = h.Linkname
			case tar.TypeLink:
				if nh.Linkname, err = debPath(h.Linkname); err != nil || nh.Linkname == "" {
					return fmt.Errorf("hard link %q to %q", h.Name, h.Linkname)
				}
			default:
				return nil // no device nodes or fifos in a package
			}
			if err := tw.WriteHeader(nh); err != nil {
				return err
			}
			if h.Typeflag == tar.TypeReg {
				if _, err := io.CopyN(tw, rd, h.Size); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return 0, fmt.Errorf("%s: %w", p.Name, err)
		}
	}
	for _, p := range pkgs {
		if err := addFile(tw, "var/cache/apt/archives/"+filepath.Base(file[p.Name]), file[p.Name], now); err != nil {
			return 0, err
		}
	}
	motd := "case $- in *i*) [ -r /etc/motd ] && cat /etc/motd ;; esac\n"
	for _, e := range []struct {
		name string
		data string
	}{
		{"etc/kosa8/network.md", agent.NetworkNote},
		{"etc/motd", agent.NetworkNote},
		{"etc/profile.d/kosa8-motd.sh", motd},
		{"etc/apt/sources.list", strings.Join(r.Mirrors, "\n") + "\n"},
	} {
		if err := regular(e.name, 0o644, []byte(e.data)); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	// A raw disk is whole sectors; GNU tar reads records of 10 KiB.
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	if err := f.Truncate(size); err != nil {
		return 0, err
	}
	return size, f.Close()
}

func addFile(tw *tar.Writer, name, src string, now time.Time) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: fi.Size(), ModTime: now, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, fi.Size())
	return err
}

// maxBuilderFile bounds one file of the builder's initramfs (it is held in
// memory while written), maxBuilderTotal all of them, a hard link's copy
// included: every file is held for the hard links that may follow, and a
// hard link costs a tar header but writes its target's bytes again. The
// builder's programs and libraries are about 35 MiB; the initramfs has to
// fit in the builder VM's memory, so more could not boot anyway.
const (
	maxBuilderFile  = 64 << 20
	maxBuilderTotal = 512 << 20
)

// addBuilderFiles adds the builder packages' programs and libraries to the
// initramfs, merged-/usr, and the builder's scripts under kosa8/.
// Documentation, manuals and translations are left out.
func addBuilderFiles(c *cpioWriter, arch vmspec.Arch, debs []string, install string) error {
	c.Dir("usr", 0o755)
	for _, l := range mergedLinks(arch) {
		c.Dir("usr/"+l, 0o755)
		c.Symlink(l, "usr/"+l)
	}
	for _, d := range []string{"etc", "tmp", "mnt", "var", "var/tmp"} {
		c.Dir(d, 0o755)
	}
	c.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	c.File("etc/group", 0o644, []byte("root:x:0:\n"))
	content := map[string][]byte{} // for hard links
	var total int64
	for _, deb := range debs {
		if err := debian.DebData(deb, func(h *tar.Header, r io.Reader) error {
			p, err := debPath(h.Name)
			if err != nil || p == "" {
				return err
			}
			if strings.HasPrefix(p, "usr/share/doc") || strings.HasPrefix(p, "usr/share/man") || strings.HasPrefix(p, "usr/share/locale") {
				return nil
			}
			c.MkdirAll(p)
			switch h.Typeflag {
			case tar.TypeDir:
				c.Dir(p, fs.FileMode(h.Mode).Perm())
			case tar.TypeSymlink:
				c.Symlink(p, h.Linkname)
			case tar.TypeReg, tar.TypeLink:
				var data []byte
				if h.Typeflag == tar.TypeLink {
					t, err := debPath(h.Linkname)
					if err != nil {
						return err
					}
					var ok bool
					if data, ok = content[t]; !ok {
						// Not an empty file in its place: a program
						// missing its bytes fails far from the cause.
						return fmt.Errorf("hard link %s to %q, not a file of the package before it", p, h.Linkname)
					}
				} else {
					if h.Size > maxBuilderFile {
						return fmt.Errorf("%s: %d bytes", p, h.Size)
					}
					if data, err = io.ReadAll(io.LimitReader(r, h.Size)); err != nil {
						return err
					}
					content[p] = data
				}
				if total += int64(len(data)); total > maxBuilderTotal {
					return fmt.Errorf("%s: the builder's files come to more than %d MiB", p, maxBuilderTotal>>20)
				}
				c.File(p, fs.FileMode(h.Mode).Perm(), data)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(deb), err)
		}
	}
	if _, ok := content["usr/bin/sh"]; !ok {
		c.Symlink("usr/bin/sh", "dash") // dash's postinst makes it in a real system
	}
	c.Dir("kosa8", 0o755)
	c.File("kosa8/build.sh", 0o755, []byte(builderShell))
	c.File("kosa8/install.sh", 0o755, []byte(install))
	return nil
}

// builderShell makes the image inside the builder VM: the blank disk
// becomes ext4 holding the tree, whose packages are then installed in a
// chroot of it (install.sh, as a first boot of the image would), and the
// filesystem is checked and shrunk to its contents.
const builderShell = `set -eu
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
disk() {
  for d in /sys/block/vd*; do
    if [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ]; then echo "/dev/${d##*/}"; return; fi
  done
  echo "kosa8: no disk with serial $1" >&2; exit 1
}
root=$(disk ` + builderRootSerial + `)
tree=$(disk ` + builderTreeSerial + `)
echo "kosa8: step mkfs"
mke2fs -q -F -t ext4 -L kosa8-root -b 4096 -m 0 -E nodiscard "$root"
mount -t ext4 -o noatime "$root" /mnt
echo "kosa8: step unpack"
tar -x -p --numeric-owner -f "$tree" -C /mnt
for f in passwd group; do
  [ -e /mnt/etc/$f ] || cp /mnt/usr/share/base-passwd/$f.master /mnt/etc/$f
done
mkdir -p /mnt/proc /mnt/sys /mnt/dev /mnt/run /mnt/tmp
mount -t proc proc /mnt/proc
mount -t sysfs sysfs /mnt/sys
mount --rbind /dev /mnt/dev
mount -t tmpfs tmpfs /mnt/run
chroot /mnt /bin/sh -c "$(cat /kosa8/install.sh)"
umount -R /mnt
echo "kosa8: step shrink"
e2fsck -f -y "$root" || [ $? -eq 1 ]
resize2fs -M "$root"
sync
`

// builderRootSerial is the serial the builder gives the disk it formats.
const builderRootSerial = "root"

// runBuilder boots the builder VM and runs builderShell in it.
func runBuilder(ctx context.Context, arch vmspec.Arch, k Kernel, initrd, rootfs, tree string, opts BuildOptions, progress func(string), logw io.Writer) (err error) {
	drv, err := opts.NewDriver(arch, opts.Accel)
	if err != nil {
		return err
	}
	console := filepath.Join(filepath.Dir(initrd), "console.log")
	spec := &vmspec.Spec{
		Name: "image-builder", Arch: arch, CPUs: 1, MemoryMiB: builderMemoryMiB,
		Kernel: k.Image, Initrd: initrd,
		Cmdline:    fmt.Sprintf("panic=-1 loglevel=4 kosa8.root=initramfs kosa8.user=%s kosa8.uid=%d kosa8.gid=%d kosa8.hostname=kosa8-build", firstBootUser, firstBootUID, firstBootUID),
		ConsoleLog: console,
		AgentPort:  firstBootPort,
		Disks: []vmspec.Disk{
			{ID: builderRootSerial, Path: rootfs, Format: "raw", Scratch: true},
			{ID: builderTreeSerial, Path: tree, Format: "raw", ReadOnly: true},
		},
	}
	start := time.Now()
	m, c, err := bootBuilder(ctx, drv, spec, opts, progress, logw)
	if err != nil {
		return fmt.Errorf("%w%s", err, consoleLines(console, 15))
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
	defer c.Close()
	fmt.Fprintf(logw, "kosa8: builder VM: agent up after %s\n", time.Since(start).Round(time.Second))
	runCtx, cancelRun := context.WithTimeout(ctx, builderRunTimeout)
	defer cancelRun()
	if err := firstBootRun(runCtx, c, "exec /bin/sh /kosa8/build.sh", progress, opts.Count, logw); err != nil {
		return err
	}
	fmt.Fprintf(logw, "kosa8: builder VM: image built after %s\n", time.Since(start).Round(time.Second))
	stopCtx, cancelStop := context.WithTimeout(ctx, builderStopTimeout)
	defer cancelStop()
	_ = c.Poweroff(stopCtx) // the script synced the disk: a kill below loses nothing
	if err := m.Wait(stopCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(logw, "kosa8: builder VM: %v\n", err)
	}
	return ctx.Err()
}

// builderAccelTimeout bounds the builder's boot under KVM or HVF, as
// accelBootTimeout in the supervisor bounds a sandbox's: such a guest
// reaches its agent in about a second.
const builderAccelTimeout = 20 * time.Second

// bootBuilder starts the builder VM on drv and connects to its agent.
// Under an acceleration the user did not force, a boot that fails (QEMU
// exits, or the agent does not answer within builderAccelTimeout) is tried
// again under TCG, as a sandbox's first boot is: some nested,
// paravirtualized hosts have a /dev/kvm that passes the probe and cannot
// boot Debian's kernel. If TCG works the failure is recorded, so later
// starts in this boot of the host go straight to TCG.
func bootBuilder(ctx context.Context, drv vmm.Driver, spec *vmspec.Spec, opts BuildOptions, progress func(string), logw io.Writer) (vmm.Machine, *guest.Client, error) {
	boot := func(drv vmm.Driver, timeout time.Duration) (vmm.Machine, *guest.Client, error) {
		progress(fmt.Sprintf("booting the builder VM (%s %s)", spec.Arch, drv.Accel()))
		bootCtx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		m, err := drv.Start(bootCtx, spec, vmm.StartOptions{Stderr: logw})
		if err != nil {
			return nil, nil, err
		}
		c, err := connect(bootCtx, m)
		if err != nil {
			_ = m.Kill()
			return nil, nil, fmt.Errorf("the builder VM's agent did not answer within %s: %w", timeout, err)
		}
		return m, c, nil
	}
	tried := drv.Accel()
	if tried == vmm.TCG {
		return boot(drv, builderBootTimeout)
	}
	m, c, err := boot(drv, builderAccelTimeout)
	if err == nil || ctx.Err() != nil {
		return m, c, err
	}
	if opts.Accel != "" {
		return nil, nil, fmt.Errorf("booting the builder VM under %s failed: %w\nkosa8 was asked for %s (KOSA8_ACCEL); to build under emulation instead, set KOSA8_ACCEL=tcg", tried, err, tried)
	}
	fmt.Fprintf(logw, "kosa8: builder VM: %s failed to boot it (%v): trying tcg\n", tried, err)
	// Recorded at once, not once the TCG boot has worked (minutes under
	// emulation): meanwhile 'kosa8 doctor' and every start would still
	// take the accelerator for usable. Forgotten again if TCG fails too
	// (then something else is wrong, not the accelerator).
	r, recorder := drv.(vmm.FailureRecorder)
	if recorder {
		if rerr := r.RecordFailure(tried, fmt.Sprintf("%s failed to boot the image builder: %v", tried, err)); rerr != nil {
			fmt.Fprintf(logw, "kosa8: record the accelerator's failure: %v\n", rerr)
		}
	}
	forget := func() {
		if f, ok := drv.(vmm.FailureForgetter); recorder && ok {
			_ = f.ForgetFailure(tried)
		}
	}
	tcg, derr := opts.NewDriver(spec.Arch, vmm.TCG)
	if derr != nil {
		forget()
		return nil, nil, errors.Join(err, derr)
	}
	if spec.ConsoleLog != "" {
		_ = os.Truncate(spec.ConsoleLog, 0)
	}
	m, c, terr := boot(tcg, builderBootTimeout)
	if terr != nil {
		forget()
		return nil, nil, fmt.Errorf("booting the builder VM under %s failed (%v), and under tcg too: %w", tried, err, terr)
	}
	return m, c, nil
}
