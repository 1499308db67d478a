package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/sandbox"
)

func runCmd() *cobra.Command {
	var f createFlags
	var interactive, tty, noTTY, detach bool
	var workdir, userName string
	cmd := &cobra.Command{
		Use:   "run [flags] [AGENT] [-- COMMAND [ARG...]]",
		Short: "Create a sandbox, start it and run a command (or a login shell) in it",
		Long: `Create a sandbox on the current folder (or --workspace), start it and run
COMMAND in it, or an interactive login shell when no command is given. The
command starts in the workspace folder and its exit status is kosa8's; kosa8's
own failures exit 125, a command that cannot be run 126, one not found 127, and
^C while booting 130. Standard input is passed only with -i (or when it is a
terminal). The sandbox is stopped when the command ends, and removed as well
with --rm (kept if it holds changes waiting for review).

'kosa8 run AGENT [-- ARGS]' runs an agent preset ('kosa8 agents'): its image (built
on first use), its hosts, its key (injected outside) and its kept settings, and
its command with ARGS appended; --agent AGENT applies the preset to any command.`,
		Example: "  kosa8 run -- uname -a\n  kosa8 run --rm --memory 2G -- npm test\n  kosa8 run -i --rm -- sh < script.sh\n  kosa8 run\n  kosa8 run claude\n  kosa8 run codex -- exec \"fix the failing test\"",
		Args:    cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.check(cmd.Flags()); err != nil {
				return err
			}
			m, err := manager()
			if err != nil {
				return err
			}
			// 'kosa8 run claude [-- ARGS]': the preset and its command.
			if args, err = f.ag.fromArgs(args, cmd.ArgsLenAtDash()); err != nil {
				return err
			}
			ctx := cmd.Context()
			sb, err := createSandbox(ctx, m, &f)
			if err != nil {
				return err
			}
			name := sb.Config.Name
			// From here on the sandbox exists: stop it (and remove it with
			// --rm) however the command ends, ^C included.
			startCtx, interrupted, stopSignals := interruptible(ctx)
			st, err := startSandbox(startCtx, sb, false)
			stopSignals()
			if err != nil {
				if interrupted() {
					// Never got to run anything: nothing of it is worth keeping.
					removeSandbox(sb, m)
					return fmt.Errorf("%w: sandbox %s removed", errInterrupted, name)
				}
				if sb.Config.Ephemeral {
					stopQuietly(sb)
					if dir, kerr := keepFailedLogs(m, sb); kerr == nil && dir != "" {
						err = fmt.Errorf("%w\n(its logs are kept in %s)", err, dir)
					}
					_ = m.Remove(name)
					return err
				}
				stopQuietly(sb)
				return fmt.Errorf("%w\n(the sandbox %s was kept: 'kosa8 logs %s', 'kosa8 rm %s')", err, name, name, name)
			}
			warnTCG(st)
			if detach {
				fmt.Println(name)
				return nil
			}
			o := execOptions{argv: args, dir: workdir, user: userName}
			if len(o.argv) == 0 {
				if o.argv, err = sb.Config.LoginShell(); err != nil {
					finishRun(sb, m)
					return err
				}
			}
			o.tty = tty || (isTerminal(os.Stdin) && isTerminal(termOut))
			if noTTY {
				o.tty = false
			}
			// Standard input only when asked for, or when it is the user's
			// terminal: a script's stdin (while read …; do kosa8 run …) is
			// not the guest's to swallow.
			o.stdin = interactive || (o.tty && isTerminal(os.Stdin))
			if len(args) == 0 && !o.stdin {
				fmt.Fprintln(os.Stderr, "kosa8: no terminal and no -i: the login shell gets no input (use -i to pass stdin)")
			}
			if err := f.ag.prepareHome(ctx, m, sb, o.user); err != nil {
				fmt.Fprintf(os.Stderr, "kosa8: %v\n", err)
			}
			code, err := execIn(ctx, sb, o)
			if err := f.ag.saveHome(ctx, m, sb, o.user); err != nil {
				fmt.Fprintf(os.Stderr, "kosa8: %v\n", err)
			}
			finishRun(sb, m)
			noteKept(m, sb, f.name == "")
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{code}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "pass standard input to the command")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "allocate a terminal even when not attached to one")
	cmd.Flags().BoolVarP(&noTTY, "no-tty", "T", false, "never allocate a terminal")
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "start the sandbox and leave it running; print its name")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the guest (default: the workspace folder, or the user's home without one)")
	cmd.Flags().StringVarP(&userName, "user", "u", "", "user in the guest (default: your name and ids; kosa8 (1000) when you are root)")
	return cmd
}

// interruptible is ctx cancelled by ^C, SIGTERM or SIGHUP; interrupted
// says whether that happened. stop ends the signal handling.
func interruptible(ctx context.Context) (_ context.Context, interrupted func() bool, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var hit atomic.Bool
	go func() {
		select {
		case <-sigs:
			hit.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, hit.Load, func() { signal.Stop(sigs); cancel() }
}

// stopQuietly stops a sandbox within a minute, whatever state it is in.
func stopQuietly(sb *sandbox.Sandbox) {
	sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_ = stopSandbox(sctx, sb, true)
}

// removeSandbox stops and removes a sandbox this command made.
func removeSandbox(sb *sandbox.Sandbox, m *sandbox.Manager) {
	stopQuietly(sb)
	_ = m.Remove(sb.Config.Name)
}

// finishRun stops the sandbox run made once its command has ended, and
// removes it with --rm, unless it holds changes waiting for review: those
// stay, and the user is told how to reach them.
func finishRun(sb *sandbox.Sandbox, m *sandbox.Manager) {
	name := sb.Config.Name
	sctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// A workspace gets a clean stop: its last sync pass carries what the
	// command wrote just before it ended.
	kill := sb.Config.Workspace == nil && sb.Config.Ephemeral
	if err := stopSandbox(sctx, sb, kill); err != nil {
		fmt.Fprintf(os.Stderr, "kosa8: stop %s: %v\n", name, err)
	}
	now, err := m.Open(name)
	if err != nil {
		return // an ephemeral sandbox removes itself when stopped
	}
	if n := now.Status().Pending; n > 0 {
		fmt.Fprintf(os.Stderr, "kosa8: %s pending in %s: 'kosa8 diff %s', then 'kosa8 apply %s' or 'kosa8 discard %s'\n",
			plural(n, "change"), name, name, name, name)
		return
	}
	if sb.Config.Ephemeral {
		_ = m.Remove(name)
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// keepFailedLogs moves a failed sandbox's logs out of its directory before
// it is removed: the console and the supervisor's log are the evidence of
// what went wrong.
func keepFailedLogs(m *sandbox.Manager, sb *sandbox.Sandbox) (string, error) {
	dir, err := m.KeepLogs(sb.Config.Name)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kosa8: could not keep the logs of %s: %v\n", sb.Config.Name, err)
	}
	return dir, err
}

func createCmd() *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create [flags] [NAME]",
		Short: "Create a sandbox without starting it",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if f.name != "" && f.name != args[0] {
					return fmt.Errorf("two names given: %s and --name %s", args[0], f.name)
				}
				f.name = args[0]
			}
			m, err := manager()
			if err != nil {
				return err
			}
			if err := f.check(cmd.Flags()); err != nil {
				return err
			}
			sb, err := createSandbox(cmd.Context(), m, &f)
			if err != nil {
				return err
			}
			fmt.Println(sb.Config.Name)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func startCmd() *cobra.Command {
	var cold bool
	var from string
	cmd := &cobra.Command{
		Use:               "start NAME...",
		ValidArgsFunction: completeAllSandboxes,
		Short:             "Start stopped sandboxes (a paused one continues where it was)",
		Long: `Start stopped sandboxes. A paused sandbox continues where it was; others boot
from their disks. --from ID (or --from latest) starts the machine saved in a
checkpoint instead, processes and memory included (after a host reboot, say); the
disks as they were are kept as a checkpoint first, so nothing is lost.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cold && from != "" {
				return errors.New("--cold and --from exclude each other")
			}
			m, err := manager()
			if err != nil {
				return err
			}
			for _, name := range args {
				sb, err := m.Open(name)
				if err != nil {
					return err
				}
				restore, rewind := "", false
				st := sb.Status()
				if st.State == api.Paused && !cold {
					restore = st.Checkpoint
				}
				if from != "" {
					if restore, err = resolveCheckpoint(sb, from, true); err != nil {
						return err
					}
					if st.State != api.Paused || restore != st.Checkpoint {
						saved, err := sandbox.SaveDisks(sb, "disks before start --from "+restore)
						if err != nil {
							return fmt.Errorf("keep %s's disks before starting it from %s: %w", name, restore, err)
						}
						fmt.Fprintf(os.Stderr, "kosa8: %s's disks as they were are kept as checkpoint %s\n", name, saved.ID)
						rewind = true
					}
				}
				ctx, interrupted, stopSignals := interruptible(cmd.Context())
				st2, err := startSandboxFrom(ctx, sb, false, restore, rewind)
				stopSignals()
				if err != nil {
					if interrupted() {
						return fmt.Errorf("%w: %s was not started", errInterrupted, name)
					}
					return fmt.Errorf("start %s: %w", name, err)
				}
				warnTCG(st2)
				if st2 != nil && st2.ColdBoot != "" {
					fmt.Fprintf(os.Stderr, "kosa8: checkpoint %s was %s: booted from its disks instead (processes were not restored)\n", restore, sanitize(st2.ColdBoot, false))
				}
				fmt.Println(name)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&cold, "cold", false, "boot a paused sandbox from its disks instead of resuming its memory")
	cmd.Flags().StringVar(&from, "from", "", "start the machine saved in this checkpoint (an id, a unique prefix, or latest)")
	_ = cmd.RegisterFlagCompletionFunc("from", func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) == 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return checkpointIDs(args[0], toComplete), cobra.ShellCompDirectiveNoFileComp
	})
	return cmd
}

// resumeCmd is 'kosa8 resume NAME...': start, under the name 'kosa8
// pause' points to, listed in 'kosa8 --help' (as an alias of start it was
// not).
func resumeCmd() *cobra.Command {
	cmd := startCmd()
	cmd.Use = "resume NAME..."
	cmd.Short = "Continue paused sandboxes where they were (as 'kosa8 start' does)"
	cmd.Long = `Continue sandboxes that 'kosa8 pause' wrote out, where they were, processes
included. It is 'kosa8 start': a sandbox that was not paused boots from its
disks; --cold boots a paused one from its disks instead.`
	return cmd
}

// resolveCheckpoint turns a checkpoint reference into a checkpoint id of
// sb: a whole id, a prefix of exactly one id, or latest (the newest one
// with a machine in it when machine is set, else the newest of all).
func resolveCheckpoint(sb *sandbox.Sandbox, ref string, machine bool) (string, error) {
	name := sb.Config.Name
	list, err := sb.Checkpoints().List()
	if err != nil {
		return "", err
	}
	if ref == "latest" {
		newest := (*checkpoint.Meta)(nil)
		for _, c := range list {
			if machine && c.DisksOnly {
				continue
			}
			if newest == nil || c.Created.After(newest.Created) || (c.Created.Equal(newest.Created) && c.ID > newest.ID) {
				newest = c
			}
		}
		if newest == nil {
			if machine {
				return "", fmt.Errorf("%s has no checkpoint with a machine in it", name)
			}
			return "", fmt.Errorf("%s has no checkpoints ('kosa8 checkpoint %s' takes one)", name, name)
		}
		return newest.ID, nil
	}
	var found []string
	for _, c := range list {
		if c.ID == ref {
			return c.ID, nil
		}
		if ref != "" && strings.HasPrefix(c.ID, ref) {
			found = append(found, c.ID)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("no checkpoint %q in %s ('kosa8 checkpoints %s' lists them)", ref, name, name)
	}
	return "", fmt.Errorf("checkpoint %q of %s is ambiguous: it starts %s", ref, name, strings.Join(found, ", "))
}

func execCmd() *cobra.Command {
	var interactive, tty, checkpointFirst bool
	var env []string
	var workdir, userName string
	cmd := &cobra.Command{
		Use:               "exec [flags] NAME -- COMMAND [ARG...]",
		ValidArgsFunction: completeSandboxes,
		Short:             "Run a command in a running sandbox",
		Long: `Run COMMAND in a running sandbox, in its workspace folder. Its exit status is
kosa8's; kosa8's own failures exit 125, a command that cannot be run 126, one not
found 127. Standard input is passed only with -i; -t allocates a terminal.`,
		Example: "  kosa8 exec demo -- ls -la\n  kosa8 exec -it demo -- bash",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := runningSandbox(args[0])
			if err != nil {
				return err
			}
			envs, err := resolveEnv(env)
			if err != nil {
				return err
			}
			if checkpointFirst {
				s, err := sdkSandbox(args[0])
				if err != nil {
					return err
				}
				cp, err := s.Checkpoint(cmd.Context(), "before: "+strings.Join(args[1:], " "))
				if err != nil {
					return supervisorErr(err)
				}
				fmt.Fprintf(os.Stderr, "kosa8: checkpoint %s (undo with: kosa8 rewind %s %s)\n", cp.ID, args[0], cp.ID)
			}
			code, err := execIn(cmd.Context(), sb, execOptions{argv: args[1:], tty: tty, stdin: interactive, env: envs, dir: workdir, user: userName})
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{code}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "pass standard input to the command")
	cmd.Flags().BoolVar(&checkpointFirst, "checkpoint", false, "take a checkpoint first, to rewind to if the command goes wrong")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "allocate a terminal")
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "set KEY=VALUE, or pass the host's KEY (repeatable)")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the guest (default: the workspace folder, or the user's home without one)")
	cmd.Flags().StringVarP(&userName, "user", "u", "", "user in the guest (default: the sandbox's user)")
	return cmd
}

func shellCmd() *cobra.Command {
	var userName string
	cmd := &cobra.Command{
		Use:               "shell NAME",
		ValidArgsFunction: completeSandboxes,
		Short:             "Open an interactive login shell in a running sandbox",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := runningSandbox(args[0])
			if err != nil {
				return err
			}
			sh, err := sb.Config.LoginShell()
			if err != nil {
				return err
			}
			code, err := execIn(cmd.Context(), sb, execOptions{argv: sh, tty: isTerminal(os.Stdin), stdin: true, user: userName})
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{code}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&userName, "user", "u", "", "user in the guest")
	return cmd
}

func stopCmd() *cobra.Command {
	var kill bool
	cmd := &cobra.Command{
		Use:               "stop NAME...",
		ValidArgsFunction: completeAllSandboxes,
		Short:             "Stop running sandboxes (a clean poweroff of the guest)",
		Args:              cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			for _, name := range args {
				sb, err := m.Open(name)
				if err != nil {
					return err
				}
				if !sb.Alive() {
					fmt.Fprintf(os.Stderr, "kosa8: %s is not running\n", name)
					continue
				}
				if err := stopSandbox(cmd.Context(), sb, kill); err != nil {
					return err
				}
				fmt.Println(name)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&kill, "kill", "k", false, "end the VM at once instead of powering it off")
	return cmd
}

func rmCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:               "rm [-f] NAME...",
		ValidArgsFunction: completeAllSandboxes,
		Short:             "Remove sandboxes and everything they hold",
		Args:              cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			for _, name := range args {
				sb, err := m.Open(name)
				if err != nil {
					if !force {
						return err
					}
					// A folder that does not open ('kosa8 ls' says broken).
					if rerr := m.RemoveBroken(name); rerr != nil {
						if errors.Is(rerr, sandbox.ErrNotFound) {
							return err
						}
						return rerr
					}
					fmt.Println(name)
					continue
				}
				// Refused before anything stops: its forks' disks build on it.
				if err := m.CheckNoForks(name); err != nil {
					return err
				}
				if sb.Alive() {
					if !force {
						return fmt.Errorf("%w: %s (stop it first, or use 'kosa8 rm -f')", sandbox.ErrRunning, name)
					}
					if err := stopSandbox(cmd.Context(), sb, true); err != nil {
						return err
					}
				} else if n := sb.Status().Pending; n > 0 && !force {
					// The agent's unreviewed work is only on this sandbox's disk.
					q := fmt.Sprintf("%s holds %s not applied to %s; remove it anyway?", name, plural(n, "change"), sb.Config.Workspace.Path)
					if !isTerminal(os.Stdin) || !confirm(q) {
						return fmt.Errorf("%s holds %s not applied to the host folder: 'kosa8 diff %s', 'kosa8 apply %s' or 'kosa8 discard %s' first, or 'kosa8 rm -f %s'",
							name, plural(n, "change"), name, name, name, name)
					}
				}
				if err := m.Remove(name); err != nil {
					if errors.Is(err, sandbox.ErrNotFound) && sb.Config.Ephemeral {
						fmt.Println(name) // an ephemeral sandbox removes itself when stopped
						continue
					}
					return err
				}
				fmt.Println(name)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "stop a running sandbox first; remove one with unapplied changes without asking")
	return cmd
}
