package podimage

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kosa8/kosa8/internal/oci"
)

// OCIWriter is Writer through kosa8's OCI code (internal/oci): ref
// "oci:DIR[:TAG]" writes an OCI image layout folder, anything else is a
// registry reference pushed to.
type OCIWriter struct {
	Options oci.PullOptions // credentials, transport, insecure registries
	TempDir string          // where the layers' tar files are made ("": the system's)
	// Progress, if set, is told each step (a layer's tar, the write).
	Progress func(string)
}

// Write builds the image and writes or pushes it.
func (w OCIWriter) Write(ctx context.Context, ref string, cfg Config, layers []Layer) (string, error) {
	img, cleanup, err := w.Image(cfg, layers)
	defer cleanup()
	if err != nil {
		return "", err
	}
	w.say("writing the image to " + ref)
	if dir, ok := strings.CutPrefix(ref, "oci:"); ok {
		tag := "kosa8"
		if i := strings.LastIndex(dir, ":"); i > 0 {
			dir, tag = dir[:i], dir[i+1:]
		}
		return oci.WriteLayout(dir, tag, img)
	}
	return oci.PushV1Image(ctx, ref, img, w.Options)
}

// Image is the container image of these layers (linux/amd64), each a
// gzip-compressed tar made in TempDir; cleanup removes those files.
func (w OCIWriter) Image(cfg Config, layers []Layer) (v1.Image, func(), error) {
	var files []string
	cleanup := func() {
		for _, f := range files {
			os.Remove(f)
		}
	}
	img := empty.Image
	for _, l := range layers {
		w.say(fmt.Sprintf("layer %s: %d files", l.Name, len(l.Files)))
		f, err := os.CreateTemp(w.TempDir, "kosa8-layer-*.tar")
		if err != nil {
			return nil, cleanup, err
		}
		files = append(files, f.Name())
		err = writeTar(f, l)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, cleanup, fmt.Errorf("layer %s: %w", l.Name, err)
		}
		layer, err := tarball.LayerFromFile(f.Name())
		if err != nil {
			return nil, cleanup, fmt.Errorf("layer %s: %w", l.Name, err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return nil, cleanup, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, cleanup, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint, cf.Config.Env, cf.Config.User, cf.Config.WorkingDir = cfg.Entrypoint, cfg.Env, cfg.User, cfg.WorkingDir
	cf.Config.ExposedPorts = map[string]struct{}{}
	for _, p := range cfg.ExposedPorts {
		cf.Config.ExposedPorts[p] = struct{}{}
	}
	img, err = mutate.ConfigFile(img, cf)
	return img, cleanup, err
}

func (w OCIWriter) say(s string) {
	if w.Progress != nil {
		w.Progress(s)
	}
}

// writeTar writes a layer's files as a tar archive: owned by root, but the
// folders the pod writes to, which are its user's.
func writeTar(w io.Writer, l Layer) error {
	tw := tar.NewWriter(w)
	for _, f := range l.Files {
		h := &tar.Header{Name: strings.TrimPrefix(f.Path, "/"), Mode: int64(f.Mode.Perm()), Format: tar.FormatPAX}
		if strings.HasPrefix(f.Path, "/var/lib/kosa8") && f.Dir || f.Path == "/run/kosa8" || f.Path == "/workspace" {
			h.Uid, h.Gid = UID, UID
		}
		if f.Path == "/tmp" {
			h.Mode = 0o1777
		}
		switch {
		case f.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		default:
			src, err := os.Open(f.Source)
			if err != nil {
				return err
			}
			fi, err := src.Stat()
			if err != nil {
				src.Close()
				return err
			}
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
			if err := tw.WriteHeader(h); err != nil {
				src.Close()
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", f.Source, err)
			}
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	return tw.Close()
}
