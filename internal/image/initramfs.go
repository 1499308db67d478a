package image

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// ModuleListPath is where the initramfs lists the modules to load, one path
// per line relative to lib/modules/VERSION, dependencies first.
const ModuleListPath = "kosa8/modules"

// writeInitramfs writes an initramfs with agent as /init, the kernel
// modules in order (paths inside mods, which is lib/modules/KVER) and the
// list the agent loads them from.
func writeInitramfs(w io.Writer, agent []byte, mods fs.FS, kver string, order []string) error {
	c := newCPIOWriter(w)
	for _, d := range []string{"dev", "proc", "sys", "run", "newroot", "kosa8", "lib", "lib/modules"} {
		c.Dir(d, 0o755)
	}
	c.CharDevice("dev/console", 0o600, 5, 1)
	c.File("init", 0o755, agent)
	base := "lib/modules/" + kver
	made := map[string]bool{}
	mkdirs := func(p string) {
		var parts []string
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			parts = append(parts, d)
		}
		for i := len(parts) - 1; i >= 0; i-- {
			if !made[parts[i]] {
				made[parts[i]] = true
				c.Dir(base+"/"+parts[i], 0o755)
			}
		}
	}
	c.Dir(base, 0o755)
	for _, p := range order {
		data, err := fs.ReadFile(mods, p)
		if err != nil {
			return fmt.Errorf("read module %s: %w", p, err)
		}
		mkdirs(p)
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

// BuildInitramfs writes an initramfs for k with the agent at agentPath as
// /init to dst, atomically.
func BuildInitramfs(dst, agentPath string, k Kernel) error {
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return fmt.Errorf("read kosa8-agent: %w", err)
	}
	mods := os.DirFS(k.Modules)
	tree, err := loadModuleTree(mods)
	if err != nil {
		return err
	}
	order, err := tree.resolve(GuestModules)
	if err != nil {
		return err
	}
	return writeFileAtomic(dst, 0o644, func(w io.Writer) error {
		return writeInitramfs(w, agent, mods, k.Version, order)
	})
}
