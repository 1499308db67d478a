package image

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
)

// GuestModules are the kernel modules the guest needs before it can reach
// its root disk and the host, in the order they are asked for. Dependencies
// are added ahead of each module from the modules' own .modinfo, so the
// order also holds where a kernel build moves a driver into a module.
var GuestModules = []string{
	"virtio_ring", "virtio", "virtio_mmio",
	"virtio_console", "virtio_blk", "failover", "net_failover", "virtio_net",
	"virtio_rng", "virtio_balloon",
	"ext4",
}

// DockerModules are added for a sandbox made with --docker, and loaded at
// its boot (no other sandbox carries them): the overlay filesystem of
// image layers, the bridge and veth pairs of container networks, and the
// netfilter parts of Docker's rules as Debian's iptables (its nft backend)
// writes them: NAT and masquerading, conntrack, and the xtables matches it
// passes through nft_compat (addrtype, conntrack, MASQUERADE, DNAT's nat,
// tcp/udp ports). br_netfilter makes bridged traffic meet those rules.
// Debian's cloud kernel builds each as a module.
var DockerModules = []string{
	"overlay", "bridge", "veth", "br_netfilter",
	"nf_tables", "nft_compat", "nft_chain_nat", "nft_ct", "nft_masq", "nft_nat",
	"nf_conntrack", "nf_nat", "nf_reject_ipv4", "nft_reject_inet",
	"x_tables", "xt_addrtype", "xt_conntrack", "xt_MASQUERADE", "xt_nat", "xt_tcpudp", "xt_mark",
	"ip_tables", "iptable_nat", "iptable_filter",
}

// VirtioFSModules are added for the benchmark's comparison VM only, which
// shares a host folder over virtiofs (bench/vfs.go). Sandboxes never mount
// a host folder, so their initramfs does not carry these: a module the
// guest does not need is code an attacker inside could reach.
var VirtioFSModules = []string{"fuse", "virtiofs"}

// moduleName normalises a module or file name: the kernel treats '-' and '_'
// in module names alike.
func moduleName(s string) string {
	s = path.Base(s)
	for _, ext := range []string{".ko.xz", ".ko.zst", ".ko.gz", ".ko"} {
		s = strings.TrimSuffix(s, ext)
	}
	return strings.ReplaceAll(s, "-", "_")
}

// modinfoDepends returns the "depends=" list of a module's .modinfo section.
func modinfoDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, fmt.Errorf("parse module: %w", err)
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module has no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo: %w", err)
	}
	return parseModinfoDepends(data), nil
}

func parseModinfoDepends(data []byte) []string {
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		v, ok := bytes.CutPrefix(kv, []byte("depends="))
		if !ok {
			continue
		}
		for _, d := range strings.Split(string(v), ",") {
			if d = strings.TrimSpace(d); d != "" {
				deps = append(deps, moduleName(d))
			}
		}
	}
	return deps
}

// moduleTree indexes a kernel's module directory (lib/modules/VERSION).
type moduleTree struct {
	fsys    fs.FS
	paths   map[string]string // name → path of the .ko inside fsys
	builtin map[string]bool
}

func loadModuleTree(fsys fs.FS) (*moduleTree, error) {
	t := &moduleTree{fsys: fsys, paths: map[string]string{}, builtin: map[string]bool{}}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.Contains(path.Base(p), ".ko") {
			t.paths[moduleName(p)] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index kernel modules: %w", err)
	}
	if f, err := fsys.Open("modules.builtin"); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			t.builtin[moduleName(s.Text())] = true
		}
	}
	return t, nil
}

// resolve returns the .ko paths to load, dependencies first, each once.
// Built-in modules are skipped; a module that is neither built in nor
// present is an error naming it.
func (t *moduleTree) resolve(want []string) ([]string, error) {
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		name = moduleName(name)
		switch state[name] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("module dependency cycle: %s", strings.Join(append(chain, name), " → "))
		}
		if t.builtin[name] {
			state[name] = 2
			return nil
		}
		p, ok := t.paths[name]
		if !ok {
			return fmt.Errorf("kernel module %s not found (needed by %s)", name, strings.Join(append(chain, name), " → "))
		}
		state[name] = 1
		data, err := t.read(p)
		if err != nil {
			return err
		}
		deps, err := modinfoDepends(data)
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		for _, d := range deps {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, p)
		return nil
	}
	for _, w := range want {
		if err := visit(w, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func (t *moduleTree) read(p string) ([]byte, error) {
	f, err := t.fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
