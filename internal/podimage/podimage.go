// Package podimage assembles kosa8's container image for a Kubernetes pod
// (deploy/kubernetes): kosa8 and its guest agents, QEMU with the shared
// libraries and firmware it loads, and the guest image (kernel, modules,
// root filesystem) where KOSA8_CACHE points in the pod. It is built from
// this host's files, with no Docker daemon: the layers are handed to a
// Writer, the image-writing half of kosa8's OCI code (internal/oci, issue
// 30, not merged when this was written: it is to implement Writer).
//
// Three layers, from the least to the most often changed: QEMU and its
// libraries, the guest image, kosa8's binaries; a node that has the older
// ones pulls only what changed.
package podimage

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// File is one entry of a layer: a copy of the host file Source at Path in
// the image, or a symbolic link to Link.
type File struct {
	Path   string // absolute, in the image
	Source string // host file ("" for a link or a folder)
	Link   string
	Dir    bool
	Mode   fs.FileMode
}

// Layer is a named set of files.
type Layer struct {
	Name  string
	Files []File
}

// Config is the image's runtime configuration (OCI image config).
type Config struct {
	Entrypoint   []string
	Env          []string
	User         string
	WorkingDir   string
	ExposedPorts []string // "8888/tcp"
}

// Writer writes an image of these layers under ref (an OCI layout folder
// or a registry reference, as the implementation takes) and returns its
// manifest's digest.
type Writer interface {
	Write(ctx context.Context, ref string, cfg Config, layers []Layer) (string, error)
}

// Sources are the host files the image is made of.
type Sources struct {
	BinDir   string   // kosa8, kosa8-agent, kosa8-agent-linux-*
	QEMU     []string // qemu-system-x86_64 (and -aarch64), qemu-img
	QEMUData []string // firmware folders: /usr/share/qemu, /usr/share/seabios
	ImageDir string   // the guest image's folder (internal/image's Image.Dir)
	CacheDir string   // the KOSA8_CACHE it is in
}

// In the image.
const (
	BinDir   = "/usr/local/bin"
	CacheDir = "/var/lib/kosa8/cache"
	UID      = 1000 // the template's runAsUser
)

// ImageConfig is how the pod runs it (deploy/kubernetes/30-template.yaml
// sets the rest).
func ImageConfig() Config {
	return Config{
		Entrypoint:   []string{BinDir + "/kosa8", "serve"},
		Env:          []string{"PATH=" + BinDir + ":/usr/bin:/bin", "KOSA8_CACHE=" + CacheDir, "HOME=/var/lib/kosa8"},
		User:         fmt.Sprint(UID),
		WorkingDir:   "/var/lib/kosa8",
		ExposedPorts: []string{"8888/tcp"},
	}
}

// Assemble lists the image's layers.
func Assemble(s Sources) ([]Layer, error) {
	qemu := Layer{Name: "qemu"}
	seen := map[string]bool{}
	add := func(l *Layer, f File) {
		if !seen[f.Path] {
			seen[f.Path] = true
			l.Files = append(l.Files, f)
		}
	}
	for _, q := range s.QEMU {
		libs, err := sharedLibs(q)
		if err != nil {
			return nil, err
		}
		add(&qemu, File{Path: "/usr/bin/" + filepath.Base(q), Source: q, Mode: 0o755})
		for _, lib := range libs {
			if err := addPath(&qemu, add, lib, lib); err != nil {
				return nil, err
			}
		}
	}
	for _, d := range s.QEMUData {
		if err := addTree(&qemu, add, d, d); err != nil {
			return nil, err
		}
	}
	guest := Layer{Name: "guest-image"}
	rel, err := filepath.Rel(s.CacheDir, s.ImageDir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("the guest image %s is not in KOSA8_CACHE %s", s.ImageDir, s.CacheDir)
	}
	if err := addTree(&guest, add, s.ImageDir, filepath.Join(CacheDir, rel)); err != nil {
		return nil, err
	}
	kosa8 := Layer{Name: "kosa8"}
	for _, b := range []string{"kosa8", "kosa8-agent", "kosa8-agent-linux-amd64", "kosa8-agent-linux-arm64"} {
		p := filepath.Join(s.BinDir, b)
		if _, err := os.Stat(p); err != nil {
			if b == "kosa8" || b == "kosa8-agent" {
				return nil, fmt.Errorf("%w: run 'make build'", err)
			}
			continue
		}
		add(&kosa8, File{Path: BinDir + "/" + b, Source: p, Mode: 0o755})
	}
	// kosa8 itself may link the C library (it is built with cgo where the
	// keyring asks for it).
	libs, err := sharedLibs(filepath.Join(s.BinDir, "kosa8"))
	if err != nil {
		return nil, err
	}
	for _, lib := range libs {
		if err := addPath(&qemu, add, lib, lib); err != nil {
			return nil, err
		}
	}
	// The folders the pod writes to, owned by its user.
	for _, d := range []string{"/var/lib/kosa8", "/var/lib/kosa8/state", "/run/kosa8", "/workspace", "/tmp"} {
		add(&kosa8, File{Path: d, Dir: true, Mode: 0o755})
	}
	for _, l := range []*Layer{&qemu, &guest, &kosa8} {
		sort.Slice(l.Files, func(i, j int) bool { return l.Files[i].Path < l.Files[j].Path })
	}
	return []Layer{qemu, guest, kosa8}, nil
}

// Build assembles the image and writes it.
func Build(ctx context.Context, w Writer, ref string, s Sources) (string, error) {
	layers, err := Assemble(s)
	if err != nil {
		return "", err
	}
	return w.Write(ctx, ref, ImageConfig(), layers)
}

// addPath adds the host path src at dst, and, for a link, the link and
// what it leads to.
func addPath(l *Layer, add func(*Layer, File), src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		add(l, File{Path: dst, Link: target, Mode: 0o777})
		real := target
		if !filepath.IsAbs(real) {
			real = filepath.Join(filepath.Dir(src), target)
		}
		realDst := target
		if !filepath.IsAbs(realDst) {
			realDst = filepath.Join(filepath.Dir(dst), target)
		}
		return addPath(l, add, filepath.Clean(real), filepath.Clean(realDst))
	}
	if fi.IsDir() {
		return addTree(l, add, src, dst)
	}
	add(l, File{Path: dst, Source: src, Mode: fi.Mode().Perm()})
	return nil
}

// addTree adds a folder and everything under it; links are kept as links
// (and followed when they lead outside it).
func addTree(l *Layer, add func(*Layer, File), src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return addPath(l, add, p, to)
		case d.IsDir():
			add(l, File{Path: to, Dir: true, Mode: 0o755})
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			add(l, File{Path: to, Source: p, Mode: fi.Mode().Perm()})
		}
		return nil
	})
}

// sharedLibs lists the shared libraries bin loads (ldd's answer), the
// dynamic loader included; none for a static binary.
func sharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, bytes.TrimSpace(out))
	}
	return parseLdd(out)
}

// parseLdd reads ldd's output: "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)"
// and the loader's "/lib64/ld-linux-x86-64.so.2 (0x...)".
func parseLdd(out []byte) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>":
			if f[2] == "not" {
				return nil, fmt.Errorf("ldd: %s is not found", f[0])
			}
			if strings.HasPrefix(f[2], "/") {
				libs = append(libs, f[2])
			}
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	if len(libs) == 0 {
		return nil, errors.New("ldd listed no library")
	}
	return libs, nil
}
