package supervisor

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// withWorkspace gives s a workspace in step with a host folder holding
// files, as attach does but for the guest's side: the fake machine runs no
// agent to mount a workspace disk in, so the guest's workspace is a folder
// of its own, read and written through wsync.HostSide (as wsync's own
// tests do). It returns the host folder and the guest's.
func withWorkspace(t *testing.T, s *supervisor, review bool, files map[string]string) (hostDir, guestDir string) {
	t.Helper()
	base := t.TempDir()
	hostDir, guestDir = filepath.Join(base, "host"), filepath.Join(base, "guest")
	for _, d := range []string{hostDir, guestDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, content := range files {
		writeFile(t, hostDir, p, content)
	}
	s.sb.Config.Workspace = &sandbox.WorkspaceConfig{Path: hostDir, Review: review}
	w, err := openWorkspace(s.sb, t.TempDir(), s.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.closeFiles)
	gr, err := wsync.OpenRoot(guestDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gr.Close() })
	host := &wsync.HostSide{Root: w.root}
	w.engine = wsync.NewEngine(host, &wsync.HostSide{Root: gr}, nil, wsync.Options{Review: review}, func(m map[string]*wsync.Entry) {
		if err := s.sb.SaveManifest(m); err != nil {
			t.Errorf("save the manifest: %v", err)
		}
	})
	host.Skip = w.engine.Excluded
	w.readGuest = (&wsync.HostSide{Root: gr}).Read
	if err := w.engine.Sync(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if errs := w.engine.Status().Errors; len(errs) > 0 {
		t.Fatalf("first sync: %v", errs)
	}
	s.ws = w
	return hostDir, guestDir
}

func writeFile(t *testing.T, dir, rel, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, rel), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readFile is rel's content in dir, or "" when there is none.
func readFile(dir, rel string) string {
	b, _ := os.ReadFile(filepath.Join(dir, rel))
	return string(b)
}

func changePaths(cs []wsync.Change) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Path)
	}
	return out
}

// The sync routes of a sandbox with a workspace in review mode, against a
// fake machine: the status, a pass that finds the agent's changes (each
// held back from the host, .envrc held for approval), then apply, approve
// and discard: what each writes where, what it answers, and bad input
// refused with a 400 that leaves the host folder and the changes waiting
// as they were. A change waits for a checkpoint in progress.
func TestAPISyncOnAFakeMachine(t *testing.T) {
	s, _, _ := fakeSupervisor(t)
	h := s.routes()
	hostDir, guestDir := withWorkspace(t, s, true, map[string]string{"keep.txt": "host\n", "drop.txt": "host's\n"})
	status := func(t *testing.T, method, path string) api.SyncStatus {
		t.Helper()
		code, body := apiCall(t, h, method, path, "")
		var st api.SyncStatus
		decodeAnswer(t, body, &st)
		if code != http.StatusOK || st.Path != hostDir {
			t.Fatalf("%s %s: %d %s", method, path, code, body)
		}
		return st
	}
	waiting := func(t *testing.T, pending, held []string) {
		t.Helper()
		st := status(t, "GET", "/v1/sync")
		if got := changePaths(st.Pending); !slices.Equal(got, pending) {
			t.Errorf("pending %v, want %v", got, pending)
		}
		if got := changePaths(st.Held); !slices.Equal(got, held) {
			t.Errorf("held %v, want %v", got, held)
		}
	}
	hostHas := func(t *testing.T, files map[string]string) {
		t.Helper()
		for p, want := range files {
			if got := readFile(hostDir, p); got != want {
				t.Errorf("host %s: %q, want %q", p, got, want)
			}
		}
	}
	done := func(t *testing.T, route string, code int, body string, want ...string) {
		t.Helper()
		var res api.SyncResponse
		decodeAnswer(t, body, &res)
		if code != http.StatusOK || !slices.Equal(res.Done, want) {
			t.Errorf("%s: %d %s, want 200 and %v done", route, code, body, want)
		}
	}

	if st := status(t, "GET", "/v1/sync"); st.Files != 2 || len(st.Pending)+len(st.Held)+len(st.Errors) != 0 {
		t.Fatalf("status in step: %+v", st)
	}
	writeFile(t, guestDir, "keep.txt", "agent's\n")
	writeFile(t, guestDir, "drop.txt", "agent's too\n")
	writeFile(t, guestDir, "added.txt", "new\n")
	writeFile(t, guestDir, ".envrc", "export X=1\n")
	st := status(t, "POST", "/v1/sync/now")
	if got := changePaths(st.Pending); !slices.Equal(got, []string{"added.txt", "drop.txt", "keep.txt"}) {
		t.Errorf("pending after the pass %v", got)
	}
	if got := changePaths(st.Held); !slices.Equal(got, []string{".envrc"}) {
		t.Errorf("held after the pass %v", got)
	}
	original := map[string]string{"keep.txt": "host\n", "drop.txt": "host's\n", "added.txt": "", ".envrc": ""}
	hostHas(t, original)

	t.Run("apply", func(t *testing.T) {
		for _, tc := range []struct{ name, body, says string }{
			{"a path not pending", `{"paths":["nope.txt"]}`, "not pending"},
			{"a held path", `{"paths":[".envrc"]}`, "not pending"},
			{"an unknown field", `{"paths":["added.txt"],"all":true}`, "bad request"},
			{"a cut body", `{"paths":`, "bad request"},
		} {
			code, body := apiCall(t, h, "POST", "/v1/sync/apply", tc.body)
			wantAPIError(t, "apply of "+tc.name, code, body, http.StatusBadRequest, tc.says)
		}
		hostHas(t, original)
		waiting(t, []string{"added.txt", "drop.txt", "keep.txt"}, []string{".envrc"})

		code, body := apiCall(t, h, "POST", "/v1/sync/apply", `{"paths":["added.txt"]}`)
		done(t, "apply", code, body, "added.txt")
		hostHas(t, map[string]string{"added.txt": "new\n", "keep.txt": "host\n"})
		waiting(t, []string{"drop.txt", "keep.txt"}, []string{".envrc"})
	})

	t.Run("approve", func(t *testing.T) {
		for _, tc := range []struct{ name, body, says string }{
			{"no paths", `{}`, "needs the paths"},
			{"a pending path", `{"paths":["keep.txt"]}`, "not held"},
		} {
			code, body := apiCall(t, h, "POST", "/v1/sync/approve", tc.body)
			wantAPIError(t, "approve of "+tc.name, code, body, http.StatusBadRequest, tc.says)
		}
		hostHas(t, map[string]string{".envrc": "", "keep.txt": "host\n"})
		waiting(t, []string{"drop.txt", "keep.txt"}, []string{".envrc"})

		code, body := apiCall(t, h, "POST", "/v1/sync/approve", `{"paths":[".envrc"]}`)
		done(t, "approve", code, body, ".envrc")
		hostHas(t, map[string]string{".envrc": "export X=1\n"})
		waiting(t, []string{"drop.txt", "keep.txt"}, nil)
	})

	t.Run("discard", func(t *testing.T) {
		code, body := apiCall(t, h, "POST", "/v1/sync/discard", `{"paths":["nope.txt"]}`)
		wantAPIError(t, "discard of a path not waiting", code, body, http.StatusBadRequest, "neither pending nor held")
		if got := readFile(guestDir, "keep.txt"); got != "agent's\n" {
			t.Errorf("a refused discard changed the guest's keep.txt: %q", got)
		}
		waiting(t, []string{"drop.txt", "keep.txt"}, nil)

		code, body = apiCall(t, h, "POST", "/v1/sync/discard", `{"paths":["keep.txt"]}`)
		done(t, "discard of keep.txt", code, body, "keep.txt")
		if got := readFile(guestDir, "keep.txt"); got != "host\n" {
			t.Errorf("the guest's keep.txt after its discard: %q, want the host's", got)
		}
		waiting(t, []string{"drop.txt"}, nil)
		// No paths: all of them.
		code, body = apiCall(t, h, "POST", "/v1/sync/discard", `{"paths":[]}`)
		done(t, "discard of all", code, body, "drop.txt")
		if got := readFile(guestDir, "drop.txt"); got != "host's\n" {
			t.Errorf("the guest's drop.txt after discarding all: %q, want the host's", got)
		}
		hostHas(t, map[string]string{"keep.txt": "host\n", "drop.txt": "host's\n"})
		waiting(t, nil, nil)
	})

	t.Run("a change waits for a checkpoint", func(t *testing.T) {
		writeFile(t, guestDir, "later.txt", "later\n")
		status(t, "POST", "/v1/sync/now")
		s.cpMu.Lock() // as a checkpoint or a rewind holds it
		var unlock sync.Once
		defer unlock.Do(s.cpMu.Unlock)
		apply := answerLater(h, "POST", "/v1/sync/apply", `{"paths":["later.txt"]}`)
		notAnsweredYet(t, "apply", "the checkpoint ended", apply)
		if got := readFile(hostDir, "later.txt"); got != "" {
			t.Errorf("apply wrote the host during a checkpoint: %q", got)
		}
		unlock.Do(s.cpMu.Unlock)
		rec := answered(t, "apply", apply)
		done(t, "apply after the checkpoint", rec.Code, rec.Body.String(), "later.txt")
		hostHas(t, map[string]string{"later.txt": "later\n"})
	})
}
