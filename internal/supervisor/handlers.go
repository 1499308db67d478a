package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/vmm"
)

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *supervisor) routes() http.Handler {
	mux, _ := s.routeMux()
	return s.sameSandbox(mux)
}

// sameSandbox refuses a request that names another sandbox's identity
// (api.SandboxIDHeader) than the one this supervisor runs: its caller
// opened a sandbox that was removed since, and this one was made under
// its name (and so its socket's path). A request naming none is the
// caller's who did not open one by identity.
func (s *supervisor) sameSandbox(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get(api.SandboxIDHeader); id != "" && id != s.sb.Identity() {
			writeJSON(w, http.StatusConflict, api.ErrorResponse{Error: fmt.Sprintf(
				"sandbox %s is not the one you opened (that one was removed and a new one made under its name): open it again",
				s.sb.Config.Name)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// routeMux registers the API's handlers, each only if api.Routes documents it,
// and returns the patterns it registered.
func (s *supervisor) routeMux() (*http.ServeMux, []string) {
	mux := &documentedMux{mux: http.NewServeMux()}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.StatusResponse{Name: s.sb.Config.Name, Status: s.getStatus()})
	})
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		info, err := s.currentClient().Info(r.Context())
		if err != nil {
			writeJSON(w, http.StatusBadGateway, api.ErrorResponse{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("POST /v1/stop", func(w http.ResponseWriter, r *http.Request) {
		m := s.currentMachine()
		s.requestStop(stopRequest{kill: r.URL.Query().Get("kill") == "1"})
		select {
		case <-m.Done():
			writeJSON(w, http.StatusOK, struct{}{})
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("POST /v1/pause", func(w http.ResponseWriter, r *http.Request) {
		done := make(chan error, 1)
		if !s.requestStop(stopRequest{pause: true, done: done}) {
			// Nobody would tell done an outcome: the sandbox stops as asked before.
			writeJSON(w, http.StatusConflict, api.ErrorResponse{Error: "the sandbox is already stopping: it cannot be paused now"})
			return
		}
		select {
		case err := <-done:
			if err != nil {
				writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: "pause: " + err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, struct{}{})
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("POST /v1/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		var req api.CheckpointRequest
		if !decodeBody(w, r, &req) {
			return
		}
		meta, err := s.checkpoint(r.Context(), req.Message, "manual")
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: "checkpoint: " + err.Error()})
			return
		}
		s.enforceRetention()
		writeJSON(w, http.StatusOK, meta)
	})
	mux.HandleFunc("POST /v1/rewind", func(w http.ResponseWriter, r *http.Request) {
		var req api.CheckpointRequest
		if !decodeBody(w, r, &req) {
			return
		}
		res, err := s.rewind(r.Context(), req.ID)
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, checkpoint.ErrNotFound) {
				code = http.StatusNotFound
			}
			writeJSON(w, code, api.ErrorResponse{Error: "rewind: " + err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("DELETE /v1/checkpoints/{id}", func(w http.ResponseWriter, r *http.Request) {
		s.cpMu.Lock()
		err := sandbox.DeleteCheckpointLocked(s.sb, r.PathValue("id"))
		if err == nil {
			s.dropRewindRAM(r.PathValue("id"))
		}
		s.cpMu.Unlock()
		if err != nil {
			writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
	})
	mux.HandleFunc("POST /v1/exec", s.handleExec)
	mux.HandleFunc("GET /v1/net", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.NetResponse{Rules: ruleTexts(s.net.gw.Policy())})
	})
	mux.HandleFunc("POST /v1/net/allow", netChange(func(ctx context.Context, req api.NetRequest) (*netpolicy.Policy, error) {
		return s.net.allow(ctx, req.Rules, req.AllowBroad)
	}))
	mux.HandleFunc("POST /v1/net/deny", netChange(func(_ context.Context, req api.NetRequest) (*netpolicy.Policy, error) { return s.net.deny(req.Rules) }))
	mux.HandleFunc("GET /v1/net/refused", func(w http.ResponseWriter, r *http.Request) {
		// A stream for 'kosa8 net approve': one JSON object a line per
		// refused host, as it happens.
		w.Header().Set("Content-Type", "application/x-ndjson")
		rc := http.NewResponseController(w)
		_ = s.net.streamRefused(r.Context(), w, func() { _ = rc.Flush() })
	})
	mux.HandleFunc("POST /v1/net/rm", netChange(func(_ context.Context, req api.NetRequest) (*netpolicy.Policy, error) { return s.net.remove(req.Rules) }))
	mux.HandleFunc("GET /v1/debug/memory", s.handleMemory)
	mux.HandleFunc("POST /v1/debug/plain-migrate", s.handlePlainMigrate)
	mux.HandleFunc("GET /v1/sync", func(w http.ResponseWriter, r *http.Request) {
		if s.ws == nil {
			writeJSON(w, http.StatusNotFound, api.ErrorResponse{Error: "this sandbox has no workspace"})
			return
		}
		writeJSON(w, http.StatusOK, api.SyncStatus{Path: s.sb.Config.Workspace.Path, Status: s.ws.engine.Status()})
	})
	mux.HandleFunc("POST /v1/sync/now", func(w http.ResponseWriter, r *http.Request) {
		if s.ws == nil {
			writeJSON(w, http.StatusNotFound, api.ErrorResponse{Error: "this sandbox has no workspace"})
			return
		}
		s.ws.syncNow(r.Context(), nil)
		writeJSON(w, http.StatusOK, api.SyncStatus{Path: s.sb.Config.Workspace.Path, Status: s.ws.engine.Status()})
	})
	mux.HandleFunc("POST /v1/sync/apply", func(w http.ResponseWriter, r *http.Request) { s.handleSyncChange(w, r, "apply") })
	mux.HandleFunc("POST /v1/sync/approve", func(w http.ResponseWriter, r *http.Request) { s.handleSyncChange(w, r, "approve") })
	mux.HandleFunc("POST /v1/sync/discard", func(w http.ResponseWriter, r *http.Request) { s.handleSyncChange(w, r, "discard") })
	mux.HandleFunc("GET /v1/sync/summary", func(w http.ResponseWriter, r *http.Request) {
		if s.ws == nil {
			writeJSON(w, http.StatusNotFound, api.ErrorResponse{Error: "this sandbox has no workspace"})
			return
		}
		sum, err := s.changeSummary(r.Context())
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, sum)
	})
	mux.HandleFunc("POST /v1/fork", s.handleFork)
	mux.HandleFunc("GET /v1/ports", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.net.ports())
	})
	mux.HandleFunc("POST /v1/ports", func(w http.ResponseWriter, r *http.Request) {
		var pf api.PortForward
		if !decodeBody(w, r, &pf) {
			return
		}
		if err := s.net.addForward(pf, true); err != nil {
			code := http.StatusBadRequest
			if errors.Is(err, sandbox.ErrPortInUse) {
				code = http.StatusConflict
			}
			writeJSON(w, code, api.ErrorResponse{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s.net.ports())
	})
	mux.HandleFunc("DELETE /v1/ports/{port}", func(w http.ResponseWriter, r *http.Request) {
		p, err := strconv.ParseUint(r.PathValue("port"), 10, 16)
		if err == nil {
			err = s.net.removeForward(uint16(p))
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s.net.ports())
	})
	return mux.mux, mux.registered
}

// netChange is a route that changes the allow-list: a api.NetRequest in, the
// rules in force out.
func netChange(change func(context.Context, api.NetRequest) (*netpolicy.Policy, error)) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		var req api.NetRequest
		if !decodeBody(w, r, &req) {
			return
		}
		p, err := change(r.Context(), req)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, api.NetResponse{Rules: ruleTexts(p)})
	}
}

// documentedMux registers a handler only for a route api.Routes documents.
// Its ServeMux is a field, not embedded, so that no Handle can register a
// route past the check.
type documentedMux struct {
	mux        *http.ServeMux
	registered []string
}

func (m *documentedMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	if !slices.ContainsFunc(api.Routes, func(r api.Route) bool { return r.Pattern == pattern }) {
		panic("api route " + pattern + " is not in api.Routes: document it there")
	}
	m.registered = append(m.registered, pattern)
	m.mux.HandleFunc(pattern, h)
}

func (s *supervisor) handleSyncChange(w http.ResponseWriter, r *http.Request, what string) {
	if s.ws == nil {
		writeJSON(w, http.StatusNotFound, api.ErrorResponse{Error: "this sandbox has no workspace"})
		return
	}
	var req api.SyncRequest
	if !decodeBody(w, r, &req) {
		return
	}
	// Not during a checkpoint or a rewind: this scans the guest, which
	// they pause (a rewind would wait on the engine this holds).
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	resume := s.ws.Pause()
	defer resume()
	if what != "discard" {
		// Forks of one folder may each be applied: one at a time.
		lock, err := lockApply(s.home, s.sb.Config.Workspace.Path)
		if err != nil {
			writeJSON(w, http.StatusConflict, api.ErrorResponse{Error: err.Error()})
			return
		}
		defer lock.Close()
	}
	var done []string
	var err error
	switch what {
	case "apply":
		done, err = s.ws.engine.ApplySeen(r.Context(), req.Paths, false, req.Seen)
	case "approve":
		if len(req.Paths) == 0 {
			err = errors.New("approve needs the paths to approve, one by one")
			break
		}
		done, err = s.ws.engine.ApplySeen(r.Context(), req.Paths, true, req.Seen)
	case "discard":
		done, err = s.ws.engine.Discard(r.Context(), req.Paths)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: err.Error()})
		return
	}
	if done == nil {
		done = []string{}
	}
	writeJSON(w, http.StatusOK, api.SyncResponse{Done: done})
}

// memoryStallTimeout cuts a memory stream whose client stops reading: the
// machine stays paused and cpMu held (checkpoints, rewinds and a pause
// wait) until the stream ends.
var memoryStallTimeout = 30 * time.Second

// handleMemory streams the guest's RAM, paused for a consistent image:
// the proof that no secret is inside is a scan of it. The API socket is
// the sandbox owner's alone.
func (s *supervisor) handleMemory(w http.ResponseWriter, r *http.Request) {
	// Not during a checkpoint or a rewind: its resume would let the guest
	// run in the middle of theirs.
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	m, err := snapshotter(s.currentMachine())
	if err != nil {
		writeJSON(w, http.StatusNotImplemented, api.ErrorResponse{Error: err.Error()})
		return
	}
	ram := m.RAM()
	if ram == nil {
		writeJSON(w, http.StatusNotImplemented, api.ErrorResponse{Error: "the guest's memory is mapped copy-on-write from the checkpoint it was forked from, private to QEMU: no dump until it is restarted from a checkpoint of its own ('kosa8 checkpoint', then 'kosa8 rewind' to it)"})
		return
	}
	st, err := ram.Stat()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: err.Error()})
		return
	}
	if err := m.Pause(r.Context()); err != nil {
		writeJSON(w, http.StatusBadGateway, api.ErrorResponse{Error: err.Error()})
		return
	}
	defer m.Resume(context.Background())
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
	rc := http.NewResponseController(w)
	defer rc.SetWriteDeadline(time.Time{}) // not on the connection's next request
	_, _ = io.Copy(stallWriter{w: w, rc: rc}, io.NewSectionReader(ram, 0, st.Size()))
}

// stallWriter fails a write its client has not taken within
// memoryStallTimeout.
type stallWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (s stallWriter) Write(p []byte) (int, error) {
	_ = s.rc.SetWriteDeadline(time.Now().Add(memoryStallTimeout))
	return s.w.Write(p)
}

// handlePlainMigrate pauses the VM, migrates it whole (RAM in the stream)
// to a scratch file, resumes it and reports the pause: the benchmark's
// baseline. The file is deleted.
func (s *supervisor) handlePlainMigrate(w http.ResponseWriter, r *http.Request) {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	mach := s.currentMachine()
	m, err := snapshotter(mach)
	if err != nil {
		writeJSON(w, http.StatusNotImplemented, api.ErrorResponse{Error: err.Error()})
		return
	}
	full, ok := mach.(vmm.FullSaver)
	if !ok {
		writeJSON(w, http.StatusNotImplemented, api.ErrorResponse{Error: "a whole-machine save: " + vmm.ErrNotSupported.Error()})
		return
	}
	f, err := os.CreateTemp(s.sb.Dir, ".plain-migrate-*")
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: err.Error()})
		return
	}
	defer os.Remove(f.Name())
	defer f.Close()
	start := time.Now()
	err = m.Pause(r.Context())
	if err == nil {
		err = full.SaveAll(r.Context(), f)
		if rerr := m.Resume(context.Background()); err == nil {
			err = rerr
		}
	}
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: err.Error()})
		return
	}
	st, _ := f.Stat()
	writeJSON(w, http.StatusOK, api.PlainMigrate{PauseMillis: msSince(start), Bytes: st.Size()})
}

func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	d := json.NewDecoder(io.LimitReader(r.Body, api.MaxBody))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: "bad request: " + err.Error()})
		return false
	}
	return true
}

func (s *supervisor) handleExec(w http.ResponseWriter, r *http.Request) {
	var req guest.ExecRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, api.MaxBody)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: "bad exec request: " + err.Error()})
		return
	}
	if err := req.Validate(); err != nil {
		// The client's fault, said before any stream to the guest is opened.
		writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: "bad exec request: " + err.Error()})
		return
	}
	base, err := s.sb.GuestEnv()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: err.Error()})
		return
	}
	req.Env = append(base, req.Env...)
	if req.Dir == "" && s.sb.Config.Workspace != nil {
		req.Dir = s.sb.Config.Workspace.Path // commands start in the project folder
	} else if req.Dir == "" && s.sb.Config.WorkDir != "" {
		req.Dir = s.sb.Config.WorkDir // an OCI image's WorkingDir
	}
	if r.Header.Get("Upgrade") != api.ExecUpgrade {
		writeJSON(w, http.StatusBadRequest, api.ErrorResponse{Error: "exec needs Upgrade: " + api.ExecUpgrade})
		return
	}
	client := s.currentClient()
	stream, resp, err := client.Exec(r.Context(), &req)
	if err != nil {
		code, exit := http.StatusBadGateway, 0
		var ae *guest.AgentError
		if errors.As(err, &ae) {
			code, exit = http.StatusUnprocessableEntity, ae.Code
		}
		writeJSON(w, code, api.ExecErrorResponse{Error: err.Error(), ExitCode: exit})
		return
	}
	defer stream.Close()
	if !guest.ValidExecID(resp.ID) {
		// The guest's words go into a header line: no CR, LF or other
		// bytes a client's parser would read as more than the id.
		writeJSON(w, http.StatusBadGateway, api.ExecErrorResponse{Error: "the guest answered an exec id that is not a plain token"})
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, api.ErrorResponse{Error: "connection cannot be upgraded"})
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\nKosa8-Exec-Id: %s\r\nKosa8-Exec-Pid: %d\r\n\r\n", api.ExecUpgrade, resp.ID, resp.Pid)
	if err := brw.Flush(); err != nil {
		return
	}
	s.log.Info("exec", "id", resp.ID, "pid", resp.Pid, "argv0", req.Argv[0])
	// The stream breaks when a rewind replaces the VM: the process lives on
	// in the restored guest (if it ran at the checkpoint), so attach to it
	// again and carry on.
	toGuest := newSwitchWriter(stream)
	go func() {
		_, _ = io.Copy(toGuest, brw.Reader)
		toGuest.cliGone()
	}()
	for {
		switch spliceExec(conn, stream, toGuest) {
		case spliceDone:
			return
		case spliceGuestLost:
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			next, err := s.nextClient(ctx, client)
			if err == nil {
				var st net.Conn
				if st, _, err = next.Attach(ctx, resp.ID); err == nil {
					stream.Close()
					stream, client = st, next
					toGuest.swap(st)
					cancel()
					s.log.Info("exec re-attached", "id", resp.ID)
					continue
				}
			}
			cancel()
			_ = guest.WriteJSON(conn, guest.FrameError, guest.Response{Error: "the sandbox was rewound to before this command started"})
			return
		}
	}
}

// hangupTimeout bounds the send of SIGHUP to a process whose client went
// away: a guest that stops reading its stream (with its window full) must
// not keep the handler, the stream and the client's connection forever.
const hangupTimeout = 5 * time.Second

type spliceEnd int

const (
	spliceDone      spliceEnd = iota // exit delivered, or the CLI went away
	spliceGuestLost                  // the guest stream broke (a rewind?)
)

// switchWriter sends the CLI's frames to the current guest stream; a
// rewind swaps the stream underneath.
type switchWriter struct {
	mu   sync.Mutex
	w    net.Conn
	gone chan struct{}
	once sync.Once
}

func newSwitchWriter(w net.Conn) *switchWriter {
	return &switchWriter{w: w, gone: make(chan struct{})}
}

func (s *switchWriter) Write(p []byte) (int, error) {
	for {
		s.mu.Lock()
		w := s.w
		s.mu.Unlock()
		n, err := w.Write(p)
		if err == nil {
			return n, nil
		}
		// The stream broke: wait a little for its replacement.
		time.Sleep(100 * time.Millisecond)
		s.mu.Lock()
		same := s.w == w
		s.mu.Unlock()
		if same {
			select {
			case <-s.gone:
				return 0, err
			case <-time.After(2 * time.Second):
			}
			s.mu.Lock()
			same = s.w == w
			s.mu.Unlock()
			if same {
				return 0, err
			}
		}
	}
}

func (s *switchWriter) swap(w net.Conn) {
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
}

func (s *switchWriter) cliGone() { s.once.Do(func() { close(s.gone) }) }

// spliceExec copies the guest's frames to the CLI until the exit frame,
// the CLI going away, or the guest stream breaking. If the CLI goes away
// before the process has exited, the process gets SIGHUP, as it would when
// its terminal closes. (The CLI keeps its connection until it has the exit
// frame: stdin EOF is a frame, not a half-close.)
func spliceExec(conn net.Conn, stream net.Conn, toGuest *switchWriter) spliceEnd {
	type result struct {
		end  spliceEnd
		exit bool
	}
	res := make(chan result, 1)
	go func() {
		for {
			f, err := guest.ReadFrame(stream)
			if err != nil {
				res <- result{end: spliceGuestLost}
				return
			}
			last := f.Kind == guest.FrameExit || f.Kind == guest.FrameError
			if err := guest.WriteFrame(conn, f.Kind, f.Payload); err != nil {
				// The CLI went away with output on its way to it: the
				// same hangup as below, or the process runs on unseen.
				if !last {
					hangup(stream)
				}
				res <- result{end: spliceDone}
				return
			}
			if last {
				res <- result{end: spliceDone, exit: true}
				return
			}
		}
	}()
	select {
	case r := <-res:
		return r.end
	case <-toGuest.gone:
		select {
		case r := <-res:
			return r.end
		case <-time.After(100 * time.Millisecond):
			hangup(stream)
			return spliceDone
		}
	}
}

// hangup sends the process on stream SIGHUP, within hangupTimeout; the
// stream is done with after it.
func hangup(stream net.Conn) {
	_ = stream.SetWriteDeadline(time.Now().Add(hangupTimeout))
	_ = guest.WriteFrame(stream, guest.FrameSignal, []byte{byte(syscall.SIGHUP)})
}
