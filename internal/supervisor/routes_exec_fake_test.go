package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/sandbox"
)

// serveFakeAPI serves s's API on the sandbox's socket, as Supervise does
// (s.serveAPI), until the test ends, and returns a client of it.
func serveFakeAPI(t *testing.T, s *supervisor) (*api.Client, *http.Server) {
	t.Helper()
	srv, err := s.serveAPI()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return api.NewClient(s.sb.Path(sandbox.APISocket)), srv
}

// pumpWithin connects an exec stream to sio as the CLI does (guest.Pump)
// and returns the exit status, failing the test if none comes in time.
func pumpWithin(t *testing.T, c io.ReadWriteCloser, sio guest.StdIO) *guest.ExitStatus {
	t.Helper()
	type result struct {
		st  *guest.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := guest.Pump(c, sio)
		done <- result{st, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("exec stream: %v", r.err)
		}
		return r.st
	case <-time.After(10 * time.Second):
		c.Close()
		t.Fatal("no exit frame in 10s")
		return nil
	}
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
	}
}

// Exec over the API socket against a fake guest: the stream the client
// sees (stdout, stderr, its stdin echoed, the exit code), what reaches the
// guest (the sandbox's environment under the request's, the project
// folder), a command the guest cannot start, requests refused with a 400
// before anything reaches the guest, and a client that goes away.
func TestAPIExecOnAFakeMachine(t *testing.T) {
	r := newFakeRig(t, false)
	s := r.s
	g := r.guest(r.drv.Machines()[0])
	s.sb.Config.Env = []string{"FROM_CONFIG=1", "EXIT=9"}
	s.sb.Config.Workspace = &sandbox.WorkspaceConfig{Path: "/home/u/project"}
	c, _ := serveFakeAPI(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("output, input and exit code", func(t *testing.T) {
		conn, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"echo", "hello", "world"}, Env: []string{"EXIT=3"}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		n := len(g.Execs())
		if conn.ID != fmt.Sprintf("fake-%d", n) || conn.Pid != strconv.Itoa(1000+n) {
			t.Errorf("exec id %q pid %q, want the guest's fake-%d and %d", conn.ID, conn.Pid, n, 1000+n)
		}
		var out, errOut bytes.Buffer
		st := pumpWithin(t, conn, guest.StdIO{Stdin: strings.NewReader("typed in\n"), Stdout: &out, Stderr: &errOut})
		if st.Code != 3 || out.String() != "hello world\ntyped in\n" || errOut.String() != "stderr\n" {
			t.Errorf("exit %d, stdout %q, stderr %q; want 3, the arguments and the input, stderr", st.Code, out.String(), errOut.String())
		}
		// The sandbox's environment first, the request's after it (the
		// guest lets the later entry win), in the project folder.
		got := g.Execs()[n-1]
		if got.Dir != "/home/u/project" {
			t.Errorf("exec in %q, want the project folder", got.Dir)
		}
		cfg, req := slices.Index(got.Env, "EXIT=9"), slices.Index(got.Env, "EXIT=3")
		if !slices.Contains(got.Env, "FROM_CONFIG=1") || cfg < 0 || req < cfg {
			t.Errorf("environment %q: want the sandbox's entries, then the request's", got.Env)
		}
		if !slices.ContainsFunc(got.Env, func(e string) bool { return strings.HasPrefix(e, "SSL_CERT_FILE=") }) {
			t.Errorf("environment %q lacks the sandbox CA's", got.Env)
		}
	})

	t.Run("a folder given is kept", func(t *testing.T) {
		conn, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"true"}, Dir: "/srv"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if st := pumpWithin(t, conn, guest.StdIO{}); st.Code != 9 {
			t.Errorf("exit %d, want the sandbox's EXIT=9", st.Code)
		}
		if execs := g.Execs(); execs[len(execs)-1].Dir != "/srv" {
			t.Errorf("exec in %q, want /srv", execs[len(execs)-1].Dir)
		}
	})

	t.Run("a command not found", func(t *testing.T) {
		_, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"missing"}})
		var ce *api.CommandError
		if !errors.As(err, &ce) || ce.Code != 127 || !strings.Contains(ce.Msg, "no such file") {
			t.Errorf("exec of a missing command: %v, want a CommandError with 127 and the guest's reason", err)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		before := len(g.Execs())
		for _, tc := range []struct {
			name, body string
			upgrade    bool
			says       string
		}{
			{"a cut body", `{"argv":`, true, "bad exec request"},
			{"no upgrade", `{"argv":["echo"]}`, false, "Upgrade: " + api.ExecUpgrade},
			{"no command", `{"argv":[]}`, true, "no command"},
			{"an empty command", `{"argv":[""]}`, true, "no command"},
			{"an environment entry without =", `{"argv":["echo"],"env":["NOEQUALS"]}`, true, "KEY=VALUE"},
			{"an id with a line break", `{"argv":["echo"],"id":"a\r\nX: y"}`, true, "an id is"},
			{"an id too long", `{"argv":["echo"],"id":"` + strings.Repeat("a", 65) + `"}`, true, "an id is"},
		} {
			req := httptest.NewRequest(http.MethodPost, "/v1/exec", strings.NewReader(tc.body))
			if tc.upgrade {
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Upgrade", api.ExecUpgrade)
			}
			rec := httptest.NewRecorder()
			s.routes().ServeHTTP(rec, req)
			wantAPIError(t, tc.name, rec.Code, rec.Body.String(), http.StatusBadRequest, tc.says)
		}
		if n := len(g.Execs()); n != before {
			t.Errorf("refused requests reached the guest: %d execs, %d before", n, before)
		}
	})

	t.Run("a guest's exec id that is not a token", func(t *testing.T) {
		// Written into the 101's header lines, it would be more headers.
		conn, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{"badid"}})
		if err == nil {
			conn.Close()
			t.Fatalf("exec answered with id %q pid %q, want a refusal", conn.ID, conn.Pid)
		}
		if !strings.Contains(err.Error(), "not a plain token") {
			t.Errorf("exec with a guest's bad id: %v", err)
		}
	})

	// The process gets SIGHUP, as when its terminal closes: a quiet one
	// and one whose output the supervisor is copying when the client goes.
	for _, prog := range []string{"cat", "yes"} {
		t.Run("the client goes away from "+prog, func(t *testing.T) {
			before := len(g.Signals())
			conn, err := c.Exec(ctx, &guest.ExecRequest{Argv: []string{prog}})
			if err != nil {
				t.Fatal(err)
			}
			first := make(chan error, 1)
			go func() {
				_, err := guest.ReadFrame(conn)
				first <- err
			}()
			select {
			case err := <-first:
				if err != nil {
					t.Fatalf("first frame: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no output in 5s")
			}
			conn.Close()
			waitFor(t, prog+" signalled", func() bool { return len(g.Signals()) > before })
			if sig := g.Signals()[before]; sig != syscall.SIGHUP {
				t.Errorf("%s got signal %v, want SIGHUP", prog, sig)
			}
		})
	}
}

// A guest that stops reading its exec stream once the host has filled its
// window (here with stdin the client sent) cannot keep the exec handler:
// the hangup sent when the client goes away gives up after
// hangupTimeout, and the handler ends, closing the guest's stream.
func TestAPIExecClientGoneFromADeafGuest(t *testing.T) {
	r := newFakeRig(t, false)
	s := r.s
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	h := s.routes()
	ended := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.URL.Path == "/v1/exec" {
			close(ended)
		}
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := api.NewClient(sock).Exec(ctx, &guest.ExecRequest{Argv: []string{"deaf"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := guest.ReadFrame(conn); err != nil {
		t.Fatalf("first frame: %v", err)
	}
	// More input than the stream's window and the sockets on the way
	// hold: the writes stop going through.
	var sent atomic.Int64
	go func() {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range 256 {
			if guest.WriteFrame(conn, guest.FrameStdin, chunk) != nil {
				return
			}
			sent.Add(1)
		}
	}()
	for last := int64(-1); ; {
		time.Sleep(300 * time.Millisecond)
		n := sent.Load()
		if n == 256 {
			t.Fatal("16 MiB of input went through a guest that reads none")
		}
		if n == last {
			break
		}
		last = n
	}
	conn.Close()
	select {
	case <-ended:
	case <-time.After(hangupTimeout + 10*time.Second):
		t.Fatalf("the exec handler still runs %v after its client went away", hangupTimeout+10*time.Second)
	}
}
