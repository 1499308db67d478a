package main

import (
	"errors"
	"os"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/sandbox"
)

func debugCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "debug", Short: "Inspect a sandbox from the host", Hidden: true}
	cmd.AddCommand(&cobra.Command{
		Use:   "memory NAME",
		Short: "Write the guest's RAM to stdout (the VM pauses while it is read)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := runningSandbox(args[0])
			if err != nil {
				return err
			}
			if isTerminal(termOut) {
				return errors.New("refusing to write guest memory to a terminal: redirect it to a file")
			}
			return sandbox.NewClient(sb).Memory(cmd.Context(), os.Stdout)
		},
	})
	return cmd
}
