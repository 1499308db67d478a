package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmspec"
	"github.com/kosa8/kosa8/sdk"
)

// A derived image is built inside a sandbox of the base image whose
// allow-list holds only the recipe's package sources: a setup line from a
// cloned repository runs as root in a VM that can reach nothing else. Each
// source's name is resolved here first and the sandbox may reach exactly
// that address under exactly that name (sandbox.NetworkConfig.Pins), so a
// mirror behind a proxy in a private or documentation range works without
// a CIDR rule that would open the address to any name.

// buildUser is the guest user of a build sandbox, removed before the image
// is frozen so that the image holds no user of ours.
const (
	buildUser = "kosa8build"
	buildUID  = 64055
)

// debianMirrorHost is the host of the Debian mirror the base image uses.
func debianMirrorHost() string {
	m := os.Getenv("KOSA8_DEBIAN_MIRROR")
	if m == "" {
		m = "http://deb.debian.org/debian"
	}
	if u, err := url.Parse(m); err == nil && u.Hostname() != "" {
		return u.Hostname()
	}
	return "deb.debian.org"
}

// derivedRecipe is the recipe for a preset and a project's [image] table
// (either may be empty/nil). It is Empty when neither adds anything.
func derivedRecipe(base *image.Image, p *agent.Preset, packages, setup []string, label string) image.DerivedRecipe {
	d := image.DerivedRecipe{Base: base.Manifest.Key, Label: label}
	d.Packages = append(d.Packages, packages...)
	d.Setup = append(d.Setup, setup...)
	hosts := []string{}
	if p != nil {
		d.Packages = append(d.Packages, p.Install.Packages...)
		d.Setup = append(d.Setup, p.InstallLine())
		hosts = append(hosts, p.InstallHosts()...)
	}
	if len(d.Setup) > 0 {
		// Setup lines install with npm (the registry) or apt-get (the mirror).
		hosts = append(hosts, "registry.npmjs.org")
	}
	if len(d.Packages) > 0 || len(d.Setup) > 0 {
		hosts = append(hosts, packageHosts(base)...)
	}
	slices.Sort(hosts)
	d.Hosts = slices.Compact(hosts)
	return d
}

// packageHosts are the package sources a derived build over base may
// reach: kosa8's Debian mirror for its own images; for an OCI image, those
// of its distribution (as its own package lists name them).
func packageHosts(base *image.Image) []string {
	o := base.Manifest.OCI
	if o == nil {
		return []string{debianMirrorHost()}
	}
	switch {
	case o.Packages == "apt" && o.OS == "ubuntu":
		return []string{"archive.ubuntu.com", "security.ubuntu.com", "ports.ubuntu.com"}
	case o.Packages == "apt":
		return []string{"deb.debian.org"}
	case o.Packages == "apk":
		return []string{"dl-cdn.alpinelinux.org"}
	}
	return nil
}

// checkDerivedBase says why d cannot be built over base: an OCI image
// installs packages only with apt (Debian, Ubuntu) or apk (Alpine), and
// runs setup lines only with a shell.
func checkDerivedBase(base *image.Image, d image.DerivedRecipe) error {
	o := base.Manifest.OCI
	if o == nil || d.Empty() {
		return nil
	}
	if o.Shell == "" {
		return fmt.Errorf("%s has no shell (/bin/sh): kosa8 cannot run its image setup or a preset's install in it; use an image with a shell", sanitize(o.Name, false))
	}
	if len(d.Packages) > 0 && o.Packages == "" {
		return fmt.Errorf("%s has neither apt-get (Debian, Ubuntu) nor apk (Alpine): kosa8 cannot install the packages %s in it; install them with setup lines, or use another base image",
			sanitize(o.Name, false), strings.Join(d.Packages, " "))
	}
	return nil
}

// ensureDerived returns d's image, building it on first use.
func ensureDerived(ctx context.Context, m *sandbox.Manager, base *image.Image, d image.DerivedRecipe) (*image.Image, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	store := image.Store{Dir: m.Paths.Cache}
	if img, err := store.LookupDerived(base, d); err == nil {
		return img, nil
	}
	// ^C stops the build and removes its sandbox (deferred in buildDerived).
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stopSignals()
	p := newProgress(os.Stderr)
	defer p.Done()
	logPath := filepath.Join(m.Paths.Cache, "image-build-"+d.Key()+".log")
	stopWatch := func() {}
	lock, err := store.LockDerived(ctx, base, d, func() {
		stopWatch = watchBuildLog(p, "waiting for another build of this image to finish", logPath)
	})
	stopWatch()
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if img, err := store.LookupDerived(base, d); err == nil {
		return img, nil // built while we waited
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	p.LogTo(logf)
	label := d.Label
	if label == "" {
		label = d.Key()
	}
	p.Step(fmt.Sprintf("building image %s for %s, once (log: %s)", d.Key(), label, logPath))
	if note := firstBuildNote(d); note != "" {
		p.Note("kosa8: " + note)
	}
	start := time.Now()
	img, err := buildDerived(ctx, m, base, d, p, logf, logPath)
	if err != nil {
		fmt.Fprintf(logf, "kosa8: build failed: %v\n", err)
		return nil, fmt.Errorf("%w\n(full log: %s)", err, logPath)
	}
	p.Step(fmt.Sprintf("image %s ready in %s (%d MiB)", d.Key(), time.Since(start).Round(time.Second), img.Manifest.RootFSBytes>>20))
	return img, nil
}

// firstBuildNote says what an agent's first run costs: its image is built
// once, before the agent starts. The figures are those measured for Claude
// Code (docs/images.md): a 2.5 GiB image in 3-4 minutes under TCG on 2
// cores (30 Nov and 2 Dec 2026), later runs in seconds.
func firstBuildNote(d image.DerivedRecipe) string {
	if _, err := agent.Get(d.Label); err != nil || d.Label == "" {
		return ""
	}
	return fmt.Sprintf("first use of %s: its image (the base image plus the agent, about 2.5 GiB) is built now, once; "+
		"about 4 minutes under emulation (TCG) on 2 cores, less with KVM or HVF. Later runs start from it in seconds.", d.Label)
}

// buildStep is one shell line of a build.
type buildStep struct {
	what string // what the progress display says
	line string
}

func buildSteps(d image.DerivedRecipe, base *image.Image) []buildStep {
	if base != nil && base.Manifest.OCI != nil {
		return ociBuildSteps(d, base.Manifest.OCI)
	}
	var steps []buildStep
	apt := "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0"
	if len(d.Packages) > 0 {
		steps = append(steps,
			buildStep{"apt-get update", apt + " update"},
			buildStep{"installing " + strings.Join(d.Packages, " "), apt + " install --no-install-recommends " + strings.Join(d.Packages, " ")})
	}
	for _, l := range d.Setup {
		steps = append(steps, buildStep{l, l})
	}
	// Leave nothing of the build behind: apt's lists and caches, npm's
	// cache, the build user, the build sandbox's CA and the host's roots
	// (each sandbox adds its own at boot).
	steps = append(steps, buildStep{"cleaning up", strings.Join([]string{
		apt + " clean",
		"rm -rf /var/lib/apt/lists/* /root/.npm /root/.cache /tmp/* /var/tmp/*",
		"userdel -r " + buildUser + " 2>/dev/null || true",
		"groupdel " + buildUser + " 2>/dev/null || true",
		"rm -f /etc/sudoers.d/kosa8",
		// The supervisor appended these to the bundle byte for byte; taking
		// them out again restores it (update-ca-certificates --fresh took
		// many minutes under TCG).
		stripCAs,
		"rm -f " + sandbox.GuestCAPath + " " + sandbox.GuestHostCAPath,
		// On the disk before the poweroff, which kills QEMU if it is slow.
		"sync",
	}, "\n")}) // one command a line; bash -e stops at the first that fails
	return steps
}

// ociBuildSteps are a derived build's steps over an OCI image: its own
// package manager, and a clean-up in POSIX sh (the image may have no bash,
// python3 or userdel).
func ociBuildSteps(d image.DerivedRecipe, o *image.OCISource) []buildStep {
	var steps []buildStep
	apt := "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0"
	if len(d.Packages) > 0 {
		switch o.Packages {
		case "apt":
			steps = append(steps,
				buildStep{"apt-get update", apt + " update"},
				buildStep{"installing " + strings.Join(d.Packages, " "), apt + " install --no-install-recommends " + strings.Join(d.Packages, " ")})
		case "apk":
			steps = append(steps, buildStep{"installing " + strings.Join(d.Packages, " "), "apk add --no-cache " + strings.Join(d.Packages, " ")})
		}
	}
	for _, l := range d.Setup {
		steps = append(steps, buildStep{l, l})
	}
	clean := []string{
		"rm -rf /var/lib/apt/lists/* /var/cache/apk/* /root/.npm /root/.cache /tmp/* /var/tmp/*",
		"for f in /etc/passwd /etc/group /etc/shadow /etc/gshadow; do [ ! -e $f ] || sed -i '/^" + buildUser + ":/d' $f; done",
		"rm -rf /home/" + buildUser + " /etc/sudoers.d/kosa8",
		stripCAsSh,
		"rm -f " + sandbox.GuestCAPath + " " + sandbox.GuestHostCAPath,
		"sync",
	}
	if o.Packages == "apt" {
		clean = append([]string{apt + " clean"}, clean...)
	}
	return append(steps, buildStep{"cleaning up", strings.Join(clean, "\n")})
}

// stripCAsSh takes the build sandbox's CA and the host's roots off the end
// of the guest's bundle, where the supervisor appended them, in POSIX sh.
var stripCAsSh = `b=` + sandbox.GuestCABundle + `
cat ` + sandbox.GuestCAPath + ` ` + sandbox.GuestHostCAPath + ` > /run/kosa8-added 2>/dev/null || true
n=$(wc -c < /run/kosa8-added); t=$(wc -c < "$b")
if [ "$n" -gt 0 ] && [ "$t" -ge "$n" ] && tail -c "$n" "$b" | cmp -s - /run/kosa8-added; then head -c $((t - n)) "$b" > /run/kosa8-bundle && cat /run/kosa8-bundle > "$b"; fi
rm -f /run/kosa8-added /run/kosa8-bundle`

// stripCAs removes the build sandbox's CA and the host's roots from the
// guest's bundle.
var stripCAs = `python3 - <<'EOF'
b = open("` + sandbox.GuestCABundle + `").read()
for f in ["` + sandbox.GuestCAPath + `", "` + sandbox.GuestHostCAPath + `"]:
    try:
        pem = open(f).read()
    except FileNotFoundError:
        continue
    if pem:
        b = b.replace(pem, "")
open("` + sandbox.GuestCABundle + `", "w").write(b)
EOF`

func buildDerived(ctx context.Context, m *sandbox.Manager, base *image.Image, d image.DerivedRecipe, p *progress, logw io.Writer, logPath string) (*image.Image, error) {
	var r net.Resolver
	pins, err := image.ResolvePins(ctx, d.Hosts, r.LookupNetIP)
	if err != nil {
		return nil, err
	}
	cfg := sandbox.Config{
		Name: "image-build-" + d.Key()[2:10] + "-" + randHex(3), Arch: string(base.Manifest.Recipe.Arch),
		CPUs: 2, MemoryMiB: 2048, DiskGiB: sandbox.DefaultDiskGiB, Accel: os.Getenv("KOSA8_ACCEL"),
		User: buildUser, UID: buildUID, GID: buildUID, Ephemeral: false,
	}
	cfg.Network.Pins = pins
	if o := base.Manifest.OCI; o != nil {
		// The image's Env (its PATH) in the build too; the build's own user.
		applyOCIConfig(&cfg, o)
		cfg.User, cfg.UID, cfg.GID, cfg.WorkDir = buildUser, buildUID, buildUID, ""
	}
	for _, h := range d.Hosts {
		cfg.Network.Rules = append(cfg.Network.Rules, h)
		fmt.Fprintf(logw, "kosa8: the build may reach %s (pinned to %s)\n", h, pins[h])
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sb, err := m.Create(ctx, cfg, base)
	if err != nil {
		return nil, fmt.Errorf("create the build sandbox: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = stopSandbox(sctx, sb, true)
		_ = m.Remove(sb.Config.Name)
	}()
	p.Step("booting the build sandbox")
	if _, err := startSandbox(ctx, sb, true); err != nil {
		return nil, fmt.Errorf("start the build sandbox: %w", err)
	}
	steps := buildSteps(d, base)
	for i, st := range steps {
		what := st.what
		if len(what) > 60 {
			what = what[:57] + "..."
		}
		p.Step(fmt.Sprintf("[%d/%d] %s", i+1, len(steps), what))
		fmt.Fprintf(logw, "kosa8: step %d/%d: %s\n", i+1, len(steps), st.line)
		tail := &tailWriter{w: logw}
		argv := []string{"/bin/bash", "-e", "-o", "pipefail", "-c", st.line}
		if o := base.Manifest.OCI; o != nil && o.Shell != "/bin/bash" && o.Shell != "/usr/bin/bash" {
			argv = []string{"/bin/sh", "-e", "-c", st.line}
		}
		code, err := execCapture(ctx, sb, argv, "root", tail, tail)
		if err != nil {
			return nil, fmt.Errorf("image build step %d (%s): %w", i+1, st.line, err)
		}
		if code != 0 {
			msg := fmt.Sprintf("image build step %d failed with exit status %d: %s", i+1, code, st.line)
			if hosts := refusedHosts(sb); len(hosts) > 0 {
				msg += fmt.Sprintf("\nit tried to reach %s, which the build's allow-list (%s) does not hold: install from the package sources only",
					strings.Join(hosts, ", "), strings.Join(d.Hosts, ", "))
			}
			if t := tail.last(8); t != "" {
				msg += "\nlast lines:\n  " + strings.ReplaceAll(t, "\n", "\n  ")
			}
			return nil, errors.New(msg)
		}
	}
	p.Step("stopping the build sandbox")
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = stopSandbox(sctx, sb, false)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("stop the build sandbox: %w", err)
	}
	p.Step("freezing the image")
	return image.Store{Dir: m.Paths.Cache}.CommitDerived(ctx, base, d, m.Disks, sb.Path(sandbox.RootDisk), logPath, logw)
}

// refusedHosts lists the names the build sandbox asked for and was refused.
func refusedHosts(sb *sandbox.Sandbox) []string {
	pol, err := sb.LoadPolicy()
	if err != nil {
		return nil
	}
	events, err := audit.Read(sb.Path(sandbox.AuditLog))
	if err != nil {
		return nil
	}
	var out []string
	for _, b := range sandbox.BlockedHosts(events, pol) {
		if h := sanitize(b.Host, false); !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// execCapture runs argv in a running sandbox with its output to stdout
// and stderr.
func execCapture(ctx context.Context, sb *sandbox.Sandbox, argv []string, user string, stdout, stderr io.Writer) (int, error) {
	return execWith(ctx, sb, sdk.Cmd{Args: argv, User: user, Stdout: stdout, Stderr: stderr})
}

// execWith runs c in a running sandbox (not on this terminal: see
// execIn), until it exits or ctx ends.
func execWith(ctx context.Context, sb *sandbox.Sandbox, c sdk.Cmd) (int, error) {
	// Root's build steps start in /root; any other user where the guest
	// starts it (it cannot enter /root: the agent-home save failed so).
	if c.User == "root" {
		c.Dir = "/root"
	}
	s, err := sdkSandbox(sb.Config.Name)
	if err != nil {
		return exitKosa8, err
	}
	res, err := s.Exec(ctx, c)
	if ctx.Err() != nil {
		// ^C (ctx) killed the process; the caller's clean-up removes the
		// build sandbox. It is kosa8's failure, not the step's.
		return exitKosa8, fmt.Errorf("exec stream: %w", ctx.Err())
	}
	return execExit(res, err)
}

// tailWriter copies to w and keeps the last bytes written.
type tailWriter struct {
	w   io.Writer
	buf []byte
}

func (t *tailWriter) Write(b []byte) (int, error) {
	t.buf = append(t.buf, b...)
	if len(t.buf) > 16<<10 {
		t.buf = t.buf[len(t.buf)-8<<10:]
	}
	return t.w.Write(b)
}

func (t *tailWriter) last(n int) string {
	return sanitize(lastLines(string(t.buf), n), true)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// baseImage returns the base image for arch.
func baseImage(m *sandbox.Manager, arch vmspec.Arch) (*image.Image, error) {
	return image.Store{Dir: m.Paths.Cache}.Lookup(image.DefaultRecipe(arch))
}
