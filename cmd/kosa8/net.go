package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/sdk"
)

func netCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "net",
		Short: "Show and change what a sandbox may reach",
		Long: `A sandbox reaches nothing unless its allow-list names it. Rules are hosts
(example.com), subdomains (*.example.com), either with ports (github.com:22; 80 and
443 when none is given), or IPv4 ranges (10.0.0.0/8:5432). Deny rules
(net deny) win over allow rules. Changes apply to new connections at once,
running or not.`,
	}
	var broad, asJSON, follow, security bool
	allow := &cobra.Command{
		Use:     "allow NAME RULE...",
		Short:   "Allow hosts, ports or ranges",
		Example: "  kosa8 net allow dev github.com:22 '*.npmjs.org'",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			allow := s.Allow
			if broad {
				allow = s.AllowBroad
			}
			rules, err := allow(cmd.Context(), args[1:]...)
			if err != nil {
				return err
			}
			return printRules(rules, false)
		},
	}
	allow.Flags().BoolVar(&broad, "allow-broad", false, "accept rules that match a whole public suffix or everything")
	deny := &cobra.Command{
		Use:   "deny NAME TARGET...",
		Short: "Refuse hosts, wildcards or ranges, even where an allow rule covers them",
		Long: `Add deny rules. A deny rule wins over every allow rule (and over a secret's
own hosts): with *.example.com allowed, 'kosa8 net deny dev other.example.com'
refuses that one host. Without a port it covers every port. 'kosa8 net ls' lists
deny rules as deny:TARGET; 'kosa8 net rm' takes them away, and 'kosa8 net allow'
of exactly the same target does too.`,
		Example: "  kosa8 net deny dev other.example.com '*.ads.example.com' 10.0.0.0/8",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			rules, err := s.Deny(cmd.Context(), args[1:]...)
			if err != nil {
				return err
			}
			return printRules(rules, false)
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME TARGET...",
		Short: "Remove the rules (allow or deny) for hosts, wildcards or ranges",
		Long: `Remove every rule for each target, as 'kosa8 net ls' lists it (github.com,
*.npmjs.org, 10.0.0.0/8, deny:other.example.com). A target no rule has is an
error, and then nothing is removed.`,
		Example: "  kosa8 net rm dev github.com deny:other.example.com",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			rules, err := s.Remove(cmd.Context(), args[1:]...)
			if err != nil {
				return err
			}
			return printRules(rules, false)
		},
	}
	ls := &cobra.Command{
		Use:   "ls NAME",
		Short: "List the allow-list",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := openSandbox(args[0])
			if err != nil {
				return err
			}
			p, err := sb.LoadPolicy()
			if err != nil {
				return err
			}
			var rules []string
			for _, r := range p.Rules {
				rules = append(rules, r.Text)
			}
			return printRules(rules, asJSON)
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	logc := &cobra.Command{
		Use:   "log NAME",
		Short: "Show every DNS answer and connection decision",
		Long: `Show the sandbox's audit log: DNS answers and connection decisions, with
repeats summed up. --security shows the security log instead: denials,
exfiltration attempts, held writes, checkpoints, rewinds and policy changes,
kept apart (64 MiB) so that a noisy guest cannot rotate them away.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := openSandbox(args[0])
			if err != nil {
				return err
			}
			path := sb.Path(sandbox.AuditLog)
			if security {
				path = audit.SecurityPath(path)
			}
			return showAudit(cmd, path, asJSON, follow)
		},
	}
	logc.Flags().BoolVar(&asJSON, "json", false, "print JSON lines")
	logc.Flags().BoolVar(&security, "security", false, "show the security log (denials, exfiltration attempts, held writes, checkpoints, rewinds)")
	logc.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	blocked := &cobra.Command{
		Use:   "blocked NAME",
		Short: "List the hosts the sandbox asked for and was refused, to allow with 'net allow'",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := openSandbox(args[0])
			if err != nil {
				return err
			}
			pol, err := sb.LoadPolicy()
			if err != nil {
				return err
			}
			// Denials are kept in the security log, which a flood cannot
			// rotate away.
			events, err := audit.ReadSecurity(sb.Path(sandbox.AuditLog))
			if err != nil {
				return err
			}
			list := sandbox.BlockedHosts(events, pol)
			if asJSON {
				return printJSON(list)
			}
			if len(list) == 0 {
				fmt.Println("(nothing blocked that the allow-list still refuses)")
				return nil
			}
			var rules []string
			for _, b := range list {
				fmt.Printf("%-40s %5d×  last %s\n", sanitize(b.Rule, false), b.Count, b.Last.Local().Format(time.DateTime))
				rules = append(rules, sanitize(b.Rule, false)) // normalised host names: no shell metacharacters
			}
			fmt.Fprintf(os.Stderr, "allow with: kosa8 net allow %s %s\n", args[0], strings.Join(rules, " "))
			return nil
		},
	}
	blocked.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	approve := &cobra.Command{
		Use:   "approve NAME",
		Short: "Show each host the sandbox is refused as it happens, and allow it on 'y'",
		Long: `Watch a running sandbox (from a second terminal while the agent works): each
host it is refused is shown as it happens, once, with a question; 'y' allows it
for this sandbox as 'kosa8 net allow' does, anything else leaves it refused.
With --json, each refused host is printed as one JSON object a line
({"host","port","rule","count","last"}) and nothing is asked: a tool builds its
own prompt and runs 'kosa8 net allow NAME RULE'. Ctrl-C ends it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := openSandbox(args[0])
			if err != nil {
				return err
			}
			if !sb.Alive() {
				return fmt.Errorf("sandbox %s is not running: start it, or see what it was refused with 'kosa8 net blocked %s'", args[0], args[0])
			}
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			return approveHosts(cmd, s, args[0], asJSON)
		},
	}
	approve.Flags().BoolVar(&asJSON, "json", false, "print refused hosts as JSON lines and ask nothing")
	cmd.AddCommand(allow, deny, rm, ls, logc, blocked, approve)
	return cmd
}

func printRules(rules []string, asJSON bool) error {
	if rules == nil {
		rules = []string{}
	}
	if asJSON {
		return printJSON(map[string]any{"rules": rules})
	}
	if len(rules) == 0 {
		fmt.Println("(nothing is allowed)")
	}
	for _, r := range rules {
		fmt.Println(r)
	}
	return nil
}

func showAudit(cmd *cobra.Command, path string, asJSON, follow bool) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) && !follow {
		return nil
	}
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	print := func(e audit.Event) {
		if asJSON {
			b, _ := json.Marshal(e)
			fmt.Println(string(b))
			return
		}
		what := e.Name
		if e.QType != "" {
			what += " " + e.QType
		}
		detail := e.Rule
		if e.Decision == "deny" || detail == "" {
			detail = e.Reason
		}
		if e.Answer != "" {
			detail = "→ " + e.Answer + "  " + detail
		}
		bytes := ""
		if e.Decision == audit.DecisionSummary {
			detail = e.Reason
		}
		if e.BytesOut+e.BytesIn > 0 {
			bytes = fmt.Sprintf("↑%d ↓%d", e.BytesOut, e.BytesIn)
		}
		fmt.Printf("%s  %-7s %-6s %-32s %-21s %-14s %s\n", e.Time.Local().Format("15:04:05"), e.Kind, e.Decision,
			sanitize(what, false), e.Dest, bytes, sanitize(detail, false))
	}
	if f != nil {
		events, err := readEvents(f)
		if err != nil {
			return err
		}
		for _, e := range events {
			print(e)
		}
	}
	for follow {
		select {
		case <-cmd.Context().Done():
			return nil
		case <-time.After(250 * time.Millisecond):
		}
		if f == nil {
			if f, err = os.Open(path); err != nil {
				continue
			}
		}
		events, err := readEvents(f)
		if err != nil {
			return err
		}
		for _, e := range events {
			print(e)
		}
	}
	return nil
}

// readEvents reads whole lines from f's current position on.
func readEvents(f *os.File) ([]audit.Event, error) {
	pos, _ := f.Seek(0, io.SeekCurrent)
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return nil, err
	}
	// Leave a partial last line for the next read.
	end := len(b)
	for end > 0 && b[end-1] != '\n' {
		end--
	}
	_, _ = f.Seek(pos+int64(end), io.SeekStart)
	var out []audit.Event
	for _, line := range splitLines(b[:end]) {
		var e audit.Event
		if json.Unmarshal(line, &e) == nil {
			out = append(out, e)
		}
	}
	return out, nil
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		out = append(out, b[:i])
		if i < len(b) {
			i++
		}
		b = b[i:]
	}
	return out
}

func portCmd() *cobra.Command {
	var all, asJSON bool
	cmd := &cobra.Command{
		Use:     "port NAME HOSTPORT[:GUESTPORT]",
		Short:   "Forward a host port (127.0.0.1) to a port of a running sandbox",
		Example: "  kosa8 port dev 3000\n  kosa8 port dev 8080:80\n  kosa8 port ls dev",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			pf, err := api.ParsePortForward(args[1], all)
			if err != nil {
				return err
			}
			if err := s.AddPort(cmd.Context(), sdk.Port(pf)); err != nil {
				return err
			}
			switch s.Info().State {
			case sdk.Running, sdk.Starting, sdk.Stopping: // its supervisor forwards it now
				fmt.Println(pf)
			default:
				fmt.Printf("%s (from the next start)\n", pf)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all-interfaces", false, "listen on all host interfaces, not only loopback")
	ls := &cobra.Command{
		Use:   "ls NAME",
		Short: "List port forwards",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			ports, err := s.Ports(cmd.Context()) // never nil: [] in JSON
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ports)
			}
			for _, p := range ports {
				fmt.Println(api.PortForward(p))
			}
			return nil
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm NAME HOSTPORT",
		Short: "Stop forwarding a host port",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := sdkSandbox(args[0])
			if err != nil {
				return err
			}
			p, err := strconv.ParseUint(args[1], 10, 16)
			if err != nil || p == 0 {
				return fmt.Errorf("invalid port %q: a number from 1 to 65535", args[1])
			}
			return s.RemovePort(cmd.Context(), uint16(p))
		},
	}
	cmd.AddCommand(ls, rm)
	return cmd
}

// approveHosts asks about each host the sandbox is refused, once per host.
func approveHosts(cmd *cobra.Command, s *sdk.Sandbox, name string, asJSON bool) error {
	in := bufio.NewReader(cmd.InOrStdin())
	asked := map[string]bool{}
	if !asJSON {
		fmt.Fprintf(os.Stderr, "kosa8: watching what %s is refused (Ctrl-C to end)\n", name)
	}
	err := s.WatchRefused(cmd.Context(), func(b sdk.Blocked) error {
		rule := sanitize(b.Rule, false) // a normalised host: no control characters left anyway
		if asked[rule] {
			return nil
		}
		asked[rule] = true
		if asJSON {
			return json.NewEncoder(os.Stdout).Encode(b) // one object a line
		}
		fmt.Printf("%s was refused %s: allow it? [y/N] ", name, rule)
		line, err := in.ReadString('\n')
		if err != nil && line == "" {
			fmt.Println()
			return io.EOF
		}
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Printf("left refused: %s\n", rule)
			return nil
		}
		rules, err := s.Allow(cmd.Context(), b.Rule)
		if err != nil {
			return fmt.Errorf("allow %s: %w", rule, err)
		}
		fmt.Printf("allowed: %s (%d rules)\n", rule, len(rules))
		return nil
	})
	if errors.Is(err, io.EOF) {
		return nil // the user closed the input: done
	}
	return err
}
