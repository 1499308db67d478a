// Package access answers one question for every face of kosa8: may this
// caller act on this sandbox? A Scope is a caller's answer, made by the
// face that serves it:
//
//   - Everything: the CLI and the Go SDK, whose caller is the user (or the
//     user's program) and may act on every sandbox the user owns.
//   - Folders: an MCP session. It may act only on the sandboxes it created
//     or picked in this session (Grant, a capability bound to the
//     sandbox's identity, never its name: a sandbox removed and made again
//     under the same name is another sandbox), and only on those whose
//     canonical workspace is inside the server's folders.
//   - Only: a network listener (the coming `kosa8 serve`): a fixed set of
//     sandboxes, by identity, and no other ever.
//
// The checks read a Target, what a face knows of a sandbox it opened; the
// errors say which rule refused, and are ErrDenied to errors.Is.
package access

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/kosa8/kosa8/internal/folder"
)

// ErrDenied is what every refusal of this package is (errors.Is).
var ErrDenied = errors.New("not allowed")

// Denied is a refusal: the sandbox (or folder) asked for and the rule
// that refused it, said so that the caller (a model, often) knows what to
// do instead.
type Denied struct {
	What string // "sandbox dev", "folder /x"
	Rule string
}

func (d *Denied) Error() string        { return d.What + ": " + d.Rule }
func (d *Denied) Is(target error) bool { return target == ErrDenied }

// Target is what the rules read of a sandbox.
type Target struct {
	// ID is the sandbox's identity (sandbox.Sandbox.Identity).
	ID   string
	Name string
	// Workspace is its host folder as recorded at create (canonical: it
	// went through folder.Resolve), "" for none.
	Workspace string
}

type kind int

const (
	everything kind = iota
	folders
	only
)

// Scope is what one caller may act on. Its methods are safe to call from
// several goroutines.
type Scope struct {
	kind    kind
	folders []folder.Path
	rule    string // names the folders rule in refusals

	mu      sync.Mutex
	granted map[string]string // identity -> name when granted
}

// Everything is the scope of the user's own faces (CLI, SDK): every
// sandbox, every folder.
func Everything() *Scope { return &Scope{kind: everything} }

// Folders is an MCP session's scope: no sandbox at first; Grant adds the
// ones it creates or picks, each only if its workspace is inside roots.
// rule names how the user widens roots, for refusals ("the user can add
// it with 'kosa8 mcp --folder'").
func Folders(rule string, roots ...folder.Path) *Scope {
	return &Scope{kind: folders, folders: roots, rule: rule, granted: map[string]string{}}
}

// Only is a listener's scope: the sandboxes of these identities, fixed.
func Only(ids ...string) *Scope {
	s := &Scope{kind: only, granted: map[string]string{}}
	for _, id := range ids {
		s.granted[id] = ""
	}
	return s
}

// Roots are the folders a Folders scope allows (nil for the others).
func (s *Scope) Roots() []folder.Path { return s.folders }

// Folder says whether the caller may make or pick a sandbox for f.
func (s *Scope) Folder(f folder.Path) error {
	switch s.kind {
	case everything:
		return nil
	case folders:
		if f.Within(s.folders...) {
			return nil
		}
		return &Denied{What: "folder " + f.String(), Rule: fmt.Sprintf(
			"it is outside the folders this server may use (%s)%s", s.rootList(), s.ruleSuffix())}
	}
	return &Denied{What: "folder " + f.String(), Rule: "this caller may act only on the sandboxes it was given, and make none"}
}

// Grant records that the caller created or picked t, after checking that
// its workspace may be used. In an Everything scope it does nothing; in an
// Only scope it adds nothing (t must be one of its own).
func (s *Scope) Grant(t Target) error {
	switch s.kind {
	case everything:
		return nil
	case only:
		return s.Check(t)
	}
	if err := s.workspaceInside(t); err != nil {
		return err
	}
	s.mu.Lock()
	s.granted[t.ID] = t.Name
	s.mu.Unlock()
	return nil
}

// Check says whether the caller may act on t now.
func (s *Scope) Check(t Target) error {
	if s.kind == everything {
		return nil
	}
	what := "sandbox " + t.Name
	s.mu.Lock()
	_, ok := s.granted[t.ID]
	var sameName bool
	for _, n := range s.granted {
		sameName = sameName || n == t.Name
	}
	s.mu.Unlock()
	if t.ID == "" || !ok {
		if s.kind == only {
			return &Denied{What: what, Rule: "this caller may act only on the sandboxes it was given"}
		}
		rule := "this MCP session may act only on sandboxes it created or picked with sandbox_create_or_pick"
		if sameName {
			rule = "it is not the sandbox this session picked under that name (that one was removed, and this one made under its name since): " + rule
		}
		return &Denied{What: what, Rule: rule}
	}
	if s.kind == folders {
		return s.workspaceInside(t)
	}
	return nil
}

// workspaceInside: t's recorded workspace is inside the scope's folders.
func (s *Scope) workspaceInside(t Target) error {
	what := "sandbox " + t.Name
	if t.Workspace == "" {
		return &Denied{What: what, Rule: "it has no workspace folder, and this MCP session may act only on sandboxes of its folders (" + s.rootList() + ")"}
	}
	// Resolved anew: the recorded path was canonical when the sandbox was
	// made; if a link has been put into it since, the folder it leads to
	// is the one that counts (and the supervisor refuses to sync it).
	f, err := folder.Resolve(t.Workspace)
	if err != nil {
		return &Denied{What: what, Rule: fmt.Sprintf("its folder %s cannot be checked (%v)", t.Workspace, err)}
	}
	if f.String() != t.Workspace {
		return &Denied{What: what, Rule: fmt.Sprintf("its folder %s now leads to %s through a link", t.Workspace, f.String())}
	}
	if !f.Within(s.folders...) {
		return &Denied{What: what, Rule: fmt.Sprintf("its folder %s is outside the folders this server may use (%s)%s", t.Workspace, s.rootList(), s.ruleSuffix())}
	}
	return nil
}

func (s *Scope) rootList() string {
	var out []string
	for _, r := range s.folders {
		out = append(out, r.String())
	}
	return strings.Join(out, ", ")
}

func (s *Scope) ruleSuffix() string {
	if s.rule == "" {
		return ""
	}
	return ": " + s.rule
}
