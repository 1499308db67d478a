package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/launch"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/project"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmspec"
	"github.com/kosa8/kosa8/sdk"
)

// createFlags are shared by create and run.
type createFlags struct {
	name       string
	cpus       int
	memory     string
	disk       string
	rm         bool
	env        []string
	accel      string
	arch       string
	allow      []string
	preset     string
	allowBroad bool
	publish    []string
	publishAll bool
	cpEvery    time.Duration
	maxCP      int
	allowRead  []string
	secrets    []string
	workspace  string
	noWS       bool
	review     bool
	exclude    []string
	force      bool
	image      string       // --image: an OCI image (oci.go)
	devBuild   *dockerBuild // a dev container's build.dockerfile, built before the sandbox is made
	imageFrom  imageFrom    // who named image (oci.go)
	docker     bool
	dockerDisk string
	ag         agentFlags // --agent, --no-host-ca, [agent] and [image] (agents.go)
}

func (f *createFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	defer func() { _ = cmd.RegisterFlagCompletionFunc("net", completePresets) }()
	fs.StringVar(&f.name, "name", "", "sandbox name (default: the folder's name and a random suffix)")
	fs.IntVar(&f.cpus, "cpus", 0, fmt.Sprintf("virtual CPUs (default %d)", sandbox.DefaultCPUs))
	fs.StringVar(&f.memory, "memory", "", fmt.Sprintf("guest memory, e.g. 2G (default %dM)", sandbox.DefaultMemoryMiB))
	fs.StringVar(&f.disk, "disk", "", fmt.Sprintf("root disk size, e.g. 32G (default %dG)", sandbox.DefaultDiskGiB))
	fs.BoolVar(&f.rm, "rm", false, "remove the sandbox when it stops")
	fs.StringArrayVarP(&f.env, "env", "e", nil, "set KEY=VALUE in the guest, or pass the host's KEY (repeatable)")
	fs.StringVar(&f.accel, "accel", os.Getenv("KOSA8_ACCEL"), "force the acceleration: kvm, hvf or tcg")
	archFlag(fs, &f.arch)
	fs.StringArrayVar(&f.allow, "allow", nil, "allow a host, *.domain, host:port or CIDR (repeatable); nothing is allowed by default")
	fs.StringVar(&f.preset, "net", "", "network preset: "+strings.Join(netpolicy.PresetNames(), ", ")+" (dev: package registries and code hosts)")
	fs.BoolVar(&f.allowBroad, "allow-broad", false, "accept rules that match a whole public suffix or everything (*.com, *)")
	fs.StringArrayVarP(&f.publish, "publish", "p", nil, "forward host 127.0.0.1:HOSTPORT to the guest's port: HOSTPORT[:GUESTPORT] (repeatable)")
	fs.BoolVar(&f.publishAll, "publish-all-interfaces", false, "listen for --publish on all host interfaces, not only loopback")
	fs.StringArrayVar(&f.allowRead, "allow-read", nil, "allow a host read-only: TLS inspected, only GET/HEAD and git fetch pass (repeatable)")
	fs.StringArrayVar(&f.secrets, "secret", nil, "bind a host secret: the guest gets NAME=<placeholder>, the broker injects the value (repeatable)")
	fs.StringVar(&f.workspace, "workspace", "", "the host folder the sandbox works in, synced both ways (default: the current folder)")
	fs.BoolVar(&f.noWS, "no-workspace", false, "attach no folder at all")
	fs.BoolVar(&f.review, "review", false, "nothing reaches the host folder until 'kosa8 apply'")
	fs.StringArrayVar(&f.exclude, "exclude", nil, "a name or path glob that stays inside the sandbox, e.g. node_modules (repeatable)")
	fs.BoolVar(&f.force, "force", false, "allow your home directory or / as the workspace")
	fs.DurationVar(&f.cpEvery, "checkpoint-every", 0, "take a checkpoint at this interval while running (e.g. 10m)")
	fs.BoolVar(&f.docker, "docker", false, "run a container engine (Docker, compose) inside; registries of Docker Hub, ghcr.io and quay.io allowed read-only")
	fs.StringVar(&f.dockerDisk, "docker-disk", "", fmt.Sprintf("with --docker: the size of its disk for images and containers (default %dG, sparse)", sandbox.DefaultDockerDiskGiB))
	fs.IntVar(&f.maxCP, "max-checkpoints", 0, fmt.Sprintf("keep at most this many checkpoints (default %d)", sandbox.DefaultMaxCheckpoints))
	fs.StringVar(&f.image, "image", "", "boot an OCI image: a registry reference, an OCI layout directory or a docker/podman save tarball (pulled on the host, unpacked in a converter VM)")
	f.ag.register(fs)
}

// check validates the flags' own values before anything is created or
// started: a value the user typed is never silently replaced by a default.
func (f *createFlags) check(fs *pflag.FlagSet) error {
	if fs.Changed("cpus") && (f.cpus < 1 || f.cpus > 64) {
		return fmt.Errorf("--cpus %d is out of range: use 1 to 64", f.cpus)
	}
	for _, sz := range []struct{ flag, val string }{{"memory", f.memory}, {"disk", f.disk}} {
		if !fs.Changed(sz.flag) {
			continue
		}
		mib, err := sandbox.ParseSize(sz.val)
		if err != nil {
			return fmt.Errorf("--%s: %w", sz.flag, err)
		}
		bare := strings.Trim(sz.val, "0123456789. ") == ""
		switch {
		case sz.flag == "memory" && mib < 256 && bare:
			return fmt.Errorf("--memory %s is %d MiB, below the 256M minimum: a bare number is MiB (did you mean %sG?)", sz.val, mib, sz.val)
		case sz.flag == "disk" && mib < 2<<10 && bare:
			return fmt.Errorf("--disk %s is %d MiB, below the 2G minimum: a bare number is MiB (did you mean %sG?)", sz.val, mib, sz.val)
		}
	}
	if fs.Changed("docker-disk") {
		if !f.docker {
			return errors.New("--docker-disk needs --docker")
		}
		mib, err := sandbox.ParseSize(f.dockerDisk)
		if err != nil {
			return fmt.Errorf("--docker-disk: %w", err)
		}
		if mib < 2<<10 {
			return fmt.Errorf("--docker-disk %s is below the 2G minimum", f.dockerDisk)
		}
	}
	if f.maxCP < 0 {
		return fmt.Errorf("--max-checkpoints %d: use 0 (the default, %d) or more", f.maxCP, sandbox.DefaultMaxCheckpoints)
	}
	if f.cpEvery < 0 || (f.cpEvery > 0 && f.cpEvery < 10*time.Second) {
		return fmt.Errorf("--checkpoint-every %s: use 10s or more", f.cpEvery)
	}
	if f.noWS && f.workspace != "" {
		return errors.New("--workspace and --no-workspace exclude each other")
	}
	if f.noWS && f.review {
		return errors.New("--review needs a workspace: drop --no-workspace")
	}
	return nil
}

// resolveEnv turns --env entries into KEY=VALUE, taking bare KEYs from the
// host's environment.
func resolveEnv(entries []string) ([]string, error) {
	var out []string
	for _, e := range entries {
		if strings.Contains(e, "=") {
			out = append(out, e)
			continue
		}
		v, ok := os.LookupEnv(e)
		if !ok {
			return nil, fmt.Errorf("--env %s: not set on the host (use --env %s=VALUE)", e, e)
		}
		out = append(out, e+"="+v)
	}
	return out, nil
}

// projectConfig loads kosa8.toml from the current folder, saying so when it
// is not trusted.
func projectConfig(m *sandbox.Manager) (*config.Project, error) {
	wd, err := folder.Current()
	if err != nil {
		return nil, err
	}
	l, err := config.Load(wd, config.NewTrustStore(m.Paths.Config))
	if err != nil {
		return nil, err
	}
	if l.Untrusted != nil {
		fmt.Fprintf(os.Stderr, "kosa8: ignoring %s: its content is not trusted. It would set:\n", l.Path)
		for _, s := range l.Untrusted {
			fmt.Fprintf(os.Stderr, "    %s\n", s)
		}
		fmt.Fprintf(os.Stderr, "  run 'kosa8 trust' to use it\n")
	}
	return l.Project, nil
}

// sandboxConfig combines defaults, kosa8.toml (from the current folder)
// and the flags, in that order (project.Resolve).
func (f *createFlags) sandboxConfig(m *sandbox.Manager) (sandbox.Config, error) {
	arch, err := guestArch(f.arch)
	if err != nil {
		return sandbox.Config{}, err
	}
	proj, err := projectConfig(m)
	if err != nil {
		return sandbox.Config{}, err
	}
	wd, err := folder.Current()
	if err != nil {
		return sandbox.Config{}, err
	}
	env, err := resolveEnv(f.env)
	if err != nil {
		return sandbox.Config{}, err
	}
	o := project.Options{
		Name: f.name, NameFrom: wd.String(), Arch: arch, Accel: f.accel,
		CPUs: f.cpus, Memory: f.memory, Disk: f.disk, Ephemeral: f.rm,
		Review: f.review, Exclude: f.exclude,
		NetPreset: f.preset, Allow: f.allow, AllowBroad: f.allowBroad,
		Ports: f.publish, PublishAll: f.publishAll, Secrets: f.secrets, Env: env,
		CheckpointEvery: f.cpEvery, MaxCheckpoints: f.maxCP,
		Docker: f.docker, DockerDisk: f.dockerDisk,
	}
	for _, a := range f.allowRead {
		o.Allow = append(o.Allow, "read:"+a)
	}
	if !f.noWS {
		dir := f.workspace
		if dir == "" {
			dir = wd.String()
		}
		if o.Workspace, err = sandbox.CheckWorkspace(dir, f.force); err != nil {
			return sandbox.Config{}, err
		}
	}
	if err := f.ag.options(m, proj, &o); err != nil {
		return sandbox.Config{}, err
	}
	if err := f.projectImage(wd.String(), proj); err != nil {
		return sandbox.Config{}, err
	}
	c, err := project.Resolve(o, proj, m.Paths.Config)
	if err != nil {
		return c, err
	}
	return c, f.ag.recipeFor(m, proj, &c)
}

func createSandbox(ctx context.Context, m *sandbox.Manager, f *createFlags) (*sandbox.Sandbox, error) {
	cfg, err := f.sandboxConfig(m)
	if err != nil {
		return nil, err
	}
	if err := checkFolderFree(m, cfg.Name, cfg.Workspace); err != nil {
		return nil, err
	}
	if err := checkQEMU(vmspec.Arch(cfg.Arch)); err != nil {
		return nil, err
	}
	if f.devBuild != nil {
		rec, err := buildDockerfile(ctx, m, *f.devBuild)
		if err != nil {
			return nil, err
		}
		f.image = rec.Name
	}
	if f.image != "" {
		img, err := ociImage(ctx, m, f.image, vmspec.Arch(cfg.Arch), f.imageFrom)
		if err != nil {
			return nil, err
		}
		applyOCIConfig(&cfg, img.Manifest.OCI)
		if !f.ag.recipe.Empty() {
			// The preset's install and [image] packages/setup, over the
			// OCI image (its package manager, its package sources).
			d := derivedRecipe(img, f.ag.preset, f.ag.pkgs, f.ag.setup, f.ag.recipe.Label)
			if err := checkDerivedBase(img, d); err != nil {
				return nil, err
			}
			if img, err = ensureDerived(ctx, m, img, d); err != nil {
				return nil, err
			}
		}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return m.Create(ctx, cfg, img)
	}
	img, err := f.ag.image(ctx, m, cfg)
	if err != nil {
		return nil, err
	}
	return m.Create(ctx, cfg, img)
}

// checkFolderFree fails when another sandbox syncs the workspace folder, a
// folder above it or one inside it: found before anything boots, so the
// failure leaves nothing behind.
func checkFolderFree(m *sandbox.Manager, self string, ws *sandbox.WorkspaceConfig) error {
	if ws == nil {
		return nil
	}
	return m.CheckFolderFree(self, ws.Path)
}

// startSandbox starts the sandbox's supervisor, detached, and waits for it
// to report the guest ready.
func startSandbox(ctx context.Context, sb *sandbox.Sandbox, quiet bool) (*api.Status, error) {
	return startSandboxFrom(ctx, sb, quiet, "", false)
}

// startSandboxFrom starts the supervisor, resuming checkpoint restore when
// set.
// startSandboxFrom starts a sandbox's supervisor: a cold boot, or with
// restore a checkpoint's machine; rewind merges the host folder back to it.
func startSandboxFrom(ctx context.Context, sb *sandbox.Sandbox, quiet bool, restore string, rewind bool) (*api.Status, error) {
	m, err := manager()
	if err != nil {
		return nil, err
	}
	if err := checkFolderFree(m, sb.Config.Name, sb.Config.Workspace); err != nil {
		return nil, err
	}
	agent, err := agentPath(vmspec.Arch(sb.Config.Arch))
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var p *progress
	head := "booting sandbox " + sb.Config.Name
	if restore != "" {
		head = "resuming sandbox " + sb.Config.Name
	}
	started := func() {
		if quiet {
			return
		}
		p = newProgress(os.Stderr)
		p.Step(head)
	}
	phase := func(ph launch.BootPhase) {
		if p != nil {
			p.Step(fmt.Sprintf("%s: %s (step %d of %d)", head, ph.What, ph.Step, ph.Of))
		}
	}
	progress := func(cp launch.CopyProgress) {
		if p != nil {
			p.Step(fmt.Sprintf("copying %s in: %d files, %s", sb.Config.Workspace.Path, cp.Files, humanBytes(cp.Bytes)))
		}
	}
	st, err := launch.Launch(ctx, sb, launch.LaunchOptions{Binary: self, Agent: agent, Restore: restore, Rewind: rewind, Started: started, Progress: progress, Phase: phase})
	if p != nil {
		p.Done()
	}
	return st, err
}

// oneLine joins s's lines with " / " (QEMU's message is often on its last
// line), cleaned for a terminal and cut to max bytes.
func oneLine(s string, max int) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && l != "last console lines:" {
			parts = append(parts, l)
		}
	}
	s = sanitize(strings.Join(parts, " / "), false)
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// openSandbox opens a sandbox by name.
func openSandbox(name string) (*sandbox.Sandbox, error) {
	m, err := manager()
	if err != nil {
		return nil, err
	}
	return m.Open(name)
}

// sdkSandbox opens a sandbox through the SDK (the same directories as
// manager's): the CLI's commands that change a sandbox, running or
// stopped, are the SDK's calls.
func sdkSandbox(name string) (*sdk.Sandbox, error) {
	c, err := sdk.New()
	if err != nil {
		return nil, err
	}
	return c.Open(name)
}

// supervisorErr is the reason an SDK call on a running sandbox failed, as
// the supervisor gave it: the CLI's messages do not name again the command
// and the sandbox the user typed.
func supervisorErr(err error) error {
	if e, ok := err.(*sdk.OpError); ok {
		return e.Err
	}
	return err
}

// runningSandbox opens a sandbox that must be running.
func runningSandbox(name string) (*sandbox.Sandbox, error) {
	sb, err := openSandbox(name)
	if err != nil {
		return nil, err
	}
	if !sb.Alive() {
		st := sb.Status()
		msg := fmt.Sprintf("sandbox %s is %s: 'kosa8 start %s' first", name, st.State, name)
		if st.State == api.Crashed && st.Error != "" {
			msg += " (" + st.Error + ")"
		}
		return nil, errors.New(msg)
	}
	return sb, nil
}

// execOptions describe one process to run in a sandbox.
type execOptions struct {
	argv  []string
	tty   bool
	stdin bool
	env   []string
	dir   string
	user  string
}

// execIn runs a process in a running sandbox, connected to this terminal,
// and returns its exit code.
func execIn(ctx context.Context, sb *sandbox.Sandbox, o execOptions) (int, error) {
	s, err := sdkSandbox(sb.Config.Name)
	if err != nil {
		return exitKosa8, err
	}
	sigs := make(chan os.Signal, 8)
	c := sdk.Cmd{
		Args: o.argv, Env: o.env, Dir: o.dir, User: o.user, TTY: o.tty,
		// The process's own output, raw: the user attached it on purpose.
		Stdout: &pipeWriter{w: termOut, sigs: sigs}, Stderr: &pipeWriter{w: termErr, sigs: sigs},
		Signals: sigs,
	}
	if o.tty {
		if w, h, err := term.GetSize(int(termOut.Fd())); err == nil {
			c.Size = sdk.WindowSize{Rows: uint16(h), Cols: uint16(w)}
		}
		if t := os.Getenv("TERM"); t != "" {
			c.Env = append([]string{"TERM=" + t}, c.Env...)
		}
	}
	if o.stdin {
		c.Stdin = os.Stdin
	}
	// The terminal goes raw, and signals go to the process, once it runs:
	// until then ^C ends kosa8.
	var restore func()
	if o.tty && isTerminal(os.Stdin) {
		resize := make(chan sdk.WindowSize, 1)
		winch := make(chan os.Signal, 1)
		defer signal.Stop(winch)
		c.Started = func(int) {
			if old, err := term.MakeRaw(int(os.Stdin.Fd())); err == nil {
				restore = func() { term.Restore(int(os.Stdin.Fd()), old) }
			}
			signal.Notify(winch, syscall.SIGWINCH)
			go func() {
				for range winch {
					if w, h, err := term.GetSize(int(termOut.Fd())); err == nil {
						select {
						case resize <- sdk.WindowSize{Rows: uint16(h), Cols: uint16(w)}:
						default:
						}
					}
				}
			}()
		}
		c.Resize = resize
	} else {
		// Without a terminal, signals to kosa8 go to the process in the guest.
		defer signal.Stop(sigs)
		c.Started = func(int) {
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
		}
	}
	res, err := s.Exec(ctx, c)
	if restore != nil {
		restore()
	}
	return execExit(res, err)
}

// execExit is a guest process's exit status, or kosa8's own (exitKosa8)
// when it could not be run or followed, with the reason as the guest, the
// supervisor or the stream gave it.
func execExit(res *sdk.ExecResult, err error) (int, error) {
	if err != nil {
		return exitKosa8, supervisorErr(err)
	}
	return res.ExitCode, nil
}

// pipeWriter passes a guest process's output on. When the reader has gone
// (EPIPE: 'kosa8 run … | head') the process gets SIGPIPE, as it would
// writing to that pipe itself; if it ignores that and keeps writing, it
// gets SIGTERM, then SIGKILL, a few seconds apart. Its output after that
// is dropped.
type pipeWriter struct {
	w    io.Writer
	sigs chan<- os.Signal

	broken time.Time // when the pipe broke
	sent   int       // escalation steps taken
}

func (p *pipeWriter) Write(b []byte) (int, error) {
	if p.broken.IsZero() {
		_, err := p.w.Write(b)
		if err == nil || !errors.Is(err, syscall.EPIPE) {
			return len(b), nil
		}
		p.broken = time.Now()
	}
	steps := []syscall.Signal{syscall.SIGPIPE, syscall.SIGTERM, syscall.SIGKILL}
	if p.sent < len(steps) && time.Since(p.broken) >= time.Duration(p.sent)*3*time.Second {
		select {
		case p.sigs <- steps[p.sent]:
			p.sent++
		default:
		}
	}
	return len(b), nil
}

// stopSandbox stops a running sandbox and waits until it has (the SDK's
// Stop or Kill: a wedged supervisor is ended).
func stopSandbox(ctx context.Context, sb *sandbox.Sandbox, kill bool) error {
	if !sb.Alive() {
		return nil
	}
	s, err := sdkSandbox(sb.Config.Name)
	if err != nil {
		if !sb.Alive() {
			return nil // it stopped meanwhile (an ephemeral one is gone with it)
		}
		return err
	}
	if kill {
		defer slowWait("killing sandbox " + sb.Config.Name)()
		return s.Kill(ctx)
	}
	defer slowWait("stopping sandbox " + sb.Config.Name + " (a last sync pass, then the guest powers off)")()
	return s.Stop(ctx)
}
