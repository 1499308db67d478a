package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kosa8/kosa8/internal/oci"
)

// Publishing kosa8's own images (base, derived, converted) as OCI
// artifacts, and installing one pulled from a registry (what 'kosa8 setup'
// does with a base pinned by digest instead of building it).
//
// The artifact's config is the image's manifest.json (without host paths);
// its blobs are the root filesystem (ext4, zstd), the kernel (vmlinuz) and
// the kernel's module tree (tar, zstd). Installing writes them where a
// local build would have (CACHE/images/ARCH/KEY-TIME/), the root
// filesystem sparse, and checks the module tree as a build's is checked.

// artifactBlobMax bounds each blob of a kosa8 image pulled from a registry.
var artifactBlobMax = map[string]int64{
	oci.MediaRootFS:       64 << 30,
	oci.MediaKernel:       maxKernelMemberSize,
	oci.MediaKernelModule: 4 << 30,
}

// ArtifactBlobMax is artifactBlobMax, for oci.PullArtifact.
func ArtifactBlobMax() map[string]int64 { return artifactBlobMax }

// Artifact packs img as an OCI artifact, its blobs written to cache.
func (s Store) Artifact(ctx context.Context, img *Image, cache oci.Cache, progress func(string)) (oci.Artifact, error) {
	if progress == nil {
		progress = func(string) {}
	}
	m := img.Manifest
	m.BaseDir = "" // a path of this host
	cfg, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return oci.Artifact{}, err
	}
	art := oci.Artifact{Arch: m.Recipe.Arch, Config: cfg}
	progress(fmt.Sprintf("compressing the root filesystem (%d MiB, zstd)", m.RootFSBytes>>20))
	b, err := blobOf(cache, oci.MediaRootFS, func(w io.Writer) error {
		f, err := os.Open(img.RootFS())
		if err != nil {
			return err
		}
		defer f.Close()
		return zstdCopy(ctx, w, f)
	})
	if err != nil {
		return art, fmt.Errorf("the root filesystem: %w", err)
	}
	art.Blobs = append(art.Blobs, b)
	k := img.Kernel()
	if b, err = blobOf(cache, oci.MediaKernel, func(w io.Writer) error {
		f, err := os.Open(k.Image)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(w, f)
		return err
	}); err != nil {
		return art, fmt.Errorf("the kernel: %w", err)
	}
	art.Blobs = append(art.Blobs, b)
	progress("packing the kernel's modules")
	if b, err = blobOf(cache, oci.MediaKernelModule, func(w io.Writer) error {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarTree(pw, k.Modules, k.Version)) }()
		defer pr.Close()
		return zstdCopy(ctx, w, pr)
	}); err != nil {
		return art, fmt.Errorf("the kernel's modules: %w", err)
	}
	art.Blobs = append(art.Blobs, b)
	return art, nil
}

// blobOf writes a blob with fill into the cache and describes it.
func blobOf(cache oci.Cache, mt string, fill func(io.Writer) error) (oci.Blob, error) {
	f, err := cache.TempFile()
	if err != nil {
		return oci.Blob{}, err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	cw := &blobCounter{w: io.MultiWriter(f, h)}
	if err := fill(cw); err != nil {
		return oci.Blob{}, err
	}
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if err := cache.Adopt(f, d); err != nil {
		return oci.Blob{}, err
	}
	ok = true
	return oci.Blob{MediaType: mt, Digest: d, Size: cw.n}, nil
}

type blobCounter struct {
	w io.Writer
	n int64
}

func (c *blobCounter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

func zstdCopy(ctx context.Context, w io.Writer, r io.Reader) error {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)), zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return err
	}
	buf := make([]byte, 4<<20)
	for {
		if err := ctx.Err(); err != nil {
			zw.Close()
			return err
		}
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if _, err := zw.Write(buf[:n]); err != nil {
				zw.Close()
				return err
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			zw.Close()
			return rerr
		}
	}
	return zw.Close()
}

// tarTree writes the directories and regular files under dir as a tar,
// named prefix/...: a module tree's links (build, source) are left out.
func tarTree(w io.Writer, dir, prefix string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		name := path.Join(prefix, filepath.ToSlash(rel))
		fi, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: fi.ModTime(), Format: tar.FormatPAX})
		case fi.Mode().IsRegular():
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: fi.Size(), ModTime: fi.ModTime(), Format: tar.FormatPAX}); err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyN(tw, f, fi.Size())
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// kernelVersionRE is a kernel version as a directory name.
var kernelVersionRE = regexp.MustCompile(`^[0-9][A-Za-z0-9.+_-]{0,63}$`)

// ErrRecipeMismatch: a pulled image was built from another recipe than
// the one this kosa8 would build.
var ErrRecipeMismatch = errors.New("built from another recipe")

// InstallArtifact installs a kosa8 image pulled into cache as the image of
// want (its recipe's key must be want's: an image of another recipe is
// not this kosa8's base), and removes the pulled blobs.
func (s Store) InstallArtifact(ctx context.Context, cache oci.Cache, art *oci.PulledArtifact, want Recipe, progress func(string)) (*Image, error) {
	if progress == nil {
		progress = func(string) {}
	}
	var m Manifest
	if err := json.Unmarshal(art.Config, &m); err != nil {
		return nil, fmt.Errorf("%s: its config is not a kosa8 image manifest: %w", art.Ref, err)
	}
	if m.Key != want.Key() || m.Recipe.Key() != want.Key() || m.Recipe.Arch != want.Arch || m.Derived != nil || m.OCI != nil {
		return nil, fmt.Errorf("%s holds image %s (%s), and this kosa8's base for %s is %s: %w", art.Ref, clipText(m.Key), clipText(string(m.Recipe.Arch)), want.Arch, want.Key(), ErrRecipeMismatch)
	}
	if !kernelVersionRE.MatchString(m.KernelVersion) {
		return nil, fmt.Errorf("%s: kernel version %s", art.Ref, clipText(m.KernelVersion))
	}
	blob := map[string]oci.Blob{}
	for _, b := range art.Blobs {
		blob[b.MediaType] = b
	}
	for _, mt := range []string{oci.MediaRootFS, oci.MediaKernel, oci.MediaKernelModule} {
		if _, ok := blob[mt]; !ok {
			return nil, fmt.Errorf("%s has no %s blob", art.Ref, mt)
		}
	}
	archDir := s.archDir(want.Arch)
	if err := os.MkdirAll(archDir, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(archDir, ".build-"+want.Key()+"-pull-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	out := filepath.Join(work, "out")
	kdir := filepath.Join(out, "kernel")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		return nil, err
	}
	start := time.Now()
	progress(fmt.Sprintf("writing the root filesystem (%d MiB)", m.RootFSBytes>>20))
	rootfs := filepath.Join(out, "rootfs.ext4")
	if err := unzstdTo(cache, blob[oci.MediaRootFS], rootfs, m.RootFSBytes); err != nil {
		return nil, fmt.Errorf("%s: the root filesystem: %w", art.Ref, err)
	}
	if size, err := ext4Size(rootfs); err != nil || size != m.RootFSBytes {
		return nil, fmt.Errorf("%s: the root filesystem is not the %d-byte ext4 its manifest says (%d, %v)", art.Ref, m.RootFSBytes, size, err)
	}
	kf, err := cache.OpenBlob(blob[oci.MediaKernel].Digest)
	if err != nil {
		return nil, err
	}
	_, err = writeNewMax(filepath.Join(kdir, "vmlinuz"), kf, maxKernelMemberSize)
	kf.Close()
	if err != nil {
		return nil, err
	}
	progress("writing the kernel's modules")
	if err := untarModules(cache, blob[oci.MediaKernelModule], kdir, m.KernelVersion); err != nil {
		return nil, fmt.Errorf("%s: the kernel's modules: %w", art.Ref, err)
	}
	if err := writeNew(filepath.Join(kdir, "version"), strings.NewReader(m.KernelVersion+"\n")); err != nil {
		return nil, err
	}
	tree, err := loadModuleTree(os.DirFS(filepath.Join(kdir, m.KernelVersion)))
	if err != nil {
		return nil, err
	}
	if _, err := tree.resolve(GuestModules); err != nil {
		return nil, err
	}
	_ = os.Chmod(rootfs, 0o444)
	dst, err := install(out, archDir, m)
	if err != nil {
		return nil, err
	}
	cache.RemoveBlobs(art.Blobs)
	progress(fmt.Sprintf("installed in %s", time.Since(start).Round(time.Millisecond)))
	return s.Open(dst)
}

// unzstdTo decompresses blob b into a new sparse file p of exactly size
// bytes.
func unzstdTo(cache oci.Cache, b oci.Blob, p string, size int64) error {
	f, err := cache.OpenBlob(b.Digest)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)), zstd.WithDecoderMaxWindow(128<<20))
	if err != nil {
		return err
	}
	defer zr.Close()
	out, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	n, err := copySparseAt(out, 0, zr, size)
	if errors.Is(err, errBomb) {
		return fmt.Errorf("more than the %d bytes its manifest says", size)
	}
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%d bytes where its manifest says %d", n, size)
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	return out.Close()
}

// untarModules unpacks the module tree blob into kdir: directories and
// regular files only, every name under VERSION/, clean, and at most
// maxKernelTotal bytes. kdir is new and holds no links, so nothing
// written here can be led elsewhere.
func untarModules(cache oci.Cache, b oci.Blob, kdir, version string) error {
	f, err := cache.OpenBlob(b.Digest)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20))
	if err != nil {
		return err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if n > 100_000 {
			return errors.New("more than 100000 members")
		}
		name := strings.TrimSuffix(h.Name, "/")
		if !fs.ValidPath(name) || (name != version && !strings.HasPrefix(name, version+"/")) {
			return fmt.Errorf("member %s is not under %s/", clipText(h.Name), version)
		}
		dst := filepath.Join(kdir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if total += h.Size; total > maxKernelTotal {
				return fmt.Errorf("more than %d bytes", maxKernelTotal)
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			if w, err := writeNewMax(dst, tr, h.Size); err != nil || w != h.Size {
				return fmt.Errorf("%s: %v", clipText(name), err)
			}
		default:
			return fmt.Errorf("member %s is neither a file nor a directory", clipText(h.Name))
		}
	}
}
