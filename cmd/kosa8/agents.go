package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/agent"
	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/image"
	"github.com/kosa8/kosa8/internal/project"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/secrets"
	"github.com/kosa8/kosa8/internal/vmspec"
	"github.com/kosa8/kosa8/sdk"
)

func agentsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "agents",
		Short: "List the agent presets: what each installs, allows, injects and keeps",
		Long: `An agent preset says how a coding agent is installed into its image, which hosts
its API and its updater need, which secrets it uses and how kosa8 injects each,
which folders of its home are kept across runs (its credential files never are),
and the command that starts it. 'kosa8 run NAME' runs it; --agent NAME applies
a preset to any command; [agent] preset = "NAME" in kosa8.toml does so for a
project.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			all, err := agent.All()
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(all)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			for _, p := range all {
				pkg := "npm " + p.Install.NPM
				if p.Install.Pip != "" {
					pkg = "pip " + p.Install.Pip
				}
				fmt.Fprintf(w, "%s\t%s\n", p.Name, p.Description)
				fmt.Fprintf(w, "  install\t%s@%s\n", pkg, p.Install.Version)
				fmt.Fprintf(w, "  allows\t%s\n", strings.Join(p.Rules(), " "))
				for i, s := range p.Secrets {
					label := "  secret"
					if i > 0 {
						label = "  or"
					}
					f := s.Format
					if f == "" {
						f = "{value}"
					}
					fmt.Fprintf(w, "%s\t%s → %s: %s on %s\n", label, s.Name, s.Header, f, strings.Join(s.Hosts, ", "))
				}
				home := func(l []string) string {
					var out []string
					for _, x := range l {
						out = append(out, "~/"+x)
					}
					return strings.Join(out, " ")
				}
				fmt.Fprintf(w, "  keeps\t%s\n", home(p.Home.Keep))
				if len(p.Home.Credentials) > 0 {
					fmt.Fprintf(w, "  never keeps\t%s (credentials: use 'kosa8 secret add')\n", home(p.Home.Credentials))
				}
				fmt.Fprintf(w, "  runs\t%s\n", strings.Join(p.Command, " "))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// agentFlags are the agent and image parts of create and run.
type agentFlags struct {
	name     string
	noHostCA bool

	preset  *agent.Preset
	recipe  image.DerivedRecipe // derived image to use (Empty: the base)
	project string              // the folder whose agent home is kept
	// What the recipe adds, kept to make it again over an OCI image.
	pkgs, setup []string
}

func (a *agentFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&a.name, "agent", "", "an agent preset ('kosa8 agents'): its image, hosts, secrets and kept settings")
	fs.BoolVar(&a.noHostCA, "no-host-ca", false, "do not add the certificate authorities this host trusts to the guest's bundle")
}

// fromArgs turns 'kosa8 run NAME [-- ARGS]' into the preset NAME and its
// command with ARGS appended. 'kosa8 run -- CMD' stays a plain command.
func (a *agentFlags) fromArgs(args []string, dash int) ([]string, error) {
	before := len(args)
	if dash >= 0 {
		before = dash
	}
	if before == 0 {
		if a.name != "" && len(args) == 0 {
			p, err := agent.Get(a.name)
			if err != nil {
				return nil, err
			}
			return slices.Clone(p.Command), nil
		}
		return args, nil
	}
	if before > 1 {
		return nil, fmt.Errorf("'kosa8 run %s': put the command after --, as in 'kosa8 run -- %s'", strings.Join(args[:before], " "), strings.Join(args, " "))
	}
	p, err := agent.Get(args[0])
	if err != nil {
		return nil, fmt.Errorf("%w (or run a command with 'kosa8 run -- %s')", err, args[0])
	}
	if a.name != "" && a.name != p.Name {
		return nil, fmt.Errorf("two agents given: %s and --agent %s", p.Name, a.name)
	}
	a.name = p.Name
	return append(slices.Clone(p.Command), args[1:]...), nil
}

// apply adds the preset's and the project's parts to a sandbox being made:
// network rules, secrets (those stored; a message naming the 'kosa8 secret
// add' line when none is), environment, and the derived image's recipe.
// options adds the agent preset's (--agent, or kosa8.toml's [agent]) rules,
// secrets and environment to o; a preset none of whose keys is stored is
// an error that says how to store one.
func (a *agentFlags) options(m *sandbox.Manager, proj *config.Project, o *project.Options) error {
	o.NoHostCA = a.noHostCA
	if a.name == "" && proj != nil {
		a.name = proj.Agent.Preset
	}
	if a.name == "" {
		return nil
	}
	p, err := agent.Get(a.name)
	if err != nil {
		return err
	}
	a.preset = p
	// The preset's rules first: the user's own (kosa8.toml's, the flags')
	// come after and add to them, or deny what they allow.
	o.PresetAllow = p.Rules()
	store, err := secrets.Open(m.Paths.Config)
	if err != nil {
		return err
	}
	asked := slices.Clone(o.Secrets)
	if proj != nil {
		asked = append(asked, proj.Secrets.Use...)
	}
	var have []string
	for _, s := range p.Secrets {
		if _, err := store.Describe(s.Name); err == nil || slices.Contains(asked, s.Name) {
			have = append(have, s.Name)
		}
	}
	if len(have) == 0 {
		var lines []string
		for _, s := range p.Secrets {
			lines = append(lines, "    "+s.AddCommand())
		}
		either := "this"
		if len(lines) > 1 {
			either = "one of these"
		}
		return fmt.Errorf("%s needs a key, kept on this machine and injected by kosa8 (the sandbox sees a placeholder); store it with %s (the value is read from stdin or a prompt):\n%s",
			p.Name, either, strings.Join(lines, "\n"))
	}
	for _, s := range have {
		if !slices.Contains(o.Secrets, s) {
			o.Secrets = append(o.Secrets, s)
		}
	}
	o.PresetEnv = p.EnvList()
	return nil
}

// recipeFor settles, once the sandbox's settings are known, the derived image
// its preset and kosa8.toml's [image] need (built by image) and the folder
// its kept agent home belongs to.
func (a *agentFlags) recipeFor(m *sandbox.Manager, proj *config.Project, c *sandbox.Config) error {
	var pkgs, setup []string
	if proj != nil {
		pkgs, setup = proj.Image.Packages, proj.Image.Setup
	}
	if c.Docker != nil {
		// The engine comes from Debian: the packages join the recipe, so
		// one image holds the agent, the project's packages and Docker.
		pkgs = append(slices.Clone(pkgs), image.DockerPackages...)
	}
	if a.preset != nil || len(pkgs) > 0 || len(setup) > 0 {
		base, err := baseImage(m, vmspec.Arch(c.Arch))
		if err != nil {
			return err
		}
		label := "project"
		if a.preset != nil {
			label = a.preset.Name
			if len(pkgs)+len(setup) > 0 {
				label += " + project"
			}
		}
		if c.Docker != nil {
			label += " + docker"
			if a.preset == nil && len(pkgs) == len(image.DockerPackages) && len(setup) == 0 {
				label = "docker"
			}
		}
		a.recipe = derivedRecipe(base, a.preset, pkgs, setup, label)
		a.pkgs, a.setup = pkgs, setup
		if err := a.recipe.Validate(); err != nil {
			return fmt.Errorf("kosa8.toml: %w", err)
		}
	}
	// The kept agent home is the current folder's, as it always was (the
	// key of its archive must not change under a user's feet).
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	a.project = wd
	return nil
}

// image returns the image a sandbox of cfg starts from: the base, or the
// derived image for the preset and the project, built on first use.
func (a *agentFlags) image(ctx context.Context, m *sandbox.Manager, cfg sandbox.Config) (*image.Image, error) {
	base, err := baseImage(m, vmspec.Arch(cfg.Arch))
	if err != nil {
		return nil, err
	}
	if a.recipe.Empty() {
		return base, nil
	}
	return ensureDerived(ctx, m, base, a.recipe)
}

// Agent home: the preset's settings folders are kept per project on the
// host as one archive, restored into the guest when a run starts and saved
// when it ends. The host only ever writes that one file (never unpacks it),
// so no name or link the agent plants can reach a host path; credential
// files are dropped on the way out.

// maxHomeArchive bounds a kept agent home.
const maxHomeArchive = 256 << 20

func (a *agentFlags) homeArchive(m *sandbox.Manager) string {
	h := sha256.Sum256([]byte(a.project))
	return filepath.Join(m.Paths.Home, "agent-homes", hex.EncodeToString(h[:8])+"-"+a.preset.Name+".tar")
}

// prepareHome restores the kept home into the guest and writes the
// network note where the agent reads its standing instructions.
func (a *agentFlags) prepareHome(ctx context.Context, m *sandbox.Manager, sb *sandbox.Sandbox, user string) error {
	if a.preset == nil {
		return nil
	}
	p := a.preset
	if f, err := os.Open(a.homeArchive(m)); err == nil {
		code, err := execStdin(ctx, sb, []string{"/bin/sh", "-c", "cd ~ && exec tar -x --no-same-owner --no-overwrite-dir -f -"}, user, f)
		f.Close()
		if err != nil || code != 0 {
			fmt.Fprintf(os.Stderr, "kosa8: could not restore %s's kept settings (%v, status %d): starting without them\n", p.Name, err, code)
		}
	}
	if p.Home.Memory == "" {
		return nil
	}
	// The note goes in once: the user may edit the file, and it is kept.
	script := `f="$HOME/$1"; mkdir -p "$(dirname "$f")"; grep -qs 'kosa8 sandbox' "$f" || { [ -s "$f" ] && echo; cat /etc/kosa8/network.md; } >> "$f"`
	code, err := execStdin(ctx, sb, []string{"/bin/sh", "-c", script, "sh", p.Home.Memory}, user, nil)
	if err != nil || code != 0 {
		return fmt.Errorf("write the network note into ~/%s: status %d: %v", p.Home.Memory, code, err)
	}
	return nil
}

// saveHomeScript lists, in the guest and as the sandbox's user, what of the
// kept paths ($@) can be kept, and streams it as one tar. A file the user
// cannot read (a root-owned one, a hard link to /etc/shadow) or one over
// the limit ($1 bytes: a sparse file reads as its whole size) is left out
// and named on stderr ("kosa8-skip\tWHY\tPATH"), and the rest goes on:
// one such file used to fail the whole save. Hard links are stored as
// files (the host keeps no link of that kind). Nothing here is trusted:
// the host bounds and filters whatever comes out (filterHome).
const saveHomeScript = `cd ~ || exit 0
max=$1; shift
for k in "$@"; do
  [ -e "$k" ] || [ -L "$k" ] || continue
  find "$k" \( -type f \( \( ! -readable -fprintf /dev/stderr 'kosa8-skip\tunreadable\t%p\n' \) -o \( -size +"$max"c -fprintf /dev/stderr 'kosa8-skip\t%s bytes\t%p\n' \) -o -print0 \) \) -o \( -type d ! \( -readable -executable \) -fprintf /dev/stderr 'kosa8-skip\tunreadable folder\t%p\n' -prune \) -o \( \( -type d -o -type l \) -print0 \)
done | tar -c --null --no-recursion --ignore-failed-read --hard-dereference -T - -f -`

// maxHomeStream bounds what is read of the guest's stream: the files kept
// (maxHomeArchive), plus what a hostile guest sends that is skipped.
const maxHomeStream = 2 * maxHomeArchive

// saveHome streams the kept folders out of the guest into the host archive,
// without the agent's credential files: into a file as they arrive, so the
// host's memory stays bounded whatever the guest sends. What cannot be read
// or is too large is skipped (said in one line) and the rest kept. When the
// stream fails, the archive kept before stays.
func (a *agentFlags) saveHome(ctx context.Context, m *sandbox.Manager, sb *sandbox.Sandbox, user string) error {
	if a.preset == nil {
		return nil
	}
	p := a.preset
	dst := a.homeArchive(m)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("save %s's settings: %w", p.Name, err)
	}
	defer os.Remove(tmp) // renamed over dst when the save is whole
	args := append([]string{"/bin/sh", "-c", saveHomeScript, "sh", fmt.Sprint(maxHomeArchive)}, p.Home.Keep...)
	pr, pw := io.Pipe()
	var res homeResult
	var ferr error
	filtered := make(chan struct{})
	go func() {
		defer close(filtered)
		res, ferr = filterHome(p, pr, f)
		// Whatever follows the end of the archive (tar's padding, or
		// more from a hostile guest) is read and dropped, so the guest's
		// side never blocks; the producer's limit bounds it.
		_, _ = io.Copy(io.Discard, pr)
	}()
	var stderr bytes.Buffer
	code, err := execCapture(ctx, sb, args, user, &limitWriter{w: pw, n: maxHomeStream, err: fmt.Errorf("the sandbox sent more than %d MiB", maxHomeStream>>20)}, &limitWriter{w: &stderr, n: 64 << 10})
	pw.Close()
	<-filtered
	cerr := f.Close()
	res.skipped = append(res.skipped, guestSkips(stderr.String())...)
	adviseCredentials(os.Stderr, p, res.held, secretStored)
	keep := ferr == nil && err == nil && cerr == nil && (code == 0 || code == 1) // tar: 1 is "a file changed as it was read"
	if !keep {
		why := ferr
		switch {
		case err != nil:
			why = err
		case why == nil && cerr != nil:
			why = cerr
		case why == nil:
			why = fmt.Errorf("the archiver in the sandbox exited with status %d: %s", code, sanitize(lastLines(stderr.String(), 2), false))
		}
		return fmt.Errorf("%s's settings from this run were not kept (%v); those kept before stay (%s)", p.Name, why, dst)
	}
	if line := skippedLine(p, res.skipped); line != "" {
		fmt.Fprintln(os.Stderr, "kosa8: "+line)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("save %s's settings: %w", p.Name, err)
	}
	return nil
}

// homeResult is what filterHome left out: credential files, and files
// skipped (too large for what is left of the limit).
type homeResult struct {
	held    []string
	skipped []homeSkip
}

// homeSkip is a file not kept, and why (in a few words).
type homeSkip struct{ name, why string }

// maxSkipsNamed bounds the files a save names (the rest are counted).
const maxSkipsNamed = 8

// guestSkips reads the files the guest's script left out from its stderr
// ("kosa8-skip\tWHY\tPATH" lines; bounded by the caller). The guest may
// lie here: the text is only shown, cleaned, and capped.
func guestSkips(stderr string) []homeSkip {
	var out []homeSkip
	for _, l := range strings.Split(stderr, "\n") {
		f := strings.SplitN(l, "\t", 3)
		if len(f) != 3 || f[0] != "kosa8-skip" || len(out) >= 1000 {
			continue
		}
		why := f[1]
		if n, ok := strings.CutSuffix(why, " bytes"); ok {
			if v, err := strconv.ParseInt(n, 10, 64); err == nil {
				why = humanBytes(v) + ", over the limit"
			}
		}
		out = append(out, homeSkip{name: strings.TrimPrefix(f[2], "./"), why: why})
	}
	return out
}

// skippedLine is the one line that says which files were not kept and
// what to do about them; "" when none were.
func skippedLine(p *agent.Preset, skipped []homeSkip) string {
	if len(skipped) == 0 {
		return ""
	}
	var names []string
	for i, s := range skipped {
		if i == maxSkipsNamed {
			names = append(names, fmt.Sprintf("and %d more", len(skipped)-i))
			break
		}
		name := []rune(sanitize(s.name, false))
		if len(name) > 120 {
			name = append(name[:117], []rune("...")...)
		}
		names = append(names, fmt.Sprintf("~/%s (%s)", string(name), sanitize(s.why, false)))
	}
	return fmt.Sprintf("kept %s's settings except %s: %s. To keep a file, make it readable by the sandbox's user and smaller than %d MiB; to silence this, move it out of %s",
		p.Name, plural(len(skipped), "file"), strings.Join(names, ", "), maxHomeArchive>>20, "~/"+strings.Join(p.Home.Keep, ", ~/"))
}

// filterHome copies a tar stream from the guest, keeping only directories,
// regular files and links under the preset's kept paths, never a
// credential file. It writes at most maxHomeArchive bytes: a file that
// does not fit in what is left (a sparse file of a few KiB in the stream
// reads as its whole size) is skipped, and the rest goes on. It returns
// the credential files it dropped and the files it skipped.
func filterHome(p *agent.Preset, in io.Reader, out io.Writer) (homeResult, error) {
	var res homeResult
	tr := tar.NewReader(in)
	lw := &limitWriter{w: out, n: maxHomeArchive}
	tw := tar.NewWriter(lw)
	const trailer = 2 << 10 // the end-of-archive blocks tw.Close writes
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, fmt.Errorf("the sandbox's archive of them is broken: %w", err)
		}
		name := strings.TrimPrefix(path.Clean(strings.TrimPrefix(h.Name, "./")), "/")
		if name == "." || strings.HasPrefix(name, "../") || name == ".." || !p.Keeps(name) {
			continue
		}
		if p.IsCredential(name) {
			if len(res.held) < maxSkipsNamed {
				res.held = append(res.held, name)
			}
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir, tar.TypeReg, tar.TypeSymlink:
		default:
			continue
		}
		hdr := &tar.Header{Name: name, Typeflag: h.Typeflag, Mode: h.Mode & 0o777, Size: h.Size, ModTime: h.ModTime, Linkname: h.Linkname}
		if h.Typeflag != tar.TypeReg {
			hdr.Size = 0
		}
		// A header and its padded data must fit, with the trailer after.
		if need := 512 + (hdr.Size+511)/512*512 + 512 + trailer; need > lw.n || len(name) > 4096 || len(h.Linkname) > 4096 {
			if len(res.skipped) < 1000 {
				res.skipped = append(res.skipped, homeSkip{name, humanBytes(h.Size) + ", over what is left of the " + fmt.Sprint(maxHomeArchive>>20) + " MiB limit"})
			}
			continue // Next skips its data (for a sparse file, only what the stream holds)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return res, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return res, fmt.Errorf("the sandbox's archive of them is broken: %w", err)
			}
		}
	}
	return res, tw.Close()
}

// limitWriter passes at most n bytes to w, then fails with err.
type limitWriter struct {
	w   io.Writer
	n   int64
	err error // nil: errHomeTooLarge
}

var errHomeTooLarge = fmt.Errorf("agent home larger than %d MiB: not kept", maxHomeArchive>>20)

func (l *limitWriter) Write(b []byte) (int, error) {
	if int64(len(b)) > l.n {
		if l.err != nil {
			return 0, l.err
		}
		return 0, errHomeTooLarge
	}
	l.n -= int64(len(b))
	return l.w.Write(b)
}

// execStdin runs argv in the sandbox with stdin from r (nil: none) and its
// output to this process's stderr.
func execStdin(ctx context.Context, sb *sandbox.Sandbox, argv []string, user string, r io.Reader) (int, error) {
	return execWith(ctx, sb, sdk.Cmd{Args: argv, User: user, Stdin: r, Stdout: os.Stderr, Stderr: os.Stderr})
}
