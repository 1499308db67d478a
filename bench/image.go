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
			// The cache goes with the run: its build log is kept beside it.
			kept := filepath.Join(os.TempDir(), "kosa8-bench-image-"+method+".log")
			if b, rerr := os.ReadFile(filepath.Join(cache, "image-build.log")); rerr == nil && os.WriteFile(kept, b, 0o600) == nil {
				fmt.Fprintf(os.Stderr, "image build, %s, failed: its log is kept in %s\n", method, kept)
			}
			rows = append(rows, row{"image build: " + method, "failed", a, failure(string(out))})
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

// failure is what a failed build said: its error line and, where the
// error quotes the builder's console, the last line of that (the log it
// names goes with the bench's cache).
func failure(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for len(lines) > 1 && strings.HasPrefix(lines[len(lines)-1], "(full log:") {
		lines = lines[:len(lines)-1]
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "kosa8:") {
			if i < len(lines)-1 {
				return lines[i] + " … " + strings.TrimSpace(lines[len(lines)-1])
			}
			return lines[i]
		}
	}
	return lines[len(lines)-1]
}
