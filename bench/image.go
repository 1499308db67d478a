package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// benchImage builds the default image of the host's architecture twice,
// each from nothing (a fresh cache: packages downloaded again), in the
// same run: the portable way (a builder VM, the default) and with the
// host's mmdebstrap (KOSA8_IMAGE_BUILDER=mmdebstrap), and prints the
// times and the images' sizes. After each base build that succeeds it
// times `kosa8 image build --agent NAME` in the same cache: the derived
// image of the -agent preset (claude by default, an npm install, which
// needs only the npm registry; pip presets need PyPI). That build is the
// same code after either base (a sandbox of the base image, its disk then
// flattened and shrunk on the host), timed after each because the base
// under it differs. Then benchImageRegistry: setup from a registry against
// the local build, and OCI images pulled and converted by size
// (-local-build=false leaves the builds out and takes the local build's
// time from this machine's last setup log).
func benchImage() {
	_, cleanup := setupHome()
	defer cleanup()
	accel := hostAccel()
	a := string(accel)
	preset, err := agent.Get(*agentName)
	must(err)
	var rows []row
	times := map[string]time.Duration{}
	methods := []string{image.MethodPortable, image.MethodHostTools}
	if !*localBuild {
		methods = nil
	}
	for _, method := range methods {
		cache, err := os.MkdirTemp("", "kosa8-bench-image-")
		must(err)
		defer os.RemoveAll(cache)
		// build times `kosa8 image build args...` in this cache. The cache
		// goes with the run: a failed build's log (log, a pattern in the
		// cache) is kept beside it as kosa8-bench-image-NAME.log.
		build := func(name, log string, args ...string) (time.Duration, error) {
			fmt.Fprintf(os.Stderr, "image build, %s...\n", name)
			cmd := exec.Command(filepath.Join(*binDir, "kosa8"), append([]string{"image", "build"}, args...)...)
			cmd.Env = append(os.Environ(), "KOSA8_CACHE="+cache, image.MethodEnv+"="+method)
			t0 := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				kept := filepath.Join(os.TempDir(), "kosa8-bench-image-"+name+".log")
				logs, _ := filepath.Glob(filepath.Join(cache, log))
				if len(logs) > 0 {
					if b, rerr := os.ReadFile(logs[0]); rerr == nil && os.WriteFile(kept, b, 0o600) == nil {
						fmt.Fprintf(os.Stderr, "image build, %s, failed: its log is kept in %s\n", name, kept)
					}
				}
				return 0, errors.New(failure(string(out)))
			}
			return time.Since(t0), nil
		}
		d, err := build(method, "image-build.log")
		if err != nil {
			rows = append(rows, row{"image build: " + method, "failed", a, err.Error()})
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

		what := fmt.Sprintf("derived image build: %s on the %s base", preset.Name, method)
		d, err = build(method+"-"+preset.Name, "image-build-d-*.log", "--agent", preset.Name)
		if err != nil {
			rows = append(rows, row{what, "failed", a, err.Error()})
			continue
		}
		note = preset.InstallLine()
		imgs, _ := image.Store{Dir: cache}.List()
		for _, img := range imgs {
			if img.Manifest.Derived != nil {
				note += fmt.Sprintf("; rootfs.ext4 %d MiB", img.Manifest.RootFSBytes>>20)
			}
		}
		rows = append(rows, row{what, secs(d), a, note + "; the same build after either base, in a sandbox of it"})
	}
	if p, m := times[image.MethodPortable], times[image.MethodHostTools]; p > 0 && m > 0 {
		rows = append(rows, row{"portable / mmdebstrap", fmt.Sprintf("%.2fx", p.Seconds()/m.Seconds()), a, "same run, packages downloaded by each"})
	}
	rows = append(rows, benchImageRegistry(accel, times[image.MethodPortable])...)
	printTable(fmt.Sprintf("Guest image build, default recipe and the %s preset's derived image, setup from a registry, OCI images, %s", preset.Name, vmspec.HostArch()), rows, accel)
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
