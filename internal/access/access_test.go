package access

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/folder"
)

func resolve(t *testing.T, name string) folder.Path {
	t.Helper()
	p, err := folder.Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestScopes(t *testing.T) {
	top := resolve(t, t.TempDir()).String()
	for _, d := range []string{"A/p", "B", "A/moved"} {
		os.MkdirAll(filepath.Join(top, d), 0o755)
	}
	a := resolve(t, filepath.Join(top, "A"))
	inA := Target{ID: "1", Name: "dev", Workspace: filepath.Join(top, "A", "p")}
	inB := Target{ID: "2", Name: "other", Workspace: filepath.Join(top, "B")}
	denied := func(what string, err error, says string) {
		t.Helper()
		if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want a refusal saying %q", what, err, says)
		}
	}

	all := Everything()
	if all.Check(inB) != nil || all.Grant(inB) != nil || all.Folder(resolve(t, "/")) != nil {
		t.Error("Everything refused something")
	}

	s := Folders("add one with --folder", a)
	denied("check before a pick", s.Check(inA), "only on sandboxes it created or picked")
	denied("folder outside", s.Folder(resolve(t, filepath.Join(top, "B"))), "outside the folders this server may use ("+a.String()+"): add one with --folder")
	if err := s.Folder(resolve(t, filepath.Join(top, "A", "p"))); err != nil {
		t.Errorf("folder inside: %v", err)
	}
	denied("grant outside", s.Grant(inB), "is outside the folders")
	denied("check after a refused grant", s.Check(inB), "only on sandboxes it created or picked")
	denied("grant without a workspace", s.Grant(Target{ID: "3", Name: "bare"}), "has no workspace")
	if err := s.Grant(inA); err != nil {
		t.Fatalf("grant inside: %v", err)
	}
	if err := s.Check(inA); err != nil {
		t.Errorf("check after the grant: %v", err)
	}
	// Another sandbox under the granted one's name is another sandbox.
	denied("same name, new identity", s.Check(Target{ID: "9", Name: "dev", Workspace: inA.Workspace}), "not the sandbox this session picked")
	denied("no identity", s.Check(Target{Name: "dev", Workspace: inA.Workspace}), "only on sandboxes")
	// Its folder replaced by a link since: the folder it leads to counts.
	p := filepath.Join(top, "A", "p")
	os.Rename(p, p+".old")
	os.Symlink(filepath.Join(top, "B"), p)
	denied("folder now a link", s.Check(inA), "now leads to "+filepath.Join(top, "B"))
	os.Remove(p)
	denied("folder gone", s.Check(inA), "cannot be checked")

	only := Only("2")
	if err := only.Check(inB); err != nil {
		t.Errorf("Only: its own: %v", err)
	}
	denied("Only: another", only.Check(inA), "only on the sandboxes it was given")
	denied("Only: grant another", only.Grant(inA), "only on the sandboxes it was given")
	denied("Only: a folder", only.Folder(a), "make none")
}
