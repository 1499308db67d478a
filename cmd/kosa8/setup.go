package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/image"
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
	logPath := filepath.Join(m.Paths.Cache, "image-build.log")
	if image.Foreign(arch) {
		logPath = filepath.Join(m.Paths.Cache, "image-build-"+string(arch)+".log")
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	p := newProgress(os.Stderr)
	p.Step("building the guest image (log: " + logPath + ")")
	img, err := store.Build(ctx, r, image.BuildOptions{Progress: p.Step, Log: logf, Rebuild: rebuild,
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

func setupCmd() *cobra.Command {
	var rebuild, noInstall bool
	var archName string
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Install what kosa8 needs and build the guest image",
		Long: `Installs QEMU and the image build tools when they are missing (apt-get, through sudo
when you are not root), then builds the guest image: a Debian cloud kernel, an
initramfs with kosa8-agent, and a Debian root filesystem. The image is cached and
rebuilt only when its inputs change.

--arch arm64 on an x86-64 host builds the arm64 image: its packages are unpacked
here and installed in a first boot of the image under emulation (20-25 minutes on 2 cores).`,
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
			img, err := buildImage(ctx, m, arch, agent, rebuild)
			if err != nil {
				return err
			}
			if _, err := img.Initramfs(agent); err != nil {
				return err
			}
			try := "kosa8 run -- uname -a"
			if image.Foreign(arch) {
				try = "kosa8 run --arch " + string(arch) + " -- uname -m"
			}
			fmt.Fprintf(os.Stderr, "kosa8: ready (image %s, kernel %s). Try: %s\n", filepath.Base(img.Dir), img.Manifest.KernelVersion, try)
			return nil
		},
	}
	archFlag(cmd.Flags(), &archName)
	cmd.Flags().BoolVar(&rebuild, "rebuild", false, "build the image again even if it exists")
	cmd.Flags().BoolVar(&noInstall, "no-install", false, "do not install host packages; fail if any is missing")
	return cmd
}

func imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage guest images"}
	var asJSON, rebuild bool
	var agentName, archName string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List built images",
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
			if asJSON {
				type imageView struct {
					Name string `json:"name"`
					Dir  string `json:"dir"`
					image.Manifest
				}
				out := make([]imageView, 0, len(imgs))
				for _, img := range imgs {
					out = append(out, imageView{filepath.Base(img.Dir), img.Dir, img.Manifest})
				}
				return printJSON(out)
			}
			for _, img := range imgs {
				what := "base (Debian " + img.Manifest.Recipe.Suite + ")"
				if d := img.Manifest.Derived; d != nil {
					what = "derived: " + d.Label + " on " + d.Base
				}
				fmt.Printf("%s\t%s\t%s\tkernel %s\t%d MiB\tbuilt %s\n", filepath.Base(img.Dir), img.Manifest.Recipe.Arch, what, img.Manifest.KernelVersion, img.Manifest.RootFSBytes>>20, ago(img.Manifest.Built))
			}
			return nil
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	build := &cobra.Command{
		Use:   "build",
		Short: "Build the guest image (as setup does, without installing packages)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			arch, err := guestArch(archName)
			if err != nil {
				return err
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
			return nil
		},
	}
	prune.Flags().BoolVar(&pruneAll, "all", false, "remove derived images too unless a sandbox uses them")
	cmd.AddCommand(ls, build, prune)
	return cmd
}

func trustProject(args []string) error {
	dir := "."
	if len(args) == 1 {
		dir = args[0]
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	m, err := manager()
	if err != nil {
		return err
	}
	p := filepath.Join(dir, config.FileName)
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no %s in %s", config.FileName, dir)
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
