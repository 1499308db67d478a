package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/vmm"
	"github.com/kosa8/kosa8/internal/vmm/vmmtest"
)

// freePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// apiCall serves one request on h, as the API socket would, and returns
// the answer's code and body.
func apiCall(t *testing.T, h http.Handler, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, rd))
	return rec.Code, rec.Body.String()
}

// decodeAnswer decodes an answer's JSON body into v.
func decodeAnswer(t *testing.T, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
}

// wantAPIError checks that route answered code want with an
// api.ErrorResponse whose message contains says.
func wantAPIError(t *testing.T, route string, code int, body string, want int, says string) {
	t.Helper()
	var e api.ErrorResponse
	_ = json.Unmarshal([]byte(body), &e)
	if code != want || e.Error == "" || !strings.Contains(e.Error, says) {
		t.Errorf("%s: %d %q, want %d and an error saying %q", route, code, body, want, says)
	}
}

// The routes a client uses on a running sandbox other than checkpoints,
// rewinds and exec (tested with their own machinery), each against a
// supervisor of a fake machine with the real network: the answer's code
// and body, bad input refused with a 4xx and a message, and what each
// change leaves behind (the allow-list in force and on disk, the ports).
func TestAPIRoutesOnAFakeMachine(t *testing.T) {
	r := newFakeRig(t, true)
	s := r.s
	h := s.routes()
	call := func(method, path, body string) (int, string) {
		t.Helper()
		return apiCall(t, h, method, path, body)
	}

	t.Run("status", func(t *testing.T) {
		s.setStatus(func(st *api.Status) { st.State = api.Running })
		code, body := call("GET", "/v1/status", "")
		var st api.StatusResponse
		decodeAnswer(t, body, &st)
		if code != http.StatusOK || st.Name != "fake" || st.Status.State != api.Running {
			t.Errorf("GET /v1/status: %d %s", code, body)
		}
	})
	t.Run("info from a guest that answers nothing", func(t *testing.T) {
		// Until told an Info the fake guest answers info with an empty
		// response: the guest's fault, said as such, not a crash or an
		// empty 200.
		code, body := call("GET", "/v1/info", "")
		wantAPIError(t, "GET /v1/info", code, body, http.StatusBadGateway, "info missing")
	})
	t.Run("info from the guest", func(t *testing.T) {
		g := r.guest(r.drv.Machines()[0])
		want := guest.Info{Kernel: "6.12.0-fake", Machine: "x86_64", Hostname: "fake", User: "u", UID: 1000, GID: 1000}
		g.SetInfo(&want)
		defer g.SetInfo(nil)
		code, body := call("GET", "/v1/info", "")
		var got guest.Info
		decodeAnswer(t, body, &got)
		if code != http.StatusOK || got != want {
			t.Errorf("GET /v1/info: %d %s, want 200 and %+v", code, body, want)
		}
		if ops := g.Ops(); len(ops) == 0 || ops[len(ops)-1] != guest.OpInfo {
			t.Errorf("the guest was asked %v, want info last", ops)
		}
	})

	t.Run("network rules", func(t *testing.T) {
		rules := func(body string) []string {
			var n api.NetResponse
			decodeAnswer(t, body, &n)
			return n.Rules
		}
		code, body := call("POST", "/v1/net/allow", `{"rules":["example.test:443"]}`)
		if code != http.StatusOK || !slices.Contains(rules(body), "example.test:443") {
			t.Fatalf("allow: %d %s", code, body)
		}
		if code, body := call("GET", "/v1/net", ""); code != http.StatusOK || !slices.Contains(rules(body), "example.test:443") {
			t.Errorf("GET /v1/net after allow: %d %s", code, body)
		}
		if p, err := s.sb.LoadPolicy(); err != nil || !slices.Contains(ruleTexts(p), "example.test:443") {
			t.Errorf("the allow-list on disk after allow: %v %v", err, p)
		}
		code, body = call("POST", "/v1/net/deny", `{"rules":["evil.test"]}`)
		if code != http.StatusOK || !slices.ContainsFunc(rules(body), func(r string) bool { return strings.Contains(r, "evil.test") }) {
			t.Errorf("deny: %d %s", code, body)
		}
		code, body = call("POST", "/v1/net/rm", `{"rules":["example.test:443"]}`)
		if code != http.StatusOK || slices.Contains(rules(body), "example.test:443") {
			t.Errorf("rm: %d %s", code, body)
		}
		// Bad input: refused with what to fix, and the rules unchanged.
		_, before := call("GET", "/v1/net", "")
		code, body = call("POST", "/v1/net/allow", `{"rules":`)
		wantAPIError(t, "allow with a cut body", code, body, http.StatusBadRequest, "")
		code, body = call("POST", "/v1/net/allow", `{"rules":["*"]}`)
		wantAPIError(t, "allow of everything without allow_broad", code, body, http.StatusBadRequest, "")
		code, body = call("POST", "/v1/net/allow", `{"rules":["bad host name!:443"]}`)
		wantAPIError(t, "allow of a malformed host", code, body, http.StatusBadRequest, "")
		if _, after := call("GET", "/v1/net", ""); after != before {
			t.Errorf("refused changes changed the rules: %s, then %s", before, after)
		}
	})

	t.Run("ports", func(t *testing.T) {
		port := freePort(t)
		code, body := call("POST", "/v1/ports", fmt.Sprintf(`{"host_port":%d,"guest_port":8080}`, port))
		var list []api.PortForward
		decodeAnswer(t, body, &list)
		if code != http.StatusOK || !slices.Contains(list, api.PortForward{HostPort: port, GuestPort: 8080}) {
			t.Fatalf("POST /v1/ports: %d %s", code, body)
		}
		// The host port listens, on loopback only.
		if c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
			t.Errorf("the forwarded port does not listen: %v", err)
		} else {
			c.Close()
		}
		code, body = call("POST", "/v1/ports", fmt.Sprintf(`{"host_port":%d,"guest_port":9090}`, port))
		wantAPIError(t, "a port forwarded twice", code, body, http.StatusConflict, "already forwarded")
		code, body = call("GET", "/v1/ports", "")
		decodeAnswer(t, body, &list)
		if code != http.StatusOK || len(list) != 1 {
			t.Errorf("GET /v1/ports: %d %s", code, body)
		}
		code, body = call("DELETE", fmt.Sprintf("/v1/ports/%d", port), "")
		decodeAnswer(t, body, &list)
		if code != http.StatusOK || len(list) != 0 {
			t.Errorf("DELETE /v1/ports: %d %s", code, body)
		}
		if c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			t.Errorf("port %d still listens after its forward ended", port)
		}
		code, body = call("DELETE", "/v1/ports/notaport", "")
		wantAPIError(t, "DELETE of a port that is not a number", code, body, http.StatusBadRequest, "")
		code, body = call("DELETE", fmt.Sprintf("/v1/ports/%d", port), "")
		wantAPIError(t, "DELETE of a port not forwarded", code, body, http.StatusBadRequest, "")
	})

	t.Run("sync without a workspace", func(t *testing.T) {
		for _, rt := range []struct{ method, path, body string }{
			{"GET", "/v1/sync", ""}, {"POST", "/v1/sync/now", ""},
			{"POST", "/v1/sync/apply", `{"paths":["a"]}`}, {"POST", "/v1/sync/approve", `{"paths":["a"]}`}, {"POST", "/v1/sync/discard", `{}`},
		} {
			code, body := call(rt.method, rt.path, rt.body)
			wantAPIError(t, rt.method+" "+rt.path, code, body, http.StatusNotFound, "no workspace")
		}
	})

	t.Run("checkpoints that do not exist", func(t *testing.T) {
		code, body := call("POST", "/v1/rewind", `{"id":"nope"}`)
		wantAPIError(t, "rewind to an unknown checkpoint", code, body, http.StatusNotFound, "nope")
		code, body = call("DELETE", "/v1/checkpoints/nope", "")
		wantAPIError(t, "DELETE of an unknown checkpoint", code, body, http.StatusBadRequest, "nope")
	})

	t.Run("methods and paths outside the table", func(t *testing.T) {
		for _, rt := range []struct{ method, path string }{{"DELETE", "/v1/status"}, {"GET", "/v1/nothing"}, {"GET", "/v2/status"}} {
			if code, _ := call(rt.method, rt.path, ""); code < 400 || code >= 500 {
				t.Errorf("%s %s: %d, want a 4xx", rt.method, rt.path, code)
			}
		}
	})
}

// answerLater serves one request on h in the background, as a client
// waiting on the API socket would be served.
func answerLater(h http.Handler, method, path, body string) <-chan *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		done <- rec
	}()
	return done
}

// answered is the answer answerLater's request got, within a deadline.
func answered(t *testing.T, route string, ch <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case rec := <-ch:
		return rec
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no answer in 5s", route)
		return nil
	}
}

// notAnsweredYet checks that answerLater's request is still waiting a
// moment after it was sent.
func notAnsweredYet(t *testing.T, route, until string, ch <-chan *httptest.ResponseRecorder) {
	t.Helper()
	select {
	case rec := <-ch:
		t.Fatalf("%s answered %d %q before %s", route, rec.Code, rec.Body.Next(200), until)
	case <-time.After(100 * time.Millisecond):
	}
}

// stopAsked is the stop request a handler handed to Supervise's loop (here
// nobody's: the test takes it), within a deadline.
func stopAsked(t *testing.T, s *supervisor) stopRequest {
	t.Helper()
	select {
	case req := <-s.stop:
		return req
	case <-time.After(5 * time.Second):
		t.Fatal("no stop request reached the supervisor in 5s")
		return stopRequest{}
	}
}

// Stop hands Supervise a stop request (a kill with ?kill=1) and answers
// only once the machine is gone; a second stop meanwhile asks nothing
// more and is answered as well.
func TestAPIStopOnAFakeMachine(t *testing.T) {
	for _, tc := range []struct {
		name, query string
		kill        bool
	}{
		{"clean", "", false},
		{"kill", "?kill=1", true},
		{"anything but 1 is no kill", "?kill=yes", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, m, _ := fakeSupervisor(t)
			h := s.routes()
			route := "POST /v1/stop" + tc.query
			first := answerLater(h, "POST", "/v1/stop"+tc.query, "")
			req := stopAsked(t, s)
			if req.kill != tc.kill || req.pause || req.done != nil {
				t.Errorf("%s asked for %+v, want kill %v and no pause", route, req, tc.kill)
			}
			notAnsweredYet(t, route, "the machine was gone", first)
			second := answerLater(h, "POST", "/v1/stop", "")
			notAnsweredYet(t, "a second stop", "the machine was gone", second)

			if err := m.Kill(); err != nil { // what Supervise's loop does with the request
				t.Fatal(err)
			}
			for _, ch := range []<-chan *httptest.ResponseRecorder{first, second} {
				if rec := answered(t, route, ch); rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != "{}" {
					t.Errorf("%s once the machine is gone: %d %s, want 200 {}", route, rec.Code, rec.Body)
				}
			}
			select {
			case extra := <-s.stop:
				t.Errorf("the second stop asked again: %+v", extra)
			default:
			}
		})
	}
}

// Pause hands Supervise a pause request and answers with its outcome: 200
// once the machine is written out, 500 with the reason when that failed.
func TestAPIPauseOnAFakeMachine(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome error
		code    int
		says    string
	}{
		{"written out", nil, http.StatusOK, ""},
		{"failed", errors.New("not enough disk space"), http.StatusInternalServerError, "pause: not enough disk space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := fakeSupervisor(t)
			pause := answerLater(s.routes(), "POST", "/v1/pause", "")
			req := stopAsked(t, s)
			if !req.pause || req.kill || req.done == nil {
				t.Fatalf("POST /v1/pause asked for %+v, want a pause with a channel for its outcome", req)
			}
			notAnsweredYet(t, "POST /v1/pause", "it was told the outcome", pause)
			req.done <- tc.outcome
			rec := answered(t, "POST /v1/pause", pause)
			if tc.outcome == nil {
				if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != "{}" {
					t.Errorf("POST /v1/pause: %d %s, want 200 {}", rec.Code, rec.Body)
				}
				return
			}
			wantAPIError(t, "POST /v1/pause", rec.Code, rec.Body.String(), tc.code, tc.says)
		})
	}
}

// A pause asked for while a stop is under way cannot happen (Supervise
// takes one request): it is refused at once, not left waiting for an
// outcome nobody will send, and the stop goes on.
func TestAPIPauseWhileStopping(t *testing.T) {
	s, m, _ := fakeSupervisor(t)
	h := s.routes()
	stop := answerLater(h, "POST", "/v1/stop", "")
	stopAsked(t, s)
	code, body := apiCallWithin(t, h, "POST", "/v1/pause")
	wantAPIError(t, "POST /v1/pause during a stop", code, body, http.StatusConflict, "already stopping")
	select {
	case req := <-s.stop:
		t.Errorf("the pause reached the supervisor after the stop: %+v", req)
	default:
	}
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	if rec := answered(t, "POST /v1/stop", stop); rec.Code != http.StatusOK {
		t.Errorf("the stop: %d %s", rec.Code, rec.Body)
	}
}

// A stop that does not come through the API (the machine exited: a guest
// can power itself off; the supervisor was signalled) leaves Supervise's
// loop without a request: a pause asked for after it is refused at once
// too, and one handed over just before, which the loop did not take, is
// answered that the sandbox stopped rather than left waiting.
func TestAPIPauseAfterTheMachineExited(t *testing.T) {
	t.Run("taken before the loop ended", func(t *testing.T) {
		s, _, _ := fakeSupervisor(t)
		pause := answerLater(s.routes(), "POST", "/v1/pause", "")
		waitFor(t, "the pause handed over", func() bool { return len(s.stop) == 1 })
		s.closeStop(false) // the loop ended on the machine's exit
		rec := answered(t, "POST /v1/pause", pause)
		wantAPIError(t, "POST /v1/pause as the machine exited", rec.Code, rec.Body.String(), http.StatusInternalServerError, "stopped before")
	})
	t.Run("asked for after", func(t *testing.T) {
		s, _, _ := fakeSupervisor(t)
		s.closeStop(false)
		code, body := apiCallWithin(t, s.routes(), "POST", "/v1/pause")
		wantAPIError(t, "POST /v1/pause after the machine exited", code, body, http.StatusConflict, "already stopping")
	})
}

// apiCallWithin is apiCall for a route that might never answer: it fails
// the test after a deadline instead of hanging it.
func apiCallWithin(t *testing.T, h http.Handler, method, path string) (int, string) {
	t.Helper()
	rec := answered(t, method+" "+path, answerLater(h, method, path, ""))
	return rec.Code, rec.Body.String()
}

// Plain migrate, the checkpoint benchmark's baseline: the machine paused,
// saved whole (RAM included) to a scratch file and resumed; the answer
// says how big the file was, and it is gone after. A failed step answers
// 500 and leaves the machine running; a machine that cannot save itself
// whole answers 501 and is not paused.
func TestAPIPlainMigrateOnAFakeMachine(t *testing.T) {
	const route = "POST /v1/debug/plain-migrate"
	scratchLeft := func(t *testing.T, s *supervisor) {
		t.Helper()
		if left, _ := filepath.Glob(filepath.Join(s.sb.Dir, ".plain-migrate-*")); len(left) > 0 {
			t.Errorf("scratch files left: %v", left)
		}
	}
	callsSince := func(m *vmmtest.Machine, n int) []string { return m.CallNames()[n:] }

	t.Run("saved whole and resumed", func(t *testing.T) {
		s, m, _ := fakeSupervisor(t)
		n := len(m.CallNames())
		code, body := apiCall(t, s.routes(), "POST", "/v1/debug/plain-migrate", "")
		var pm api.PlainMigrate
		decodeAnswer(t, body, &pm)
		ram := int64(s.sb.Config.MemoryMiB) << 20
		if code != http.StatusOK || pm.Bytes <= ram || pm.Bytes > ram+4096 || pm.PauseMillis <= 0 {
			t.Errorf("%s: %d %s, want 200, the RAM's %d bytes and a little device state, a pause", route, code, body, ram)
		}
		if got := callsSince(m, n); !slices.Equal(got, []string{"Pause", "SaveAll", "Resume"}) || m.Paused() {
			t.Errorf("machine calls %v, paused %v; want Pause, SaveAll, Resume and a running machine", got, m.Paused())
		}
		for _, c := range m.Calls() {
			if c.Name == "SaveAll" && !c.Paused {
				t.Error("SaveAll ran on a running machine")
			}
		}
		scratchLeft(t, s)
	})

	for _, tc := range []struct {
		fail  string
		calls []string
	}{
		{"Pause", []string{"Pause"}},
		{"SaveAll", []string{"Pause", "SaveAll", "Resume"}},
	} {
		t.Run("a failed "+tc.fail, func(t *testing.T) {
			s, m, _ := fakeSupervisor(t)
			n := len(m.CallNames())
			m.Fail(tc.fail, errors.New("injected "+tc.fail+" failure"))
			code, body := apiCall(t, s.routes(), "POST", "/v1/debug/plain-migrate", "")
			wantAPIError(t, route, code, body, http.StatusInternalServerError, "injected "+tc.fail+" failure")
			if got := callsSince(m, n); !slices.Equal(got, tc.calls) || m.Paused() {
				t.Errorf("machine calls %v, paused %v; want %v and a running machine", got, m.Paused(), tc.calls)
			}
			scratchLeft(t, s)
		})
	}

	for _, tc := range []struct {
		name string
		hide func(*vmmtest.Machine) vmm.Machine
	}{
		{"no whole-machine save", func(m *vmmtest.Machine) vmm.Machine {
			return struct {
				vmm.Machine
				vmm.Snapshotter
			}{m, m}
		}},
		{"no snapshots", func(m *vmmtest.Machine) vmm.Machine { return struct{ vmm.Machine }{m} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, m, _ := fakeSupervisor(t)
			s.machine = tc.hide(m)
			code, body := apiCall(t, s.routes(), "POST", "/v1/debug/plain-migrate", "")
			wantAPIError(t, route, code, body, http.StatusNotImplemented, vmm.ErrNotSupported.Error())
			if slices.Contains(m.CallNames(), "Pause") {
				t.Error("a machine that cannot be saved whole was paused")
			}
			scratchLeft(t, s)
		})
	}
}

// The checkpoint routes past an unknown id, against a fake machine with a
// root disk: a checkpoint's bad body refused with nothing taken, a delete
// that removes the checkpoint and the RAM kept ready for rewinding to it,
// and a rewind over the API that replaces the machine (a bad body
// replacing nothing).
func TestAPICheckpointDeleteAndRewind(t *testing.T) {
	r := newRewindRig(t)
	s := r.s
	h := s.routes()
	take := func(message string) checkpoint.Meta {
		t.Helper()
		code, body := apiCall(t, h, "POST", "/v1/checkpoints", `{"message":"`+message+`"}`)
		var meta checkpoint.Meta
		decodeAnswer(t, body, &meta)
		if code != http.StatusOK || meta.ID == "" {
			t.Fatalf("POST /v1/checkpoints: %d %s", code, body)
		}
		return meta
	}
	ids := func() []string {
		t.Helper()
		list, err := s.sb.Checkpoints().List()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range list {
			out = append(out, m.ID)
		}
		return out
	}

	code, body := apiCall(t, h, "POST", "/v1/checkpoints", `{"message":"x","parent":"y"}`)
	wantAPIError(t, "a checkpoint with an unknown field", code, body, http.StatusBadRequest, "bad request")
	if got := ids(); len(got) != 0 {
		t.Fatalf("a refused checkpoint left %v", got)
	}
	cp1 := take("one")
	cp2 := take("two")
	waitRewindRAM(t, s, cp2.ID)

	code, body = apiCall(t, h, "DELETE", "/v1/checkpoints/"+cp2.ID, "")
	if code != http.StatusOK {
		t.Fatalf("DELETE /v1/checkpoints/%s: %d %s", cp2.ID, code, body)
	}
	if got := ids(); !slices.Equal(got, []string{cp1.ID}) {
		t.Errorf("checkpoints after the delete: %v, want just %s", got, cp1.ID)
	}
	if h := s.rewindRAM().Holds(); h == cp2.ID {
		t.Errorf("the RAM kept ready still holds the deleted checkpoint %s", h)
	}

	old := s.currentMachine()
	machines := len(r.drv.Machines())
	code, body = apiCall(t, h, "POST", "/v1/rewind", `{"id":`)
	wantAPIError(t, "a rewind with a cut body", code, body, http.StatusBadRequest, "bad request")
	if s.currentMachine() != old || len(r.drv.Machines()) != machines {
		t.Fatal("a refused rewind replaced the machine")
	}
	code, body = apiCall(t, h, "POST", "/v1/rewind", `{"id":"`+cp1.ID+`"}`)
	var res api.RewindResult
	decodeAnswer(t, body, &res)
	if code != http.StatusOK || res.To != cp1.ID || res.Saved == nil || res.ColdBoot {
		t.Fatalf("POST /v1/rewind: %d %s", code, body)
	}
	if s.currentMachine() == old || len(r.drv.Machines()) != machines+1 {
		t.Error("the rewind did not replace the machine")
	}
	if st := s.getStatus(); st.Checkpoint != cp1.ID {
		t.Errorf("status names checkpoint %q after the rewind, want %s", st.Checkpoint, cp1.ID)
	}
	if got := ids(); !slices.Contains(got, res.Saved.ID) {
		t.Errorf("the state before the rewind, %s, is not among the checkpoints %v", res.Saved.ID, got)
	}
}
