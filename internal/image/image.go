// Package image builds and finds the guest image: a Debian cloud kernel
// unpacked from its package, an initramfs with kosa8-agent as /init and the
// modules it needs, and a Debian root filesystem as an ext4 image that all
// sandboxes share read-only (each has a qcow2 overlay on it).
//
// # Cache layout
//
//	CACHE/images/ARCH/KEY-TIME/       one build; KEY hashes its inputs, TIME tells builds apart
//	    manifest.json                 written last: an image without it is incomplete
//	    kernel/vmlinuz
//	    kernel/KVER/...               the kernel's module tree
//	    rootfs.ext4                   read-only base of every sandbox's root disk
//	    initramfs/AGENTHASH.cpio      one per kosa8-agent build, made on first use
//	CACHE/images/ARCH/.build-*        a build in progress (removed on failure)
//	CACHE/images/ARCH/.lock           held while building
//
// An image is rebuilt only when its inputs (the recipe) change, or when
// asked. Older builds stay for the sandboxes whose disks sit on them.
package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// recipeVersion changes whenever the build steps change in a way that
// changes the image.
const recipeVersion = 3

// Recipe is everything an image is built from.
type Recipe struct {
	Arch     vmspec.Arch `json:"arch"`
	Suite    string      `json:"suite"`
	Packages []string    `json:"packages"`
	// Mirrors are apt sources lines; not part of the key (any mirror gives
	// the same packages).
	Mirrors []string `json:"-"`
}

// DefaultPackages is the userland every sandbox starts with.
var DefaultPackages = []string{
	"bash", "coreutils", "procps", "sudo", "less", "netbase", "iproute2", "e2fsprogs",
	"ca-certificates", "curl", "git", "openssh-client",
	"python3", "python3-pip", "python3-venv", "python3-requests", "nodejs", "npm",
	// What coding agents reach for.
	"build-essential", "jq", "ripgrep", "vim-tiny", "nano", "unzip", "file",
}

// Suite is the Debian release of the base image: today's stable.
const Suite = "trixie"

// DefaultRecipe is the image kosa8 uses unless told otherwise. The mirror
// can be changed with KOSA8_DEBIAN_MIRROR (a base URL).
func DefaultRecipe(arch vmspec.Arch) Recipe {
	mirror := os.Getenv("KOSA8_DEBIAN_MIRROR")
	if mirror == "" {
		mirror = "http://deb.debian.org/debian"
	}
	security := strings.TrimSuffix(mirror, "/debian") + "/debian-security"
	return Recipe{
		Arch:     arch,
		Suite:    Suite,
		Packages: DefaultPackages,
		Mirrors: []string{
			"deb " + mirror + " " + Suite + " main",
			"deb " + mirror + " " + Suite + "-updates main",
			"deb " + security + " " + Suite + "-security main",
		},
	}
}

// WithPackages returns r with extra packages added.
func (r Recipe) WithPackages(extra ...string) Recipe {
	pk := append(slices.Clone(r.Packages), extra...)
	slices.Sort(pk)
	r.Packages = slices.Compact(pk)
	return r
}

// Key identifies the image r builds.
func (r Recipe) Key() string {
	pk := slices.Clone(r.Packages)
	slices.Sort(pk)
	pk = slices.Compact(pk)
	h := sha256.New()
	fmt.Fprintf(h, "kosa8-image v%d\n%s\n%s\n%s\n", recipeVersion, r.Arch, r.Suite, strings.Join(pk, ","))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// KernelPackage is the Debian metapackage the kernel comes from.
func (r Recipe) KernelPackage() string { return "linux-image-cloud-" + string(r.Arch) }

// Manifest describes a built image.
type Manifest struct {
	Key           string    `json:"key"`
	Recipe        Recipe    `json:"recipe"`
	KernelVersion string    `json:"kernel_version"`
	Built         time.Time `json:"built"`
	RootFSBytes   int64     `json:"rootfs_bytes"`
	// Derived is set for a derived image: its recipe, and the base build
	// it was made from.
	Derived *DerivedRecipe `json:"derived,omitempty"`
	BaseDir string         `json:"base_dir,omitempty"`
	// OCI is set for an image converted from an OCI image.
	OCI *OCISource `json:"oci,omitempty"`
}

// Image is a built image in the cache.
type Image struct {
	Dir      string
	Manifest Manifest
}

// Kernel returns the image's kernel.
func (img *Image) Kernel() Kernel {
	return Kernel{
		Image:   filepath.Join(img.Dir, "kernel", "vmlinuz"),
		Modules: filepath.Join(img.Dir, "kernel", img.Manifest.KernelVersion),
		Version: img.Manifest.KernelVersion,
	}
}

// RootFS is the shared, read-only base of every root disk.
func (img *Image) RootFS() string { return filepath.Join(img.Dir, "rootfs.ext4") }

// Store is the image cache.
type Store struct{ Dir string }

// ErrNoImage: the image has not been built.
var ErrNoImage = errors.New("guest image not built")

func (s Store) archDir(a vmspec.Arch) string { return filepath.Join(s.Dir, "images", string(a)) }

// Lookup returns the newest complete build of r.
func (s Store) Lookup(r Recipe) (*Image, error) {
	dirs, _ := filepath.Glob(filepath.Join(s.archDir(r.Arch), r.Key()+"-*"))
	slices.Sort(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		if img, err := s.Open(dirs[i]); err == nil {
			return img, nil
		}
	}
	if b, ok := s.BuildingNow(r.Arch); ok {
		return nil, fmt.Errorf("%w for %s yet: it is %s: %s", ErrNoImage, r.Arch, b, b.Wait())
	}
	return nil, fmt.Errorf("%w for %s: run '%s'", ErrNoImage, r.Arch, vmspec.SetupCommand(r.Arch))
}

// Open reads the image in dir.
func (s Store) Open(dir string) (*Image, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s: run 'kosa8 setup'", ErrNoImage, dir)
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("image manifest %s: %w (run 'kosa8 setup' to rebuild)", dir, err)
	}
	img := &Image{Dir: dir, Manifest: m}
	for _, p := range []string{img.RootFS(), img.Kernel().Image, img.Kernel().Modules} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("image %s is damaged (%v): run 'kosa8 setup --rebuild'", dir, err)
		}
	}
	return img, nil
}

// List returns the built images of every architecture.
func (s Store) List() ([]*Image, error) {
	var out []*Image
	dirs, _ := filepath.Glob(filepath.Join(s.Dir, "images", "*", "*"))
	for _, d := range dirs {
		if strings.HasPrefix(filepath.Base(d), ".") {
			continue
		}
		if img, err := s.Open(d); err == nil {
			out = append(out, img)
		}
	}
	return out, nil
}

// initramfsVersion changes with what BuildInitramfs lays out.
const initramfsVersion = 2

// Initramfs returns the initramfs for this image and the agent binary at
// agentPath, building it on first use.
func (img *Image) Initramfs(agentPath string) (string, error) {
	return img.InitramfsWith(agentPath, GuestModules)
}
