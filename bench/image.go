package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// benchImage builds the default image of the host's architecture twice,
// each from nothing (a fresh cache: packages downloaded again), in the
// same run: the portable way (a builder VM, the default) and with the
// host's mmdebstrap (KOSA8_IMAGE_BUILDER=mmdebstrap), and prints the
// times and the images' sizes. Derived images are built the same way
// after either (in a sandbox of the base image), so they are not timed
// here.
func benchImage() {
	_, cleanup := setupHome()
	defer cleanup()
	accel := hostAccel()
	a := string(accel)
	var rows []row
	times := map[string]time.Duration{}
	for _, method := range []string{image.MethodPortable, image.MethodHostTools} {
		cache, err := os.MkdirTemp("", "kosa8-bench-image-")
		must(err)
		defer os.RemoveAll(cache)
		fmt.Fprintf(os.Stderr, "image build, %s...\n", method)
		cmd := exec.Command(filepath.Join(*binDir, "kosa8"), "image", "build")
		cmd.Env = append(os.Environ(), "KOSA8_CACHE="+cache, image.MethodEnv+"="+method)
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(t0)
		if err != nil {
			rows = append(rows, row{"image build: " + method, "failed", a, lastLine(string(out))})
			continue
		}
		times[method] = d
		note := ""
		if img, err := (image.Store{Dir: cache}).Lookup(image.DefaultRecipe(vmspec.HostArch())); err == nil {
			note = fmt.Sprintf("rootfs.ext4 %d MiB", img.Manifest.RootFSBytes>>20)
		}
		if method == image.MethodPortable {
			note += "; needs only QEMU on the host"
		} else {
			note += "; needs mmdebstrap, dpkg, mkfs, root or subuids"
		}
		rows = append(rows, row{"image build: " + method, fmt.Sprintf("%.0f s", d.Seconds()), a, note})
	}
	if p, m := times[image.MethodPortable], times[image.MethodHostTools]; p > 0 && m > 0 {
		rows = append(rows, row{"portable / mmdebstrap", fmt.Sprintf("%.2fx", p.Seconds()/m.Seconds()), a, "same run, packages downloaded by each"})
	}
	printTable(fmt.Sprintf("Guest image build, default recipe, %s", vmspec.HostArch()), rows, accel)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
