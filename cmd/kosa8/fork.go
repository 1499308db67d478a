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
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/sdk"
)

func forkCmd() *cobra.Command {
	var n int
	var from, message string
	var detach, asJSON bool
	cmd := &cobra.Command{
		Use:   "fork SOURCE -n N [-- COMMAND [ARG...]]",
		Short: "Fork a running sandbox into N sandboxes, each in review mode (best of N attempts)",
		Long: `Take one checkpoint of the running sandbox SOURCE (its pause is all SOURCE pays) and
start N sandboxes from it, named SOURCE.1 to SOURCE.N (numbers past those in use):
the same memory, processes, disks and workspace, each with disk layers, a network
stack, an audit log, a machine id and a boot id of its own, and its RNG reseeded. They
keep SOURCE's allow-list, secrets (the same placeholders, injected by their own
broker) and sandbox CA. SOURCE keeps running.

Each fork's workspace is in review mode: nothing reaches the host folder until
'kosa8 apply FORK'. 'kosa8 fork ls SOURCE' shows each fork's state, the exit status
of COMMAND and what it changed; 'kosa8 diff FORK' shows one fork's changes against
the host folder and 'kosa8 diff FORK1 FORK2' two forks against each other;
'kosa8 apply --rm FORK' writes one fork's changes and removes the other forks.

With COMMAND, each fork runs it (in the workspace, as 'kosa8 exec' would), and kosa8
waits for all of them to end, unless -d; the commands run on without kosa8 either way
(their output is kept: 'kosa8 fork logs FORK'). How many forks fit is checked first,
against the host's free memory and disk.`,
		Example: "  kosa8 fork base -n 3 -- claude -p \"fix the flaky test in api/\"\n  kosa8 fork ls base\n  kosa8 diff base.1 base.3\n  kosa8 apply --rm base.2",
		Args:    cobra.MinimumNArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) == 0 {
				return completeSandboxes(cmd, args, toComplete)
			}
			return nil, cobra.ShellCompDirectiveDefault
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 1 || (dash < 0 && len(args) > 1) {
				return fmt.Errorf("fork takes one sandbox, then the command after --: 'kosa8 fork %s -n %d -- COMMAND'", args[0], max(n, 2))
			}
			if !cmd.Flags().Changed("count") {
				return errors.New("say how many forks with -n N")
			}
			name, command := args[0], args[1:]
			sb, err := openSandbox(name)
			if err != nil {
				return err
			}
			if from != "" {
				if from, err = resolveCheckpoint(sb, from, true); err != nil {
					return err
				}
			} else if !sb.Alive() {
				return fmt.Errorf("sandbox %s is %s: 'kosa8 start %s' first, or fork one of its checkpoints with --from", name, sb.Status().State, name)
			}
			s, err := sdkSandbox(name)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			p := newProgress(os.Stderr)
			p.Step(fmt.Sprintf("forking %s into %d", name, n))
			opts := []sdk.ForkOption{sdk.ForkProgress(func(e sdk.ForkEvent) {
				switch e.Step {
				case "checkpoint":
					p.Step(fmt.Sprintf("checkpoint %s of %s (paused %.0f ms); starting %d forks", e.Checkpoint.ID, name, e.Checkpoint.PauseMillis, n))
				case "running":
					p.Step(fmt.Sprintf("%s running after %.1f s", e.Sandbox, e.Millis/1000))
				case "failed":
					p.Step(fmt.Sprintf("%s failed to start", e.Sandbox))
				}
			})}
			if len(command) > 0 {
				opts = append(opts, sdk.ForkCommand(command...))
			}
			if from != "" {
				opts = append(opts, sdk.ForkFrom(from))
			}
			if message != "" {
				opts = append(opts, sdk.ForkMessage(message))
			}
			t0 := time.Now()
			forks, err := s.Fork(ctx, n, opts...)
			p.Done()
			if err != nil && len(forks) == 0 {
				return supervisorErr(err)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "kosa8: %v\n", supervisorErr(err))
			}
			if !asJSON {
				var names []string
				for _, f := range forks {
					names = append(names, f.Name())
				}
				fmt.Fprintf(os.Stderr, "kosa8: %s running %.1f s after the fork began\n", strings.Join(names, ", "), time.Since(t0).Seconds())
			}
			if len(command) > 0 && !detach {
				waitForks(ctx, forks)
			}
			if err := printForks(ctx, name, asJSON); err != nil {
				return err
			}
			if err != nil {
				return &exitError{exitKosa8}
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 0, "how many forks")
	cmd.Flags().StringVar(&from, "from", "", "fork this checkpoint of SOURCE (an id, a unique prefix, or latest) instead of its running machine")
	cmd.Flags().StringVarP(&message, "message", "m", "", "the message of the checkpoint the forks start from")
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "return once the forks run; do not wait for COMMAND")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the forks as 'kosa8 fork ls --json' does")
	cmd.AddCommand(forkLsCmd(), forkLogsCmd())
	return cmd
}

// waitForks waits until the command of every fork has ended (or its fork
// stopped), showing which still run; ^C ends the wait, not the commands.
func waitForks(ctx context.Context, forks []*sdk.Sandbox) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	interrupted := false
	go func() {
		select {
		case <-sigs:
			interrupted = true
			cancel()
		case <-ctx.Done():
		}
	}()
	p := newProgress(os.Stderr)
	defer p.Done()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		var running, done []string
		for _, f := range forks {
			st, err := f.ForkStatus(ctx)
			switch {
			case err != nil, !st.Ended.IsZero(), st.State != sdk.Running:
				done = append(done, f.Name())
			default:
				running = append(running, f.Name())
			}
		}
		if len(running) == 0 {
			return
		}
		p.Step(fmt.Sprintf("waiting for the command in %s (%d of %d ended; ^C stops waiting, not the commands)", strings.Join(running, ", "), len(done), len(forks)))
		select {
		case <-ctx.Done():
			if interrupted {
				p.Done()
				fmt.Fprintln(os.Stderr, "kosa8: stopped waiting; the commands run on ('kosa8 fork ls' shows them)")
			}
			return
		case <-t.C:
		}
	}
}

// printForks lists the forks of source: a table, or JSON.
func printForks(ctx context.Context, source string, asJSON bool) error {
	c, err := sdk.New()
	if err != nil {
		return err
	}
	forks, err := c.Forks(ctx, source)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(forks)
	}
	if len(forks) == 0 {
		fmt.Printf("(%s has no forks: 'kosa8 fork %s -n 3' makes three)\n", source, source)
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FORK\tSTATE\tCOMMAND\tEXIT\tFILES\t+/-\tFROM")
	for _, f := range forks {
		exit := "-"
		switch {
		case f.ExitCode != nil:
			exit = fmt.Sprint(*f.ExitCode)
		case f.Error != "":
			exit = "error"
		case !f.Started.IsZero():
			exit = "running"
		}
		files, lines := "-", "-"
		if ch := f.Changes; ch != nil {
			files = fmt.Sprint(len(ch.Files))
			lines = fmt.Sprintf("+%d -%d", ch.Added, ch.Removed)
			if !ch.Live {
				files += " (" + ago(ch.Taken) + ")"
			}
		} else if f.Pending > 0 {
			files = fmt.Sprint(f.Pending)
		}
		command := strings.Join(f.Command, " ")
		if len(command) > 40 {
			command = command[:37] + "..."
		}
		if command == "" {
			command = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, f.State, command, exit, files, lines, f.Origin.Checkpoint)
	}
	tw.Flush()
	for _, f := range forks {
		if f.Error != "" {
			fmt.Fprintf(os.Stderr, "%s: %s\n", f.Name, f.Error)
		}
		if f.State == sdk.Created {
			fmt.Fprintf(os.Stderr, "%s was made but never started (its fork was interrupted): 'kosa8 start %s' brings up the checkpoint's machine, 'kosa8 rm %s' removes it\n", f.Name, f.Name, f.Name)
		}
	}
	return nil
}

func forkLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls SOURCE",
		Short: "List a sandbox's forks: state, the forked command's exit status, files changed, lines added and removed",
		Long: `List the forks of SOURCE: each one's state, the command it was forked to run and its
exit status, and its changes waiting for review (files, and lines added and removed
against the host folder: asked of a running fork now, else as it recorded them when
its command ended or it stopped, with their age).`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := openSandbox(args[0]); err != nil {
				return err
			}
			return printForks(cmd.Context(), args[0], asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func forkLogsCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "logs FORK",
		Short:             "Print the output of the command a fork was made to run",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := openSandbox(args[0])
			if err != nil {
				return err
			}
			if sb.Config.Fork == nil {
				return fmt.Errorf("%s is not a fork ('kosa8 logs %s' shows its console)", args[0], args[0])
			}
			f, err := os.OpenFile(sb.Path(sandbox.ForkOutputFile), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%s ran no command", args[0])
			}
			if err != nil {
				return err
			}
			defer f.Close()
			// The guest's bytes: stdout goes through termsafe (fork is no raw command).
			_, err = io.Copy(os.Stdout, f)
			return err
		},
	}
}
