package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/checkpoint"
)

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

func checkpointCmd() *cobra.Command {
	var message string
	var asJSON bool
	cmd := &cobra.Command{
		Use:               "checkpoint NAME",
		Short:             "Save the whole running machine (RAM, devices, disks, workspace) to rewind to",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := runningSandbox(args[0])
			if err != nil {
				return err
			}
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			cp, err := s.Checkpoint(cmd.Context(), message)
			if err != nil {
				return supervisorErr(err)
			}
			if asJSON {
				return printJSON(cp)
			}
			fmt.Printf("%s  paused %.0f ms, total %.0f ms, %s RAM", cp.ID, cp.PauseMillis, cp.TotalMillis, humanBytes(cp.RAMBytes))
			if u, err := sb.Usage(); err == nil {
				fmt.Printf(", %s on disk (all %d checkpoints: %s)", humanBytes(u.PerCheckpoint[cp.ID]), len(u.PerCheckpoint), humanBytes(u.Checkpoints))
			}
			fmt.Println()
			return nil
		},
	}
	cmd.Flags().StringVarP(&message, "message", "m", "", "what this checkpoint is")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:               "rm NAME ID...",
		Short:             "Delete checkpoints (ids, unique prefixes, or latest)",
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: completeCheckpoints,
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := openSandbox(args[0])
			if err != nil {
				return err
			}
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			for _, ref := range args[1:] {
				id, err := resolveCheckpoint(sb, ref, false)
				if err != nil {
					return err
				}
				if err := s.DeleteCheckpoint(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Println(id)
			}
			return nil
		},
	}
	// 'kosa8 checkpoint ls NAME' is 'kosa8 checkpoints NAME' (it answered
	// "no such sandbox named ls").
	ls := checkpointsCmd()
	ls.Use, ls.Short = "ls NAME", "List a sandbox's checkpoints as a tree (as 'kosa8 checkpoints NAME')"
	cmd.AddCommand(rm, ls)
	return cmd
}

func checkpointsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:               "checkpoints NAME",
		Short:             "List a sandbox's checkpoints as a tree",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := openSandbox(args[0])
			if err != nil {
				return err
			}
			list, err := sb.Checkpoints().List()
			if err != nil {
				return err
			}
			usage, err := sb.Usage()
			if err != nil {
				return err
			}
			if asJSON {
				type entry struct {
					*checkpoint.Meta
					DiskBytes int64 `json:"disk_bytes"` // allocated on the host: its files and the disk layers it froze
				}
				// The totals the text view ends with, beside the list.
				type totals struct {
					Count       int   `json:"count"`
					Checkpoints int64 `json:"checkpoints_bytes"` // all checkpoints on disk
					Spare       int64 `json:"spare_bytes"`       // the spare RAM files waiting for the next ones
					Active      int64 `json:"live_disk_bytes"`   // the disk layers the machine writes to now
					Total       int64 `json:"sandbox_bytes"`     // the whole sandbox directory
				}
				out := struct {
					Checkpoints []entry `json:"checkpoints"`
					Current     string  `json:"current,omitempty"` // the checkpoint the sandbox descends from
					Totals      totals  `json:"totals"`
				}{Checkpoints: []entry{}, Current: sb.Status().Checkpoint,
					Totals: totals{len(list), usage.Checkpoints, usage.Spare, usage.Active, usage.Total}}
				for _, c := range list {
					out.Checkpoints = append(out.Checkpoints, entry{c, usage.PerCheckpoint[c.ID]})
				}
				return printJSON(out)
			}
			if len(list) == 0 {
				fmt.Println("(no checkpoints: 'kosa8 checkpoint " + args[0] + "' takes one)")
				return nil
			}
			cur := sb.Status().Checkpoint
			children := map[string][]*checkpoint.Meta{}
			ids := map[string]bool{}
			for _, c := range list {
				ids[c.ID] = true
			}
			var roots []*checkpoint.Meta
			for _, c := range list {
				if c.Parent == "" || !ids[c.Parent] {
					roots = append(roots, c)
				} else {
					children[c.Parent] = append(children[c.Parent], c)
				}
			}
			var show func(c *checkpoint.Meta, depth int)
			show = func(c *checkpoint.Meta, depth int) {
				mark := " "
				if c.ID == cur {
					mark = "*"
				}
				msg := c.Message
				if c.Kind != "manual" {
					msg = strings.TrimSpace("[" + c.Kind + "] " + msg)
				}
				fmt.Printf("%s %s%s  %s  %-9s  %s\n", mark, strings.Repeat("  ", depth), c.ID, c.Created.Local().Format(time.DateTime), humanBytes(usage.PerCheckpoint[c.ID]), sanitize(msg, false))
				for _, k := range children[c.ID] {
					show(k, depth+1)
				}
			}
			for _, r := range roots {
				show(r, 0)
			}
			fmt.Printf("%d checkpoints, %s on disk; spare RAM file %s, live disk layers %s; sandbox total %s\n",
				len(list), humanBytes(usage.Checkpoints), humanBytes(usage.Spare), humanBytes(usage.Active), humanBytes(usage.Total))
			fmt.Fprintln(os.Stderr, "(* the checkpoint the sandbox now descends from; sizes are host disk space, RAM and frozen disk layers)")
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func rewindCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "rewind NAME ID|latest",
		Short: "Return the machine and the workspace to a checkpoint (the state just before is saved as one)",
		Long: `Return the running machine and the workspace to a checkpoint: ID is a checkpoint
id, a unique prefix of one, or latest (the newest). The state just before the rewind
is saved as a checkpoint, so a rewind can be undone; the host folder is merged back,
keeping your own edits.`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: completeCheckpoints,
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := runningSandbox(args[0])
			if err != nil {
				return err
			}
			id, err := resolveCheckpoint(sb, args[1], false)
			if err != nil {
				return err
			}
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			p := newProgress(os.Stderr)
			p.Step("rewinding " + args[0] + " to " + id)
			res, err := s.Rewind(cmd.Context(), id)
			p.Done()
			if err != nil {
				return supervisorErr(err)
			}
			if asJSON {
				return printJSON(res)
			}
			if res.Saved != nil {
				fmt.Printf("rewound to %s in %.0f ms; the state before is checkpoint %s\n", res.To, res.Millis, res.Saved.ID)
			} else {
				fmt.Printf("rewound to %s in %.0f ms\n", res.To, res.Millis)
			}
			if res.Warning != "" {
				fmt.Fprintln(os.Stderr, "kosa8: warning: "+sanitize(res.Warning, false))
			}
			if res.ColdBoot {
				fmt.Fprintln(os.Stderr, "kosa8: the checkpoint was saved by another QEMU build: booted from its disks (processes were not restored)")
			}
			for _, c := range res.Conflicts {
				fmt.Printf("  kept your version: %s\n", sanitize(c.Path, false))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func pauseCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pause NAME...",
		Short: "Write running sandboxes out to disk and free their memory ('kosa8 resume' continues them)",
		Long: `Save each running sandbox's whole machine to a checkpoint on disk and stop its VM,
freeing the host's memory. 'kosa8 resume NAME' (or 'kosa8 start NAME') continues it
where it was, processes included; 'kosa8 start --cold NAME' boots it from its disks
instead.`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completeAllSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, name := range args {
				if _, err := runningSandbox(name); err != nil { // its message says how to start it
					return err
				}
				s, err := sdkSandbox(name)
				if err != nil {
					return err
				}
				done := slowWait("pausing sandbox " + name + " (its memory written out)")
				err = s.Pause(cmd.Context()) // returns once it has stopped
				done()
				if err != nil {
					return supervisorErr(err)
				}
				fmt.Println(name)
			}
			return nil
		},
	}
}
