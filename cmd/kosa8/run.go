package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/sandbox"
)

func runCmd() *cobra.Command {
	var f createFlags
	var tty, noTTY, detach bool
	var workdir, userName string
	cmd := &cobra.Command{
		Use:   "run [flags] [AGENT] [-- COMMAND [ARG...]]",
		Short: "Create a sandbox, start it and run a command (or a login shell) in it",
		Long: `Create a sandbox, start it and run COMMAND in it, or an interactive login shell
when no command is given. The command's exit status is kosa8's. The sandbox is
stopped when the command ends, and removed as well with --rm.

'kosa8 run AGENT [-- ARGS]' runs an agent preset ('kosa8 agents'): its image (built
on first use), its hosts, its key (injected outside) and its kept settings, and
its command with ARGS appended; --agent AGENT applies the preset to any command.`,
		Example: "  kosa8 run -- uname -a\n  kosa8 run --rm --memory 2G -- npm test\n  kosa8 run\n  kosa8 run claude\n  kosa8 run codex -- exec \"fix the failing test\"",
		Args:    cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
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
			// From here on the sandbox exists: stop it (and remove it with
			// --rm) however the command ends, ^C included.
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
			defer signal.Stop(sigs)
			cleanup := func() {
				if detach {
					return
				}
				sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				_ = stopSandbox(sctx, sb, sb.Config.Ephemeral)
				if sb.Config.Ephemeral {
					_ = m.Remove(sb.Config.Name) // the supervisor removes it too; either wins
				}
			}
			startCtx, cancel := context.WithCancel(ctx)
			go func() {
				select {
				case <-sigs:
					cancel()
				case <-startCtx.Done():
				}
			}()
			st, err := startSandbox(startCtx, sb, false)
			cancel()
			if err != nil {
				cleanup()
				if !sb.Config.Ephemeral {
					err = fmt.Errorf("%w\n(the sandbox %s was kept: 'kosa8 logs %s', 'kosa8 rm %s')", err, sb.Config.Name, sb.Config.Name, sb.Config.Name)
				}
				return err
			}
			signal.Stop(sigs)
			warnTCG(st)
			if detach {
				fmt.Println(sb.Config.Name)
				return nil
			}
			o := execOptions{argv: args, stdin: true, dir: workdir, user: userName}
			if len(o.argv) == 0 {
				o.argv = []string{"/bin/bash", "-l"}
			}
			o.tty = (isTerminal(os.Stdin) && isTerminal(os.Stdout)) || tty
			if noTTY {
				o.tty = false
			}
			if err := f.ag.prepareHome(ctx, m, sb, o.user); err != nil {
				fmt.Fprintf(os.Stderr, "kosa8: %v\n", err)
			}
			code, err := execIn(ctx, sb, o)
			if err := f.ag.saveHome(ctx, m, sb, o.user); err != nil {
				fmt.Fprintf(os.Stderr, "kosa8: %v\n", err)
			}
			cleanup()
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{code}
			}
			return nil
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "allocate a terminal even when not attached to one")
	cmd.Flags().BoolVarP(&noTTY, "no-tty", "T", false, "never allocate a terminal")
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "start the sandbox and leave it running; print its name")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the guest (default: the user's home)")
	cmd.Flags().StringVarP(&userName, "user", "u", "", "user in the guest (default: yours; root for root)")
	return cmd
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
			sb, err := createSandbox(cmd.Context(), m, &f)
			if err != nil {
				return err
			}
			fmt.Println(sb.Config.Name)
			return nil
		},
	}
	f.register(cmd.Flags())
	return cmd
}

func startCmd() *cobra.Command {
	var cold bool
	var from string
	cmd := &cobra.Command{
		Use:     "start NAME...",
		Aliases: []string{"resume"},
		Short:   "Start stopped sandboxes (a paused one continues where it was)",
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
				if st.State == sandbox.Paused && !cold {
					restore = st.Checkpoint
				}
				if from != "" {
					if restore, err = resolveCheckpoint(sb, from); err != nil {
						return err
					}
					if st.State != sandbox.Paused || restore != st.Checkpoint {
						saved, err := sandbox.SaveDisks(sb, "disks before start --from "+restore)
						if err != nil {
							return fmt.Errorf("keep %s's disks before starting it from %s: %w", name, restore, err)
						}
						fmt.Fprintf(os.Stderr, "kosa8: %s's disks as they were are kept as checkpoint %s\n", name, saved.ID)
						rewind = true
					}
				}
				st2, err := startSandboxFrom(cmd.Context(), sb, false, restore, rewind)
				if err != nil {
					return fmt.Errorf("start %s: %w", name, err)
				}
				warnTCG(st2)
				fmt.Println(name)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&cold, "cold", false, "boot a paused sandbox from its disks instead of resuming its memory")
	cmd.Flags().StringVar(&from, "from", "", "start the machine saved in this checkpoint (an id, or latest)")
	return cmd
}

// resolveCheckpoint turns an id or "latest" into a checkpoint id of sb.
func resolveCheckpoint(sb *sandbox.Sandbox, ref string) (string, error) {
	if ref != "latest" {
		if _, err := sb.Checkpoints().Load(ref); err != nil {
			return "", fmt.Errorf("%w %q of %s ('kosa8 checkpoints %s' lists them)", err, ref, sb.Config.Name, sb.Config.Name)
		}
		return ref, nil
	}
	list, err := sb.Checkpoints().List()
	if err != nil {
		return "", err
	}
	for i := len(list) - 1; i >= 0; i-- {
		if !list[i].DisksOnly {
			return list[i].ID, nil
		}
	}
	return "", fmt.Errorf("%s has no checkpoint with a machine in it to start from", sb.Config.Name)
}

func execCmd() *cobra.Command {
	var interactive, tty, checkpointFirst bool
	var env []string
	var workdir, userName string
	cmd := &cobra.Command{
		Use:     "exec [flags] NAME -- COMMAND [ARG...]",
		Short:   "Run a command in a running sandbox",
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
				meta, err := sandbox.NewClient(sb).Checkpoint(cmd.Context(), "before: "+strings.Join(args[1:], " "))
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "kosa8: checkpoint %s (undo with: kosa8 rewind %s %s)\n", meta.ID, args[0], meta.ID)
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
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the guest")
	cmd.Flags().StringVarP(&userName, "user", "u", "", "user in the guest")
	return cmd
}

func shellCmd() *cobra.Command {
	var userName string
	cmd := &cobra.Command{
		Use:   "shell NAME",
		Short: "Open an interactive login shell in a running sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := runningSandbox(args[0])
			if err != nil {
				return err
			}
			code, err := execIn(cmd.Context(), sb, execOptions{argv: []string{"/bin/bash", "-l"}, tty: isTerminal(os.Stdin), stdin: true, user: userName})
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
		Use:   "stop NAME...",
		Short: "Stop running sandboxes (a clean poweroff of the guest)",
		Args:  cobra.MinimumNArgs(1),
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
		Use:   "rm [-f] NAME...",
		Short: "Remove sandboxes and everything they hold",
		Args:  cobra.MinimumNArgs(1),
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
				if sb.Alive() {
					if !force {
						return fmt.Errorf("%w: %s (stop it first, or use 'kosa8 rm -f')", sandbox.ErrRunning, name)
					}
					if err := stopSandbox(cmd.Context(), sb, true); err != nil {
						return err
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
	cmd.Flags().BoolVarP(&force, "force", "f", false, "stop a running sandbox first")
	return cmd
}
