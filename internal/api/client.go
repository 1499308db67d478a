package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/wsync"
)

// Client talks to a sandbox's supervisor.
type Client struct {
	sock string
	http *http.Client
	id   string // the sandbox's identity the caller means; "": any
}

// SandboxIDHeader carries the identity (sandbox.Sandbox.Identity) of the sandbox
// a caller opened: a supervisor that serves another sandbox (one removed
// and re-created under the same name, whose socket is at the same path)
// refuses the request instead of acting on the wrong machine.
const SandboxIDHeader = "Kosa8-Sandbox-Id"

// For returns a client whose every request names the sandbox identity id
// (SandboxIDHeader); "" names none.
func (c *Client) For(id string) *Client {
	cc := *c
	cc.id = id
	return &cc
}

// NewClient returns a client for the supervisor listening on the unix
// socket sock (a sandbox's api.sock).
func NewClient(sock string) *Client {
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
		rd = bytes.NewReader(b)
	}
	resp, err := c.send(ctx, method, path, rd)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeResponse(resp, out)
}

// stream GETs path and returns its body when the supervisor answers 200
// OK, or the error it sent.
func (c *Client) stream(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, "GET", path, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, decodeResponse(resp, nil)
	}
	return resp.Body, nil
}

func (c *Client) send(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://kosa8"+path, body)
	if err != nil {
		return nil, err
	}
	if c.id != "" {
		req.Header.Set(SandboxIDHeader, c.id)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("supervisor: %w", err)
	}
	return resp, nil
}

func decodeResponse(resp *http.Response, out any) error {
	if resp.StatusCode >= 300 {
		var e ExecErrorResponse
		_ = json.NewDecoder(io.LimitReader(resp.Body, MaxBody)).Decode(&e)
		if e.Error == "" {
			e.Error = resp.Status
		}
		if e.ExitCode != 0 {
			return &CommandError{Code: e.ExitCode, Msg: e.Error}
		}
		return errors.New(e.Error)
	}
	if out != nil {
		return json.NewDecoder(io.LimitReader(resp.Body, MaxBody)).Decode(out)
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
	body, err := c.stream(ctx, "/v1/net/refused")
	if err != nil {
		return err
	}
	defer body.Close()
	dec := json.NewDecoder(body)
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
	body, err := c.stream(ctx, "/v1/debug/memory")
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = io.Copy(w, body)
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

// ApproveSeen approves held paths, each only as the version seen (see
// SyncRequest.Seen).
func (c *Client) ApproveSeen(ctx context.Context, seen map[string]*wsync.Entry) ([]string, error) {
	return c.SyncSeen(ctx, "approve", seen)
}

// SyncSeen applies (what "apply") or approves ("approve") the paths of
// seen, each only as the version seen (see SyncRequest.Seen).
func (c *Client) SyncSeen(ctx context.Context, what string, seen map[string]*wsync.Entry) ([]string, error) {
	var out SyncResponse
	paths := slices.Sorted(maps.Keys(seen))
	err := c.do(ctx, "POST", "/v1/sync/"+what, SyncRequest{Paths: paths, Seen: seen}, &out)
	return out.Done, err
}

// ChangeSummary sums up the workspace's pending and held changes.
func (c *Client) ChangeSummary(ctx context.Context) (*ChangeSummary, error) {
	var out ChangeSummary
	err := c.do(ctx, "GET", "/v1/sync/summary", nil, &out)
	return &out, err
}

// Fork takes the checkpoint count forks of the sandbox start from.
func (c *Client) Fork(ctx context.Context, count int, message string) (*checkpoint.Meta, error) {
	var out checkpoint.Meta
	err := c.do(ctx, "POST", "/v1/fork", ForkRequest{Count: count, Message: message}, &out)
	return &out, err
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
	hreq, err := http.NewRequestWithContext(ctx, "POST", "http://kosa8/v1/exec", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", ExecUpgrade)
	if c.id != "" {
		hreq.Header.Set(SandboxIDHeader, c.id)
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("supervisor: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if err := decodeResponse(resp, nil); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("supervisor: exec answered %s, not an upgrade", resp.Status)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, errors.New("supervisor: exec connection not upgraded")
	}
	return &ExecConn{ReadWriteCloser: rwc, ID: resp.Header.Get("Kosa8-Exec-Id"), Pid: resp.Header.Get("Kosa8-Exec-Pid")}, nil
}
