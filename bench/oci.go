package main

import (
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kosa8/kosa8/internal/oci/ocitest"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

var (
	localBuild = flag.Bool("local-build", true, "image: also build the base here, both ways (tens of minutes); without it the baseline is the build time this machine's last 'kosa8 setup' logged")
	ociSizes   = flag.String("oci-sizes", "16,64,256", "image: sizes in MiB of the OCI images pulled and converted")
	baseline   = flag.Duration("build-time", 0, "image, with -local-build=false: the local build's time measured elsewhere on this machine (CI's setup step), when no setup log has it")
)

// benchImageRegistry times, in one run, 'kosa8 setup' from a registry on
// loopback (Debian's docker-registry, the base pushed there from this
// machine's cache) into a fresh cache, against the local build (built in
// this run, or the figure the machine's own setup logged), then the pull
// and the conversion of OCI images of several sizes.
func benchImageRegistry(accel vmm.Accel, built time.Duration) []row {
	a := string(accel)
	var rows []row
	dir, err := os.MkdirTemp("", "kosa8-bench-registry-")
	must(err)
	defer os.RemoveAll(dir)
	reg, stop, err := ocitest.RunRegistry(dir, nil)
	if err != nil {
		return append(rows, row{"setup from a registry", "skipped", a, err.Error()})
	}
	defer stop()
	run := func(env []string, args ...string) (time.Duration, string, error) {
		cmd := exec.Command(filepath.Join(*binDir, "kosa8"), args...)
		cmd.Env = append(os.Environ(), env...)
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return 0, string(out), fmt.Errorf("kosa8 %s: %v: %s", strings.Join(args, " "), err, failure(string(out)))
		}
		return time.Since(t0), string(out), nil
	}
	arch := string(vmspec.HostArch())
	d, out, err := run(nil, "image", "push", "--base", "--arch", arch, reg.Addr+"/kosa8/base:bench")
	if err != nil {
		return append(rows, row{"push the base", "failed", a, err.Error()})
	}
	pinned := strings.TrimSpace(strings.Split(out, "\n")[0])
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "@sha256:") && !strings.Contains(l, " ") {
			pinned = strings.TrimSpace(l)
		}
	}
	rows = append(rows, row{"image push --base (loopback registry)", secs(d), "host", "zstd of the root filesystem, kernel and modules, upload"})
	cache, err := os.MkdirTemp("", "kosa8-bench-cache-")
	must(err)
	defer os.RemoveAll(cache)
	env := []string{"KOSA8_CACHE=" + cache, "KOSA8_BASE_IMAGE=" + pinned}
	d, _, err = run(env, "setup", "--no-install")
	if err != nil {
		return append(rows, row{"setup from the registry", "failed", a, err.Error()})
	}
	rows = append(rows, row{"setup from a registry on loopback", secs(d), "host", "fresh cache; pull, check digests, install; target <= 60 s"})
	note := "built in this run"
	if built == 0 {
		built, note = loggedBuild()
	}
	if built == 0 && *baseline > 0 {
		built, note = *baseline, "not built in this run: the time given with -build-time"
	}
	if built > 0 {
		ba := a
		if *baseline > 0 && note == "not built in this run: the time given with -build-time" {
			ba = "given"
		}
		rows = append(rows, row{"local build of the base (baseline)", secs(built), ba, note})
		rows = append(rows, row{"local build / setup from the registry", fmt.Sprintf("%.1fx", built.Seconds()/d.Seconds()), a, ""})
	}
	for _, s := range strings.Split(*ociSizes, ",") {
		mib, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || mib <= 0 {
			must(fmt.Errorf("-oci-sizes %q: sizes in MiB, comma-separated", *ociSizes))
		}
		ref, files := pushSized(reg.Addr, mib)
		what := fmt.Sprintf("OCI image of %d MiB, %d files", mib, files)
		dp, _, err := run(env, "image", "pull", ref)
		if err != nil {
			rows = append(rows, row{what, "failed", a, err.Error()})
			continue
		}
		name := fmt.Sprintf("bench-oci-%d", mib)
		dc, _, err := run(env, "create", "--no-workspace", "--name", name, "--image", ref)
		_, _, _ = run(env, "rm", "-f", name)
		if err != nil {
			rows = append(rows, row{what, "failed", a, err.Error()})
			continue
		}
		rows = append(rows, row{what + ": pull", secs(dp), "host", "loopback registry, digests checked"})
		rows = append(rows, row{what + ": convert", secs(dc), a, "decompress on the host, unpack in the converter VM (its boot included)"})
	}
	return rows
}

// pushSized pushes an image of mib MiB of incompressible data in 64 KiB
// files, and returns its reference and the number of files.
func pushSized(addr string, mib int) (string, int) {
	files := mib * 16
	var es []ocitest.Entry
	es = append(es, ocitest.Entry{Name: "data/", Type: '5'})
	buf := make([]byte, 64<<10)
	for i := 0; i < files; i++ {
		_, _ = rand.Read(buf)
		es = append(es, ocitest.Entry{Name: fmt.Sprintf("data/%03d/f%05d", i/1000, i), Body: string(buf)})
	}
	img := ocitest.Image(string(vmspec.HostArch()), v1.Config{}, ocitest.Layer(es))
	ref, err := name.ParseReference(fmt.Sprintf("%s/bench/sized:%d", addr, mib))
	must(err)
	must(remote.Write(ref, img))
	return ref.String(), files
}

var readyRE = regexp.MustCompile(`image ready in ([0-9hms.]+)`)

// loggedBuild reads the time of this machine's last base build from the
// default cache's image-build.log (CI's setup step writes it).
func loggedBuild() (time.Duration, string) {
	c, err := os.UserCacheDir()
	if err != nil {
		return 0, ""
	}
	p := filepath.Join(c, "kosa8", "image-build.log")
	if v := os.Getenv("KOSA8_CACHE"); v != "" {
		p = filepath.Join(v, "image-build.log")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, ""
	}
	m := readyRE.FindAllStringSubmatch(string(b), -1)
	if m == nil {
		return 0, ""
	}
	d, err := time.ParseDuration(m[len(m)-1][1])
	if err != nil {
		return 0, ""
	}
	fi, _ := os.Stat(p)
	return d, fmt.Sprintf("not built in this run: the time this machine's last 'kosa8 setup' logged (%s, %s)", p, fi.ModTime().UTC().Format("2006-01-02 15:04"))
}
