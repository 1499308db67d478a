package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/vmm"
)

// Route is one route of the supervisor's API, served on the sandbox's
// api.sock (mode 0600: the sandbox owner's alone).
type Route struct {
	Pattern string // method and path, as http.ServeMux takes them
	Doc     string // what it takes and answers
}

// Routes is the supervisor's API, every route it serves and nothing else:
// routes() refuses to register a route missing here, and a test checks
// that each one here is registered. Errors answer {"error": "..."} with a
// 4xx or 5xx status.
var Routes = []Route{
	{"GET /v1/status", "StatusResponse: the sandbox's name and Status"},
	{"GET /v1/info", "guest.Info: the guest's kernel, user and workspace, asked of its agent"},
	{"POST /v1/stop", "?kill=1 for no clean poweroff; answers once QEMU is gone"},
	{"POST /v1/pause", "saves the running machine and stops; start resumes it"},
	{"POST /v1/checkpoints", "CheckpointRequest{message} → checkpoint.Meta of the new checkpoint"},
	{"DELETE /v1/checkpoints/{id}", "deletes a checkpoint and the disk layers nothing else uses"},
	{"POST /v1/rewind", "CheckpointRequest{id} → RewindResult; 404 for an unknown checkpoint"},
	{"POST /v1/exec", `guest.ExecRequest JSON with "Upgrade: kosa8-exec" → 101, then exec frames (stdin, stdout, stderr, resize, exit)`},
	{"GET /v1/net", "NetResponse: the allow-list in force"},
	{"POST /v1/net/allow", "NetRequest{rules, allow_broad} → NetResponse"},
	{"POST /v1/net/deny", "NetRequest{rules} → NetResponse"},
	{"POST /v1/net/rm", "NetRequest{rules} → NetResponse; host:port removes that port"},
	{"GET /v1/net/refused", "a stream of the hosts the network refuses, one JSON object a line, as it happens"},
	{"GET /v1/ports", "[]PortForward: the ports forwarded from the host"},
	{"POST /v1/ports", "PortForward → PortForward; 409 when the host port is taken"},
	{"DELETE /v1/ports/{port}", "ends the forward of a host port"},
	{"GET /v1/sync", "SyncStatus: the workspace sync, held and pending changes, quota"},
	{"POST /v1/sync/now", "a sync pass now → SyncStatus"},
	{"POST /v1/sync/apply", "SyncRequest{paths} writes reviewed changes to the host"},
	{"POST /v1/sync/approve", "SyncRequest{paths} writes held changes to the host"},
	{"POST /v1/sync/discard", "SyncRequest{paths} drops held or pending changes"},
	{"GET /v1/debug/memory", "the guest's RAM, paused for a consistent image (the proof no secret is inside)"},
	{"POST /v1/debug/plain-migrate", "PlainMigrate: QEMU's whole-machine migration to a scratch file, the checkpoint benchmark's baseline"},
}

const upgradeProto = "kosa8-exec"

// StatusResponse is /v1/status.
type StatusResponse struct {
	Name   string      `json:"name"`
	Status Status      `json:"status"`
	Guest  *guest.Info `json:"guest,omitempty"`
}

type apiError struct {
	Error string `json:"error"`
}

// execError is apiError for an exec the guest could not start.
type execError struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code,omitempty"` // 126 or 127
}

// CommandError is an exec the guest could not start: Code is 127 when the
// command was not found, 126 when it cannot be run.
type CommandError struct {
	Code int
	Msg  string
}

func (e *CommandError) Error() string { return e.Msg }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *supervisor) routes() http.Handler {
	mux, _ := s.routeMux()
	return mux
}

// routeMux registers the API's handlers, each only if Routes documents it,
// and returns the patterns it registered.
func (s *supervisor) routeMux() (*http.ServeMux, []string) {
	mux := &documentedMux{ServeMux: http.NewServeMux()}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, StatusResponse{Name: s.sb.Config.Name, Status: s.getStatus()})
	})
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		info, err := s.currentClient().Info(r.Context())
		if err != nil {
			writeJSON(w, http.StatusBadGateway, apiError{err.Error()})
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
		s.requestStop(stopRequest{pause: true, done: done})
		select {
		case err := <-done:
			if err != nil {
				writeJSON(w, http.StatusInternalServerError, apiError{"pause: " + err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, struct{}{})
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("POST /v1/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		var req CheckpointRequest
		if !decodeBody(w, r, &req) {
			return
		}
		meta, err := s.checkpoint(r.Context(), req.Message, "manual")
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, apiError{"checkpoint: " + err.Error()})
			return
		}
		s.enforceRetention()
		writeJSON(w, http.StatusOK, meta)
	})
	mux.HandleFunc("POST /v1/rewind", func(w http.ResponseWriter, r *http.Request) {
		var req CheckpointRequest
		if !decodeBody(w, r, &req) {
			return
		}
		res, err := s.rewind(r.Context(), req.ID)
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, checkpoint.ErrNotFound) {
				code = http.StatusNotFound
			}
			writeJSON(w, code, apiError{"rewind: " + err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("DELETE /v1/checkpoints/{id}", func(w http.ResponseWriter, r *http.Request) {
		s.cpMu.Lock()
		err := deleteCheckpoint(s.sb, r.PathValue("id"))
		if err == nil {
			s.dropRewindRAM(r.PathValue("id"))
		}
		s.cpMu.Unlock()
		if err != nil {
			writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
	})
	mux.HandleFunc("POST /v1/exec", s.handleExec)
	mux.HandleFunc("GET /v1/net", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, NetResponse{Rules: ruleTexts(s.net.gw.Policy())})
	})
	mux.HandleFunc("POST /v1/net/allow", netChange(func(req NetRequest) (*netpolicy.Policy, error) { return s.net.allow(req.Rules, req.AllowBroad) }))
	mux.HandleFunc("POST /v1/net/deny", netChange(func(req NetRequest) (*netpolicy.Policy, error) { return s.net.deny(req.Rules) }))
	mux.HandleFunc("GET /v1/net/refused", func(w http.ResponseWriter, r *http.Request) {
		// A stream for 'kosa8 net approve': one JSON object a line per
		// refused host, as it happens.
		w.Header().Set("Content-Type", "application/x-ndjson")
		rc := http.NewResponseController(w)
		_ = s.net.streamRefused(r.Context(), w, func() { _ = rc.Flush() })
	})
	mux.HandleFunc("POST /v1/net/rm", netChange(func(req NetRequest) (*netpolicy.Policy, error) { return s.net.remove(req.Rules) }))
	mux.HandleFunc("GET /v1/debug/memory", s.handleMemory)
	mux.HandleFunc("POST /v1/debug/plain-migrate", s.handlePlainMigrate)
	mux.HandleFunc("GET /v1/sync", func(w http.ResponseWriter, r *http.Request) {
		if s.ws == nil {
			writeJSON(w, http.StatusNotFound, apiError{"this sandbox has no workspace"})
			return
		}
		writeJSON(w, http.StatusOK, SyncStatus{Path: s.sb.Config.Workspace.Path, Status: s.ws.engine.Status()})
	})
	mux.HandleFunc("POST /v1/sync/now", func(w http.ResponseWriter, r *http.Request) {
		if s.ws == nil {
			writeJSON(w, http.StatusNotFound, apiError{"this sandbox has no workspace"})
			return
		}
		s.ws.syncNow(r.Context(), nil)
		writeJSON(w, http.StatusOK, SyncStatus{Path: s.sb.Config.Workspace.Path, Status: s.ws.engine.Status()})
	})
	mux.HandleFunc("POST /v1/sync/apply", func(w http.ResponseWriter, r *http.Request) { s.handleSyncChange(w, r, "apply") })
	mux.HandleFunc("POST /v1/sync/approve", func(w http.ResponseWriter, r *http.Request) { s.handleSyncChange(w, r, "approve") })
	mux.HandleFunc("POST /v1/sync/discard", func(w http.ResponseWriter, r *http.Request) { s.handleSyncChange(w, r, "discard") })
	mux.HandleFunc("GET /v1/ports", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.net.ports())
	})
	mux.HandleFunc("POST /v1/ports", func(w http.ResponseWriter, r *http.Request) {
		var pf PortForward
		if !decodeBody(w, r, &pf) {
			return
		}
		if err := s.net.addForward(pf, true); err != nil {
			code := http.StatusBadRequest
			if errors.Is(err, ErrPortInUse) {
				code = http.StatusConflict
			}
			writeJSON(w, code, apiError{err.Error()})
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
			writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s.net.ports())
	})
	return mux.ServeMux, mux.registered
}

// netChange is a route that changes the allow-list: a NetRequest in, the
// rules in force out.
func netChange(change func(NetRequest) (*netpolicy.Policy, error)) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		var req NetRequest
		if !decodeBody(w, r, &req) {
			return
		}
		p, err := change(req)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, NetResponse{Rules: ruleTexts(p)})
	}
}

// documentedMux registers a handler only for a route Routes documents.
type documentedMux struct {
	*http.ServeMux
	registered []string
}

func (m *documentedMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	if !slices.ContainsFunc(Routes, func(r Route) bool { return r.Pattern == pattern }) {
		panic("api route " + pattern + " is not in Routes: document it there")
	}
	m.registered = append(m.registered, pattern)
	m.ServeMux.HandleFunc(pattern, h)
}

// SyncRequest names workspace paths.
type SyncRequest struct {
	Paths []string `json:"paths"`
}

// SyncResponse lists the paths done.
type SyncResponse struct {
	Done []string `json:"done"`
}

func (s *supervisor) handleSyncChange(w http.ResponseWriter, r *http.Request, what string) {
	if s.ws == nil {
		writeJSON(w, http.StatusNotFound, apiError{"this sandbox has no workspace"})
		return
	}
	var req SyncRequest
	if !decodeBody(w, r, &req) {
		return
	}
	// Not during a checkpoint or a rewind: this scans the guest, which
	// they pause (a rewind would wait on the engine this holds).
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	resume := s.ws.Pause()
	defer resume()
	var done []string
	var err error
	switch what {
	case "apply":
		done, err = s.ws.engine.Apply(r.Context(), req.Paths, false)
	case "approve":
		if len(req.Paths) == 0 {
			err = errors.New("approve needs the paths to approve, one by one")
			break
		}
		done, err = s.ws.engine.Apply(r.Context(), req.Paths, true)
	case "discard":
		done, err = s.ws.engine.Discard(r.Context(), req.Paths)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	if done == nil {
		done = []string{}
	}
	writeJSON(w, http.StatusOK, SyncResponse{Done: done})
}

// handleMemory streams the guest's RAM, paused for a consistent image:
// the proof that no secret is inside is a scan of it. The API socket is
// the sandbox owner's alone.
func (s *supervisor) handleMemory(w http.ResponseWriter, r *http.Request) {
	m, err := snapshotter(s.currentMachine())
	if err != nil {
		writeJSON(w, http.StatusNotImplemented, apiError{err.Error()})
		return
	}
	ram := m.RAM()
	st, err := ram.Stat()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	if err := m.Pause(r.Context()); err != nil {
		writeJSON(w, http.StatusBadGateway, apiError{err.Error()})
		return
	}
	defer m.Resume(context.Background())
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
	_, _ = io.Copy(w, io.NewSectionReader(ram, 0, st.Size()))
}

// PlainMigrate is the baseline a checkpoint is measured against: QEMU's
// own migration of the whole machine, RAM included, to a file.
type PlainMigrate struct {
	PauseMillis float64 `json:"pause_ms"`
	Bytes       int64   `json:"bytes"`
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
		writeJSON(w, http.StatusNotImplemented, apiError{err.Error()})
		return
	}
	full, ok := mach.(vmm.FullSaver)
	if !ok {
		writeJSON(w, http.StatusNotImplemented, apiError{"a whole-machine save: " + vmm.ErrNotSupported.Error()})
		return
	}
	f, err := os.CreateTemp(s.sb.Dir, ".plain-migrate-*")
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
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
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	st, _ := f.Stat()
	writeJSON(w, http.StatusOK, PlainMigrate{PauseMillis: msSince(start), Bytes: st.Size()})
}

// maxRequestBody bounds JSON request bodies.
const maxRequestBody = 1 << 20

// CheckpointRequest names a checkpoint or describes a new one.
type CheckpointRequest struct {
	ID      string `json:"id,omitempty"`
	Message string `json:"message,omitempty"`
}

// NetRequest changes the allow-list.
type NetRequest struct {
	Rules      []string `json:"rules"`
	AllowBroad bool     `json:"allow_broad,omitempty"`
}

// NetResponse is the allow-list in force.
type NetResponse struct {
	Rules   []string `json:"rules"`
	Removed int      `json:"removed,omitempty"`
}

func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	d := json.NewDecoder(io.LimitReader(r.Body, maxRequestBody))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{"bad request: " + err.Error()})
		return false
	}
	return true
}

func (s *supervisor) handleExec(w http.ResponseWriter, r *http.Request) {
	var req guest.ExecRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxRequestBody)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{"bad exec request: " + err.Error()})
		return
	}
	base, err := s.sb.GuestEnv()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	req.Env = append(base, req.Env...)
	if req.Dir == "" && s.sb.Config.Workspace != nil {
		req.Dir = s.sb.Config.Workspace.Path // commands start in the project folder
	}
	if r.Header.Get("Upgrade") != upgradeProto {
		writeJSON(w, http.StatusBadRequest, apiError{"exec needs Upgrade: " + upgradeProto})
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
		writeJSON(w, code, execError{Error: err.Error(), ExitCode: exit})
		return
	}
	defer stream.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, apiError{"connection cannot be upgraded"})
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\nKosa8-Exec-Id: %s\r\nKosa8-Exec-Pid: %d\r\n\r\n", upgradeProto, resp.ID, resp.Pid)
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
			if err := guest.WriteFrame(conn, f.Kind, f.Payload); err != nil {
				res <- result{end: spliceDone}
				return
			}
			if f.Kind == guest.FrameExit || f.Kind == guest.FrameError {
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
			_ = guest.WriteFrame(stream, guest.FrameSignal, []byte{byte(syscall.SIGHUP)})
			return spliceDone
		}
	}
}

// Client talks to a sandbox's supervisor.
type Client struct {
	sock string
	http *http.Client
}

// NewClient returns a client for the supervisor of sb.
func NewClient(sb *Sandbox) *Client {
	sock := sb.Path(APISocket)
	return &Client{sock: sock, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}}
}

func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytesReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://kosa8"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	defer resp.Body.Close()
	return decodeResponse(resp, out)
}

func decodeResponse(resp *http.Response, out any) error {
	if resp.StatusCode >= 300 {
		var e execError
		_ = json.NewDecoder(io.LimitReader(resp.Body, maxRequestBody)).Decode(&e)
		if e.Error == "" {
			e.Error = resp.Status
		}
		if e.ExitCode != 0 {
			return &CommandError{Code: e.ExitCode, Msg: e.Error}
		}
		return errors.New(e.Error)
	}
	if out != nil {
		return json.NewDecoder(io.LimitReader(resp.Body, maxRequestBody)).Decode(out)
	}
	return nil
}

// Status asks the supervisor for the sandbox's status.
func (c *Client) Status(ctx context.Context) (*StatusResponse, error) {
	var out StatusResponse
	return &out, c.do(ctx, "GET", "/v1/status", nil, &out)
}

// Info asks the guest agent for its Info.
func (c *Client) Info(ctx context.Context) (*guest.Info, error) {
	var out guest.Info
	return &out, c.do(ctx, "GET", "/v1/info", nil, &out)
}

// Stop deadlines: a supervisor's stop is bounded (a last sync pass, a
// poweroff, then SIGKILL); one that overruns these is wedged, and the
// caller ends it (its QEMU dies with it).
const (
	stopTimeout = 3 * time.Minute
	killTimeout = 30 * time.Second
)

// Stop stops the sandbox and returns once its VM is gone, or with an
// error once the supervisor overran its deadline.
func (c *Client) Stop(ctx context.Context, kill bool) error {
	p, d := "/v1/stop", stopTimeout
	if kill {
		p, d = p+"?kill=1", killTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return c.do(ctx, "POST", p, nil, nil)
}

// Allow adds rules to a running sandbox's allow-list.
func (c *Client) Allow(ctx context.Context, rules []string, broad bool) ([]string, error) {
	var out NetResponse
	err := c.do(ctx, "POST", "/v1/net/allow", NetRequest{Rules: rules, AllowBroad: broad}, &out)
	return out.Rules, err
}

// Deny adds deny rules (which win over allow rules) to a running
// sandbox's policy.
func (c *Client) Deny(ctx context.Context, targets []string) ([]string, error) {
	var out NetResponse
	err := c.do(ctx, "POST", "/v1/net/deny", NetRequest{Rules: targets}, &out)
	return out.Rules, err
}

// RemoveRules removes the rules for targets from a running sandbox's
// policy; a target no rule has is an error.
func (c *Client) RemoveRules(ctx context.Context, targets []string) ([]string, error) {
	var out NetResponse
	err := c.do(ctx, "POST", "/v1/net/rm", NetRequest{Rules: targets}, &out)
	return out.Rules, err
}

// Refused calls f with each host the sandbox is refused, as it happens,
// until ctx ends or f returns an error.
func (c *Client) Refused(ctx context.Context, f func(Blocked) error) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://kosa8/v1/net/refused", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return decodeResponse(resp, nil)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var b Blocked
		if err := dec.Decode(&b); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("supervisor stream: %w", err)
		}
		if err := f(b); err != nil {
			return err
		}
	}
}

// Ports lists a running sandbox's port forwards.
func (c *Client) Ports(ctx context.Context) ([]PortForward, error) {
	var out []PortForward
	err := c.do(ctx, "GET", "/v1/ports", nil, &out)
	return out, err
}

// AddPort forwards a host port into a running sandbox.
func (c *Client) AddPort(ctx context.Context, pf PortForward) ([]PortForward, error) {
	var out []PortForward
	err := c.do(ctx, "POST", "/v1/ports", pf, &out)
	return out, err
}

// RemovePort stops forwarding a host port.
func (c *Client) RemovePort(ctx context.Context, hostPort uint16) ([]PortForward, error) {
	var out []PortForward
	err := c.do(ctx, "DELETE", "/v1/ports/"+strconv.Itoa(int(hostPort)), nil, &out)
	return out, err
}

// Memory streams the guest's RAM (the VM is paused meanwhile) to w.
func (c *Client) Memory(ctx context.Context, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://kosa8/v1/debug/memory", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return decodeResponse(resp, nil)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// Sync returns the workspace sync's status (now: after a full pass).
func (c *Client) Sync(ctx context.Context, now bool) (*SyncStatus, error) {
	var out SyncStatus
	if now {
		return &out, c.do(ctx, "POST", "/v1/sync/now", nil, &out)
	}
	return &out, c.do(ctx, "GET", "/v1/sync", nil, &out)
}

// SyncChange applies, approves or discards workspace paths.
func (c *Client) SyncChange(ctx context.Context, what string, paths []string) ([]string, error) {
	var out SyncResponse
	err := c.do(ctx, "POST", "/v1/sync/"+what, SyncRequest{Paths: paths}, &out)
	return out.Done, err
}

// Checkpoint saves the running machine.
func (c *Client) Checkpoint(ctx context.Context, message string) (*checkpoint.Meta, error) {
	var out checkpoint.Meta
	err := c.do(ctx, "POST", "/v1/checkpoints", CheckpointRequest{Message: message}, &out)
	return &out, err
}

// Rewind returns the machine to a checkpoint.
func (c *Client) Rewind(ctx context.Context, id string) (*RewindResult, error) {
	var out RewindResult
	err := c.do(ctx, "POST", "/v1/rewind", CheckpointRequest{ID: id}, &out)
	return &out, err
}

// DeleteCheckpoint removes a checkpoint of a running sandbox.
func (c *Client) DeleteCheckpoint(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/checkpoints/"+url.PathEscape(id), nil, nil)
}

// Pause writes the machine out to a checkpoint and stops it.
func (c *Client) Pause(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/pause", nil, nil)
}

// ExecConn is an upgraded exec connection: frames both ways.
type ExecConn struct {
	io.ReadWriteCloser
	ID  string
	Pid string
}

// Exec starts a process in the guest and returns its frame stream.
func (c *Client) Exec(ctx context.Context, req *guest.ExecRequest) (*ExecConn, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, "POST", "http://kosa8/v1/exec", bytesReader(b))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", upgradeProto)
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("supervisor: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, decodeResponse(resp, nil)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, errors.New("supervisor: exec connection not upgraded")
	}
	return &ExecConn{ReadWriteCloser: rwc, ID: resp.Header.Get("Kosa8-Exec-Id"), Pid: resp.Header.Get("Kosa8-Exec-Pid")}, nil
}
