package image

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
)

// flattenSpy records what it was asked to flatten.
type flattenSpy struct {
	vmmtest.Layers
	flattened []string
}

func (f *flattenSpy) Flatten(ctx context.Context, path, dst string, log io.Writer) error {
	f.flattened = append(f.flattened, path)
	return f.Layers.Flatten(ctx, path, dst, log)
}

// The build sandbox's root disk header is QEMU's to write: a compromised
// QEMU could name any host file as its backing one (a host disk, another
// sandbox's layer), which flattening, run by root, would copy into the
// image every sandbox of it boots. Only a disk one layer over the base's
// root file system is flattened.
func TestCommitDerivedFlattensOnlyALayerOverTheBase(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := &Image{Dir: filepath.Join(dir, "arch", "base")}
	if err := os.MkdirAll(base.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(base.RootFS(), []byte("base rootfs"), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "host-disk")
	if err := os.WriteFile(secret, []byte("the host's own disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	l := &flattenSpy{}
	root := filepath.Join(dir, "root.qcow2")
	if err := l.Create(ctx, root, secret, "raw", 1<<30); err != nil { // as QEMU rewrote it
		t.Fatal(err)
	}
	d := DerivedRecipe{Base: "b1", Packages: []string{"jq"}}
	if _, err := (Store{Dir: dir}).CommitDerived(ctx, base, d, l, root, "", io.Discard); err == nil {
		t.Error("an image was made of a root disk over a host file")
	}
	if len(l.flattened) != 0 {
		t.Errorf("flattened %v, a root disk over %s", l.flattened, secret)
	}
}
