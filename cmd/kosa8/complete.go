package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/netpolicy"
)

// completeSandboxes offers sandbox names for the first argument.
func completeSandboxes(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault
	}
	return sandboxNames(toComplete), cobra.ShellCompDirectiveNoFileComp
}

// completeAllSandboxes offers sandbox names for every argument (stop, rm).
func completeAllSandboxes(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	var out []string
	for _, n := range sandboxNames(toComplete) {
		if !contains(args, n) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeCheckpoints offers sandbox names, then that sandbox's checkpoint
// ids (and latest).
func completeCheckpoints(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) == 0 {
		return sandboxNames(toComplete), cobra.ShellCompDirectiveNoFileComp
	}
	return checkpointIDs(args[0], toComplete), cobra.ShellCompDirectiveNoFileComp
}

func completePresets(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	var out []string
	for _, p := range netpolicy.PresetNames() {
		if strings.HasPrefix(p, toComplete) {
			out = append(out, p)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func sandboxNames(prefix string) []string {
	m, err := manager()
	if err != nil {
		return nil
	}
	list, _ := m.List()
	var out []string
	for _, sb := range list {
		if strings.HasPrefix(sb.Config.Name, prefix) {
			out = append(out, sb.Config.Name)
		}
	}
	return out
}

func checkpointIDs(name, prefix string) []string {
	sb, err := openSandbox(name)
	if err != nil {
		return nil
	}
	list, _ := sb.Checkpoints().List()
	out := []string{}
	if strings.HasPrefix("latest", prefix) {
		out = append(out, "latest")
	}
	for _, c := range list {
		if strings.HasPrefix(c.ID, prefix) {
			out = append(out, c.ID)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
