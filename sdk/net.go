package sdk

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/audit"
	"github.com/kosa8/kosa8/internal/netpolicy"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/wsync"
)

// Rules lists the sandbox's network allow-list.
func (s *Sandbox) Rules(ctx context.Context) ([]string, error) {
	p, err := s.sb.LoadPolicy()
	if err != nil {
		return nil, err
	}
	return ruleTexts(p), nil
}

func ruleTexts(p *netpolicy.Policy) []string {
	out := []string{}
	for _, r := range p.Rules {
		out = append(out, r.Text)
	}
	return out
}

// Allow adds rules to the allow-list, for new connections at once (a
// stopped sandbox keeps them for its next start), and returns the list.
// Rules matching a whole public suffix or everything are refused: use
// AllowBroad for those. A pin (pin:NAME, for a name that resolves to a
// private or documentation address, as behind a corporate proxy) is
// resolved on the host now and kept with its addresses: the sandbox then
// reaches NAME at exactly those, and never resolves it again.
func (s *Sandbox) Allow(ctx context.Context, rules ...string) ([]string, error) {
	return s.allow(ctx, rules, false)
}

// AllowBroad is Allow that accepts rules like *.com or *.
func (s *Sandbox) AllowBroad(ctx context.Context, rules ...string) ([]string, error) {
	return s.allow(ctx, rules, true)
}

func (s *Sandbox) allow(ctx context.Context, rules []string, broad bool) ([]string, error) {
	if s.sb.Alive() {
		return s.sb.Client().Allow(ctx, rules, broad)
	}
	return stopped(sandbox.AllowStopped(ctx, s.sb, rules, broad))
}

// Deny adds deny rules for hosts, wildcards or ranges: a deny rule wins
// over every allow rule. It returns the rules now in force.
func (s *Sandbox) Deny(ctx context.Context, targets ...string) ([]string, error) {
	if s.sb.Alive() {
		return s.sb.Client().Deny(ctx, targets)
	}
	return stopped(sandbox.DenyStopped(s.sb, targets))
}

// Remove takes away the rules (allow or deny, the latter written
// deny:TARGET) for hosts, wildcards or ranges and returns the rules left.
// A target no rule has is an error, and then nothing is removed.
func (s *Sandbox) Remove(ctx context.Context, targets ...string) ([]string, error) {
	if s.sb.Alive() {
		return s.sb.Client().RemoveRules(ctx, targets)
	}
	return stopped(sandbox.RemoveStopped(s.sb, targets))
}

// stopped is the rules a stopped sandbox's edit left.
func stopped(p *netpolicy.Policy, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return ruleTexts(p), nil
}

// Blocked is a host the sandbox asked for and was refused.
type Blocked struct {
	Host  string    `json:"host"`           // a name, or a raw address
	Port  uint16    `json:"port,omitempty"` // 0: only looked up in DNS
	Rule  string    `json:"rule"`           // what Allow would take to let it through
	Count int       `json:"count"`
	Last  time.Time `json:"last"`
	// Address is the address refused: a raw connection's, or those an
	// allowed name resolved to that only a pin reaches (Rule is then
	// pin:NAME, which Allow resolves and pins).
	Address string `json:"address,omitempty"`
	Why     string `json:"why,omitempty"` // why it was refused, in words
	// DenyRule is the deny rule refusing it, if one does: Remove of it
	// lifts the refusal.
	DenyRule string `json:"deny_rule,omitempty"`
}

// Blocked lists the hosts the sandbox was refused that its allow-list
// still refuses, each with the rule that would allow it.
func (s *Sandbox) Blocked(ctx context.Context) ([]Blocked, error) {
	pol, err := s.sb.LoadPolicy()
	if err != nil {
		return nil, err
	}
	events, err := audit.Read(s.sb.Path(sandbox.AuditLog))
	if err != nil {
		return nil, err
	}
	out := []Blocked{}
	for _, b := range sandbox.BlockedHosts(events, pol) {
		out = append(out, Blocked(b))
	}
	return out, nil
}

// WatchRefused calls f with each host the running sandbox is refused, as
// it happens, that its rules still refuse (each refusal, so a host may come
// more than once; Count is 1), until ctx ends (then it returns nil) or f
// returns an error (which it returns). f may call Allow: the host is then
// let through for the connections that follow.
func (s *Sandbox) WatchRefused(ctx context.Context, f func(Blocked) error) error {
	client, err := s.client()
	if err != nil {
		return err
	}
	return client.Refused(ctx, func(b api.Blocked) error {
		return f(Blocked(b))
	})
}

// NetEvent is one network decision of the sandbox's audit log.
type NetEvent struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"` // dns, tcp, udp, icmp, ipv6, policy, …
	Name     string    `json:"name,omitempty"`
	Dest     string    `json:"dest,omitempty"` // ip:port as the guest addressed it
	Decision string    `json:"decision,omitempty"`
	Rule     string    `json:"rule,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	BytesOut int64     `json:"bytes_out,omitempty"`
	BytesIn  int64     `json:"bytes_in,omitempty"`
}

// NetLog returns the sandbox's network decisions, oldest first.
func (s *Sandbox) NetLog(ctx context.Context) ([]NetEvent, error) {
	events, err := audit.Read(s.sb.Path(sandbox.AuditLog))
	if err != nil {
		return nil, err
	}
	out := make([]NetEvent, 0, len(events))
	for _, e := range events {
		out = append(out, NetEvent{Time: e.Time, Kind: e.Kind, Name: e.Name, Dest: e.Dest, Decision: e.Decision,
			Rule: e.Rule, Reason: e.Reason, BytesOut: e.BytesOut, BytesIn: e.BytesIn})
	}
	return out, nil
}

// Port forwards a host port to a port of the guest.
type Port struct {
	HostPort  uint16 `json:"host_port"`
	GuestPort uint16 `json:"guest_port"`
	// AllInterfaces listens on every host interface, not only 127.0.0.1.
	AllInterfaces bool `json:"all_interfaces,omitempty"`
}

func toPorts(in []api.PortForward) []Port {
	out := []Port{}
	for _, p := range in {
		out = append(out, Port(p))
	}
	return out
}

// Ports lists the sandbox's port forwards.
func (s *Sandbox) Ports(ctx context.Context) ([]Port, error) {
	if s.sb.Alive() {
		p, err := s.sb.Client().Ports(ctx)
		return toPorts(p), err
	}
	p, err := s.sb.LoadPorts()
	return toPorts(p), err
}

// AddPort forwards a host port to the guest, at once when running, else
// from the next start.
func (s *Sandbox) AddPort(ctx context.Context, p Port) error {
	pf := api.PortForward(p)
	if pf.GuestPort == 0 {
		pf.GuestPort = pf.HostPort
	}
	if pf.HostPort == 0 {
		return fmt.Errorf("port forward %s: the host port must be set", pf)
	}
	if s.sb.Alive() {
		_, err := s.sb.Client().AddPort(ctx, pf)
		return err
	}
	return sandbox.AddPortStopped(s.sb, pf)
}

// RemovePort stops forwarding a host port.
func (s *Sandbox) RemovePort(ctx context.Context, hostPort uint16) error {
	if s.sb.Alive() {
		_, err := s.sb.Client().RemovePort(ctx, hostPort)
		return err
	}
	return sandbox.RemovePortStopped(s.sb, hostPort)
}

// SyncStatus is the state of the workspace sync.
type SyncStatus struct {
	Path     string    `json:"path"`  // the host folder
	Files    int       `json:"files"` // paths in step
	LastSync time.Time `json:"last_sync"`
	// Pending changes wait for review (CreateOptions.Review); Held ones
	// touch files host tools run or obey and wait for `kosa8 approve`.
	Pending   []SyncChange   `json:"pending"`
	Held      []SyncChange   `json:"held"`
	Conflicts []SyncConflict `json:"conflicts"`
	Skipped   []string       `json:"skipped"` // too large, special files, refused names
	Errors    []string       `json:"errors"`
	Quota     SyncQuota      `json:"quota"`
}

// SyncChange is a change the sync has not written to the host.
type SyncChange struct {
	Path string `json:"path"`
	Kind string `json:"kind"` // added, modified, deleted
	// Why a held change is held; "review" for one waiting for review.
	Why string `json:"why,omitempty"`
	// The sandbox's side of the path: Type is file, dir, link or other
	// (empty when deleted), Size a file's size, Link a link's target.
	Type string `json:"type,omitempty"`
	Size int64  `json:"size,omitempty"`
	Link string `json:"link,omitempty"`
	// Hash is a file's SHA-256 (hex) and Mode its permission bits, as the
	// sync scanned it: ApproveShown writes a change only while it is so.
	Hash string      `json:"hash,omitempty"`
	Mode fs.FileMode `json:"mode,omitempty"`
}

// SyncQuota is how much the sandbox has made in the host folder against
// its limits (a zero MaxBytes: no limit).
type SyncQuota struct {
	Bytes    int64 `json:"bytes"`
	MaxBytes int64 `json:"max_bytes"`
	Files    int   `json:"files"`
	MaxFiles int   `json:"max_files"`
	// Refused counts writes refused because they would pass a limit.
	Refused int `json:"refused,omitempty"`
}

// SyncConflict is a path both sides changed; your version stayed and the
// sandbox's is in Copy.
type SyncConflict struct {
	Path string    `json:"path"`
	Copy string    `json:"copy"`
	Time time.Time `json:"time"`
}

// SyncStatus reports the workspace sync of the running sandbox; with now,
// after comparing the whole folder.
func (s *Sandbox) SyncStatus(ctx context.Context, now bool) (*SyncStatus, error) {
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	st, err := client.Sync(ctx, now)
	if err != nil {
		return nil, err
	}
	conv := func(in []wsync.Change) []SyncChange {
		out := []SyncChange{}
		for _, c := range in {
			sc := SyncChange{Path: c.Path, Kind: c.Kind, Why: c.Why}
			if g := c.Guest; g != nil {
				sc.Type, sc.Size, sc.Link, sc.Hash, sc.Mode = entryType(g.Type), g.Size, g.Link, g.Hash, g.Mode
			}
			out = append(out, sc)
		}
		return out
	}
	out := &SyncStatus{Path: st.Path, Files: st.Files, LastSync: st.LastSync, Pending: conv(st.Pending), Held: conv(st.Held),
		Conflicts: []SyncConflict{}, Skipped: st.Skipped, Errors: st.Errors, Quota: SyncQuota(st.Quota)}
	for _, c := range st.Conflicts {
		out.Conflicts = append(out.Conflicts, SyncConflict{Path: c.Path, Copy: c.Copy, Time: c.Time})
	}
	return out, nil
}

func entryType(t byte) string {
	switch t {
	case 'f':
		return "file"
	case 'd':
		return "dir"
	case 'l':
		return "link"
	}
	return "other"
}

// ApplyChanges writes the sandbox's changes waiting for review
// (CreateOptions.Review) to the host folder: those at paths (each must be
// one), or all of them. It returns the paths written.
func (s *Sandbox) ApplyChanges(ctx context.Context, paths ...string) ([]string, error) {
	return s.syncChange(ctx, "apply", paths)
}

// ApproveChanges writes held changes (to files host tools run or obey,
// see SyncStatus.Held) to the host folder. Each path must be named: there
// is no approving all at once. It returns the paths written.
func (s *Sandbox) ApproveChanges(ctx context.Context, paths ...string) ([]string, error) {
	return s.syncChange(ctx, "approve", paths)
}

// ApproveShown approves held changes as they were shown to the user (from
// SyncStatus.Held): each is written only if the sandbox's version is still
// the one described (type, content hash, mode, link), so a guest that sees
// its file being read for a diff cannot swap in another before the answer.
// The others are refused, named in the error. It returns the paths written.
func (s *Sandbox) ApproveShown(ctx context.Context, shown ...SyncChange) ([]string, error) {
	if len(shown) == 0 {
		return nil, errors.New("approve needs the changes to approve, one by one")
	}
	return s.syncShown(ctx, "approve", shown)
}

// ApplyShown applies changes waiting for review as they were shown to the
// user (from SyncStatus.Pending), as ApproveShown approves held ones: a
// change the sandbox made again since is refused, not written.
func (s *Sandbox) ApplyShown(ctx context.Context, shown ...SyncChange) ([]string, error) {
	if len(shown) == 0 {
		return nil, errors.New("nothing to apply")
	}
	return s.syncShown(ctx, "apply", shown)
}

func (s *Sandbox) syncShown(ctx context.Context, what string, shown []SyncChange) ([]string, error) {
	seen := map[string]*wsync.Entry{}
	for _, c := range shown {
		var e *wsync.Entry
		switch c.Type {
		case "": // deleted
		case "file":
			e = &wsync.Entry{Path: c.Path, Type: 'f', Size: c.Size, Hash: c.Hash, Mode: c.Mode}
		case "dir":
			e = &wsync.Entry{Path: c.Path, Type: 'd', Mode: c.Mode}
		case "link":
			e = &wsync.Entry{Path: c.Path, Type: 'l', Link: c.Link}
		default:
			return nil, fmt.Errorf("%s is a %s: nothing to %s", c.Path, c.Type, what)
		}
		seen[c.Path] = e
	}
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	return client.SyncSeen(ctx, what, seen)
}

// DiscardChanges undoes, inside the sandbox, its changes that have not
// reached the host folder (pending or held): those at paths, or all of
// them. It returns the paths undone.
func (s *Sandbox) DiscardChanges(ctx context.Context, paths ...string) ([]string, error) {
	return s.syncChange(ctx, "discard", paths)
}

func (s *Sandbox) syncChange(ctx context.Context, what string, paths []string) ([]string, error) {
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	return client.SyncChange(ctx, what, paths)
}

// AccessRequest is a request for a host that only the user can grant.
type AccessRequest struct {
	Time   time.Time `json:"time"`
	Rule   string    `json:"rule"` // normalised, as Allow takes it
	Reason string    `json:"reason,omitempty"`
	// Command is what the user runs to grant it.
	Command string `json:"command"`
}

// netRequests is the file in the state directory that keeps the requests.
const netRequests = "net-requests.jsonl"

// RequestNetAccess records that the sandbox's agent asks for a host, for
// the user to decide; it allows nothing. The request is appended to
// net-requests.jsonl in the sandbox's state directory and returned with
// the command that grants it. Rules matching a whole public suffix or
// everything are refused.
func (s *Sandbox) RequestNetAccess(ctx context.Context, rule, reason string) (*AccessRequest, error) {
	r, err := netpolicy.ParseRule(rule, netpolicy.ParseOptions{})
	if err != nil {
		return nil, err
	}
	if r.Pinned && len(r.Pin) > 0 {
		// The addresses of a pin are what the name resolves to on the
		// user's machine when they add it, never what the asker names.
		return nil, fmt.Errorf("ask for pin:%s without addresses: a pin holds what the name resolves to on the user's machine", r.Host)
	}
	if len(reason) > 1024 {
		reason = reason[:1024]
	}
	arg := r.Text
	if strings.ContainsAny(arg, "*?[") {
		arg = "'" + arg + "'" // a rule holds no quote: ParseRule normalised it
	}
	req := &AccessRequest{Time: time.Now().UTC(), Rule: r.Text, Reason: strings.ToValidUTF8(reason, "?"),
		Command: "kosa8 net allow " + s.Name() + " " + arg}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(s.sb.Path(netRequests), os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("record the request: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("record the request: %w", err)
	}
	return req, nil
}

// NetRequests lists the requests RequestNetAccess recorded, oldest first.
func (s *Sandbox) NetRequests(ctx context.Context) ([]AccessRequest, error) {
	f, err := os.OpenFile(s.sb.Path(netRequests), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return []AccessRequest{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := []AccessRequest{}
	sc := bufio.NewScanner(io.LimitReader(f, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		var r AccessRequest
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			out = append(out, r)
		}
	}
	return out, sc.Err()
}
