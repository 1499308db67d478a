package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/podimage"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// imagePodCmd builds kosa8's container image for a Kubernetes pod
// (deploy/kubernetes) from this host's files, with kosa8's OCI code.
func imagePodCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pod oci:DIR[:TAG] | REGISTRY/REPO:TAG",
		Short: "Build kosa8's container image for a Kubernetes pod (kosa8, QEMU, the guest image)",
		Long: `Build the container image deploy/kubernetes's SandboxTemplate runs: this kosa8 and its
guest agents, this host's QEMU with every library it loads and its firmware, and the guest
image 'kosa8 setup' built. oci:DIR writes an OCI image layout folder (load it with skopeo or
'ctr images import'); anything else is pushed to that registry with your credentials.
No Docker daemon is needed. In full: docs/kubernetes.md.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			img, err := image.Store{Dir: m.Paths.Cache}.Lookup(image.DefaultRecipe(vmspec.AMD64))
			if err != nil {
				return err
			}
			// This kosa8 and its agents beside it (on Linux the path is the
			// real one: /proc/self/exe).
			self, err := os.Executable()
			if err != nil {
				return err
			}
			src := podimage.Sources{BinDir: filepath.Dir(self), ImageDir: img.Dir, CacheDir: m.Paths.Cache}
			for _, q := range []string{"qemu-system-x86_64", "qemu-img"} {
				p, err := exec.LookPath(q)
				if err != nil {
					return fmt.Errorf("%s not found: install qemu-system-x86 and qemu-utils", q)
				}
				src.QEMU = append(src.QEMU, p)
			}
			for _, d := range []string{"/usr/share/qemu", "/usr/share/seabios", "/usr/lib/ipxe/qemu"} {
				if fi, err := os.Stat(d); err == nil && fi.IsDir() {
					src.QEMUData = append(src.QEMUData, d)
				}
			}
			start := time.Now()
			w := podimage.OCIWriter{Progress: func(s string) {
				fmt.Fprintf(os.Stderr, "%5.1fs %s\n", time.Since(start).Seconds(), s)
			}}
			d, err := podimage.Build(cmd.Context(), w, args[0], src)
			if err != nil {
				return err
			}
			fmt.Println(d)
			return nil
		},
	}
}
