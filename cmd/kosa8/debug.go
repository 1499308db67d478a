package main

import (
	"errors"
	"os"

	"github.com/spf13/cobra"
)

func debugCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "debug", Short: "Inspect a sandbox from the host", Hidden: true}
	cmd.AddCommand(&cobra.Command{
		Use:   "memory NAME",
		Short: "Write the guest's RAM to stdout (the VM pauses while it is read)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := runningSandbox(args[0]) // its message says how to start it
			if err != nil {
				return err
			}
			if isTerminal(termOut) {
				return errors.New("refusing to write guest memory to a terminal: redirect it to a file")
			}
			s, err := sdkSandbox(sb.Config.Name)
			if err != nil {
				return err
			}
			return s.DumpMemory(cmd.Context(), os.Stdout)
		},
	})
	return cmd
}
