package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/supervisor"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// qemuPackage is the Debian package of the QEMU that runs arch's guests.
func qemuPackage(arch vmspec.Arch) string {
	if arch == vmspec.ARM64 {
		return "qemu-system-arm" // it holds qemu-system-aarch64
	}
	return "qemu-system-x86"
}

// hostPackages are the Debian/Ubuntu packages kosa8 needs on the host to
// build and run arch's guests.
func hostPackages(arch vmspec.Arch) []string {
	var missing []string
	if _, err := qemu.FindBinary(arch, ""); err != nil {
		missing = append(missing, qemuPackage(arch))
	}
	if !lookTool("qemu-img") {
		missing = append(missing, "qemu-utils")
	}
	if method, _ := image.Method(arch); method == image.MethodHostTools {
		missing = append(missing, image.MissingTools()...)
		if os.Geteuid() != 0 && !lookTool("newuidmap") {
			missing = append(missing, "uidmap") // mmdebstrap --mode=unshare
		}
	}
	sort.Strings(missing)
	return missing
}

// installPackages installs Debian packages with apt-get, through sudo when
// not root (saying so before it asks for a password).
func installPackages(ctx context.Context, pkgs []string) error {
	if !lookTool("apt-get") {
		return fmt.Errorf("missing %s and this system has no apt-get: install them with your package manager", strings.Join(pkgs, ", "))
	}
	install := append([]string{"apt-get", "install", "-y", "--no-install-recommends"}, pkgs...)
	var prefix []string
	if os.Geteuid() != 0 {
		if !lookTool("sudo") || !isTerminal(os.Stdin) {
			return fmt.Errorf("installing %s needs root: run 'sudo %s'", strings.Join(pkgs, ", "), strings.Join(install, " "))
		}
		fmt.Fprintf(os.Stderr, "kosa8: installing %s needs root; running: sudo %s\n", strings.Join(pkgs, ", "), strings.Join(install, " "))
		prefix = []string{"sudo"}
	} else {
		fmt.Fprintf(os.Stderr, "kosa8: installing %s\n", strings.Join(pkgs, ", "))
	}
	run := func(args ...string) error {
		args = append(prefix, args...)
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		return cmd.Run()
	}
	if err := run(install...); err != nil {
		// A stale package index is the usual cause on a fresh machine.
		if run("apt-get", "update") != nil || run(install...) != nil {
			return fmt.Errorf("apt-get install %s: %w", strings.Join(pkgs, " "), err)
		}
	}
	return nil
}

// buildImage builds (or finds) the default image for arch with a progress
// display. agent is kosa8-agent for arch: an image of another architecture
// than the host's boots once to finish its build.
func buildImage(ctx context.Context, m *sandbox.Manager, arch vmspec.Arch, agent string, rebuild bool) (*image.Image, error) {
	store := image.Store{Dir: m.Paths.Cache}
	r := image.DefaultRecipe(arch)
	if !rebuild {
		if img, err := store.Lookup(r); err == nil {
			return img, nil
		}
	}
	if err := os.MkdirAll(m.Paths.Cache, 0o755); err != nil {
		return nil, err
	}
	if hint := builderHint(arch); hint != "" {
		fmt.Fprintln(os.Stderr, "kosa8: the guest image is built in a builder VM; "+hint)
	}
	logPath := filepath.Join(m.Paths.Cache, "image-build.log")
	if image.Foreign(arch) {
		logPath = filepath.Join(m.Paths.Cache, "image-build-"+string(arch)+".log")
	}
	// Created once this build holds the image's lock: another build
	// writing it may be under way, and a wait shows its progress from it.
	logf := &lazyFile{path: logPath}
	defer logf.Close()
	p := newProgress(os.Stderr)
	p.Step("building the guest image (log: " + logPath + ")")
	p.LogTo(logf)
	img, err := store.Build(ctx, r, image.BuildOptions{Progress: p.Step, Count: p.Count, Log: logf, LogPath: logPath, Rebuild: rebuild,
		Waiting: func() func() {
			return watchBuildLog(p, "waiting for another build of the guest image to finish", logPath)
		},
		Agent: agent, Accel: vmm.Accel(os.Getenv("KOSA8_ACCEL")),
		NewDriver: func(arch vmspec.Arch, accel vmm.Accel) (vmm.Driver, error) {
			// The sandboxes' record of accelerators that failed to boot
			// (the supervisor's RecordDir): read, and written on a fallback.
			return qemu.New(qemu.Config{Arch: arch, Accel: accel, RecordDir: m.Paths.Home})
		}})
	p.Done()
	if err != nil {
		return nil, fmt.Errorf("%w\n(full log: %s)", err, logPath)
	}
	return img, nil
}

// lazyFile creates (truncates) its file at the first write, so that opening
// a log does not wipe the one another build is still writing.
type lazyFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
	err  error
}

func (l *lazyFile) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil && l.err == nil {
		l.f, l.err = os.Create(l.path)
	}
	if l.err != nil {
		return 0, l.err
	}
	return l.f.Write(b)
}

func (l *lazyFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	return l.f.Close()
}

// kosa8Command is how to call this kosa8 (self) from cwd: "kosa8" when that
// name on the PATH is this binary, else its path (relative when below cwd),
// with a hint saying how to put it on the PATH.
func kosa8Command(self, cwd string, lookPath func(string) (string, error)) (name, hint string) {
	if self == "" {
		return "kosa8", ""
	}
	real := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return p
	}
	if p, err := lookPath("kosa8"); err == nil && real(p) == real(self) {
		return "kosa8", ""
	}
	name = self
	if rel, err := filepath.Rel(cwd, self); err == nil && cwd != "" && !strings.HasPrefix(rel, "..") {
		name = "./" + rel
	}
	return name, fmt.Sprintf("%s is not the kosa8 on your PATH: 'make install' puts it there, or add  export PATH=\"%s:$PATH\"  to your shell profile", name, filepath.Dir(self))
}

func setupCmd() *cobra.Command {
	var rebuild, noInstall, build bool
	var archName string
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Install what kosa8 needs and build the guest image",
		Long: `Installs QEMU and the image build tools when they are missing (apt-get, through sudo
when you are not root), then builds the guest image: a Debian cloud kernel, an
initramfs with kosa8-agent, and a Debian root filesystem. The image is cached and
rebuilt only when its inputs change.

--arch arm64 on an x86-64 host builds the arm64 image: its packages are unpacked
here and installed in a first boot of the image under emulation (20-25 minutes on 2 cores).

With a base image pinned by digest (` + BaseImageEnv + `=REPOSITORY@sha256:..., or
the release's), setup pulls it instead: its blobs are checked against their digests and
installed as a build would be (under a minute). If that fails, setup says why and builds
the image here; --build builds without trying.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			arch, err := guestArch(archName)
			if err != nil {
				return err
			}
			if missing := hostPackages(arch); len(missing) > 0 {
				if noInstall {
					return fmt.Errorf("missing host packages: %s", strings.Join(missing, " "))
				}
				if err := installPackages(ctx, missing); err != nil {
					return err
				}
				if still := hostPackages(arch); len(still) > 0 {
					return fmt.Errorf("still missing after install: %s", strings.Join(still, " "))
				}
			}
			agent, err := agentPath(arch)
			if err != nil {
				return err
			}
			m, err := manager()
			if err != nil {
				return err
			}
			if err := sandbox.EnsureWritable(m.Paths.SandboxesDir()); err != nil {
				return err
			}
			var img *image.Image
			if ref := baseImageRef(); ref != "" && !build && !rebuild {
				store := image.Store{Dir: m.Paths.Cache}
				if _, err := store.Lookup(image.DefaultRecipe(arch)); err != nil {
					if img, err = pullBase(ctx, m, ref, arch); err != nil {
						if ctx.Err() != nil {
							return err
						}
						fmt.Fprintf(os.Stderr, "kosa8: could not set up the base image from %s: %v\nkosa8: building it here instead ('kosa8 setup --build' does so without trying the registry)\n", sanitize(ref, false), err)
						img = nil
					}
				}
			}
			if img == nil {
				if img, err = buildImage(ctx, m, arch, agent, rebuild); err != nil {
					return err
				}
			}
			if _, err := img.Initramfs(agent); err != nil {
				return err
			}
			self, _ := os.Executable()
			cwd, _ := os.Getwd()
			name, hint := kosa8Command(self, cwd, exec.LookPath)
			try := name + " run -- uname -a"
			if image.Foreign(arch) {
				try = name + " run --arch " + string(arch) + " -- uname -m"
			}
			fmt.Fprintf(os.Stderr, "kosa8: ready (image %s, kernel %s). Try: %s\n", filepath.Base(img.Dir), img.Manifest.KernelVersion, try)
			if hint != "" {
				fmt.Fprintf(os.Stderr, "kosa8: %s\n", hint)
			}
			return nil
		},
	}
	archFlag(cmd.Flags(), &archName)
	cmd.Flags().BoolVar(&rebuild, "rebuild", false, "build the image again even if it exists")
	cmd.Flags().BoolVar(&noInstall, "no-install", false, "do not install host packages; fail if any is missing")
	cmd.Flags().BoolVar(&build, "build", false, "build the base image here even when a pinned one can be pulled ("+BaseImageEnv+")")
	return cmd
}

func imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage guest images"}
	var asJSON, rebuild bool
	var agentName, archName string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List built images and pulled OCI images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			imgs, err := image.Store{Dir: m.Paths.Cache}.List()
			if err != nil {
				return err
			}
			recs, err := oci.NewCache(m.Paths.Cache).Records()
			if err != nil {
				return err
			}
			if asJSON {
				// Kind: "built" (a root filesystem sandboxes boot: base,
				// derived or converted from an OCI image) or "pulled" (an
				// OCI image in the cache, by digest).
				type imageView struct {
					Kind string `json:"kind"`
					Name string `json:"name"`
					Dir  string `json:"dir"`
					image.Manifest
				}
				type pulledView struct {
					Kind string `json:"kind"`
					*oci.Record
					Size int64 `json:"size"`
				}
				out := make([]any, 0, len(imgs)+len(recs))
				for _, img := range imgs {
					out = append(out, imageView{"built", filepath.Base(img.Dir), img.Dir, img.Manifest})
				}
				for _, r := range recs {
					out = append(out, pulledView{"pulled", r, r.Size()})
				}
				return printJSON(out)
			}
			printImages(os.Stdout, imgs, recs)
			return nil
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var df dockerBuildFlags
	build := &cobra.Command{
		Use:   "build [-f Dockerfile -t NAME [CONTEXT]]",
		Short: "Build the guest image (as setup does), or an OCI image from a Dockerfile inside a builder sandbox",
		Long: `Without -f or -t: build kosa8's guest image (as setup does, without installing
packages), and with --agent the derived image of an agent preset.

With -t NAME (and -f Dockerfile, default CONTEXT/Dockerfile; CONTEXT, default
the current folder): build the Dockerfile with buildah inside a builder sandbox.
The images its stages start from are pulled on this host; its RUN lines reach
only what the sandbox's allow-list holds (kosa8.toml's [network], --allow,
--net), and a refused host fails the build. The context is copied in
(.dockerignore applied; a link out of it is refused). The result is an OCI
image in kosa8's cache: 'kosa8 run --image NAME' boots it, 'kosa8 image push
NAME REF' publishes it.`,
		Example: "  kosa8 image build\n  kosa8 image build --agent claude\n  kosa8 image build -t myproj .\n  kosa8 image build -f docker/Dockerfile.dev -t myproj:dev --allow pypi.org --allow files.pythonhosted.org .",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			arch, err := guestArch(archName)
			if err != nil {
				return err
			}
			if df.tag != "" || df.file != "" || len(args) > 0 {
				if agentName != "" || rebuild {
					return fmt.Errorf("--agent and --rebuild build kosa8's own images; a Dockerfile build takes -t NAME, -f and a context")
				}
				return df.run(cmd.Context(), m, arch, args)
			}
			agentBin, err := agentPath(arch)
			if err != nil {
				return err
			}
			img, err := buildImage(cmd.Context(), m, arch, agentBin, rebuild)
			if err != nil {
				return err
			}
			if agentName != "" {
				p, err := agent.Get(agentName)
				if err != nil {
					return err
				}
				if img, err = ensureDerived(cmd.Context(), m, img, derivedRecipe(img, p, nil, nil, p.Name)); err != nil {
					return err
				}
			}
			fmt.Println(img.Dir)
			return nil
		},
	}
	build.Flags().BoolVar(&rebuild, "rebuild", false, "build again even if it exists")
	archFlag(build.Flags(), &archName)
	build.Flags().StringVar(&agentName, "agent", "", "also build the derived image of this agent preset ('kosa8 agents')")
	df.register(build)
	var pruneAll bool
	prune := &cobra.Command{
		Use:   "prune",
		Short: "Remove image builds no sandbox uses, keeping the newest of the current base and of each derived image on it (--all: not those)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			store := image.Store{Dir: m.Paths.Cache}
			keep := map[string]bool{}
			for _, arch := range []vmspec.Arch{vmspec.AMD64, vmspec.ARM64} {
				if img, err := store.Lookup(image.DefaultRecipe(arch)); err == nil {
					keep[img.Dir] = true
				}
			}
			cur, _ := store.Lookup(image.DefaultRecipe(vmspec.HostArch()))
			if cur != nil && !pruneAll {
				// The newest build of each derived recipe on the current base:
				// the next 'kosa8 run AGENT' would build it again.
				newest := map[string]*image.Image{}
				all, _ := store.List()
				for _, img := range all {
					if d := img.Manifest.Derived; d != nil && d.Base == cur.Manifest.Key {
						if n := newest[img.Manifest.Key]; n == nil || img.Manifest.Built.After(n.Manifest.Built) {
							newest[img.Manifest.Key] = img
						}
					}
				}
				for _, img := range newest {
					keep[img.Dir] = true
				}
				// The newest conversion of each OCI image still pulled.
				pulled := map[string]bool{}
				recs, _ := oci.NewCache(m.Paths.Cache).Records()
				for _, r := range recs {
					pulled[r.Manifest] = true
				}
				conv := map[string]*image.Image{}
				for _, img := range all {
					if o := img.Manifest.OCI; o != nil && pulled[o.Manifest] {
						if n := conv[o.Manifest]; n == nil || img.Manifest.Built.After(n.Manifest.Built) {
							conv[o.Manifest] = img
						}
					}
				}
				for _, img := range conv {
					keep[img.Dir] = true
				}
			}
			sbs, err := m.List()
			if err != nil {
				return err
			}
			for _, sb := range sbs {
				keep[sb.Config.ImageDir] = true
			}
			imgs, _ := store.List()
			for _, img := range imgs {
				if keep[img.Dir] {
					continue
				}
				if err := os.RemoveAll(img.Dir); err != nil {
					return err
				}
				fmt.Println(img.Dir)
			}
			// Boot templates of the images removed go with them.
			for _, d := range supervisor.PruneTemplates(m.Paths.Cache) {
				fmt.Println(d)
			}
			// OCI blobs no pulled image reaches.
			freed, err := oci.NewCache(m.Paths.Cache).Prune(nil)
			if err != nil {
				return err
			}
			if freed > 0 {
				fmt.Printf("freed %s of OCI blobs no pulled image uses\n", humanBytes(freed))
			}
			return nil
		},
	}
	prune.Flags().BoolVar(&pruneAll, "all", false, "remove derived images too unless a sandbox uses them")
	cmd.AddCommand(ls, build, prune, imagePullCmd(), imageRmCmd(), imagePushCmd(), imagePodCmd())
	return cmd
}

// printImages lists images as 'kosa8 ls' lists sandboxes: a header, and
// columns aligned with spaces.
func printImages(w io.Writer, imgs []*image.Image, recs []*oci.Record) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tARCH\tKIND\tKERNEL\tSIZE\tBUILT")
	for _, img := range imgs {
		what := "base (Debian " + img.Manifest.Recipe.Suite + ")"
		if o := img.Manifest.OCI; o != nil {
			what = "from " + o.Name + " " + o.ShortDigest()
		}
		if d := img.Manifest.Derived; d != nil {
			base := d.Base
			if len(base) > 16 {
				base = base[:16]
			}
			what = "derived: " + d.Label + " on " + base
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dM\t%s\n", filepath.Base(img.Dir), img.Manifest.Recipe.Arch, sanitize(what, false),
			img.Manifest.KernelVersion, img.Manifest.RootFSBytes>>20, ago(img.Manifest.Built))
	}
	// Pulled OCI images, not yet (or no longer) converted: their layers.
	for _, r := range recs {
		kind, when := "pulled", "pulled "+ago(r.Pulled)
		if r.Source == oci.SourceBuilt {
			kind, when = "built from a Dockerfile", "built "+ago(r.Pulled)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t-\t%s\t%s\n", sanitize(r.Name, false), r.Platform,
			sanitize(fmt.Sprintf("%s %s, %d layers", kind, r.ShortDigest(), len(r.Layers)), false), humanBytes(r.Size()), when)
	}
	tw.Flush()
}

func trustProject(args []string) error {
	name := "."
	if len(args) == 1 {
		name = args[0]
	}
	dir, err := folder.Resolve(name)
	if err != nil {
		return err
	}
	m, err := manager()
	if err != nil {
		return err
	}
	p := filepath.Join(dir.String(), config.FileName)
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no %s in %s", config.FileName, dir.String())
	}
	if err != nil {
		return err
	}
	proj, err := config.Parse(data)
	if err != nil {
		return err
	}
	if err := config.NewTrustStore(m.Paths.Config).Trust(p, data); err != nil {
		return err
	}
	fmt.Printf("trusted %s (sha256 %s)\n", p, config.Hash(data)[:16])
	for _, s := range proj.Settings() {
		fmt.Printf("    %s\n", s)
	}
	return nil
}
