package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/supervisor"
	"github.com/kosa8/kosa8/internal/vmm/qemu"
)

func superviseCmd() *cobra.Command {
	var readyFd int
	var agent, restore string
	var rewind bool
	var bootTimeout time.Duration
	cmd := &cobra.Command{
		Use:    "supervise NAME",
		Short:  "Run a sandbox's supervisor (started by kosa8 itself)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("sandbox", args[0])
			m, err := manager()
			if err != nil {
				return err
			}
			var ready *os.File
			if readyFd > 2 {
				ready = os.NewFile(uintptr(readyFd), "ready")
			}
			signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			err = supervisor.Supervise(ctx, m, args[0], supervisor.Options{
				AgentPath: agent, Ready: ready, Log: log, BootTimeout: bootTimeout, Restore: restore, Rewind: rewind,
				NewDriver: qemu.NewDriver, // the one VMM kosa8 runs today
			})
			if err != nil {
				log.Error("supervisor", "err", err)
				return fmt.Errorf("supervise %s: %w", args[0], err)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&readyFd, "ready-fd", 0, "descriptor to report readiness on")
	cmd.Flags().StringVar(&agent, "agent", "", "kosa8-agent binary")
	cmd.Flags().StringVar(&restore, "restore", "", "resume from this checkpoint")
	cmd.Flags().BoolVar(&rewind, "rewind", false, "with --restore: merge the host folder back to it")
	cmd.Flags().DurationVar(&bootTimeout, "boot-timeout", 120*time.Second, "how long to wait for the guest agent")
	return cmd
}

func trustCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "trust [DIR]",
		Short: "Approve the exact content of DIR/kosa8.toml (default: this folder)",
		Long: `kosa8.toml can widen what a sandbox may do, and a cloned repository or an agent can
write it. It takes effect only once its exact content is approved here; any change
needs a new approval.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return trustProject(args)
		},
	}
}
