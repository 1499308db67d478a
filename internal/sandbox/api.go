package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/guest"
)

// The supervisor's API, on api.sock:
//
//	GET  /v1/status          StatusResponse
//	POST /v1/exec            ExecRequest JSON; "Upgrade: kosa8-exec" → 101, then exec frames
//	POST /v1/stop?kill=1     stop (clean poweroff unless kill); answers once QEMU is gone
//	GET  /v1/info            the guest's Info

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

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *supervisor) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, StatusResponse{Name: s.sb.Config.Name, Status: s.getStatus()})
	})
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		info, err := s.client.Info(r.Context())
		if err != nil {
			writeJSON(w, http.StatusBadGateway, apiError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("POST /v1/stop", func(w http.ResponseWriter, r *http.Request) {
		s.requestStop(r.URL.Query().Get("kill") == "1")
		select {
		case <-s.machine.Done():
			writeJSON(w, http.StatusOK, struct{}{})
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("POST /v1/exec", s.handleExec)
	mux.HandleFunc("GET /v1/net", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, NetResponse{Rules: ruleTexts(s.net.gw.Policy())})
	})
	mux.HandleFunc("POST /v1/net/allow", func(w http.ResponseWriter, r *http.Request) {
		var req NetRequest
		if !decodeBody(w, r, &req) {
			return
		}
		p, err := s.net.allow(req.Rules, req.AllowBroad)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, NetResponse{Rules: ruleTexts(p)})
	})
	mux.HandleFunc("POST /v1/net/deny", func(w http.ResponseWriter, r *http.Request) {
		var req NetRequest
		if !decodeBody(w, r, &req) {
			return
		}
		p, n, err := s.net.deny(req.Rules)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, NetResponse{Rules: ruleTexts(p), Removed: n})
	})
	mux.HandleFunc("GET /v1/debug/memory", s.handleMemory)
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
	return mux
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
	ram := s.machine.RAM()
	st, err := ram.Stat()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	q := s.machine.QMP()
	if err := q.Execute(r.Context(), "stop", nil, nil); err != nil {
		writeJSON(w, http.StatusBadGateway, apiError{err.Error()})
		return
	}
	defer q.Execute(context.Background(), "cont", nil, nil)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
	_, _ = io.Copy(w, io.NewSectionReader(ram, 0, st.Size()))
}

// maxRequestBody bounds JSON request bodies.
const maxRequestBody = 1 << 20

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
	stream, resp, err := s.client.Exec(r.Context(), &req)
	if err != nil {
		code := http.StatusBadGateway
		var ae *guest.AgentError
		if errors.As(err, &ae) {
			code = http.StatusUnprocessableEntity
		}
		writeJSON(w, code, apiError{err.Error()})
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
	spliceExec(conn, brw.Reader, stream)
}

// spliceExec joins the CLI's connection to the guest's exec stream. If the
// CLI goes away before the process has exited, the process gets SIGHUP, as
// it would when its terminal closes.
func spliceExec(conn net.Conn, fromCLI *bufio.Reader, stream net.Conn) {
	var once sync.Once
	exited := make(chan struct{})
	cliGone := make(chan struct{})
	go func() {
		_, _ = io.Copy(stream, fromCLI)
		close(cliGone)
	}()
	go func() {
		defer once.Do(func() { close(exited) })
		for {
			f, err := guest.ReadFrame(stream)
			if err != nil {
				return
			}
			if err := guest.WriteFrame(conn, f.Kind, f.Payload); err != nil {
				return
			}
			if f.Kind == guest.FrameExit || f.Kind == guest.FrameError {
				return
			}
		}
	}()
	select {
	case <-exited:
	case <-cliGone:
		// The CLI keeps its connection open until it has the exit frame
		// (stdin EOF is a frame, not a half-close), so a connection that
		// ends first means the CLI is gone; allow for the exit frame being
		// just delivered.
		select {
		case <-exited:
		case <-time.After(100 * time.Millisecond):
			_ = guest.WriteFrame(stream, guest.FrameSignal, []byte{byte(syscall.SIGHUP)})
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
		var e apiError
		_ = json.NewDecoder(io.LimitReader(resp.Body, maxRequestBody)).Decode(&e)
		if e.Error == "" {
			e.Error = resp.Status
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

// Stop stops the sandbox and returns once its VM is gone.
func (c *Client) Stop(ctx context.Context, kill bool) error {
	p := "/v1/stop"
	if kill {
		p += "?kill=1"
	}
	return c.do(ctx, "POST", p, nil, nil)
}

// Allow adds rules to a running sandbox's allow-list.
func (c *Client) Allow(ctx context.Context, rules []string, broad bool) ([]string, error) {
	var out NetResponse
	err := c.do(ctx, "POST", "/v1/net/allow", NetRequest{Rules: rules, AllowBroad: broad}, &out)
	return out.Rules, err
}

// Deny removes rules from a running sandbox's allow-list.
func (c *Client) Deny(ctx context.Context, targets []string) (*NetResponse, error) {
	var out NetResponse
	err := c.do(ctx, "POST", "/v1/net/deny", NetRequest{Rules: targets}, &out)
	return &out, err
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
