package image

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ModuleListPath is where the initramfs lists the modules to load, one path
// per line relative to lib/modules/VERSION, dependencies first.
const ModuleListPath = "kosa8/modules"

// writeInitramfs writes an initramfs with agent as /init, the kernel
// modules in order (paths inside mods, which is lib/modules/KVER) and the
// list the agent loads them from. extra, when set, adds more first (the
// image builder's programs, builder.go).
func writeInitramfs(w io.Writer, agent []byte, mods fs.FS, kver string, order []string, extra func(c *cpioWriter) error) error {
	c := newCPIOWriter(w)
	if extra != nil {
		if err := extra(c); err != nil {
			return err
		}
	}
	for _, d := range []string{"dev", "proc", "sys", "run", "newroot", "kosa8", "lib", "lib/modules"} {
		c.Dir(d, 0o755)
	}
	c.CharDevice("dev/console", 0o600, 5, 1)
	c.File("init", 0o755, agent)
	base := "lib/modules/" + kver
	c.Dir(base, 0o755)
	for _, p := range order {
		data, err := fs.ReadFile(mods, p)
		if err != nil {
			return fmt.Errorf("read module %s: %w", p, err)
		}
		c.MkdirAll(base + "/" + p)
		c.File(base+"/"+p, 0o644, data)
	}
	c.File(ModuleListPath, 0o644, []byte(strings.Join(order, "\n")+"\n"))
	c.File("kosa8/kernel-version", 0o644, []byte(kver+"\n"))
	return c.Close()
}

// Kernel is an unpacked guest kernel.
type Kernel struct {
	Image   string // vmlinuz
	Modules string // its lib/modules/VERSION directory
	Version string
}

// InitramfsWith returns the initramfs for this image, the agent binary at
// agentPath and the kernel modules mods (GuestModules for a sandbox),
// building it on first use.
func (img *Image) InitramfsWith(agentPath string, mods []string) (string, error) {
	f, err := os.Open(agentPath)
	if err != nil {
		return "", fmt.Errorf("kosa8-agent: %w", err)
	}
	// Named by what goes in: the agent, the modules, the layout's version.
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "\x00initramfs v%d\x00%s", initramfsVersion, strings.Join(mods, ","))
	dir := filepath.Join(img.Dir, "initramfs")
	p := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:16]+".cpio")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := BuildInitramfs(p, agentPath, img.Kernel(), mods); err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	return p, nil
}

// BuildInitramfs writes an initramfs for k with the agent at agentPath as
// /init and the modules want (with their dependencies) to dst, atomically.
func BuildInitramfs(dst, agentPath string, k Kernel, want []string) error {
	return buildInitramfs(dst, agentPath, k, want, nil)
}

func buildInitramfs(dst, agentPath string, k Kernel, want []string, extra func(c *cpioWriter) error) error {
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return fmt.Errorf("read kosa8-agent: %w", err)
	}
	mods := os.DirFS(k.Modules)
	tree, err := loadModuleTree(mods)
	if err != nil {
		return err
	}
	order, err := tree.resolve(want)
	if err != nil {
		return err
	}
	return writeFileAtomic(dst, 0o644, func(w io.Writer) error {
		return writeInitramfs(w, agent, mods, k.Version, order, extra)
	})
}
