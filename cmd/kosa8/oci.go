package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/dockerfile"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// OCI images: pulled on the host (outside every sandbox's allow-list) into
// the cache by digest; see internal/oci and docs/images.md.

// imageFrom says who named an image: the user (a flag, kosa8.toml) or a
// repository's own file (a dev container definition and its Dockerfile),
// which is not trusted.
type imageFrom int

const (
	fromUser imageFrom = iota
	// fromRepository: pulled anonymously (the user's registry credentials
	// would let the repository pull the user's private images into a
	// sandbox it drives), from a registry only (never a host path), and
	// never a local image built under that name.
	fromRepository
)

// pullImage pulls src for arch with a progress display. An image built
// here under that name ('kosa8 image build -t') is taken as it is, as
// docker takes a local image before a registry's, unless a repository
// named it.
func pullImage(ctx context.Context, m *sandbox.Manager, src string, arch vmspec.Arch, from imageFrom) (*oci.Record, error) {
	opts := oci.PullOptions{Arch: arch}
	if from == fromRepository {
		if oci.IsPath(src) {
			return nil, fmt.Errorf("%q is a path: an image named by the repository's own files must be a registry reference", sanitize(src, false))
		}
		opts.Keychain = oci.AnonymousKeychain
	} else if rec := oci.NewCache(m.Paths.Cache).FindBuilt(src, oci.PlatformString(arch)); rec != nil {
		return rec, nil
	}
	p := newProgress(os.Stderr)
	defer p.Done()
	p.Step("pulling " + src + " (on the host, outside the sandbox's allow-list)")
	last := time.Now()
	opts.Progress = func(done, total int64) {
		if time.Since(last) > 2*time.Second || done == total {
			last = time.Now()
			p.Step(fmt.Sprintf("pulling %s: %s of %s", src, humanBytes(done), humanBytes(total)))
		}
	}
	rec, err := oci.Pull(ctx, oci.NewCache(m.Paths.Cache), src, opts)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", src, err)
	}
	return rec, nil
}

func imagePullCmd() *cobra.Command {
	var archName string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "pull REF|./LAYOUT|./IMAGE.tar",
		Short: "Pull an OCI image into the cache (a registry, an OCI layout, or a docker/podman save tarball)",
		Long: `Pull an OCI image into kosa8's cache, by digest, for the sandbox's architecture.
The pull runs on this host, outside every sandbox's allow-list, with your registry
credentials (docker's and podman's config files and credential helpers). Plain HTTP
is used only for registries on loopback and those in ` + oci.InsecureEnv + `.`,
		Example: "  kosa8 image pull python:3.12-slim\n  kosa8 image pull 127.0.0.1:5000/me/app@sha256:...\n  kosa8 image pull ./app-oci-layout\n  kosa8 image pull ./app.tar",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			arch, err := guestArch(archName)
			if err != nil {
				return err
			}
			rec, err := pullImage(cmd.Context(), m, args[0], arch, fromUser)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(rec)
			}
			fmt.Printf("%s\t%s\t%s\t%d layers\t%s\n", sanitize(rec.Name, false), rec.Platform, rec.Manifest, len(rec.Layers), humanBytes(rec.Size()))
			return nil
		},
	}
	archFlag(cmd.Flags(), &archName)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func imageRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME|DIGEST...",
		Short: "Forget pulled OCI images (their blobs go at the next 'kosa8 image prune')",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			cache := oci.NewCache(m.Paths.Cache)
			for _, a := range args {
				recs, err := cache.Lookup(a)
				if err != nil {
					return err
				}
				if len(recs) == 0 {
					return fmt.Errorf("no pulled image %q ('kosa8 image ls' lists them)", a)
				}
				for _, r := range recs {
					if err := cache.RemoveRecord(r); err != nil {
						return err
					}
					fmt.Printf("removed %s (%s, %s)\n", sanitize(r.Name, false), r.Platform, r.ShortDigest())
				}
			}
			return nil
		},
	}
}

// ociImage pulls src and converts it into a root filesystem (once per
// manifest digest), with progress; it says what kosa8 added to the image
// and what the image lacks.
func ociImage(ctx context.Context, m *sandbox.Manager, src string, arch vmspec.Arch, from imageFrom) (*image.Image, error) {
	base, err := baseImage(m, arch)
	if err != nil {
		return nil, fmt.Errorf("an OCI image is unpacked in a VM of kosa8's base image, and %w", err)
	}
	rec, err := pullImage(ctx, m, src, arch, from)
	if err != nil {
		return nil, err
	}
	store := image.Store{Dir: m.Paths.Cache}
	if img, err := store.LookupOCI(base, rec); err == nil {
		return img, nil
	}
	agentBin, err := agentPath(arch)
	if err != nil {
		return nil, err
	}
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stopSignals()
	logPath := filepath.Join(m.Paths.Cache, "image-convert-"+image.OCIKey(rec.Manifest)+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	p := newProgress(os.Stderr)
	p.Step(fmt.Sprintf("converting %s (%s) into a root filesystem (log: %s)", src, rec.ShortDigest(), logPath))
	img, err := store.ConvertOCI(ctx, base, oci.NewCache(m.Paths.Cache), rec, image.ConvertOptions{
		BuildOptions: image.BuildOptions{Progress: p.Step, Log: logf, Agent: agentBin, Accel: vmm.Accel(os.Getenv("KOSA8_ACCEL")),
			NewDriver: func(arch vmspec.Arch, accel vmm.Accel) (vmm.Driver, error) {
				return qemu.New(qemu.Config{Arch: arch, Accel: accel, RecordDir: m.Paths.Home})
			}},
		Layers: m.Disks,
	})
	p.Done()
	if err != nil {
		return nil, fmt.Errorf("%w\n(full log: %s)", err, logPath)
	}
	o := img.Manifest.OCI
	if len(o.Added) > 0 {
		fmt.Fprintf(os.Stderr, "kosa8: %s lacked what a sandbox needs; kosa8 added %s\n", sanitize(src, false), strings.Join(o.Added, ", "))
	}
	if miss := o.Missing(); len(miss) > 0 {
		fmt.Fprintf(os.Stderr, "kosa8: %s has no %s\n", sanitize(src, false), strings.Join(miss, "; no "))
	}
	return img, nil
}

// caEnvKeys are set by kosa8 to the bundle holding the sandbox CA: an
// image's values for them would leave it out.
var caEnvKeys = []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT"}

// applyOCIConfig gives a sandbox of an OCI image the image config's Env
// (before --env, which wins), WorkingDir and non-root User, and its shell.
func applyOCIConfig(cfg *sandbox.Config, o *image.OCISource) {
	if o == nil {
		return
	}
	var env []string
	for _, e := range o.Env {
		k, _, _ := strings.Cut(e, "=")
		if !slices.Contains(caEnvKeys, k) {
			env = append(env, e)
		}
	}
	cfg.Env = append(env, cfg.Env...)
	cfg.WorkDir = o.WorkingDir
	if o.User != nil {
		cfg.User, cfg.UID, cfg.GID = o.User.Name, o.User.UID, o.User.GID
	}
	switch o.Shell {
	case "":
		cfg.Shell = sandbox.NoShell
	case "/bin/bash", "/usr/bin/bash":
	default:
		cfg.Shell = o.Shell
	}
}

// baseImage is the release's pinned base image (REPOSITORY@sha256:...),
// set at build time (-ldflags "-X main.pinnedBase=…"); BaseImageEnv
// overrides it. Empty: 'kosa8 setup' builds the base locally.
var pinnedBase = ""

// BaseImageEnv names the kosa8 base image 'kosa8 setup' pulls instead of
// building: a registry repository pinned by digest.
const BaseImageEnv = "KOSA8_BASE_IMAGE"

func baseImageRef() string {
	if v := strings.TrimSpace(os.Getenv(BaseImageEnv)); v != "" {
		return v
	}
	return pinnedBase
}

// pinnedBaseKey is the public key (PEM, base64-encoded: -ldflags cannot
// carry newlines) whose cosign signature a release's base image must
// carry; BaseKeyEnv overrides it. Empty: the pinned digest is the check.
var pinnedBaseKey = ""

// BaseKeyEnv names a file holding the PEM public key (cosign.pub) that
// signs the base image 'kosa8 setup' pulls.
const BaseKeyEnv = "KOSA8_BASE_KEY"

// baseImageKey is the pinned key that signs the base image, and where it
// came from; nil when none is pinned.
func baseImageKey() (signature.Verifier, string, error) {
	if p := strings.TrimSpace(os.Getenv(BaseKeyEnv)); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", BaseKeyEnv, err)
		}
		k, err := oci.ParsePublicKey(b)
		if err != nil {
			return nil, "", fmt.Errorf("%s=%s: %w", BaseKeyEnv, p, err)
		}
		return k, p, nil
	}
	if pinnedBaseKey == "" {
		return nil, "", nil
	}
	b, err := base64.StdEncoding.DecodeString(pinnedBaseKey)
	if err != nil {
		return nil, "", fmt.Errorf("this kosa8's pinned base image key is damaged: %w", err)
	}
	k, err := oci.ParsePublicKey(b)
	if err != nil {
		return nil, "", fmt.Errorf("this kosa8's pinned base image key: %w", err)
	}
	return k, "the key built into this kosa8", nil
}

// pullBase sets up the base image for arch from ref (pinned by digest):
// its blobs are fetched and checked, then installed as a local build would
// be. Any failure is returned for the caller to fall back on the build.
func pullBase(ctx context.Context, m *sandbox.Manager, ref string, arch vmspec.Arch) (*image.Image, error) {
	p := newProgress(os.Stderr)
	defer p.Done()
	start := time.Now()
	key, keySrc, err := baseImageKey()
	if err != nil {
		return nil, err
	}
	if key != nil {
		// Before anything is fetched: an image its key did not sign is
		// not pulled at all.
		r, err := oci.ParseReference(ref, nil)
		if err != nil {
			return nil, err
		}
		dg, ok := r.(name.Digest)
		if !ok {
			return nil, fmt.Errorf("%s names no digest: a pinned base image is a REPOSITORY@sha256:... reference", ref)
		}
		p.Step("checking the base image's signature against " + keySrc)
		if err := oci.VerifySignature(ctx, ref, dg.DigestStr(), key, oci.PullOptions{Arch: arch}); err != nil {
			return nil, err
		}
		// Said whatever the wait: what was trusted, and why.
		p.Note("kosa8: the base image is signed by " + keySrc)
	}
	p.Step("pulling the base image " + ref + " (on the host)")
	cache := oci.NewCache(m.Paths.Cache)
	last := time.Now()
	art, err := oci.PullArtifact(ctx, cache, ref, oci.PullOptions{Arch: arch, Progress: func(done, total int64) {
		if time.Since(last) > 2*time.Second || done == total {
			last = time.Now()
			p.Step(fmt.Sprintf("pulling the base image: %s of %s", humanBytes(done), humanBytes(total)))
		}
	}}, image.ArtifactBlobMax())
	if err != nil {
		return nil, err
	}
	img, err := image.Store{Dir: m.Paths.Cache}.InstallArtifact(ctx, cache, art, image.DefaultRecipe(arch), p.Step)
	if err != nil {
		return nil, err
	}
	// The result, said however quick the pull was (a step is quiet for its
	// first 2 s without a terminal).
	p.Note(fmt.Sprintf("kosa8: base image pulled and installed in %s", time.Since(start).Round(time.Millisecond)))
	return img, nil
}

func imagePushCmd() *cobra.Command {
	var base, asJSON bool
	var archName string
	cmd := &cobra.Command{
		Use:   "push [IMAGE] REF",
		Short: "Publish an image to a registry: a built one (base, derived, converted) as an OCI artifact, one built from a Dockerfile as a container image",
		Long: `Push a kosa8 image to a registry as an OCI artifact: the finished root filesystem
(ext4, zstd), the kernel and its module tree, with kosa8's manifest as the config,
under an index by platform. IMAGE is a name from 'kosa8 image ls'; --base pushes the
base image of every architecture built here. It prints the index digest: pin it with
` + BaseImageEnv + `=REPOSITORY@DIGEST, and 'kosa8 setup' pulls the base instead of
building it.

An image built from a Dockerfile ('kosa8 image build -t NAME') is pushed as the
container image it is (its layers, config and manifest), for docker, podman or
kosa8 to pull; it prints REPOSITORY@DIGEST.`,
		Example: "  kosa8 image push --base 127.0.0.1:5000/kosa8/base:1\n  kosa8 image push o-1234abcd-20261203T100746 registry.example.com/me/app:1\n  kosa8 image push myproj:1 registry.example.com/me/myproj:1",
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			store := image.Store{Dir: m.Paths.Cache}
			var imgs []*image.Image
			ref := args[len(args)-1]
			switch {
			case base && len(args) == 1:
				arches := []vmspec.Arch{vmspec.AMD64, vmspec.ARM64}
				if archName != "" {
					a, err := guestArch(archName)
					if err != nil {
						return err
					}
					arches = []vmspec.Arch{a}
				}
				for _, a := range arches {
					if img, err := store.Lookup(image.DefaultRecipe(a)); err == nil {
						imgs = append(imgs, img)
					}
				}
				if len(imgs) == 0 {
					return fmt.Errorf("no base image is built here: run 'kosa8 setup --build' first")
				}
			case !base && len(args) == 2:
				all, _ := store.List()
				for _, img := range all {
					if filepath.Base(img.Dir) == args[0] || img.Dir == args[0] {
						imgs = append(imgs, img)
					}
				}
				if len(imgs) == 0 {
					// An OCI image built from a Dockerfile (or pulled):
					// pushed as the container image it is.
					return pushOCIImage(cmd.Context(), m, args[0], ref, archName, asJSON)
				}
			default:
				return fmt.Errorf("give IMAGE and REF, or --base and REF")
			}
			cache := oci.NewCache(m.Paths.Cache)
			p := newProgress(os.Stderr)
			start := time.Now()
			var arts []oci.Artifact
			for _, img := range imgs {
				a, err := store.Artifact(cmd.Context(), img, cache, p.Step)
				if err != nil {
					p.Done()
					return err
				}
				arts = append(arts, a)
			}
			d, err := oci.PushArtifacts(cmd.Context(), cache, ref, arts, oci.PullOptions{}, p.Step)
			p.Done()
			for _, a := range arts {
				cache.RemoveBlobs(a.Blobs) // kept by the registry; made again by the next push
			}
			if err != nil {
				return err
			}
			r, err := oci.ParseReference(ref, nil)
			if err != nil {
				return err
			}
			pinned := r.Context().Name() + "@" + d
			if asJSON {
				return printJSON(map[string]any{"ref": ref, "digest": d, "pinned": pinned, "seconds": time.Since(start).Seconds()})
			}
			fmt.Printf("%s\n", pinned)
			fmt.Fprintf(os.Stderr, "kosa8: pushed %d image(s) to %s in %s; to set up from it: %s=%s kosa8 setup\n", len(arts), ref, time.Since(start).Round(time.Millisecond), BaseImageEnv, pinned)
			return nil
		},
	}
	cmd.Flags().BoolVar(&base, "base", false, "push the base image (of every architecture built here, or --arch)")
	cmd.Flags().StringVar(&archName, "arch", "", "only this architecture (with --base, or of an OCI image)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// projectImage takes the OCI image a project names when --image does not:
// kosa8.toml's [image] from (trusted; a path is relative to its folder),
// else .devcontainer/devcontainer.json's image (a registry reference only:
// the file is the repository's, not trusted, and a path there would have
// the host read its own files into the sandbox).
func (f *createFlags) projectImage(wd string, proj *config.Project) error {
	if f.image != "" {
		return nil
	}
	if proj != nil && proj.Image.From != "" {
		f.image = proj.Image.From
		if oci.IsPath(f.image) && !filepath.IsAbs(f.image) {
			f.image = filepath.Join(wd, f.image)
		}
		return nil
	}
	dc, err := config.LoadDevContainer(wd)
	if err != nil || dc == nil {
		return err
	}
	switch {
	case dc.Image != "" && (strings.HasPrefix(dc.Image, "/") || strings.HasPrefix(dc.Image, ".") || oci.IsPath(dc.Image)):
		return fmt.Errorf("%s names the image %q, a path: kosa8 takes only a registry reference from a dev container file (it is the repository's, not trusted); name a local image in kosa8.toml's [image] from, or pass --image",
			dc.Path, sanitize(dc.Image, false))
	case dc.Image != "":
		fmt.Fprintf(os.Stderr, "kosa8: using the image %s named by %s (pulled on this host without your registry credentials; --image or kosa8.toml's [image] from take precedence)\n", sanitize(dc.Image, false), dc.Path)
		f.image = dc.Image
		f.imageFrom = fromRepository
	case dc.Dockerfile != "":
		b, err := f.devContainerBuild(wd, dc, proj)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "kosa8: building the image of %s from %s in a builder sandbox (its RUN lines reach only what the sandbox's allow-list holds; --image or kosa8.toml's [image] from take precedence)\n",
			dc.Path, sanitize(dc.Dockerfile, false))
		f.devBuild = b
	}
	return nil
}

// devContainerBuild is the build of a dev container's build.dockerfile.
// The file is the repository's, not trusted: its Dockerfile and its
// context must lie inside the project folder (resolved through links), the
// Dockerfile is read through the folder's root, and the image is named
// after the folder ("devcontainer-NAME-HASH").
func (f *createFlags) devContainerBuild(wd string, dc *config.DevContainer, proj *config.Project) (*dockerBuild, error) {
	dcDir := filepath.Dir(dc.Path)
	outside := func(what, p string) error {
		return fmt.Errorf("%s names a %s outside the project (%s): kosa8 builds only from the project folder, since the file is the repository's; pass --image, or name the image in kosa8.toml's [image] from",
			dc.Path, what, sanitize(p, false))
	}
	dfPath := filepath.Join(dcDir, dc.Dockerfile)
	if !under(wd, dfPath) {
		return nil, outside("Dockerfile", dfPath)
	}
	dfRel, _ := filepath.Rel(wd, dfPath)
	ctxDir := filepath.Join(dcDir, dc.Context)
	if !under(wd, ctxDir) {
		return nil, outside("build context", ctxDir)
	}
	// Through links too: the resolved context must still be under the
	// resolved project folder.
	rw, err := folder.Resolve(wd)
	if err != nil {
		return nil, err
	}
	rc, err := folder.Resolve(ctxDir)
	if err != nil {
		return nil, fmt.Errorf("%s: build context: %w", dc.Path, err)
	}
	if !under(rw.String(), rc.String()) {
		return nil, outside("build context", rc.String())
	}
	root, err := os.OpenRoot(wd)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	df, err := root.Open(dfRel)
	if err != nil {
		return nil, fmt.Errorf("%s: the Dockerfile: %w", dc.Path, err)
	}
	defer df.Close()
	src, err := io.ReadAll(io.LimitReader(df, dockerfile.MaxSize+1))
	if err != nil {
		return nil, err
	}
	arch, err := guestArch(f.arch)
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256([]byte(rw.String()))
	base := strings.Trim(strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, filepath.Base(rw.String())), "-")
	if len(base) > 40 {
		base = base[:40]
	}
	return &dockerBuild{
		file: filepath.Join(wd, dfRel), contextDir: rc.String(), dockerfile: src,
		tag: "devcontainer-" + base + "-" + hex.EncodeToString(h[:4]), args: dc.Args, target: dc.Target, arch: arch,
		preset: f.preset, allow: f.allow, allowBroad: f.allowBroad, proj: proj, from: fromRepository,
	}, nil
}

// under reports whether p is base or lies below it (both cleaned,
// absolute; no link is resolved here).
func under(base, p string) bool {
	rel, err := filepath.Rel(base, p)
	return err == nil && !filepath.IsAbs(rel) && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// pushOCIImage pushes the OCI image what names in the cache (built with
// 'kosa8 image build -t', or pulled) to ref, as a container image any
// registry client pulls, and prints REPOSITORY@DIGEST.
func pushOCIImage(ctx context.Context, m *sandbox.Manager, what, ref, archName string, asJSON bool) error {
	cache := oci.NewCache(m.Paths.Cache)
	recs, err := cache.Lookup(what)
	if err != nil {
		return err
	}
	if archName != "" {
		a, err := guestArch(archName)
		if err != nil {
			return err
		}
		recs = slices.DeleteFunc(recs, func(r *oci.Record) bool { return r.Platform != oci.PlatformString(a) })
	}
	switch {
	case len(recs) == 0:
		return fmt.Errorf("no image %q ('kosa8 image ls' lists them)", what)
	case len(recs) > 1:
		return fmt.Errorf("%q names %d images (%s, ...): say which with --arch or a digest", what, len(recs), recs[0].Platform)
	}
	p := newProgress(os.Stderr)
	start := time.Now()
	d, err := oci.PushImage(ctx, cache, recs[0], ref, oci.PullOptions{}, p.Step)
	p.Done()
	if err != nil {
		return err
	}
	r, err := oci.ParseReference(ref, nil)
	if err != nil {
		return err
	}
	pinned := r.Context().Name() + "@" + d
	if asJSON {
		return printJSON(map[string]any{"ref": ref, "digest": d, "pinned": pinned, "seconds": time.Since(start).Seconds()})
	}
	fmt.Println(pinned)
	fmt.Fprintf(os.Stderr, "kosa8: pushed %s to %s in %s\n", sanitize(recs[0].Name, false), ref, time.Since(start).Round(time.Millisecond))
	return nil
}
