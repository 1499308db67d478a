// Package api is the supervisor's HTTP+JSON API, served on a sandbox's
// api.sock: the route table (Routes), the types that cross the socket, and
// a client for it. The CLI, the SDK and the MCP server talk to a running
// sandbox through it; the supervisor serves it (internal/supervisor).
package api

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/wsync"
)

// Route is one route of the supervisor's API, served on the sandbox's
// api.sock (mode 0600: the sandbox owner's alone).
type Route struct {
	Pattern string // method and path, as http.ServeMux takes them
	Doc     string // what it takes and answers
}

// Routes is the supervisor's API, every route it serves and nothing else:
// the supervisor refuses to register a route missing here, and a test
// checks that each one here is registered. Errors answer {"error": "..."}
// (ErrorResponse) with a 4xx or 5xx status.
var Routes = []Route{
	{"GET /v1/status", "StatusResponse: the sandbox's name and Status"},
	{"GET /v1/info", "guest.Info: the guest's kernel, user and workspace, asked of its agent"},
	{"POST /v1/stop", "?kill=1 for no clean poweroff; answers once QEMU is gone"},
	{"POST /v1/pause", "saves the running machine and stops; start resumes it; 409 when a stop is under way"},
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
	{"GET /v1/sync/summary", "ChangeSummary: each pending and held change with the lines it adds and removes"},
	{"POST /v1/fork", "ForkRequest{count, message} → checkpoint.Meta: the checkpoint the forks start from (kind fork)"},
	{"GET /v1/debug/memory", "the guest's RAM, paused for a consistent image (the proof no secret is inside)"},
	{"POST /v1/debug/plain-migrate", "PlainMigrate: QEMU's whole-machine migration to a scratch file, the checkpoint benchmark's baseline"},
}

// ExecUpgrade is the Upgrade protocol of POST /v1/exec.
const ExecUpgrade = "kosa8-exec"

// MaxBody bounds the JSON bodies of requests and answers.
const MaxBody = 1 << 20

// State is where a sandbox is in its life.
type State string

const (
	Created  State = "created"  // never started
	Starting State = "starting" // supervisor booting the VM
	Running  State = "running"
	Stopping State = "stopping"
	Stopped  State = "stopped"
	Crashed  State = "crashed" // the supervisor or QEMU died without a clean stop
	Paused   State = "paused"  // written out to a checkpoint; resume continues it
)

// Status is what the supervisor records in state.json, and what ls shows.
type Status struct {
	State         State  `json:"state"`
	SupervisorPID int    `json:"supervisor_pid,omitempty"`
	QEMUPID       int    `json:"qemu_pid,omitempty"`
	Accel         string `json:"accel,omitempty"`
	// AccelFallback says why the sandbox runs under TCG although the host
	// offered hardware acceleration: it failed to boot the sandbox.
	AccelFallback string    `json:"accel_fallback,omitempty"`
	Started       time.Time `json:"started,omitzero"`
	Stopped       time.Time `json:"stopped,omitzero"`
	// BootMillis: supervisor start to agent ready.
	BootMillis float64 `json:"boot_ms,omitempty"`
	Kernel     string  `json:"guest_kernel,omitempty"`
	Error      string  `json:"error,omitempty"`
	// Checkpoint is the checkpoint the running machine descends from (the
	// parent of the next one); for a paused sandbox, the one to resume.
	Checkpoint string `json:"checkpoint,omitempty"`
	// ColdBoot says why a start from a checkpoint booted from its disks
	// instead of loading its machine (saved by another QEMU build).
	ColdBoot string `json:"cold_boot,omitempty"`
	// Template is the boot template the sandbox's first start restored
	// instead of booting (its key), if any.
	Template string `json:"template,omitempty"`
	// RAMShared: the machine's RAM is mapped copy-on-write from the
	// checkpoint it was forked from, shared with the other machines
	// mapping it until each writes its pages; its own checkpoints carry
	// the RAM in their device state (QEMU's migration: slower).
	RAMShared bool `json:"ram_shared,omitempty"`
	// Pending counts the workspace changes left waiting for review or
	// approval when the sandbox stopped: they live on its disk, and
	// 'kosa8 diff', 'apply', 'discard' and 'rm' must not forget them.
	Pending int `json:"pending,omitempty"`
}

// StatusResponse is /v1/status.
type StatusResponse struct {
	Name   string      `json:"name"`
	Status Status      `json:"status"`
	Guest  *guest.Info `json:"guest,omitempty"`
}

// ErrorResponse is the body of an answer with a 4xx or 5xx status.
type ErrorResponse struct {
	Error string `json:"error"`
}

// ExecErrorResponse is ErrorResponse for an exec the guest could not start.
type ExecErrorResponse struct {
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

// SyncRequest names workspace paths.
type SyncRequest struct {
	Paths []string `json:"paths"`
	// Seen, for approve: the guest's version of each path as the user was
	// shown it (null: deleted). A path whose version is now another, or
	// that Seen lacks, is refused (wsync.Engine.ApplySeen).
	Seen map[string]*wsync.Entry `json:"seen,omitempty"`
}

// SyncResponse lists the paths done.
type SyncResponse struct {
	Done []string `json:"done"`
}

// SyncStatus is /v1/sync.
type SyncStatus struct {
	Path string `json:"path"`
	wsync.Status
}

// ChangeSummary is what a sandbox's pending and held changes amount to:
// /v1/sync/summary, and the summary a fork records when it stops.
type ChangeSummary struct {
	Files   []FileChange `json:"files"`
	Added   int          `json:"added"`   // lines, over all files
	Removed int          `json:"removed"` // lines, over all files
	// Taken is when it was made (a stopped fork's is its last).
	Taken time.Time `json:"taken"`
}

// FileChange is one pending or held path and its lines added and removed
// against the host's version (text files up to MaxSummaryFile; others
// count no lines and say why in Note).
type FileChange struct {
	Path    string `json:"path"`
	Kind    string `json:"kind"`           // added, modified, deleted
	Held    string `json:"held,omitempty"` // held for approval: why
	Added   int    `json:"added"`
	Removed int    `json:"removed"`
	Note    string `json:"note,omitempty"` // binary, too large, a link, unreadable
}

// MaxSummaryFile is the largest file whose lines a ChangeSummary counts.
const MaxSummaryFile = 1 << 20

// ForkRequest asks a running sandbox for the checkpoint its forks start
// from: Count forks will be made of it.
type ForkRequest struct {
	Count   int    `json:"count"`
	Message string `json:"message,omitempty"`
}

// PlainMigrate is the baseline a checkpoint is measured against: QEMU's
// own migration of the whole machine, RAM included, to a file.
type PlainMigrate struct {
	PauseMillis float64 `json:"pause_ms"`
	Bytes       int64   `json:"bytes"`
}

// CheckpointRequest names a checkpoint or describes a new one.
type CheckpointRequest struct {
	ID      string `json:"id,omitempty"`
	Message string `json:"message,omitempty"`
}

// RewindResult reports a rewind.
type RewindResult struct {
	To     string           `json:"to"`
	Saved  *checkpoint.Meta `json:"saved"` // the state just before the rewind
	Millis float64          `json:"ms"`    // until the restored machine runs
	// SavedMillis: until the state before is on disk too (its RAM is
	// written out while the restored machine already runs).
	SavedMillis float64          `json:"saved_ms,omitempty"`
	Warning     string           `json:"warning,omitempty"`
	ColdBoot    bool             `json:"cold_boot,omitempty"`
	Conflicts   []wsync.Conflict `json:"conflicts,omitempty"`
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

// PortForward forwards a host port to a guest port.
type PortForward struct {
	HostPort      uint16 `json:"host_port"`
	GuestPort     uint16 `json:"guest_port"`
	AllInterfaces bool   `json:"all_interfaces,omitempty"`
}

func (p PortForward) String() string {
	host := "127.0.0.1"
	if p.AllInterfaces {
		host = "0.0.0.0"
	}
	return fmt.Sprintf("%s:%d -> %d", host, p.HostPort, p.GuestPort)
}

// ParsePortForward reads HOST[:GUEST] ("3000", "8080:80").
func ParsePortForward(s string, all bool) (PortForward, error) {
	hs, gs, two := strings.Cut(s, ":")
	if !two {
		gs = hs
	}
	h, err1 := strconv.ParseUint(hs, 10, 16)
	g, err2 := strconv.ParseUint(gs, 10, 16)
	if err1 != nil || err2 != nil || h == 0 || g == 0 {
		return PortForward{}, fmt.Errorf("invalid port forward %q: use HOSTPORT or HOSTPORT:GUESTPORT, like 3000 or 8080:80", s)
	}
	return PortForward{HostPort: uint16(h), GuestPort: uint16(g), AllInterfaces: all}, nil
}

// Blocked is a host the guest asked for and was refused, still refused by
// the allow-list as it is now: a candidate for 'kosa8 net allow'.
type Blocked struct {
	Host  string    `json:"host"`           // a name, or a raw address
	Port  uint16    `json:"port,omitempty"` // 0: only looked up in DNS
	Rule  string    `json:"rule"`           // what 'kosa8 net allow' would take
	Count int       `json:"count"`
	Last  time.Time `json:"last"`
	// Address is the address refused: the one a raw connection went to,
	// or those (comma-separated) an allowed name resolved to that only a
	// pin reaches (Rule is then pin:NAME).
	Address string `json:"address,omitempty"`
	// Why it was refused, in words.
	Why string `json:"why,omitempty"`
	// DenyRule is the deny rule that refuses it, when one does: 'kosa8 net
	// rm NAME DENYRULE' lifts it ('net allow' of Rule may not, when the
	// deny rule is a wildcard or a range).
	DenyRule string `json:"deny_rule,omitempty"`
}
