package vmmtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kosa8/kosa8/internal/vmm"
)

// layerMagic starts a fake disk layer: then the backing file's path, its
// format and the size, a line each.
const layerMagic = "vmmtest layer v1"

// Layers are fake disk layers: small text files naming what they are
// built on, so tests of checkpoints, rewinds and their disk collection run
// without qemu-img. A backing file that is not a fake layer ends a chain
// (the image's raw root file system).
type Layers struct{}

var _ vmm.DiskLayers = Layers{}

// Format names the fake layers qcow2, the format a checkpoint's metadata
// accepts for a frozen layer (so that tests take checkpoints of
// checkpoints); no VMM ever opens them.
func (Layers) Format() string { return "qcow2" }

// Create implements vmm.DiskLayers; the backing file must exist.
func (Layers) Create(_ context.Context, path, backing, backingFormat string, size int64) error {
	if _, err := os.Stat(backing); err != nil {
		return fmt.Errorf("new disk layer over %s: %w", backing, err)
	}
	body := fmt.Sprintf("%s\n%s\n%s\n%d\n", layerMagic, backing, backingFormat, size)
	return os.WriteFile(path, []byte(body), 0o600)
}

// Chain implements vmm.DiskLayers.
func (Layers) Chain(_ context.Context, path, format string) ([]string, error) {
	if format == "raw" {
		return []string{path}, nil
	}
	var chain []string
	for p := path; p != ""; {
		if len(chain) > 1000 {
			return nil, fmt.Errorf("%s: a backing chain over 1000 layers (a loop?)", path)
		}
		chain = append(chain, p)
		next, err := backingOf(p)
		if err != nil {
			return nil, err
		}
		p = next
	}
	return chain, nil
}

// Flatten implements vmm.DiskLayers: dst gets the bottom file of path's
// chain (the fake layers hold no data of their own).
func (l Layers) Flatten(ctx context.Context, path, dst string, _ io.Writer) error {
	chain, err := l.Chain(ctx, path, l.Format())
	if err != nil {
		return err
	}
	b, err := os.ReadFile(chain[len(chain)-1])
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}

// backingOf is the file a fake layer is built on; "" for any other file.
func backingOf(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var lines []string
	for len(lines) < 4 && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 4 || lines[0] != layerMagic {
		return "", nil
	}
	if _, err := strconv.ParseInt(lines[3], 10, 64); err != nil || strings.TrimSpace(lines[1]) == "" {
		return "", fmt.Errorf("%s: a malformed fake layer", path)
	}
	return lines[1], nil
}
