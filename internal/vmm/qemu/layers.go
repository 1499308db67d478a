package qemu

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kosa8/kosa8/internal/vmm"
)

// Layers are qcow2 disk layers, made and read with qemu-img.
type Layers struct{}

var _ vmm.DiskLayers = Layers{}

func (Layers) Format() string { return "qcow2" }

// qemuImg finds qemu-img, or says how to get it.
func qemuImg() (string, error) {
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		return "", fmt.Errorf("%w: qemu-img not found: run 'kosa8 setup' or install qemu-utils (Debian, Ubuntu) or qemu (Homebrew)", vmm.ErrNotFound)
	}
	return p, nil
}

// Create implements vmm.DiskLayers. The layer is written here
// (qcow2new.go), not by qemu-img, which took 30 to 200 ms a layer on a
// rewind's path, starting and then opening what it made; and its size is
// read from backing, so nothing opens the backing chain.
func (Layers) Create(_ context.Context, path, backing, backingFormat string, size int64) error {
	if _, err := os.Stat(backing); err != nil {
		return fmt.Errorf("new disk layer over %s: %w", backing, err)
	}
	var err error
	if size == 0 {
		if size, err = VirtualSize(backing, backingFormat); err != nil {
			return fmt.Errorf("new disk layer over %s: %w", backing, err)
		}
	}
	if err := writeQcow2Overlay(path, size, backing, backingFormat); err != nil {
		return fmt.Errorf("new disk layer over %s: %w", backing, err)
	}
	return nil
}

// Chain implements vmm.DiskLayers. It reads the qcow2 headers itself
// rather than asking qemu-img (info --backing-chain), which root would run
// on names a hostile party wrote: a layer's header is QEMU's to write (a
// compromised QEMU names any backing file it likes), and a raw disk is the
// guest's own bytes, which qemu-img, left to probe, took for a qcow2 header
// naming anything. qemu-img opened whatever that named: a device
// (/dev/watchdog starts its countdown), a FIFO, a json: name that reaches a
// network server. Here a raw layer ends the chain unread, and a qcow2 one
// leads only to a regular file named by path, in a format its header
// gives, never to an external data file.
func (Layers) Chain(_ context.Context, path, format string) ([]string, error) {
	var chain []string
	seen := map[string]bool{}
	for path != "" {
		if seen[path] || len(chain) >= maxChain {
			return nil, fmt.Errorf("%s: a backing chain that loops or exceeds %d layers", chain[0], maxChain)
		}
		seen[path] = true
		chain = append(chain, path)
		switch format {
		case "raw": // read by nobody here: only checked to be a file
			if fi, err := os.Stat(path); err != nil {
				return nil, err
			} else if !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("%s is not a regular file", path)
			}
			return chain, nil
		case "qcow2":
		default:
			return nil, fmt.Errorf("%s: unknown disk format %q", path, format)
		}
		backing, backingFormat, err := qcow2Backing(path)
		if err != nil {
			return nil, err
		}
		if backing != "" && !filepath.IsAbs(backing) { // as QEMU reads it: beside the layer
			backing = filepath.Join(filepath.Dir(path), backing)
		}
		path, format = backing, backingFormat
	}
	return chain, nil
}

// maxChain bounds a backing chain (each checkpoint adds a layer).
const maxChain = 1 << 14

// qcow2 header fields and extensions Chain reads (QEMU's docs/interop/qcow2.txt).
const (
	qcow2ExtEnd           = 0
	qcow2ExtBackingFmt    = 0xe2792aca
	qcow2ExtDataFile      = 0x44415441
	qcow2IncompatDataFile = 1 << 2
	qcow2HeadMax          = 64 << 10 // header, extensions and backing name: QEMU keeps them in the first cluster
)

// qcow2Backing reads the backing file's name and format from the qcow2
// header of path, a regular file (nothing else is opened). "" for none.
func qcow2Backing(path string) (string, string, error) {
	f, err := openRegular(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	h := make([]byte, qcow2HeadMax)
	n, err := io.ReadFull(f, h)
	if err != nil && err != io.ErrUnexpectedEOF {
		return "", "", fmt.Errorf("read the qcow2 header of %s: %w", path, err)
	}
	h = h[:n]
	bad := func(what string) (string, string, error) {
		return "", "", fmt.Errorf("%s: qcow2 header: %s", path, what)
	}
	if len(h) < 72 || string(h[:4]) != "QFI\xfb" {
		return bad("not a qcow2 file")
	}
	be := binary.BigEndian
	version := be.Uint32(h[4:])
	off, size := be.Uint64(h[8:]), uint64(be.Uint32(h[16:]))
	extStart := uint64(72)
	switch version {
	case 2:
	case 3:
		if len(h) < 104 {
			return bad("short")
		}
		if be.Uint64(h[72:])&qcow2IncompatDataFile != 0 {
			return bad("an external data file")
		}
		extStart = uint64(be.Uint32(h[100:]))
	default:
		return bad(fmt.Sprintf("version %d", version))
	}
	if off == 0 {
		return "", "", nil
	}
	if size == 0 || size > 1023 || off > uint64(len(h)) || off+size > uint64(len(h)) {
		return bad("a backing file name out of bounds")
	}
	name := string(h[off : off+size])
	format := ""
	// As QEMU reads them: from the header's end to the backing file name.
	for p := extStart; p+8 <= off; {
		typ, l := be.Uint32(h[p:]), uint64(be.Uint32(h[p+4:]))
		p += 8
		if typ == qcow2ExtEnd {
			break
		}
		if p+l > off {
			return bad("an extension out of bounds")
		}
		switch typ {
		case qcow2ExtBackingFmt:
			format = string(h[p : p+l])
		case qcow2ExtDataFile:
			return bad("an external data file")
		}
		p += (l + 7) &^ 7
	}
	// QEMU reads "json:..." and "proto:..." (a colon before any slash) as
	// block driver options or a protocol, not as a file.
	if i := strings.IndexByte(name, ':'); i >= 0 && !strings.Contains(name[:i], "/") {
		return bad(fmt.Sprintf("backing file %q is not a file name", name))
	}
	if format != "raw" && format != "qcow2" {
		return bad(fmt.Sprintf("backing file %q of format %q (want raw or qcow2)", name, format))
	}
	return name, format, nil
}

// openRegular opens path to read if it is a regular file, and opens
// nothing else: a device's or FIFO's open acts (a watchdog starts, a
// reader waits).
func openRegular(path string) (*os.File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	if now, err := f.Stat(); err != nil || !os.SameFile(fi, now) {
		f.Close()
		return nil, fmt.Errorf("%s changed as it was opened", path)
	}
	return f, nil
}

// Flatten implements vmm.DiskLayers.
func (Layers) Flatten(ctx context.Context, path, dst string, log io.Writer) error {
	img, err := qemuImg()
	if err != nil {
		return err
	}
	b, err := exec.CommandContext(ctx, img, "convert", "-O", "raw", path, dst).CombinedOutput()
	log.Write(b)
	if err != nil {
		out := strings.TrimSpace(string(b))
		return fmt.Errorf("qemu-img convert: %w: %s", err, out[strings.LastIndexByte(out, '\n')+1:])
	}
	return nil
}

// VirtualSize is the size the guest sees of a raw or qcow2 disk file.
func VirtualSize(path, format string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	switch format {
	case "raw":
		st, err := f.Stat()
		if err != nil {
			return 0, err
		}
		return st.Size(), nil
	case "qcow2":
		var h [32]byte
		if _, err := io.ReadFull(f, h[:]); err != nil {
			return 0, fmt.Errorf("read qcow2 header: %w", err)
		}
		if string(h[:4]) != "QFI\xfb" {
			return 0, fmt.Errorf("not a qcow2 file")
		}
		return int64(binary.BigEndian.Uint64(h[24:32])), nil
	}
	return 0, fmt.Errorf("unknown disk format %q", format)
}
