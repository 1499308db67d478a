package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/sandbox"
)

func workspaceSandbox(name string) (*sandbox.Sandbox, error) {
	sb, err := runningSandbox(name)
	if err != nil {
		return nil, err
	}
	if sb.Config.Workspace == nil {
		return nil, fmt.Errorf("sandbox %s has no workspace", name)
	}
	return sb, nil
}

func printSyncStatus(st *sandbox.SyncStatus, asJSON bool) error {
	if asJSON {
		return printJSON(st)
	}
	fmt.Printf("workspace %s: %d paths in step, last sync %s\n", sanitize(st.Path, false), st.Files, ago(st.LastSync))
	q := st.Quota
	if q.MaxBytes > 0 {
		fmt.Printf("quota: %s of %s, %d of %d files made by the sandbox in the host folder", humanBytes(q.Bytes), humanBytes(q.MaxBytes), q.Files, q.MaxFiles)
		if q.Refused > 0 {
			fmt.Printf("; %d writes refused (quota reached: delete files inside, or raise quota_bytes/quota_files in the sandbox's config.json)", q.Refused)
		}
		fmt.Println()
	}
	section := func(title string, lines []string) {
		if len(lines) == 0 {
			return
		}
		fmt.Printf("%s:\n", title)
		for _, l := range lines {
			fmt.Printf("  %s\n", sanitize(l, false))
		}
	}
	var pending, held, conflicts []string
	for _, c := range st.Pending {
		pending = append(pending, fmt.Sprintf("%-8s %s", c.Kind, c.Path))
	}
	for _, c := range st.Held {
		held = append(held, fmt.Sprintf("%-8s %s  (%s)", c.Kind, c.Path, c.Why))
	}
	for _, c := range st.Conflicts {
		conflicts = append(conflicts, fmt.Sprintf("%s: the sandbox's version is in %s", c.Path, c.Copy))
	}
	section("waiting for review ('kosa8 apply')", pending)
	section("held for approval ('kosa8 approve NAME PATH')", held)
	section("conflicts (both versions kept)", conflicts)
	section("not synced", st.Skipped)
	section("errors", st.Errors)
	return nil
}

func syncCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{Use: "sync", Short: "Show the workspace sync"}
	// sub is status (full false) or now (a whole pass first).
	sub := func(use, short string, full bool) *cobra.Command {
		c := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				sb, err := workspaceSandbox(args[0])
				if err != nil {
					return err
				}
				st, err := sandbox.NewClient(sb).Sync(cmd.Context(), full)
				if err != nil {
					return err
				}
				return printSyncStatus(st, asJSON)
			},
		}
		c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
		return c
	}
	status := sub("status NAME", "Pending changes, held files, conflicts", false)
	now := sub("now NAME", "Compare the whole folder with the sandbox now", true)
	cmd.AddCommand(status, now)
	return cmd
}

func heldCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "held NAME",
		Short: "List changes held for approval (files host tools run or obey)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := workspaceSandbox(args[0])
			if err != nil {
				return err
			}
			st, err := sandbox.NewClient(sb).Sync(cmd.Context(), false)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(st.Held)
			}
			for _, c := range st.Held {
				fmt.Printf("%-8s %s  (%s)\n", c.Kind, sanitize(c.Path, false), sanitize(c.Why, false))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func changeCmd(use, short, what string, needPaths bool) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(map[bool]int{true: 2, false: 1}[needPaths]),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := workspaceSandbox(args[0])
			if err != nil {
				return err
			}
			done, err := sandbox.NewClient(sb).SyncChange(cmd.Context(), what, args[1:])
			if err != nil {
				return err
			}
			for _, p := range done {
				fmt.Println(sanitize(p, false))
			}
			return nil
		},
	}
}

func diffCmd() *cobra.Command {
	var stat bool
	cmd := &cobra.Command{
		Use:   "diff NAME [PATH...]",
		Short: "Show the sandbox's changes waiting for review",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := workspaceSandbox(args[0])
			if err != nil {
				return err
			}
			st, err := sandbox.NewClient(sb).Sync(cmd.Context(), false)
			if err != nil {
				return err
			}
			want := map[string]bool{}
			for _, p := range args[1:] {
				want[p] = true
			}
			for _, c := range st.Pending {
				if len(want) > 0 && !want[c.Path] {
					continue
				}
				fmt.Printf("%s %s\n", strings.ToUpper(c.Kind[:1]), sanitize(c.Path, false))
				if stat || c.Guest == nil || c.Guest.Type != 'f' || c.Guest.Size > 1<<20 {
					continue
				}
				if err := showDiff(cmd.Context(), sb, st.Path, c.Path); err != nil {
					fmt.Fprintf(os.Stderr, "  (no diff: %v)\n", err)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&stat, "stat", false, "list paths only")
	return cmd
}

// showDiff prints a unified diff of the host's and the guest's version.
func showDiff(ctx context.Context, sb *sandbox.Sandbox, root, rel string) error {
	var guestCopy bytes.Buffer
	conn, err := sandbox.NewClient(sb).Exec(ctx, &guest.ExecRequest{Argv: []string{"cat", "--", filepath.Join(root, rel)}})
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := guest.Pump(conn, guest.StdIO{Stdout: &guestCopy}); err != nil {
		return err
	}
	tmp, err := os.CreateTemp("", "kosa8-diff-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tmp.Write(guestCopy.Bytes())
	tmp.Close()
	host := filepath.Join(root, rel)
	if fi, err := os.Lstat(host); err != nil || !fi.Mode().IsRegular() {
		host = os.DevNull // never read through a link
	}
	out, _ := exec.CommandContext(ctx, "diff", "-u", "--label", "host/"+rel, "--label", "sandbox/"+rel, host, tmp.Name()).Output()
	os.Stdout.Write([]byte(sanitize(string(out), true)))
	return nil
}
