package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/sdk"
)

// reachWorkspace opens a sandbox's workspace for a command that needs the
// guest's side of it (diff, apply, discard, approve, held): the pending
// changes of a review sandbox live on its disk, and these commands must
// work on one that 'run --rm --review' kept, stopped, for them.
//
// A sandbox that is not running is brought up for the command: a paused
// one resumes (about a second under TCG), a stopped one boots (10-20 s
// under TCG, with its phases shown). When the command is done (done):
//   - nothing left to review: it is stopped, and one made with --rm is
//     removed with it (--rm takes effect once every change is applied or
//     discarded);
//   - changes left: it is paused, not stopped, so that the next review
//     command resumes it instead of booting it again: one boot per review
//     session, not one per command. A paused sandbox holds no memory.
//
// A running sandbox is left running.
func reachWorkspace(ctx context.Context, name string) (s *sdk.Sandbox, done func(), err error) {
	sb, err := openSandbox(name)
	if err != nil {
		return nil, nil, err
	}
	if sb.Config.Workspace == nil {
		return nil, nil, fmt.Errorf("sandbox %s has no workspace", name)
	}
	if s, err = sdkSandbox(name); err != nil {
		return nil, nil, err
	}
	if sb.Alive() {
		return s, func() {}, nil
	}
	restore := ""
	if st := sb.Status(); st.State == api.Paused {
		restore = st.Checkpoint
		fmt.Fprintf(os.Stderr, "kosa8: resuming %s to reach its workspace\n", name)
	} else {
		fmt.Fprintf(os.Stderr, "kosa8: starting %s to reach its workspace (paused after, while changes are left to review)\n", name)
	}
	if _, err := startSandboxFrom(ctx, sb, false, restore, false); err != nil {
		return nil, nil, fmt.Errorf("start %s to reach its workspace: %w", name, err)
	}
	return s, func() { endReview(sb, s) }, nil
}

// endReview puts a sandbox that reachWorkspace brought up back to rest:
// stopped (removed, with --rm) when nothing is left to review, else paused.
func endReview(sb *sandbox.Sandbox, s *sdk.Sandbox) {
	name := sb.Config.Name
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	left := -1
	if st, err := s.SyncStatus(ctx, false); err == nil {
		left = len(st.Pending) + len(st.Held)
	}
	if left > 0 {
		done := slowWait("pausing " + name + " for the next review command")
		err := s.Pause(ctx)
		done()
		if err == nil {
			fmt.Fprintf(os.Stderr, "kosa8: %s left to review in %s: paused (the next diff, apply or discard resumes it)\n", plural(left, "change"), name)
			return
		}
		fmt.Fprintf(os.Stderr, "kosa8: pause %s: %v; stopping it\n", name, supervisorErr(err))
	}
	ephemeral := sb.Config.Ephemeral
	if err := stopSandbox(ctx, sb, false); err != nil {
		fmt.Fprintf(os.Stderr, "kosa8: stop %s again: %v\n", name, err)
		return
	}
	switch {
	case left == 0 && ephemeral:
		fmt.Fprintf(os.Stderr, "kosa8: nothing left to review in %s: removed (--rm)\n", name)
	case left == 0:
		fmt.Fprintf(os.Stderr, "kosa8: nothing left to review in %s: stopped\n", name)
	}
}

// changeView is a pending or held change as --json shows it: the entry's
// type in words, not wsync's byte.
type changeView struct {
	Path string `json:"path"`
	Kind string `json:"kind"`           // added, modified, deleted
	Why  string `json:"why,omitempty"`  // held: the reason
	Type string `json:"type,omitempty"` // file, dir, link (the sandbox's side; none when deleted)
	Size int64  `json:"size,omitempty"`
	Link string `json:"link,omitempty"` // a link's target
}

func viewChanges(cs []sdk.SyncChange) []changeView {
	out := make([]changeView, 0, len(cs))
	for _, c := range cs {
		v := changeView{Path: c.Path, Kind: c.Kind, Why: c.Why, Type: c.Type, Size: c.Size, Link: c.Link}
		if c.Why == "review" {
			v.Why = ""
		}
		out = append(out, v)
	}
	return out
}

// syncView is sync status --json.
type syncView struct {
	Path      string             `json:"path"`
	Files     int                `json:"files"`
	LastSync  time.Time          `json:"last_sync"`
	Pending   []changeView       `json:"pending"`
	Held      []changeView       `json:"held"`
	Conflicts []sdk.SyncConflict `json:"conflicts"`
	Skipped   []string           `json:"skipped"`
	Errors    []string           `json:"errors"`
	Quota     sdk.SyncQuota      `json:"quota"`
}

func printSyncStatus(name string, st *sdk.SyncStatus, asJSON bool) error {
	if asJSON {
		v := syncView{Path: st.Path, Files: st.Files, LastSync: st.LastSync, Pending: viewChanges(st.Pending), Held: viewChanges(st.Held),
			Conflicts: st.Conflicts, Skipped: st.Skipped, Errors: st.Errors, Quota: st.Quota}
		if v.Conflicts == nil {
			v.Conflicts = []sdk.SyncConflict{}
		}
		if v.Skipped == nil {
			v.Skipped = []string{}
		}
		if v.Errors == nil {
			v.Errors = []string{}
		}
		return printJSON(v)
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
			fmt.Printf("  %s\n", l)
		}
	}
	var pending, held, conflicts []string
	for _, c := range st.Pending {
		pending = append(pending, fmt.Sprintf("%-8s %s", c.Kind, c.Path))
	}
	for _, c := range st.Held {
		line := fmt.Sprintf("%-8s %s  (%s)", c.Kind, c.Path, c.Why)
		if c.Type == "link" {
			line = fmt.Sprintf("%-8s %s -> %s  (%s)", c.Kind, c.Path, c.Link, c.Why)
		}
		held = append(held, line)
	}
	for _, c := range st.Conflicts {
		conflicts = append(conflicts, fmt.Sprintf("%s: the sandbox's version is in %s", c.Path, c.Copy))
	}
	section("waiting for review ('kosa8 apply')", pending)
	section("held for approval ('kosa8 approve "+name+" PATH')", held)
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
			Use:               use,
			Short:             short,
			Args:              cobra.ExactArgs(1),
			ValidArgsFunction: completeSandboxes,
			RunE: func(cmd *cobra.Command, args []string) error {
				s, done, err := reachWorkspace(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				defer done()
				st, err := s.SyncStatus(cmd.Context(), full)
				if err != nil {
					return err
				}
				return printSyncStatus(args[0], st, asJSON)
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
		Long: `List the sandbox's changes to files that host tools run or obey (.envrc,
kosa8.toml, editor and agent settings, git hooks and config, ...): they are not
written to the host folder until 'kosa8 approve NAME PATH'. 'kosa8 diff NAME PATH'
shows one; 'kosa8 discard NAME PATH' undoes it inside the sandbox.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, done, err := reachWorkspace(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer done()
			st, err := s.SyncStatus(cmd.Context(), false)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(viewChanges(st.Held))
			}
			printHeld(os.Stdout, args[0], st.Held)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printHeld lists held changes, or says there are none.
func printHeld(w io.Writer, name string, held []sdk.SyncChange) {
	if len(held) == 0 {
		fmt.Fprintf(w, "(nothing held for approval in %s)\n", name)
	}
	for _, c := range viewChanges(held) {
		what := c.Path
		if c.Type == "link" {
			what += " -> " + c.Link
		}
		fmt.Fprintf(w, "%-8s %-4s %s  (%s)\n", c.Kind, c.Type, sanitize(what, false), sanitize(c.Why, false))
	}
}

func changeCmd(use, short, long, what string, needPaths bool) *cobra.Command {
	var yes, rmOthers bool
	var expect string
	cmd := &cobra.Command{
		Use:               use,
		Short:             short,
		Long:              long,
		Args:              cobra.MinimumNArgs(map[bool]int{true: 2, false: 1}[needPaths]),
		ValidArgsFunction: completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, done, err := reachWorkspace(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer done()
			if what == "approve" {
				// The user approves what they have seen: each file's diff first.
				st, err := s.SyncStatus(cmd.Context(), false)
				if err != nil {
					return err
				}
				shown, err := showChanges(cmd.Context(), s, st, args[1:], true, false)
				if err != nil {
					return err
				}
				if !yes && isTerminal(os.Stdin) && !confirm(fmt.Sprintf("write %s to %s?", plural(len(args)-1, "held change"), st.Path)) {
					return errors.New("nothing approved")
				}
				// Exactly the versions shown: one the sandbox changed since
				// is refused, not written.
				changed, err := s.ApproveShown(cmd.Context(), shown...)
				if err != nil {
					return err
				}
				for _, p := range changed {
					fmt.Println(p)
				}
				return nil
			}
			if expect != "" {
				return applyExpected(cmd.Context(), s, args[1:], expect, rmOthers)
			}
			change := s.ApplyChanges
			switch what {
			case "approve":
				change = s.ApproveChanges
			case "discard":
				change = s.DiscardChanges
			}
			if rmOthers && s.Origin() == nil {
				return fmt.Errorf("--rm removes the other forks once one is applied: %s is not a fork", args[0])
			}
			changed, err := change(cmd.Context(), args[1:]...)
			if err != nil {
				return err
			}
			for _, p := range changed {
				fmt.Println(p)
			}
			if rmOthers {
				return removeSiblings(cmd.Context(), s)
			}
			return nil
		},
	}
	if what == "approve" {
		cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask after showing the diff")
	}
	if what == "apply" {
		cmd.Flags().BoolVar(&rmOthers, "rm", false, "for a fork: then remove the other forks of its source (their changes with them)")
		cmd.Flags().StringVar(&expect, "expect", "", "apply only if the changes are still those 'kosa8 diff' showed with this token, each as shown")
	}
	return cmd
}

// changesToken names a set of changes as they were listed (path, kind,
// type, content hash, mode, link): 'kosa8 diff' prints it, and
// 'apply --expect' applies only while the changes are still those.
func changesToken(cs []sdk.SyncChange) string {
	sorted := slices.Clone(cs)
	slices.SortFunc(sorted, func(a, b sdk.SyncChange) int { return strings.Compare(a.Path, b.Path) })
	h := sha256.New()
	for _, c := range sorted {
		fmt.Fprintf(h, "%q %q %q %q %o %q\n", c.Path, c.Kind, c.Type, c.Hash, uint32(c.Mode), c.Link)
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// applyExpected applies the changes waiting for review (those at paths,
// or all) only if they are still those a diff showed as token, and each
// only as it was then.
func applyExpected(ctx context.Context, s *sdk.Sandbox, paths []string, token string, rmOthers bool) error {
	if rmOthers && s.Origin() == nil {
		return fmt.Errorf("--rm removes the other forks once one is applied: %s is not a fork", s.Name())
	}
	st, err := s.SyncStatus(ctx, false)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, p := range paths {
		want[filepath.Clean(p)] = true
	}
	var sel []sdk.SyncChange
	for _, c := range st.Pending {
		if len(want) == 0 || want[c.Path] {
			sel = append(sel, c)
		}
	}
	if len(sel) == 0 || changesToken(sel) != token {
		return fmt.Errorf("the changes waiting for review in %s are not those the diff showed (%s): nothing applied; run 'kosa8 diff %s' again", s.Name(), sanitize(token, false), s.Name())
	}
	changed, err := s.ApplyShown(ctx, sel...)
	if err != nil {
		return err
	}
	for _, p := range changed {
		fmt.Println(p)
	}
	if rmOthers {
		return removeSiblings(ctx, s)
	}
	return nil
}

// removeSiblings removes the other forks of fork's source, running or not,
// their unapplied changes with them: the user chose this one.
func removeSiblings(ctx context.Context, fork *sdk.Sandbox) error {
	c, err := sdk.New()
	if err != nil {
		return err
	}
	forks, err := c.Forks(ctx, fork.Origin().Source)
	if err != nil {
		return err
	}
	for _, f := range forks {
		if f.Name == fork.Name() {
			continue
		}
		if err := c.Remove(ctx, f.Name, true); err != nil {
			return fmt.Errorf("remove %s: %w", f.Name, err)
		}
		fmt.Fprintf(os.Stderr, "kosa8: removed %s\n", f.Name)
	}
	return nil
}

// confirm asks a yes/no question on the terminal; no is the default.
func confirm(q string) bool {
	fmt.Fprintf(os.Stderr, "%s [y/N] ", q)
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes"
}

func diffCmd() *cobra.Command {
	var stat bool
	cmd := &cobra.Command{
		Use:   "diff NAME [PATH...] | diff NAME OTHER",
		Short: "Show the sandbox's changes waiting for review or approval (or two sandboxes' against each other)",
		Long: `Show the sandbox's changes that have not reached the host folder: those waiting
for review (--review: 'kosa8 apply') and held files ('kosa8 approve'), as unified
diffs of the host's version against the sandbox's. A sandbox not running is
started (a paused one resumed) and paused again after, or stopped (removed, with
--rm) once nothing is left to review.

'kosa8 diff NAME OTHER', where OTHER is a sandbox of the same folder (two forks of
one sandbox, say), shows their changes against each other: each path either changed,
NAME's version against OTHER's (a path one left alone is the host's version there).
A file in the workspace named like a sandbox is given as ./NAME.`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 && !strings.ContainsAny(args[1], "/") {
				if other, err := openSandbox(args[1]); err == nil {
					return diffSandboxes(cmd.Context(), args[0], other.Config.Name, stat)
				}
			}
			s, done, err := reachWorkspace(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer done()
			st, err := s.SyncStatus(cmd.Context(), false)
			if err != nil {
				return err
			}
			shown, err := showChanges(cmd.Context(), s, st, args[1:], false, stat)
			if err != nil {
				return err
			}
			// What was shown of the changes waiting for review, as a token
			// 'apply --expect' checks: the sandbox may change a file after
			// its diff was read, and apply would write that version.
			pending := map[string]bool{}
			for _, c := range st.Pending {
				pending[c.Path] = true
			}
			var review []sdk.SyncChange
			for _, c := range shown {
				if !pending[c.Path] {
					continue
				}
				if c.Type == "other" {
					fmt.Fprintf(os.Stderr, "kosa8: %s changed in %s while it was shown: run diff again before applying\n", c.Path, s.Name())
					return nil
				}
				review = append(review, c)
			}
			if len(review) > 0 {
				fmt.Fprintf(os.Stderr, "kosa8: to apply exactly what is shown: kosa8 apply %s --expect %s%s\n",
					s.Name(), changesToken(review), strings.Join(append([]string{""}, args[1:]...), " "))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&stat, "stat", false, "list paths only")
	return cmd
}

// showChanges prints the pending and held changes (only those at paths,
// when given; then each must be one), with their diffs unless stat, and
// returns those shown. For held ones (heldOnly: what approve shows), a
// file whose content read for its diff is not the version the status
// lists fails the whole: the user approves what they saw, or nothing.
func showChanges(ctx context.Context, s *sdk.Sandbox, st *sdk.SyncStatus, paths []string, heldOnly, stat bool) ([]sdk.SyncChange, error) {
	want := map[string]bool{}
	for _, p := range paths {
		want[filepath.Clean(p)] = true
	}
	all := st.Held
	if !heldOnly {
		all = append(append([]sdk.SyncChange(nil), st.Pending...), st.Held...)
	}
	seen := map[string]bool{}
	var shown []sdk.SyncChange
	for _, c := range all {
		if len(want) > 0 && !want[c.Path] {
			continue
		}
		seen[c.Path] = true
		shown = append(shown, c)
		note := ""
		if c.Why != "" && c.Why != "review" {
			note = "  (held: " + c.Why + ")"
		}
		fmt.Printf("%s %s%s\n", strings.ToUpper(c.Kind[:1]), c.Path, note)
		if stat || c.Type == "" { // deleted in the sandbox
			continue
		}
		switch {
		case c.Type == "link":
			fmt.Printf("  link -> %s\n", c.Link)
		case c.Type != "file":
		case c.Size > maxDiffBytes:
			fmt.Printf("  (%s: too large to show)\n", humanBytes(c.Size))
		default:
			sum, err := showDiff(ctx, s, st.Path, c.Path)
			if err != nil {
				fmt.Fprintf(os.Stderr, "  (no diff: %v)\n", err)
			}
			if err != nil || sum != c.Hash {
				if heldOnly {
					return nil, fmt.Errorf("%s changed in %s while it was shown: nothing approved; run approve again to see it as it is now", c.Path, s.Name())
				}
				// Not the version listed: no token covers it (diffCmd).
				shown[len(shown)-1].Hash = ""
				shown[len(shown)-1].Type = "other"
			}
		}
	}
	for p := range want {
		if !seen[p] {
			what := "neither pending nor held"
			if heldOnly {
				what = "not held"
			}
			return nil, fmt.Errorf("%s is %s in %s ('kosa8 sync status %s' lists the changes)", p, what, s.Name(), s.Name())
		}
	}
	return shown, nil
}

// showDiff prints a unified diff of the host's and the guest's version.
// The sandbox's copy is read up to maxDiffBytes (larger files are not
// shown, see showChanges): the guest may have replaced the file it listed
// with an endless one since, which would otherwise fill kosa8's memory.
// It returns the SHA-256 (hex) of the sandbox's copy it showed.
func showDiff(ctx context.Context, s *sdk.Sandbox, root, rel string) (string, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	guestCopy := &boundedBuffer{max: maxDiffBytes, over: cancel}
	if _, err := s.Exec(cctx, sdk.Cmd{Args: []string{"cat", "--", filepath.Join(root, rel)}, Stdout: guestCopy}); err != nil && !guestCopy.full {
		return "", err
	}
	if guestCopy.full {
		return "", fmt.Errorf("the sandbox's copy is now larger than %s", humanBytes(maxDiffBytes))
	}
	sum := sha256.Sum256(guestCopy.Bytes())
	// The host's version is read here, never through a link on its way
	// (a link of the user's folder would lead diff to a file outside it).
	older, err := hostVersion(root, rel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "  (the host's version is not shown: %v)\n", err)
		older = nil
	}
	host, err := writeTemp(string(older))
	if err != nil {
		return "", err
	}
	defer os.Remove(host)
	tmp, err := writeTemp(guestCopy.String())
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	out, _ := exec.CommandContext(ctx, "diff", "-u", "--label", "host/"+rel, "--label", "sandbox/"+rel, host, tmp).Output()
	os.Stdout.Write(out)
	return hex.EncodeToString(sum[:]), nil
}

// maxDiffBytes is the largest sandbox copy of a file a diff shows.
const maxDiffBytes = 1 << 20

// boundedBuffer keeps up to max bytes; past that it keeps nothing more,
// records full and calls over (which ends the command writing).
type boundedBuffer struct {
	bytes.Buffer
	max  int
	full bool
	over func()
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.full || b.Len()+len(p) > b.max {
		if !b.full {
			b.full = true
			b.over()
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}
