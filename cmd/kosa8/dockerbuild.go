package main

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/spf13/cobra"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/dockerfile"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/oci"
	"github.com/kosa8/kosa8/internal/project"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmspec"
	"github.com/kosa8/kosa8/sdk"
)

// Dockerfiles are built with buildah inside a builder sandbox:
//
//   - on the host: the Dockerfile is read (internal/dockerfile), the images
//     its stages start from are pulled into the cache (as 'kosa8 image
//     pull' does, outside every allow-list), the context is walked
//     without following links (.dockerignore applied, bounded);
//   - the builder sandbox boots the builder image (kosa8's base plus
//     Debian's buildah: a derived image of its own, built once), with the
//     user's allow-list and nothing else: RUN lines reach only what it
//     allows, and a refused host fails the build with the refusal;
//   - one tar goes in through the agent: the base images as an OCI layout,
//     the context, and the Dockerfile with its images named by the local
//     names they were loaded under; buildah builds it (chroot isolation,
//     vfs storage, never pulling);
//   - the result comes out as an OCI archive, bounded, and is pulled into
//     the cache like any archive (every blob checked: the builder ran the
//     RUN lines) under the name given with -t.
//
// The builder sandbox is removed whatever happens.

// builderPackages are what the builder image adds to kosa8's base: Debian's
// buildah and, of the two packages that provide its network stack, the
// smaller (RUN lines use the sandbox's own network under chroot isolation,
// so it never runs). No runc or crun: chroot isolation needs neither.
var builderPackages = []string{"buildah", "netavark"}

// buildDir is where the builder sandbox keeps a build's inputs and output.
const buildDir = "/var/lib/kosa8-build"

// maxBuiltImage bounds the OCI archive read back from the builder.
const maxBuiltImage int64 = 32 << 30

// dockerBuild is one Dockerfile build.
type dockerBuild struct {
	file       string // the Dockerfile on the host
	contextDir string
	tag        string
	args       map[string]string
	target     string
	arch       vmspec.Arch
	noCache    bool
	// Network: as 'kosa8 run' takes it (kosa8.toml's [network], then
	// these).
	preset     string
	allow      []string
	allowBroad bool
	proj       *config.Project // a trusted kosa8.toml, or nil
	// dockerfile is the file's content when it was read already (a dev
	// container's, read through the project folder's root).
	dockerfile []byte
	// from says who named the Dockerfile: a repository's (a dev
	// container's) FROM images are pulled as pullImage pulls those.
	from imageFrom
}

// tagRE is what -t accepts: a reference's characters without a digest,
// starting with a letter or digit (it names the image in the cache and on
// 'run --image').
var tagRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._/:-]{0,254}$`)

func checkTag(tag string) error {
	if !tagRE.MatchString(tag) || strings.Contains(tag, "..") || strings.HasSuffix(tag, ".tar") {
		return fmt.Errorf("image name %q: use lower-case letters, digits and . _ / : -, as an image reference without a digest (myproj, myproj:1, registry.example.com/me/myproj:1)", sanitize(tag, false))
	}
	if _, err := oci.ParseReference(tag, nil); err != nil {
		return fmt.Errorf("image name %q: %v", sanitize(tag, false), err)
	}
	return nil
}

// readDockerfile reads the Dockerfile at p, bounded.
func readDockerfile(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read the Dockerfile: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("the Dockerfile %s is not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, dockerfile.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read the Dockerfile: %w", err)
	}
	return b, nil
}

// readIgnore reads the Dockerfile's own ignore file (Dockerfile.dockerignore
// beside it) or else the context's .dockerignore; nil when neither exists.
// Each is opened through its folder's root: a link there leads nowhere
// outside it.
func readIgnore(dockerfilePath, contextDir string) (*dockerfile.Ignore, string, error) {
	for _, c := range []struct{ dir, name string }{
		{filepath.Dir(dockerfilePath), filepath.Base(dockerfilePath) + ".dockerignore"},
		{contextDir, ".dockerignore"},
	} {
		root, err := os.OpenRoot(c.dir)
		if err != nil {
			return nil, "", err
		}
		f, err := root.Open(c.name)
		root.Close()
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		p := filepath.Join(c.dir, c.name)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", p, err)
		}
		b, err := io.ReadAll(io.LimitReader(f, 1<<20+1))
		f.Close()
		if err != nil {
			return nil, "", err
		}
		ig, err := dockerfile.ParseIgnore(b)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", p, err)
		}
		return ig, p, nil
	}
	return nil, "", nil
}

// buildKeyVersion changes when a build of the same inputs would make
// another image.
const buildKeyVersion = 1

// buildKey names what a build makes: the rewritten Dockerfile, the build
// arguments, the target, the platform, the context's content and the base
// images' digests.
func buildKey(df []byte, args map[string]string, target string, arch vmspec.Arch, ctxDigest string, bases []*oci.Record) string {
	h := sha256.New()
	fmt.Fprintf(h, "kosa8-dockerfile v%d\x00%s\x00%s\x00%d:%s\x00", buildKeyVersion, arch, ctxDigest, len(df), df)
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "arg %d:%s=%d:%s\x00", len(k), k, len(args[k]), args[k])
	}
	fmt.Fprintf(h, "target %s\x00", target)
	for _, b := range bases {
		fmt.Fprintf(h, "base %s\x00", b.Manifest)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// buildDockerfile builds b and returns the image's record in the cache:
// the one built before from the same inputs unless b.noCache.
func buildDockerfile(ctx context.Context, m *sandbox.Manager, b dockerBuild) (*oci.Record, error) {
	if err := checkTag(b.tag); err != nil {
		return nil, err
	}
	src := b.dockerfile
	if src == nil {
		var err error
		if src, err = readDockerfile(b.file); err != nil {
			return nil, err
		}
	}
	df, err := dockerfile.Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.file, err)
	}
	plat := oci.Platform(b.arch)
	pl, err := df.Plan(b.args, b.target, dockerfile.Platform{OS: plat.OS, Arch: plat.Architecture, Variant: plat.Variant})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.file, err)
	}
	ig, igPath, err := readIgnore(b.file, b.contextDir)
	if err != nil {
		return nil, err
	}
	done := slowWait("reading and hashing the build context " + b.contextDir)
	bc, err := dockerfile.ReadContext(b.contextDir, ig, dockerfile.DefaultContextLimits)
	done()
	if err != nil {
		return nil, err
	}
	if len(bc.Skipped) > 0 {
		fmt.Fprintf(os.Stderr, "kosa8: not sent to the build (sockets, FIFOs or devices): %s\n", sanitize(strings.Join(bc.Skipped, ", "), false))
	}
	// The base images: built here under that name, else pulled on the
	// host, outside every allow-list.
	cache := oci.NewCache(m.Paths.Cache)
	var bases []*oci.Record
	local := map[string]string{}
	for i, ref := range pl.Images {
		var rec *oci.Record
		if b.from == fromUser {
			rec = cache.FindBuilt(ref, oci.PlatformString(b.arch))
		}
		if rec == nil {
			if rec, err = pullImage(ctx, m, ref, b.arch, b.from); err != nil {
				return nil, fmt.Errorf("%w\n(the Dockerfile's stages start from %s: images are pulled on this host, then handed to the builder)", err, strings.Join(pl.Images, ", "))
			}
		}
		bases = append(bases, rec)
		local[ref] = fmt.Sprintf("localhost/kosa8/from-%d", i+1)
	}
	rewritten, err := pl.Rewrite(local)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.file, err)
	}
	key := buildKey(rewritten, b.args, b.target, b.arch, bc.Digest, bases)
	if !b.noCache {
		if r := cache.FindBuilt(b.tag, oci.PlatformString(b.arch)); r != nil && r.BuildKey == key {
			fmt.Fprintf(os.Stderr, "kosa8: %s is up to date (built %s from the same Dockerfile, context and base images; --no-cache builds it again)\n", sanitize(b.tag, false), ago(r.Pulled))
			return r, nil
		}
	}
	builder, err := builderImage(ctx, m, b.arch)
	if err != nil {
		return nil, err
	}
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stopSignals()
	logPath := filepath.Join(m.Paths.Cache, "dockerfile-build-"+strings.TrimPrefix(key, "sha256:")[:16]+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	p := newProgress(os.Stderr)
	defer p.Done()
	p.LogTo(logf)
	fmt.Fprintf(logf, "kosa8: building %s from %s, context %s (%d entries, %s", b.tag, b.file, b.contextDir, bc.Entries(), humanBytes(bc.Bytes))
	if igPath != "" {
		fmt.Fprintf(logf, ", %s applied", igPath)
	}
	fmt.Fprintf(logf, ")\n")
	for i, r := range bases {
		fmt.Fprintf(logf, "kosa8: %s is %s (%s) as %s\n", pl.Images[i], r.Name, r.Manifest, local[pl.Images[i]])
	}
	start := time.Now()
	p.Step(fmt.Sprintf("building %s from %s (log: %s)", b.tag, filepath.Base(b.file), logPath))
	out, err := runBuilder(ctx, m, builder, b, bc, cache, bases, pl.Images, local, rewritten, p, logf)
	if out != "" {
		defer os.Remove(out)
	}
	if err != nil {
		fmt.Fprintf(logf, "kosa8: build failed: %v\n", err)
		return nil, fmt.Errorf("%w\n(full log: %s)", err, logPath)
	}
	p.Step("storing the image in kosa8's cache")
	rec, err := oci.Import(ctx, cache, out, b.tag, key, oci.PullOptions{Arch: b.arch})
	if err != nil {
		return nil, fmt.Errorf("the image the builder made: %w\n(full log: %s)", err, logPath)
	}
	p.Step(fmt.Sprintf("built %s (%s, %d layers, %s) in %s", b.tag, rec.ShortDigest(), len(rec.Layers), humanBytes(rec.Size()), time.Since(start).Round(time.Second)))
	return rec, nil
}

// builderImage is the builder image for arch, built on first use: kosa8's
// base image plus buildah (a derived image of its own, so that no other
// image's recipe depends on it).
func builderImage(ctx context.Context, m *sandbox.Manager, arch vmspec.Arch) (*image.Image, error) {
	base, err := baseImage(m, arch)
	if err != nil {
		return nil, fmt.Errorf("a Dockerfile is built in a sandbox of kosa8's base image, and %w", err)
	}
	d := derivedRecipe(base, nil, builderPackages, nil, "dockerfile builder")
	return ensureDerived(ctx, m, base, d)
}

// builderNetwork is the build sandbox's allow-list: kosa8.toml's [network]
// (when trusted) and the flags, as 'kosa8 run' takes them.
func builderNetwork(b dockerBuild, name string) (sandbox.NetworkConfig, error) {
	o := project.Options{Name: name, Arch: b.arch, NetPreset: b.preset, Allow: b.allow, AllowBroad: b.allowBroad}
	var proj *config.Project
	if b.proj != nil {
		// Only its network: the builder's sizes, secrets and ports are
		// the build's own.
		proj = &config.Project{Network: b.proj.Network}
	}
	c, err := project.Resolve(o, proj, "")
	if err != nil {
		return sandbox.NetworkConfig{}, err
	}
	return sandbox.NetworkConfig{Rules: c.Network.Rules, AllowBroad: c.Network.AllowBroad}, nil
}

// runBuilder runs the build in a builder sandbox and returns the path of
// the OCI archive it made (in the cache's temporary folder; the caller
// removes it).
func runBuilder(ctx context.Context, m *sandbox.Manager, builder *image.Image, b dockerBuild, bc *dockerfile.Context,
	cache oci.Cache, bases []*oci.Record, refs []string, local map[string]string, rewritten []byte, p *progress, logw io.Writer) (string, error) {
	name := "image-build-df-" + randHex(4)
	netcfg, err := builderNetwork(b, name)
	if err != nil {
		return "", err
	}
	// Room for the context twice (sent, then copied), the bases unpacked
	// (vfs copies each layer whole) and the image written out.
	need := 3*bc.Bytes + 8*cache.LayoutSize(bases)
	disk := max(sandbox.DefaultDiskGiB, int(need>>30)+8)
	cfg := sandbox.Config{
		Name: name, Arch: string(b.arch), CPUs: 2, MemoryMiB: 2048, DiskGiB: min(disk, 1024),
		Accel: os.Getenv("KOSA8_ACCEL"), User: buildUser, UID: buildUID, GID: buildUID,
		Network: netcfg,
	}
	fmt.Fprintf(logw, "kosa8: the build's RUN lines may reach: %s\n", orNone(netcfg.Rules))
	if err := cfg.Validate(); err != nil {
		return "", err
	}
	sb, err := m.Create(ctx, cfg, builder)
	if err != nil {
		return "", fmt.Errorf("create the builder sandbox: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = stopSandbox(sctx, sb, true)
		_ = m.Remove(sb.Config.Name)
	}()
	p.Step("booting the builder sandbox")
	if _, err := startSandbox(ctx, sb, true); err != nil {
		return "", fmt.Errorf("start the builder sandbox: %w", err)
	}

	// In: one tar of the base images (an OCI layout), the context and
	// the Dockerfile.
	total := cache.LayoutSize(bases) + bc.TarSize() + int64(len(rewritten)) + 4096
	p.Step(fmt.Sprintf("sending the base images and the context (%s) to the builder", humanBytes(total)))
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		names := make([]string, len(bases))
		for i, ref := range refs {
			names[i] = strings.TrimPrefix(local[ref], "localhost/kosa8/")
		}
		err := cache.WriteLayout(tw, "from", bases, names)
		if err == nil {
			err = bc.WriteTar(tw, "context")
		}
		if err == nil {
			err = tw.WriteHeader(&tar.Header{Name: "Dockerfile", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(rewritten)), ModTime: time.Unix(0, 0)})
		}
		if err == nil {
			_, err = tw.Write(rewritten)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	counted := &countingReader{r: pr, report: func(n int64) {
		p.Status(fmt.Sprintf("sending the base images and the context: %s of %s", humanBytes(n), humanBytes(total)))
	}}
	tail := &tailWriter{w: logw}
	code, err := execWith(ctx, sb, sdkCmd([]string{"/bin/sh", "-c", "rm -rf " + buildDir + " && mkdir -p " + buildDir + " && exec tar -x -C " + buildDir + " -f -"}, counted, tail, tail))
	pr.Close() // a writer still going (the guest's tar stopped early) ends
	if err != nil || code != 0 {
		if cerr := counted.err(); cerr != nil {
			return "", cerr // the host's side failed (a context file changed)
		}
		return "", fmt.Errorf("send the build's inputs to the builder (status %d): %v%s", code, err, lastLinesNote(tail))
	}

	// The base images into buildah's storage, under their local names.
	var load []string
	for _, ref := range refs {
		n := strings.TrimPrefix(local[ref], "localhost/kosa8/")
		load = append(load, fmt.Sprintf(`id=$(buildah --storage-driver vfs pull -q oci:%s/from:%s) && buildah --storage-driver vfs tag "$id" %s`, buildDir, n, local[ref]))
	}
	if len(load) > 0 {
		p.Step(fmt.Sprintf("loading %s into the builder", plural(len(load), "base image")))
		if code, err := execWith(ctx, sb, sdkCmd([]string{"/bin/sh", "-e", "-c", strings.Join(load, "\n")}, nil, tail, tail)); err != nil || code != 0 {
			return "", fmt.Errorf("load the base images into buildah (status %d): %v%s", code, err, lastLinesNote(tail))
		}
	}

	// The build: its STEP lines are the progress.
	argv := []string{"buildah", "--storage-driver", "vfs", "build", "--isolation", "chroot", "--pull=never", "--layers=false",
		"-f", buildDir + "/Dockerfile", "-t", "localhost/kosa8/result"}
	keys := make([]string, 0, len(b.args))
	for k := range b.args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		argv = append(argv, "--build-arg", k+"="+b.args[k])
	}
	if b.target != "" {
		argv = append(argv, "--target", b.target)
	}
	argv = append(argv, buildDir+"/context")
	fmt.Fprintf(logw, "kosa8: buildah build (build arguments: %s)\n", orNone(keys))
	steps := &stepWriter{w: tail, step: func(s string) { p.Step(s) }}
	code, err = execWith(ctx, sb, sdkCmd(argv, nil, steps, steps))
	steps.Flush()
	if err != nil {
		return "", fmt.Errorf("the Dockerfile build: %w", err)
	}
	if code != 0 {
		msg := fmt.Sprintf("the Dockerfile build failed (buildah exit status %d)", code)
		if hosts := refusedHosts(sb); len(hosts) > 0 {
			msg += fmt.Sprintf("\nits RUN lines tried to reach %s, which the build's allow-list (%s) does not hold: allow it with 'kosa8 image build --allow HOST' or in kosa8.toml's [network]",
				strings.Join(hosts, ", "), orNone(netcfg.Rules))
		}
		return "", errors.New(msg + lastLinesNote(tail))
	}

	// Out: the image as an OCI archive, bounded.
	p.Step("writing the image out of the builder")
	exp := "buildah --storage-driver vfs push -q localhost/kosa8/result oci-archive:" + buildDir + "/out.tar >&2 && exec cat " + buildDir + "/out.tar"
	f, err := cache.TempFile()
	if err != nil {
		return "", err
	}
	outPath := f.Name()
	lw := &limitWriter{w: f, n: maxBuiltImage, err: fmt.Errorf("the built image is larger than %s: refused", humanBytes(maxBuiltImage))}
	code, err = execWith(ctx, sb, sdkCmd([]string{"/bin/sh", "-c", exp}, nil, lw, tail))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil || code != 0 {
		return outPath, fmt.Errorf("write the image out of the builder (status %d): %v%s", code, err, lastLinesNote(tail))
	}
	return outPath, nil
}

// sdkCmd is a command of the build, as root.
func sdkCmd(argv []string, stdin io.Reader, stdout, stderr io.Writer) sdk.Cmd {
	return sdk.Cmd{Args: argv, User: "root", Stdin: stdin, Stdout: stdout, Stderr: stderr}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}

func lastLinesNote(t *tailWriter) string {
	if l := t.last(8); l != "" {
		return "\nlast lines:\n  " + strings.ReplaceAll(l, "\n", "\n  ")
	}
	return ""
}

// countingReader reports how much was read through it, at most twice a
// second, and keeps the error that ended the stream.
type countingReader struct {
	r      io.Reader
	n      int64
	last   time.Time
	report func(int64)
	rerr   error
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if c.n > 0 && time.Since(c.last) > 500*time.Millisecond {
		c.last = time.Now()
		c.report(c.n)
	}
	if err != nil && err != io.EOF {
		c.rerr = err
	}
	return n, err
}

func (c *countingReader) err() error { return c.rerr }

// stepWriter passes output on and shows buildah's "STEP n/m: ..." lines as
// progress (cleaned and cut: they come from the guest).
type stepWriter struct {
	w    io.Writer
	buf  []byte
	step func(string)
}

var stepRE = regexp.MustCompile(`^STEP [0-9]+/[0-9]+: `)

func (s *stepWriter) Write(b []byte) (int, error) {
	s.buf = append(s.buf, b...)
	for {
		i := slices.Index(s.buf, '\n')
		if i < 0 {
			break
		}
		s.line(string(s.buf[:i]))
		s.buf = s.buf[i+1:]
	}
	if len(s.buf) > 64<<10 {
		s.buf = s.buf[:0]
	}
	return s.w.Write(b)
}

func (s *stepWriter) line(l string) {
	if stepRE.MatchString(l) {
		l = sanitize(l, false)
		if len(l) > 72 {
			l = l[:69] + "..."
		}
		s.step(l)
	}
}

// Flush shows a last line without a newline.
func (s *stepWriter) Flush() {
	if len(s.buf) > 0 {
		s.line(string(s.buf))
		s.buf = nil
	}
}

// readBuildArgs turns --build-arg entries into a map (KEY=VALUE, or KEY
// for the host's value, as docker takes them).
func readBuildArgs(entries []string) (map[string]string, error) {
	out := map[string]string{}
	for _, e := range entries {
		k, v, ok := strings.Cut(e, "=")
		if k == "" {
			return nil, fmt.Errorf("--build-arg %q: want KEY=VALUE", e)
		}
		if !ok {
			v, ok = os.LookupEnv(k)
			if !ok {
				continue // docker leaves an unset one out too
			}
		}
		out[k] = v
	}
	return out, nil
}

// dockerBuildFlags are 'kosa8 image build's flags for a Dockerfile.
type dockerBuildFlags struct {
	file, tag, target string
	buildArgs         []string
	allow             []string
	preset            string
	allowBroad        bool
	noCache, asJSON   bool
}

func (f *dockerBuildFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVarP(&f.file, "file", "f", "", "the Dockerfile (default: CONTEXT/Dockerfile)")
	fs.StringVarP(&f.tag, "tag", "t", "", "the built image's name, for 'kosa8 run --image NAME' and 'kosa8 image push NAME'")
	fs.StringArrayVar(&f.buildArgs, "build-arg", nil, "a build argument KEY=VALUE, or KEY for the host's value (repeatable)")
	fs.StringVar(&f.target, "target", "", "the stage to build (default: the last)")
	fs.StringArrayVar(&f.allow, "allow", nil, "allow the build's RUN lines a host, *.domain, host:port or CIDR (repeatable); nothing is allowed by default")
	fs.StringVar(&f.preset, "net", "", "network preset for the RUN lines: "+strings.Join(netpolicy.PresetNames(), ", "))
	fs.BoolVar(&f.allowBroad, "allow-broad", false, "accept rules that match a whole public suffix or everything")
	fs.BoolVar(&f.noCache, "no-cache", false, "build even if an image of the same Dockerfile, context and base images exists")
	fs.BoolVar(&f.asJSON, "json", false, "print the built image as JSON")
}

func (f *dockerBuildFlags) run(ctx context.Context, m *sandbox.Manager, arch vmspec.Arch, args []string) error {
	if f.tag == "" {
		return fmt.Errorf("a Dockerfile build needs a name for its image: -t NAME (then 'kosa8 run --image NAME')")
	}
	ctxDir := "."
	if len(args) == 1 {
		ctxDir = args[0]
	}
	d, err := folder.Resolve(ctxDir)
	if err != nil {
		return fmt.Errorf("build context %s: %w", ctxDir, err)
	}
	file := f.file
	if file == "" {
		file = filepath.Join(d.String(), "Dockerfile")
	}
	bargs, err := readBuildArgs(f.buildArgs)
	if err != nil {
		return err
	}
	proj, err := projectConfig(m)
	if err != nil {
		return err
	}
	rec, err := buildDockerfile(ctx, m, dockerBuild{
		file: file, contextDir: d.String(), tag: f.tag, args: bargs, target: f.target, arch: arch, noCache: f.noCache,
		preset: f.preset, allow: f.allow, allowBroad: f.allowBroad, proj: proj,
	})
	if err != nil {
		return err
	}
	if f.asJSON {
		return printJSON(rec)
	}
	fmt.Printf("%s\t%s\t%s\t%d layers\t%s\n", sanitize(rec.Name, false), rec.Platform, rec.Manifest, len(rec.Layers), humanBytes(rec.Size()))
	return nil
}
