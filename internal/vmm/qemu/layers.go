package qemu

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

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

// Create implements vmm.DiskLayers. The size is read from backing here, so
// qemu-img need not open the backing chain (-u): that open was most of
// the time a rewind spent on its disks.
func (Layers) Create(ctx context.Context, path, backing, backingFormat string, size int64) error {
	img, err := qemuImg()
	if err != nil {
		return err
	}
	if _, err := os.Stat(backing); err != nil { // -u would not look
		return fmt.Errorf("new disk layer over %s: %w", backing, err)
	}
	if size == 0 {
		if size, err = VirtualSize(backing, backingFormat); err != nil {
			return fmt.Errorf("new disk layer over %s: %w", backing, err)
		}
	}
	out, err := exec.CommandContext(ctx, img, "create", "-q", "-u", "-f", "qcow2",
		"-o", "backing_file="+backing+",backing_fmt="+backingFormat+",lazy_refcounts=on",
		path, strconv.FormatInt(size, 10)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("new disk layer: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Chain implements vmm.DiskLayers.
func (Layers) Chain(ctx context.Context, path string) ([]string, error) {
	img, err := qemuImg()
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, img, "info", "-U", "--backing-chain", "--output=json", path).Output()
	if err != nil {
		return nil, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	var infos []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(out, &infos); err != nil {
		return nil, err
	}
	var chain []string
	for _, i := range infos {
		chain = append(chain, i.Filename)
	}
	return chain, nil
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
