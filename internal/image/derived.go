package image

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/vmm"
)

// Derived images: a base image plus a recipe (Debian packages, setup lines,
// an agent preset's install line), named by the recipe's hash, built once
// and shared read-only like the base.
//
//	CACHE/images/ARCH/d-KEY-TIME/     one build of derived recipe KEY
//	    manifest.json                 written last; Derived names the recipe and the base
//	    kernel/                       hard links to the base's kernel
//	    rootfs.ext4                   the build sandbox's root disk, flattened and shrunk
//	    build.log                     everything the build printed
//
// The build itself runs in a sandbox (see cmd/kosa8); this file holds the
// recipe, its key, and turning the build sandbox's disk into an image.

// DerivedRecipe is what a derived image adds to its base.
type DerivedRecipe struct {
	// Base is the key of the base image's recipe.
	Base string `json:"base"`
	// Packages are Debian packages, installed with apt-get.
	Packages []string `json:"packages,omitempty"`
	// Setup lines run in order, as root, in bash with -e -o pipefail.
	Setup []string `json:"setup,omitempty"`
	// Hosts are the only hosts the build may reach (besides Debian's
	// mirror when Packages is set).
	Hosts []string `json:"hosts,omitempty"`
	// Label says what it is for, in listings ("claude", "project foo").
	Label string `json:"label,omitempty"`
}

// DockerPackages are what a sandbox made with --docker adds to its image:
// Debian's Docker engine (dockerd, containerd, runc, iptables), its CLI and Compose
// v2 (the docker compose plugin). The engine is started by kosa8's agent,
// never by the image.
var DockerPackages = []string{"docker.io", "docker-cli", "docker-compose"}

var debPackageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?$`)

// Validate checks the package names (they go on apt-get's command line)
// and bounds the rest.
func (d DerivedRecipe) Validate() error {
	for _, p := range d.Packages {
		if !debPackageRE.MatchString(p) {
			return fmt.Errorf("image package %q is not a Debian package name", p)
		}
	}
	if len(d.Setup) > 100 {
		return errors.New("image setup: more than 100 lines")
	}
	for i, l := range d.Setup {
		if strings.TrimSpace(l) == "" || len(l) > 4096 || strings.ContainsRune(l, 0) {
			return fmt.Errorf("image setup line %d: empty, NUL or longer than 4 KiB", i+1)
		}
	}
	return nil
}

// Empty reports whether d adds nothing to its base.
func (d DerivedRecipe) Empty() bool { return len(d.Packages) == 0 && len(d.Setup) == 0 }

// Key identifies the image d builds: its base, its packages (as a set) and
// its setup lines and hosts (in order).
func (d DerivedRecipe) Key() string {
	pk := slices.Clone(d.Packages)
	slices.Sort(pk)
	pk = slices.Compact(pk)
	h := sha256.New()
	fmt.Fprintf(h, "kosa8-derived v%d\x00%s\x00", derivedVersion, d.Base)
	for _, group := range [][]string{pk, d.Setup, d.Hosts} {
		for _, s := range group {
			fmt.Fprintf(h, "%d:%s\x00", len(s), s)
		}
		h.Write([]byte{1})
	}
	return "d-" + hex.EncodeToString(h.Sum(nil))[:16]
}

// derivedVersion changes when the build steps change what an image holds.
const derivedVersion = 1

// LookupDerived returns the newest complete build of d.
func (s Store) LookupDerived(base *Image, d DerivedRecipe) (*Image, error) {
	dirs, _ := filepath.Glob(filepath.Join(filepath.Dir(base.Dir), d.Key()+"-*"))
	slices.Sort(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		if img, err := s.Open(dirs[i]); err == nil {
			return img, nil
		}
	}
	return nil, fmt.Errorf("%w: derived image %s", ErrNoImage, d.Key())
}

// LockDerived takes the build lock of d's image (a file per recipe, so a
// derived build never holds up another). Unlock by closing the file.
func (s Store) LockDerived(ctx context.Context, base *Image, d DerivedRecipe, waiting func()) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(filepath.Dir(base.Dir), "."+d.Key()+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return f, nil
	}
	if waiting != nil {
		waiting()
	}
	done := make(chan error, 1)
	go func() { done <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	case <-ctx.Done():
		f.Close() // the blocked flock ends with the file
		return nil, ctx.Err()
	}
}

// ResolvePins resolves each host on this machine, as the build sandbox's
// gateway will: the build may reach exactly those names at exactly those
// addresses (see sandbox.NetworkConfig.Pins). Loopback, link-local and
// unspecified addresses are refused even here: a package source there is
// a resolver lying, not a mirror behind a proxy.
func ResolvePins(ctx context.Context, hosts []string, lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)) (map[string]netip.Addr, error) {
	pins := map[string]netip.Addr{}
	for _, h := range hosts {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		addrs, err := lookup(rctx, "ip4", h)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("resolve %s (a package source of the image build): %w", h, err)
		}
		var ok bool
		for _, a := range addrs {
			a = a.Unmap()
			if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() {
				continue
			}
			pins[h], ok = a, true
			break
		}
		if !ok {
			return nil, fmt.Errorf("%s resolves to no usable address here (%v)", h, addrs)
		}
	}
	return pins, nil
}

// CommitDerived turns the build sandbox's stopped root disk (a qcow2 over
// base's rootfs) into the image of d: flattened into a raw ext4 file,
// checked, shrunk to its contents (each sandbox grows it again on first
// boot), and installed read-only beside base with a manifest. layers
// reads the root disk's format.
func (s Store) CommitDerived(ctx context.Context, base *Image, d DerivedRecipe, layers vmm.DiskLayers, rootDisk string, buildLog string, logw io.Writer) (*Image, error) {
	archDir := filepath.Dir(base.Dir)
	work, err := os.MkdirTemp(archDir, ".build-"+d.Key()+"-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(work)
		}
	}()
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, err
	}
	// The disk's header is QEMU's to write: a compromised QEMU could name
	// any host file as its backing one (a host disk, another sandbox's
	// layer), which flattening, as root, would copy into an image every
	// sandbox of it then boots. The build sandbox is stopped: this holds.
	if chain, err := layers.Chain(ctx, rootDisk, layers.Format()); err != nil || len(chain) != 2 || chain[1] != base.RootFS() {
		return nil, fmt.Errorf("the build sandbox's root disk is not one layer over %s (%q, %v): build the image again", base.RootFS(), chain, err)
	}
	rootfs := filepath.Join(out, "rootfs.ext4")
	if err := layers.Flatten(ctx, rootDisk, rootfs, logw); err != nil {
		return nil, err
	}
	size, err := shrinkExt4(ctx, rootfs, logw)
	if err != nil {
		return nil, err
	}
	_ = os.Chmod(rootfs, 0o444)
	if err := linkTree(filepath.Join(base.Dir, "kernel"), filepath.Join(out, "kernel")); err != nil {
		return nil, fmt.Errorf("link the base's kernel: %w", err)
	}
	if buildLog != "" {
		if b, err := os.ReadFile(buildLog); err == nil {
			_ = os.WriteFile(filepath.Join(out, "build.log"), b, 0o644)
		}
	}
	m := base.Manifest
	m.Key, m.Built, m.RootFSBytes = d.Key(), time.Now().UTC(), size
	dd := d
	m.Derived = &dd
	m.BaseDir = base.Dir
	dst, err := install(out, archDir, m)
	if err != nil {
		return nil, err
	}
	ok = true
	os.RemoveAll(work)
	return s.Open(dst)
}

// ext4Size reads an ext4 filesystem's size from its superblock.
func ext4Size(p string) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var sb [1024]byte
	if _, err := f.ReadAt(sb[:], 1024); err != nil {
		return 0, err
	}
	if binary.LittleEndian.Uint16(sb[0x38:]) != 0xEF53 {
		return 0, fmt.Errorf("%s: not an ext4 filesystem", p)
	}
	blocks := uint64(binary.LittleEndian.Uint32(sb[4:]))
	if binary.LittleEndian.Uint32(sb[0x60:])&0x80 != 0 {
		blocks |= uint64(binary.LittleEndian.Uint32(sb[0x150:])) << 32
	}
	return int64(blocks << (10 + binary.LittleEndian.Uint32(sb[24:]))), nil
}

// linkTree recreates src's directories under dst with hard links to its
// files (the kernel is shared, never written).
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		t := filepath.Join(dst, rel)
		switch {
		case e.IsDir():
			return os.MkdirAll(t, 0o755)
		case e.Type().IsRegular():
			if rel == "initramfs" || strings.HasPrefix(rel, "initramfs"+string(filepath.Separator)) {
				return nil
			}
			return os.Link(p, t)
		}
		return nil // links in a module tree (build, source) are not needed
	})
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
