package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kosa8/kosa8/internal/vmspec"
)

// Install describes one QEMU installation: its version, which chooses the
// flags that differ across releases, and where its data files are.
type Install struct {
	Binary      string
	Version     Version
	VersionLine string // first line of --version: recorded with checkpoints
	// DataDirs are folders passed with -L ahead of QEMU's own: the data of
	// a QEMU unpacked under a prefix (KOSA8_QEMU=/opt/qemu10/usr/bin/...),
	// which a QEMU built with fixed paths (Debian's 10.x) does not look in
	// by itself. Empty for a QEMU in its usual place.
	DataDirs []string
	// Builtin are the folders QEMU searches by itself (-L help).
	Builtin []string
	// Firmware is the microvm firmware passed with -bios (x86-64): qboot,
	// where the installation has it. See firmwareFor in cmdline.go.
	Firmware string
}

// DataDirEnv names folders (PATH-style list) to pass to QEMU with -L
// instead of the ones kosa8 derives from the binary's prefix.
const DataDirEnv = "KOSA8_QEMU_DATADIR"

// Probe asks bin for its version and data folders.
func Probe(ctx context.Context, bin string, arch vmspec.Arch) (Install, error) {
	// "-L help" lists the folders QEMU searches, in order (QEMU 5.0+). Run
	// beside --version: each is a QEMU start, and this is on the boot path.
	help := make(chan []byte, 1)
	go func() {
		out, _ := exec.CommandContext(ctx, bin, "-L", "help").Output()
		help <- out
	}()
	v, line, err := BinaryVersion(ctx, bin)
	out := <-help
	if err != nil {
		return Install{}, err
	}
	inst := Install{Binary: bin, Version: v, VersionLine: line}
	var builtin []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "/") {
			builtin = append(builtin, filepath.Clean(l))
		}
	}
	inst.Builtin = builtin
	if env := os.Getenv(DataDirEnv); env != "" {
		for _, d := range filepath.SplitList(env) {
			if st, err := os.Stat(d); err != nil || !st.IsDir() {
				return Install{}, fmt.Errorf("%s: %q is not a folder: point it at the QEMU's share/qemu", DataDirEnv, d)
			}
			inst.DataDirs = append(inst.DataDirs, filepath.Clean(d))
		}
	} else {
		inst.DataDirs = prefixDataDirs(bin, builtin)
	}
	if arch == vmspec.AMD64 {
		inst.Firmware = findFile("qboot.rom", append(slices.Clone(inst.DataDirs), builtin...))
	}
	return inst, nil
}

// prefixDataDirs returns the data folders under bin's prefix (PREFIX/bin/
// qemu-system-*) that QEMU does not already search. Debian's QEMU keeps
// firmware in share/qemu and share/seabios.
func prefixDataDirs(bin string, builtin []string) []string {
	if real, err := filepath.EvalSymlinks(bin); err == nil {
		bin = real
	}
	prefix := filepath.Dir(filepath.Dir(bin))
	var dirs []string
	for _, sub := range []string{"share/qemu", "share/seabios", "lib/ipxe/qemu"} {
		d := filepath.Join(prefix, sub)
		if st, err := os.Stat(d); err != nil || !st.IsDir() || slices.Contains(builtin, d) {
			continue
		}
		dirs = append(dirs, d)
	}
	if len(dirs) > 0 && !slices.Contains(dirs, filepath.Join(prefix, "share/qemu")) {
		return nil // not a QEMU prefix: only a share/qemu makes one
	}
	return dirs
}

func findFile(name string, dirs []string) string {
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// FirmwareName is the firmware's file name, "" for QEMU's default.
func (i Install) FirmwareName() string {
	if i.Firmware == "" {
		return ""
	}
	return filepath.Base(i.Firmware)
}

// Supported returns an error for a QEMU too old to run kosa8's machines.
// A release newer than the newest tested one is allowed (doctor warns).
func (i Install) Supported() error {
	if i.Version.Less(MinVersion) {
		return fmt.Errorf("%s at %s is older than QEMU %s: install QEMU %s (Debian 12, Ubuntu 24.04, Fedora and Homebrew ship one)",
			i.VersionLine, i.Binary, MinVersion, SupportedRange())
	}
	return nil
}
