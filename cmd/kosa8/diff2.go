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
	"syscall"

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
// maxDiffBytes, never through a link (of the file itself; the folder's
// links were never made by a sandbox in review mode).
func readHostFile(root, p string) ([]byte, error) {
	full := filepath.Join(root, p)
	fi, err := os.Lstat(full)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	if fi.Size() > maxDiffBytes {
		return nil, fmt.Errorf("too large to show")
	}
	f, err := openNoFollow(full)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxDiffBytes))
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

// openNoFollow opens a file to read, never through a link, and never
// blocking on a FIFO.
func openNoFollow(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	return f, nil
}
