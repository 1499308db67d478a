package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kosa8/kosa8/internal/wsync"
	"github.com/kosa8/kosa8/sdk"
)

// diffSandboxes shows two sandboxes' changes to one folder against each
// other (two forks' attempts): for each path either changed, a's version
// against b's, where a sandbox that left a path alone has the host's.
func diffSandboxes(ctx context.Context, a, b string, stat bool) error {
	sa, doneA, err := reachWorkspace(ctx, a)
	if err != nil {
		return err
	}
	defer doneA()
	sb, doneB, err := reachWorkspace(ctx, b)
	if err != nil {
		return err
	}
	defer doneB()
	stA, err := sa.SyncStatus(ctx, false)
	if err != nil {
		return err
	}
	stB, err := sb.SyncStatus(ctx, false)
	if err != nil {
		return err
	}
	if stA.Path != stB.Path {
		return fmt.Errorf("%s works in %s and %s in %s: only sandboxes of one folder compare ('kosa8 diff %s' shows one's changes)", a, stA.Path, b, stB.Path, a)
	}
	changes := func(st *sdk.SyncStatus) map[string]sdk.SyncChange {
		m := map[string]sdk.SyncChange{}
		for _, c := range append(append([]sdk.SyncChange(nil), st.Pending...), st.Held...) {
			m[c.Path] = c
		}
		return m
	}
	ca, cb := changes(stA), changes(stB)
	var paths []string
	for p := range ca {
		paths = append(paths, p)
	}
	for p := range cb {
		if _, ok := ca[p]; !ok {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	if len(paths) == 0 {
		fmt.Fprintf(os.Stderr, "kosa8: neither %s nor %s has changes waiting for review\n", a, b)
		return nil
	}
	for _, p := range paths {
		va, err := versionOf(ctx, sa, stA.Path, p, ca)
		if err != nil {
			return err
		}
		vb, err := versionOf(ctx, sb, stB.Path, p, cb)
		if err != nil {
			return err
		}
		if va.text == vb.text && va.what == vb.what {
			continue // both made the same change
		}
		fmt.Printf("%s %s: %s %s, %s %s\n", "*", p, a, va.what, b, vb.what)
		if stat || va.skip != "" || vb.skip != "" {
			if why := va.skip + vb.skip; why != "" && !stat {
				fmt.Printf("  (%s)\n", why)
			}
			continue
		}
		if err := showTwo(ctx, a+"/"+p, b+"/"+p, va.text, vb.text); err != nil {
			fmt.Fprintf(os.Stderr, "  (no diff: %v)\n", err)
		}
	}
	return nil
}

// sideVersion is one side's state of a path for diffSandboxes.
type sideVersion struct {
	what string // "modified", "added", "deleted", or "unchanged" (the host's version)
	text string // a regular file's content ("" for none)
	skip string // why its content is not shown
}

// versionOf is sandbox s's version of p: its own if it changed p, else
// the host folder's (read never through a link).
func versionOf(ctx context.Context, s *sdk.Sandbox, root, p string, changed map[string]sdk.SyncChange) (sideVersion, error) {
	c, ok := changed[p]
	if !ok {
		b, err := readHostFile(root, p)
		if errors.Is(err, os.ErrNotExist) {
			return sideVersion{what: "unchanged (absent)"}, nil
		}
		if err != nil {
			return sideVersion{what: "unchanged", skip: "the host's version: " + err.Error()}, nil
		}
		return sideVersion{what: "unchanged", text: string(b)}, nil
	}
	v := sideVersion{what: c.Kind}
	switch {
	case c.Type == "": // deleted
	case c.Type == "link":
		v.text = "link -> " + c.Link + "\n"
	case c.Type != "file":
		v.skip = "a " + c.Type
	case c.Size > maxDiffBytes:
		v.skip = s.Name() + "'s copy is too large to show"
	default:
		buf := &boundedBuffer{max: maxDiffBytes}
		cctx, cancel := context.WithCancel(ctx)
		buf.over = cancel
		_, err := s.Exec(cctx, sdk.Cmd{Args: []string{"cat", "--", filepath.Join(root, p)}, Stdout: buf})
		cancel()
		switch {
		case buf.full:
			v.skip = s.Name() + "'s copy is now larger than " + humanBytes(maxDiffBytes)
		case err != nil:
			return v, fmt.Errorf("read %s in %s: %w", p, s.Name(), err)
		}
		v.text = buf.String()
	}
	return v, nil
}

// readHostFile reads a regular file of the host folder, at most
// maxDiffBytes, through wsync.Root as every host read is: never through a
// link anywhere on its path (a link of the user's folder, config ->
// ~/.config/app, would show a file outside the folder beside the
// sandbox's), never blocking on a FIFO.
func readHostFile(root, p string) ([]byte, error) {
	r, err := wsync.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxDiffBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxDiffBytes {
		return nil, fmt.Errorf("too large to show")
	}
	return b, nil
}

// showTwo prints a unified diff of two texts under their labels.
func showTwo(ctx context.Context, la, lb, a, b string) error {
	fa, err := writeTemp(a)
	if err != nil {
		return err
	}
	defer os.Remove(fa)
	fb, err := writeTemp(b)
	if err != nil {
		return err
	}
	defer os.Remove(fb)
	out, _ := exec.CommandContext(ctx, "diff", "-u", "--label", la, "--label", lb, fa, fb).Output()
	os.Stdout.Write(out)
	if len(out) > 0 && !strings.HasSuffix(string(out), "\n") {
		fmt.Println()
	}
	return nil
}

func writeTemp(s string) (string, error) {
	f, err := os.CreateTemp("", "kosa8-diff-*")
	if err != nil {
		return "", err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// hostVersion is the host folder's version of p for a diff: nil when it has
// none, an error when it cannot be shown (a link on the way, not a regular
// file, too large).
func hostVersion(root, p string) ([]byte, error) {
	b, err := readHostFile(root, p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}
