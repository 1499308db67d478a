package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/secrets"
)

func openSecrets() (*secrets.Store, error) {
	m, err := manager()
	if err != nil {
		return nil, err
	}
	return secrets.Open(m.Paths.Config)
}

// readSecretValue reads a value from stdin: a prompt without echo on a
// terminal, else everything piped in (one trailing newline dropped). Never
// from argv, where other users and shell history would see it.
func readSecretValue(name string) ([]byte, error) {
	if isTerminal(os.Stdin) {
		fmt.Fprintf(os.Stderr, "value for %s (input hidden): ", name)
		v, err := term.ReadPassword(int(os.Stdin.Fd()))
		fmt.Fprintln(os.Stderr)
		return v, err
	}
	v, err := io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
	if err != nil {
		return nil, err
	}
	v = bytes.TrimSuffix(v, []byte("\n"))
	v = bytes.TrimSuffix(v, []byte("\r"))
	return v, nil
}

func secretCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Keep API keys on the host; sandboxes get placeholders",
		Long: `A secret's value stays on the host (the OS keyring, or a 0600 file). A sandbox
bound to it (--secret NAME) sees an environment variable with a placeholder; kosa8's
broker puts the real value into the secret's header on HTTPS requests to the secret's
hosts, refuses the placeholder anywhere else, and masks the value in responses.

Signed credentials (AWS SigV4 and the like) cannot be injected this way: the
signature covers the request and needs the key inside.`,
	}
	var hosts []string
	var header, format string
	var replace, asJSON bool
	add := &cobra.Command{
		Use:   "add NAME --host HOST [--host HOST…] [--header H] [--format F]",
		Short: "Store a secret; its value is read from stdin or a prompt, never from arguments",
		Example: `  kosa8 secret add ANTHROPIC_API_KEY --host api.anthropic.com --header x-api-key
  kosa8 secret add GITHUB_TOKEN --host api.github.com --host github.com --format 'Bearer {value}'
  kosa8 secret add GIT_PUSH --host github.com --format basic:x-access-token < token.txt`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := openSecrets()
			if err != nil {
				return err
			}
			sec := secrets.Secret{Name: args[0], Hosts: hosts, Header: header, Format: format}
			for _, h := range hosts {
				// A key may only go to hosts named narrowly: no flag widens that.
				if _, err := netpolicy.ParseRule(h, netpolicy.ParseOptions{}); errors.Is(err, netpolicy.ErrBroad) {
					return fmt.Errorf("secret %s: --host %s matches a whole public suffix or everything: name the hosts the key is for", sec.Name, h)
				}
			}
			if err := sec.Validate(); err != nil {
				return err
			}
			// Say so before asking for a value that would be refused.
			if _, err := store.Describe(sec.Name); err == nil && !replace {
				return fmt.Errorf("%w: %s (use --replace to change it, or 'kosa8 secret rm %s')", secrets.ErrExists, sec.Name, sec.Name)
			}
			v, err := readSecretValue(sec.Name)
			if err != nil {
				return err
			}
			if err := store.Add(sec, v, replace); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "stored %s in the %s; it may go to %s in %s\n", sec.Name, store.Backend(), strings.Join(sec.Hosts, ", "), sec.Header)
			return nil
		},
	}
	add.Flags().StringArrayVar(&hosts, "host", nil, "a host the secret may be sent to (repeatable; *.domain for subdomains)")
	add.Flags().StringVar(&header, "header", "Authorization", "the request header that carries it")
	add.Flags().StringVar(&format, "format", "{value}", "the header's value: '{value}', 'Bearer {value}', basic:USER for HTTP Basic (git over HTTPS), or registry:USER for a container registry's login (--docker)")
	add.Flags().BoolVar(&replace, "replace", false, "replace a secret of the same name")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List secrets (never their values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := openSecrets()
			if err != nil {
				return err
			}
			list, err := store.List()
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []secrets.Secret{}
				}
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOSTS\tHEADER\tFORMAT")
			for _, s := range list {
				f := s.Format
				if strings.HasPrefix(f, "basic:") {
					f = "basic (user " + strings.TrimPrefix(f, "basic:") + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, strings.Join(s.Hosts, ","), s.Header, f)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Delete secrets",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := openSecrets()
			if err != nil {
				return err
			}
			for _, n := range args {
				if err := store.Remove(n); err != nil {
					return err
				}
				fmt.Println(n)
			}
			return nil
		},
	}
	cmd.AddCommand(add, ls, rm)
	return cmd
}
