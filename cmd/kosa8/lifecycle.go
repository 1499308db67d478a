package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/secrets"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmspec"
)

// errorCode is kosa8's own exit status for failures that are not the
// command's (as Docker's 125), so scripts can tell them apart.
const errorCode = 125

// createFlags are shared by create and run.
type createFlags struct {
	name       string
	cpus       int
	memory     string
	disk       string
	rm         bool
	env        []string
	accel      string
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
	ag         agentFlags // --agent, --no-host-ca, [agent] and [image] (agents.go)
}

func (f *createFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.name, "name", "", "sandbox name (default: the folder's name and a random suffix)")
	fs.IntVar(&f.cpus, "cpus", 0, fmt.Sprintf("virtual CPUs (default %d)", sandbox.DefaultCPUs))
	fs.StringVar(&f.memory, "memory", "", fmt.Sprintf("guest memory, e.g. 2G (default %dM)", sandbox.DefaultMemoryMiB))
	fs.StringVar(&f.disk, "disk", "", fmt.Sprintf("root disk size, e.g. 32G (default %dG)", sandbox.DefaultDiskGiB))
	fs.BoolVar(&f.rm, "rm", false, "remove the sandbox when it stops")
	fs.StringArrayVarP(&f.env, "env", "e", nil, "set KEY=VALUE in the guest, or pass the host's KEY (repeatable)")
	fs.StringVar(&f.accel, "accel", os.Getenv("KOSA8_ACCEL"), "force the acceleration: kvm, hvf or tcg")
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
	fs.IntVar(&f.maxCP, "max-checkpoints", 0, fmt.Sprintf("keep at most this many checkpoints (default %d)", sandbox.DefaultMaxCheckpoints))
	f.ag.register(fs)
}

var userNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// guestUser mirrors the host user: same name and ids, unless the host user
// is root (the guest's default user must not be), then kosa8 with 1000:1000.
func guestUser() (name string, uid, gid int) {
	uid, gid = os.Getuid(), os.Getgid()
	name = "kosa8"
	if u, err := user.Current(); err == nil && userNameRE.MatchString(u.Username) && u.Username != "root" {
		name = u.Username
	}
	if uid == 0 {
		return "kosa8", 1000, 1000
	}
	return name, uid, gid
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
	wd, err := os.Getwd()
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

func defaultName() string {
	base := "sandbox"
	if wd, err := os.Getwd(); err == nil {
		base = strings.Trim(regexp.MustCompile(`[^a-zA-Z0-9_.-]+`).ReplaceAllString(filepath.Base(wd), "-"), "-.")
	}
	if base == "" || len(base) > 40 {
		base = "sandbox"
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return base + "-" + hex.EncodeToString(b)
}

// sandboxConfig combines flags, kosa8.toml and defaults, in that order.
func (f *createFlags) sandboxConfig(m *sandbox.Manager) (sandbox.Config, error) {
	c := sandbox.Config{
		Name: f.name, Arch: string(vmspec.HostArch()),
		CPUs: sandbox.DefaultCPUs, MemoryMiB: sandbox.DefaultMemoryMiB, DiskGiB: sandbox.DefaultDiskGiB,
		Ephemeral: f.rm, Accel: f.accel,
	}
	c.User, c.UID, c.GID = guestUser()
	proj, err := projectConfig(m)
	if err != nil {
		return c, err
	}
	var env []string
	if proj != nil {
		s := proj.Sandbox
		if s.CPUs != 0 {
			c.CPUs = s.CPUs
		}
		if s.Memory != "" {
			if c.MemoryMiB, err = sandbox.ParseSize(s.Memory); err != nil {
				return c, fmt.Errorf("kosa8.toml sandbox.memory: %w", err)
			}
		}
		if s.Disk != "" {
			mib, err := sandbox.ParseSize(s.Disk)
			if err != nil {
				return c, fmt.Errorf("kosa8.toml sandbox.disk: %w", err)
			}
			c.DiskGiB = (mib + 1023) >> 10
		}
		env = append(env, s.Env...)
		if proj.Network.Preset != "" && f.preset == "" {
			f.preset = proj.Network.Preset
		}
		f.allow = append(append([]string(nil), proj.Network.Allow...), f.allow...)
		f.publish = append(append([]string(nil), proj.Network.Ports...), f.publish...)
		f.secrets = append(append([]string(nil), proj.Secrets.Use...), f.secrets...)
		f.exclude = append(append([]string(nil), proj.Workspace.Exclude...), f.exclude...)
		f.review = f.review || proj.Workspace.Review
	}
	if err := f.ag.apply(m, proj, f, &c); err != nil {
		return c, err
	}
	if !f.noWS {
		dir := f.workspace
		if dir == "" {
			var err error
			if dir, err = os.Getwd(); err != nil {
				return c, err
			}
		}
		path, err := sandbox.CheckWorkspace(dir, f.force)
		if err != nil {
			return c, err
		}
		var hold []string
		if proj != nil {
			hold = proj.Workspace.Hold
		}
		c.Workspace = &sandbox.WorkspaceConfig{Path: path, Review: f.review, Exclude: f.exclude, Hold: hold}
	}
	if f.cpus != 0 {
		c.CPUs = f.cpus
	}
	if f.memory != "" {
		if c.MemoryMiB, err = sandbox.ParseSize(f.memory); err != nil {
			return c, fmt.Errorf("--memory: %w", err)
		}
	}
	if f.disk != "" {
		mib, err := sandbox.ParseSize(f.disk)
		if err != nil {
			return c, fmt.Errorf("--disk: %w", err)
		}
		c.DiskGiB = (mib + 1023) >> 10
	}
	switch vmm.Accel(c.Accel) {
	case "", vmm.KVM, vmm.HVF, vmm.TCG:
	default:
		return c, fmt.Errorf("--accel %q: use kvm, hvf or tcg", c.Accel)
	}
	if f.preset != "" {
		p, err := netpolicy.Preset(f.preset)
		if err != nil {
			return c, err
		}
		for _, r := range p.Rules {
			c.Network.Rules = append(c.Network.Rules, r.Text)
		}
	}
	for _, a := range f.allowRead {
		f.allow = append(f.allow, "read:"+a)
	}
	for _, a := range f.allow {
		r, err := netpolicy.ParseRule(a, netpolicy.ParseOptions{AllowBroad: f.allowBroad})
		if err != nil {
			return c, err
		}
		c.Network.Rules = append(c.Network.Rules, r.Text)
	}
	c.Network.AllowBroad = f.allowBroad
	for _, p := range f.publish {
		pf, err := sandbox.ParsePortForward(p, f.publishAll)
		if err != nil {
			return c, err
		}
		c.Network.Ports = append(c.Network.Ports, pf)
	}
	if len(f.secrets) > 0 {
		store, err := secrets.Open(m.Paths.Config)
		if err != nil {
			return c, err
		}
		for _, name := range f.secrets {
			if _, err := store.Describe(name); err != nil {
				return c, err
			}
			if !slices.Contains(c.Secrets, name) {
				c.Secrets = append(c.Secrets, name)
			}
		}
	}
	c.CheckpointEvery, c.MaxCheckpoints = sandbox.Duration(f.cpEvery), f.maxCP
	flagEnv, err := resolveEnv(f.env)
	if err != nil {
		return c, err
	}
	c.Env = append(env, flagEnv...)
	if c.Name == "" {
		c.Name = defaultName()
	}
	return c, c.Validate()
}

func createSandbox(ctx context.Context, m *sandbox.Manager, f *createFlags) (*sandbox.Sandbox, error) {
	cfg, err := f.sandboxConfig(m)
	if err != nil {
		return nil, err
	}
	img, err := f.ag.image(ctx, m, cfg)
	if err != nil {
		return nil, err
	}
	return m.Create(ctx, cfg, img)
}

// startSandbox starts the sandbox's supervisor, detached, and waits for it
// to report the guest ready.
func startSandbox(ctx context.Context, sb *sandbox.Sandbox, quiet bool) (*sandbox.Status, error) {
	return startSandboxFrom(ctx, sb, quiet, "", false)
}

// startSandboxFrom starts the supervisor, resuming checkpoint restore when
// set.
// startSandboxFrom starts a sandbox's supervisor: a cold boot, or with
// restore a checkpoint's machine; rewind merges the host folder back to it.
func startSandboxFrom(ctx context.Context, sb *sandbox.Sandbox, quiet bool, restore string, rewind bool) (*sandbox.Status, error) {
	if sb.Alive() {
		return nil, fmt.Errorf("%w: %s", sandbox.ErrRunning, sb.Config.Name)
	}
	agent, err := agentPath()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(sb.Path(sandbox.SupervisorLog), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	args := []string{"supervise", "--ready-fd", "3", "--agent", agent}
	if restore != "" {
		args = append(args, "--restore", restore)
		if rewind {
			args = append(args, "--rewind")
		}
	}
	cmd := exec.Command(self, append(args, sb.Config.Name)...)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.Dir = "/"
	// A session of its own: the supervisor outlives this CLI and its
	// terminal (no SIGHUP, no ^C from the terminal's process group).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("start supervisor: %w", err)
	}
	pw.Close()
	go func() { _ = cmd.Wait() }() // reaped if it dies while we wait; detached otherwise

	var p *progress
	if !quiet {
		p = newProgress(os.Stderr)
		if restore != "" {
			p.Step("resuming sandbox " + sb.Config.Name)
		} else {
			p.Step("booting sandbox " + sb.Config.Name)
		}
		defer p.Done()
	}
	type result struct {
		msg sandbox.ReadyMessage
		err error
	}
	res := make(chan result, 1)
	go func() {
		line, err := bufio.NewReader(pr).ReadBytes('\n')
		var msg sandbox.ReadyMessage
		if err == nil {
			err = json.Unmarshal(line, &msg)
		}
		res <- result{msg, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return nil, fmt.Errorf("the supervisor exited before the sandbox was ready%s", logTail(sb.Path(sandbox.SupervisorLog)))
		}
		if !r.msg.OK {
			return nil, errors.New(r.msg.Error)
		}
		return r.msg.Status, nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return nil, ctx.Err()
	}
}

func logTail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(sanitize(string(b), true)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	if len(lines) == 0 || lines[0] == "" {
		return ""
	}
	return ":\n  " + strings.Join(lines, "\n  ")
}

// warnTCG says, once per command, that the sandbox runs without hardware
// isolation.
func warnTCG(st *sandbox.Status) {
	if st != nil && st.Accel == string(vmm.TCG) {
		fmt.Fprintln(os.Stderr, "kosa8: warning: "+vmm.IsolationWarning)
	}
}

// openSandbox opens a sandbox by name.
func openSandbox(name string) (*sandbox.Sandbox, error) {
	m, err := manager()
	if err != nil {
		return nil, err
	}
	return m.Open(name)
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
		if st.State == sandbox.Crashed && st.Error != "" {
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
	req := &guest.ExecRequest{Argv: o.argv, Env: o.env, Dir: o.dir, User: o.user, TTY: o.tty}
	if o.tty {
		if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
			req.Cols, req.Rows = uint16(w), uint16(h)
		}
		if t := os.Getenv("TERM"); t != "" {
			req.Env = append([]string{"TERM=" + t}, req.Env...)
		}
	}
	conn, err := sandbox.NewClient(sb).Exec(ctx, req)
	if err != nil {
		return errorCode, err
	}
	defer conn.Close()

	sio := guest.StdIO{Stdout: os.Stdout, Stderr: os.Stderr}
	if o.stdin {
		sio.Stdin = os.Stdin
	}
	if o.tty && isTerminal(os.Stdin) {
		old, err := term.MakeRaw(int(os.Stdin.Fd()))
		if err == nil {
			defer term.Restore(int(os.Stdin.Fd()), old)
		}
		resize := make(chan guest.WindowSize, 1)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
					select {
					case resize <- guest.WindowSize{Rows: uint16(h), Cols: uint16(w)}:
					default:
					}
				}
			}
		}()
		sio.Resize = resize
	} else {
		// Without a terminal, signals to kosa8 go to the process in the guest.
		sigs := make(chan byte, 4)
		osig := make(chan os.Signal, 4)
		signal.Notify(osig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
		defer signal.Stop(osig)
		go func() {
			for s := range osig {
				sigs <- byte(s.(syscall.Signal))
			}
		}()
		sio.Signals = sigs
	}
	st, err := guest.Pump(conn, sio)
	if err != nil {
		return errorCode, err
	}
	if st.Error != "" {
		return errorCode, errors.New(st.Error)
	}
	return st.Code, nil
}

// stopSandbox stops a running sandbox and waits until it has.
func stopSandbox(ctx context.Context, sb *sandbox.Sandbox, kill bool) error {
	if !sb.Alive() {
		return nil
	}
	err := sandbox.NewClient(sb).Stop(ctx, kill)
	if err != nil && sb.Alive() {
		// The API may be gone with a wedged supervisor: end it.
		_ = sb.Kill()
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return sb.WaitStopped(wctx)
}
