package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
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
running or not.

A name that resolves to a private, shared (CGNAT), documentation or this host's
own address (a registry behind a corporate proxy, split-horizon DNS) is refused
unless pinned: pin:NAME resolves NAME on this machine when the rule is added and
lets the sandbox reach NAME at exactly those addresses from then on, never
another name at them and never where NAME resolves later (DNS rebinding). Add
it again to pin what it resolves to now. 'kosa8 net blocked' names the refused
address and the pin: rule.`,
	}
	var broad, asJSON, follow, security bool
	allow := &cobra.Command{
		Use:     "allow NAME RULE...",
		Short:   "Allow hosts, ports or ranges",
		Example: "  kosa8 net allow dev github.com:22 '*.npmjs.org'\n  kosa8 net allow dev pin:registry.npmjs.org   # it resolves to a private address here",
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
			for _, a := range args[1:] {
				if strings.HasPrefix(a, "pin:") {
					fmt.Fprintf(os.Stderr, "kosa8: %s: the sandbox reaches the name at exactly these addresses, never another name there, whatever it resolves to later\n", pinnedAs(a, rules))
				}
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
		Long: `Remove the rules for each target, as 'kosa8 net ls' lists it: a bare target
(github.com, *.npmjs.org, 10.0.0.0/8) removes its allow rules (plain, read:,
inspect:, pin:), never a deny rule, which goes only when named
(deny:other.example.com): removing an allow must not lift a refusal. With a
port (github.com:22) only that port goes. A target no rule has is an error,
and then nothing is removed.`,
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
			printBlocked(os.Stdout, os.Stderr, args[0], list)
			return nil
		},
	}
	blocked.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var yes []string
	approve := &cobra.Command{
		Use:   "approve NAME",
		Short: "Show each host the sandbox is refused as it happens, and allow it on 'y'",
		Long: `Watch a running sandbox (from a second terminal while the agent works): each
host it is refused is shown as it happens, once, with a question; 'y' allows it
for this sandbox with the rule 'kosa8 net blocked' names (pin:NAME for a name
that resolved to a private or documentation address), anything else leaves it
refused. Ctrl-C ends it. The questions need a terminal; without one:

  --yes HOST...  allow each HOST the sandbox was refused (a host or the rule
                 'net blocked' lists), with its rule, and end; a HOST it was
                 not refused is an error (allow that with 'kosa8 net allow')
  --json         print each refused host as one JSON object a line
                 ({"event":"refused","host","port","rule","address","why",
                 "deny_rule","count","last"}) and read answers from standard
                 input, one JSON object a line: {"rule":RULE,"allow":true}
                 allows a rule it printed (and no other), answered with
                 {"event":"answered","rule":RULE,"allowed":true|false,"error"}.
                 Without answers it only prints.

A host refused by one of your own deny rules is never approved here: 'kosa8 net
rm NAME deny:…' lifts the rule.`,
		Example: "  kosa8 net approve dev\n  kosa8 net approve dev --yes registry.npmjs.org\n  kosa8 net approve dev --json     # for a program: refusals out, answers in",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if len(yes) > 0 && asJSON {
				return errors.New("--yes and --json exclude each other")
			}
			if len(yes) == 0 && !asJSON && !isTerminal(os.Stdin) {
				return fmt.Errorf("kosa8 net approve needs a terminal to ask on, and its input is not one (it would wait for ever): "+
					"'kosa8 net approve %s --yes HOST...' allows hosts %s was refused ('kosa8 net blocked %s' lists them), "+
					"and '--json' prints each refusal as a JSON line and reads answers on standard input", name, name, name)
			}
			if len(yes) > 0 {
				s, err := sdkSandbox(name)
				if err != nil {
					return err
				}
				return approveListed(cmd, s, name, yes)
			}
			sb, err := openSandbox(name)
			if err != nil {
				return err
			}
			if !sb.Alive() {
				return fmt.Errorf("sandbox %s is not running: start it, or see what it was refused with 'kosa8 net blocked %s' (and approve with 'kosa8 net approve %s --yes HOST')", name, name, name)
			}
			s, err := sdkSandbox(name)
			if err != nil {
				return err
			}
			if asJSON {
				return approveJSON(cmd, s)
			}
			return approveHosts(cmd, s, name)
		},
	}
	approve.Flags().BoolVar(&asJSON, "json", false, "print refused hosts as JSON lines and read answers as JSON lines on standard input")
	approve.Flags().StringSliceVarP(&yes, "yes", "y", nil, "allow these hosts the sandbox was refused, without asking, and end")
	cmd.AddCommand(allow, deny, rm, ls, logc, blocked, approve)
	return cmd
}

// printBlocked lists what the sandbox was refused, each with why, then the
// commands that let it all through.
func printBlocked(out, errw io.Writer, name string, list []api.Blocked) {
	if len(list) == 0 {
		fmt.Fprintln(out, "(nothing blocked that the allow-list still refuses)")
		return
	}
	var allow, lift []string
	for _, b := range list {
		// Normalised names, addresses and rules: no shell metacharacters
		// or control characters, sanitized all the same.
		rule := sanitize(b.Rule, false)
		fmt.Fprintf(out, "%-40s %5d×  last %s  %s\n", rule, b.Count, b.Last.Local().Format(time.DateTime), sanitize(b.Why, false))
		if b.DenyRule != "" {
			lift = append(lift, sanitize(b.DenyRule, false))
		} else {
			allow = append(allow, rule)
		}
	}
	if len(allow) > 0 {
		fmt.Fprintf(errw, "allow with: kosa8 net allow %s %s\n", name, strings.Join(allow, " "))
	}
	if len(lift) > 0 {
		fmt.Fprintf(errw, "refused by your deny rules; lift with: kosa8 net rm %s %s\n", name, strings.Join(slices.Compact(lift), " "))
	}
	for _, b := range list {
		if strings.HasPrefix(b.Rule, "pin:") {
			fmt.Fprintf(errw, "(a pin: rule lets the name reach exactly the address it resolves to when you add it, %s now, never another name and never a later answer)\n", sanitize(b.Address, false))
			break
		}
	}
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
func approveHosts(cmd *cobra.Command, s *sdk.Sandbox, name string) error {
	in := bufio.NewReader(cmd.InOrStdin())
	asked := map[string]bool{}
	fmt.Fprintf(os.Stderr, "kosa8: watching what %s is refused (Ctrl-C to end)\n", name)
	err := s.WatchRefused(cmd.Context(), func(b sdk.Blocked) error {
		rule := sanitize(b.Rule, false) // a normalised host: no control characters left anyway
		if asked[rule] {
			return nil
		}
		asked[rule] = true
		if b.DenyRule != "" {
			fmt.Printf("%s was refused %s by your rule %s (lift it with 'kosa8 net rm %s %s')\n", name, sanitize(b.Host, false), sanitize(b.DenyRule, false), name, sanitize(b.DenyRule, false))
			return nil
		}
		q := "allow it? [y/N] "
		if b.Address != "" {
			// An allowed name refused for its address: the pin says so.
			q = fmt.Sprintf("(%s) allow it as %s? [y/N] ", sanitize(b.Why, false), rule)
		} else if rule != b.Host {
			q = "allow it as " + rule + "? [y/N] "
		}
		fmt.Printf("%s was refused %s: %s", name, sanitize(b.Host, false), q)
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
		fmt.Printf("allowed: %s (%d rules)\n", pinnedAs(b.Rule, rules), len(rules))
		return nil
	})
	if errors.Is(err, io.EOF) {
		return nil // the user closed the input: done
	}
	return err
}

// pinnedAs is rule as it now stands among rules: a pin with the
// addresses it was resolved to.
func pinnedAs(rule string, rules []string) string {
	want, err := netpolicy.ParseRule(rule, netpolicy.ParseOptions{})
	if err != nil || !want.Pinned {
		return sanitize(rule, false)
	}
	for _, r := range rules {
		if got, err := netpolicy.ParseRule(r, netpolicy.ParseOptions{AllowBroad: true}); err == nil && got.Pinned && got.Host == want.Host {
			return sanitize(r, false)
		}
	}
	return sanitize(rule, false)
}

// approveListed allows each of hosts (a host or a rule as 'net blocked'
// lists it) that the sandbox was refused, with its rule; a host it was
// not refused, or one its own deny rule refuses, is an error, and then
// nothing is allowed.
func approveListed(cmd *cobra.Command, s *sdk.Sandbox, name string, hosts []string) error {
	list, err := s.Blocked(cmd.Context())
	if err != nil {
		return err
	}
	var rules []string
	for _, h := range hosts {
		want := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(h), "."))
		var found *sdk.Blocked
		for i := range list {
			if list[i].Host == want || list[i].Rule == want {
				found = &list[i]
				break
			}
		}
		switch {
		case found == nil:
			return fmt.Errorf("%s was not refused %s ('kosa8 net blocked %s' lists what it was); to allow it ahead of time: kosa8 net allow %s %s", name, sanitize(h, false), name, name, sanitize(h, false))
		case found.DenyRule != "":
			return fmt.Errorf("%s is refused by your deny rule %s: 'kosa8 net rm %s %s' lifts it", sanitize(found.Host, false), sanitize(found.DenyRule, false), name, sanitize(found.DenyRule, false))
		}
		rules = append(rules, found.Rule)
	}
	now, err := s.Allow(cmd.Context(), rules...)
	if err != nil {
		return err
	}
	for _, r := range rules {
		fmt.Printf("allowed: %s\n", pinnedAs(r, now))
	}
	return nil
}

// refusedLine and answeredLine are the lines of 'net approve --json': a
// refusal (a question), and the outcome of an answer to one.
type refusedLine struct {
	Event string `json:"event"` // refused
	sdk.Blocked
}

type answeredLine struct {
	Event   string `json:"event"` // answered
	Rule    string `json:"rule"`
	Allowed bool   `json:"allowed"`
	Error   string `json:"error,omitempty"`
}

// approveAnswer is what a program writes back, one a line.
type approveAnswer struct {
	Rule  string `json:"rule"`
	Allow bool   `json:"allow"`
}

// approveJSON prints each refusal as a JSON line and allows the rules a
// program answers yes to, among those it printed.
func approveJSON(cmd *cobra.Command, s *sdk.Sandbox) error {
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	offered := map[string]bool{}
	emit := func(l any) error {
		mu.Lock()
		defer mu.Unlock()
		return enc.Encode(l)
	}
	ctx := cmd.Context()
	go func() {
		sc := bufio.NewScanner(cmd.InOrStdin())
		sc.Buffer(make([]byte, 4096), 64<<10)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			var a approveAnswer
			if err := json.Unmarshal([]byte(line), &a); err != nil || a.Rule == "" {
				_ = emit(answeredLine{Event: "answered", Error: `not an answer: want {"rule":RULE,"allow":true}`})
				continue
			}
			mu.Lock()
			ok := offered[a.Rule]
			mu.Unlock()
			out := answeredLine{Event: "answered", Rule: a.Rule}
			switch {
			case !ok:
				out.Error = "not a rule this stream offered"
			case a.Allow:
				if _, err := s.Allow(ctx, a.Rule); err != nil {
					out.Error = err.Error()
				} else {
					out.Allowed = true
				}
			}
			_ = emit(out)
		}
	}()
	return s.WatchRefused(ctx, func(b sdk.Blocked) error {
		mu.Lock()
		seen := offered[b.Rule]
		if b.DenyRule == "" {
			offered[b.Rule] = true
		}
		mu.Unlock()
		if seen {
			return nil
		}
		return emit(refusedLine{Event: "refused", Blocked: b})
	})
}
