package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/sdk"
)

// listing is one sandbox as ls --json and inspect show it.
type listing struct {
	Name    string         `json:"name"`
	State   api.State      `json:"state"`
	Dir     string         `json:"dir"`
	Config  sandbox.Config `json:"config"`
	Status  api.Status     `json:"status"`
	Network *networkView   `json:"network,omitempty"`
	Guest   *sdk.GuestInfo `json:"guest,omitempty"`
}

// networkView is what inspect shows of a sandbox's network as it is now
// (net allow/deny and port changes included, not only the create flags).
type networkView struct {
	Rules   []string          `json:"rules"`
	Secrets []string          `json:"secrets"`
	Ports   []api.PortForward `json:"ports"`
}

func describeNetwork(sb *sandbox.Sandbox) (*networkView, error) {
	v := &networkView{Rules: []string{}, Secrets: append([]string{}, sb.Config.Secrets...), Ports: []api.PortForward{}}
	pol, err := sb.LoadPolicy()
	if err != nil {
		return nil, err
	}
	for _, r := range pol.Rules {
		v.Rules = append(v.Rules, r.Text)
	}
	ports, err := sb.LoadPorts()
	if err != nil {
		return nil, err
	}
	v.Ports = append(v.Ports, ports...)
	return v, nil
}

func describe(sb *sandbox.Sandbox) listing {
	st := sb.Status()
	return listing{Name: sb.Config.Name, State: st.State, Dir: sb.Dir, Config: sb.Config, Status: st}
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// stateBroken is what ls says of a folder in the sandboxes folder that
// does not open as a sandbox.
const stateBroken api.State = "broken"

func lsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list", "ps"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			sbs, broken, err := m.ListAll()
			if err != nil {
				return err
			}
			out := make([]listing, 0, len(sbs))
			for _, sb := range sbs {
				out = append(out, describe(sb))
			}
			// Folders that do not open are listed too, never hidden.
			for _, b := range broken {
				out = append(out, listing{Name: b.Name, State: stateBroken, Dir: b.Dir,
					Status: api.Status{State: stateBroken, Error: fmt.Sprintf("%v: 'kosa8 rm -f %s' removes the folder", b.Err, b.Name)}})
			}
			if asJSON {
				return printJSON(out)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tACCEL\tCPUS\tMEMORY\tDISK\tCREATED")
			for _, l := range out {
				accel := l.Status.Accel
				if accel == "" {
					accel = "-"
				}
				state := string(l.State)
				if l.Config.Ephemeral {
					state += " (--rm)"
				}
				if n := l.Status.Pending; n > 0 && l.State != api.Running {
					state += fmt.Sprintf(" (%d pending)", n)
				}
				if f := l.Config.Fork; f != nil {
					state += " (fork of " + f.Source + ")"
				}
				if l.State == stateBroken {
					state += " (" + l.Status.Error + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dM\t%dG\t%s\n", sanitize(l.Name, false), sanitize(state, false), accel, l.Config.CPUs, l.Config.MemoryMiB, l.Config.DiskGiB, ago(l.Config.Created))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func inspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect NAME...",
		Short: "Show sandboxes' settings, state and network as JSON (a list, one entry per NAME)",
		Long: `Show each sandbox's settings, state, network as it is now (allow-list rules,
bound secrets, published ports) and, when it runs, what its guest reports, as one
JSON list.`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completeAllSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := make([]listing, 0, len(args))
			for _, name := range args {
				sb, err := openSandbox(name)
				if err != nil {
					return err
				}
				l := describe(sb)
				if l.Network, err = describeNetwork(sb); err != nil {
					return fmt.Errorf("inspect %s: %w", name, err)
				}
				if sb.Alive() {
					ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
					if s, err := sdkSandbox(name); err == nil {
						if info, err := s.GuestInfo(ctx); err == nil {
							l.Guest = info
						}
					}
					cancel()
				}
				out = append(out, l)
			}
			return printJSON(out)
		},
	}
}

// consoleFilter passes a console log on line by line, as a person reads
// it: without the serial console's carriage returns (the terminal filter
// would show each as "?"), and without the lines a boot template's guest
// wrote before this sandbox existed (a sandbox started from a template
// inherits what its guest had not yet sent; the agent stamps its lines
// "time=…"). A line longer than maxConsoleLine is passed on in pieces.
type consoleFilter struct {
	w       io.Writer
	created time.Time
	buf     []byte
}

const maxConsoleLine = 64 << 10

func (c *consoleFilter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.buf = append(c.buf, p...)
			if len(c.buf) >= maxConsoleLine {
				if err := c.emit(c.buf, false); err != nil {
					return 0, err
				}
				c.buf = c.buf[:0]
			}
			break
		}
		line := p[:i]
		if len(c.buf) > 0 {
			line = append(c.buf, line...)
		}
		if err := c.emit(line, true); err != nil {
			return 0, err
		}
		c.buf = c.buf[:0]
		p = p[i+1:]
	}
	return n, nil
}

// Flush passes on a last line without its newline.
func (c *consoleFilter) Flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	err := c.emit(c.buf, false)
	c.buf = c.buf[:0]
	return err
}

func (c *consoleFilter) emit(line []byte, newline bool) error {
	line = bytes.TrimRight(line, "\r")
	if c.beforeCreated(line) {
		return nil
	}
	if newline {
		line = append(line, '\n')
	}
	_, err := c.w.Write(line)
	return err
}

// beforeCreated reports whether line is stamped (time=RFC3339) before the
// sandbox was created.
func (c *consoleFilter) beforeCreated(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("time="))
	if !ok || c.created.IsZero() {
		return false
	}
	stamp, _, _ := bytes.Cut(rest, []byte(" "))
	t, err := time.Parse(time.RFC3339Nano, string(stamp))
	return err == nil && t.Before(c.created.Add(-time.Second))
}

func logsCmd() *cobra.Command {
	var supervisorLog, follow bool
	cmd := &cobra.Command{
		Use:               "logs [flags] NAME",
		Short:             "Print a sandbox's console log (or its supervisor's)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := openSandbox(args[0])
			if err != nil {
				return err
			}
			p := sb.Path(sandbox.ConsoleLog)
			if supervisorLog {
				p = sb.Path(sandbox.SupervisorLog)
			}
			// The console carries what the guest printed: never raw to the
			// user's terminal.
			var w io.Writer = os.Stdout // cleaned by guardOutput
			if !supervisorLog {
				cf := &consoleFilter{w: os.Stdout, created: sb.Config.Created}
				defer cf.Flush()
				w = cf
			}
			var older *os.File
			if !supervisorLog {
				// A long console log's older half (the driver bounds
				// each), opened first: should the log move between the
				// two opens, what is lost is the middle, not the newest
				// lines.
				older, _ = os.Open(p + ".1")
			}
			f, err := os.Open(p)
			if err != nil {
				if older != nil {
					older.Close()
				}
				if os.IsNotExist(err) {
					return fmt.Errorf("no log yet: %s has not been started", args[0])
				}
				return err
			}
			defer func() { f.Close() }()
			if older != nil {
				_, err = io.Copy(w, older)
				older.Close()
				if err != nil {
					return err
				}
			}
			if _, err := io.Copy(w, f); err != nil {
				return err
			}
			for follow && sb.Alive() {
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := io.Copy(w, f); err != nil {
					return err
				}
				// Past 1 MiB the log moves to console.log.1 and a new one
				// begins: follow the new one.
				if cur, err := os.Stat(p); err == nil {
					if fi, err := f.Stat(); err == nil && !os.SameFile(cur, fi) {
						if nf, err := os.Open(p); err == nil {
							_, _ = io.Copy(w, f) // what came before the move
							f.Close()
							f = nf
						}
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&supervisorLog, "supervisor", false, "the supervisor's log instead of the guest console")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing while the sandbox runs")
	return cmd
}
