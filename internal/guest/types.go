package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"
)

// Op names an operation on a stream.
type Op string

const (
	OpPing     Op = "ping"
	OpInfo     Op = "info"
	OpExec     Op = "exec"
	OpReadFile Op = "read_file"
	OpWrite    Op = "write_file"
	OpStat     Op = "stat"
	OpList     Op = "list"
	OpPoweroff Op = "poweroff"
	OpSetTime  Op = "set_time"
	OpAttach   Op = "attach"
	// Workspace operations: paths are relative to Path (the workspace root).
	OpWSMount Op = "ws_mount" // mount the workspace disk at Path
	OpWSScan  Op = "ws_scan"  // describe Paths (nil: everything): FrameData batches of entries, then FrameEOF
	OpWSOp    Op = "ws_op"    // one change: WS
	OpWSWatch Op = "ws_watch" // FrameData batches of changed paths until the stream closes
	// Checkpoints: the workloads are frozen before the VM pauses, and after a
	// restore the agent reseeds the kernel RNG and steps the clock before it
	// thaws them (a restored snapshot must not replay random numbers).
	OpFreeze   Op = "freeze"
	OpThaw     Op = "thaw"
	OpRestored Op = "restored" // Entropy, Time, Hostname; then thaw

	// OpDocker starts the sandbox's container engine (Docker): its disk
	// mounted, its cgroup made, dockerd started and answering. Idempotent:
	// a restored machine's engine is running already.
	OpDocker Op = "docker"

	OpWSPut Op = "ws_put" // many entries: a FrameRequest WSPutItem each (files then FrameData…FrameEOF), an item with End last; answered at once and again at the end
)

// WSPutItem announces one entry of a ws_put stream.
type WSPutItem struct {
	Path string      `json:"path,omitempty"`
	Type byte        `json:"type,omitempty"` // f, d, l
	Mode fs.FileMode `json:"mode,omitempty"`
	Link string      `json:"link,omitempty"`
	Hash string      `json:"hash,omitempty"` // a file's content must hash to it, or the old file stays
	Was  *WSEntry    `json:"was,omitempty"`  // see Request.Was
	End  bool        `json:"end,omitempty"`
}

// WSSync is the WSOp kind that syncs the workspace's filesystem to its
// disk (syncfs): the host records a change as made in the guest only once
// it is durable there.
const WSSync = "sync"

// WSOp is a change to the workspace the host asks for.
type WSOp struct {
	Kind string      `json:"kind"` // mkdir, symlink, remove, sync (WSSync: Path unused)
	Path string      `json:"path"`
	Mode fs.FileMode `json:"mode,omitempty"`
	Link string      `json:"link,omitempty"`
	Was  *WSEntry    `json:"was,omitempty"` // see Request.Was
}

// Stale is in the error of a workspace change refused under Was.
const Stale = "changed in the guest since the sync looked"

// WSEntry describes a path in the workspace (the same shape as the host's
// wsync.Entry).
type WSEntry struct {
	Path string      `json:"path"`
	Type byte        `json:"type"`
	Mode fs.FileMode `json:"mode"`
	Size int64       `json:"size,omitempty"`
	Hash string      `json:"hash,omitempty"`
	Link string      `json:"link,omitempty"`
	Big  bool        `json:"big,omitempty"`
}

// WSWatchBatch is one message of a watch stream.
type WSWatchBatch struct {
	Paths []string `json:"paths,omitempty"`
	All   bool     `json:"all,omitempty"` // events were lost: rescan everything
}

// Request is the first frame of every stream.
type Request struct {
	Op Op `json:"op"`

	Exec *ExecRequest `json:"exec,omitempty"`
	// ID names a running exec for OpAttach.
	ID string `json:"id,omitempty"`

	// Path and Mode serve the file operations. Paths are absolute in the guest.
	Path string      `json:"path,omitempty"`
	Mode fs.FileMode `json:"mode,omitempty"`
	User string      `json:"user,omitempty"` // owner of written files; default user when empty

	// Time is the host's wall clock for OpSetTime and OpRestored.
	Time time.Time `json:"time,omitzero"`
	// Hostname, for OpSetTime and OpRestored, is the sandbox's: the
	// kernel's command line names none, so a machine booted for one
	// sandbox (a template) can become another's.
	Hostname string `json:"hostname,omitempty"`
	// MachineID, with Hostname, is the sandbox's /etc/machine-id (32
	// hex digits); the guest's filesystem UUIDs are made from it.
	MachineID string `json:"machine_id,omitempty"`

	// Hash and Root let a workspace write record the content's hash;
	// content that does not hash to Hash is refused, the file left as it was.
	Hash string `json:"hash,omitempty"`
	Root string `json:"root,omitempty"`
	// Was is what the host saw at a workspace path when it decided to
	// change it (Type 'x': nothing there; nil: no check). Should the path
	// hold something else when the change is ready to land (the agent
	// wrote it meanwhile), nothing changes and the error says Stale.
	Was *WSEntry `json:"was,omitempty"`

	// Entropy is fresh randomness from the host for OpRestored.
	Entropy []byte `json:"entropy,omitempty"`
	// NewBootID, for OpRestored: the guest was restored as another
	// machine than the one saved (a fork, a start from a boot template):
	// it takes a boot_id of its own.
	NewBootID bool `json:"new_boot_id,omitempty"`

	Paths   []string `json:"paths,omitempty"`
	WS      *WSOp    `json:"ws,omitempty"`
	MaxFile int64    `json:"max_file,omitempty"`

	// Docker configures OpDocker.
	Docker *DockerRequest `json:"docker,omitempty"`
}

// DockerRequest is how the host wants the guest's container engine run.
type DockerRequest struct {
	// Proxy, when set, is the HTTPS proxy dockerd reaches registries
	// through (the host's gateway, which answers a refused host with
	// the reason instead of a failed lookup).
	Proxy string `json:"proxy,omitempty"`
	// Auths are registry credentials as the guest keeps them: each host's
	// user and the secret's placeholder, never the value (written to the
	// default user's ~/.docker/config.json).
	Auths []DockerAuth `json:"auths,omitempty"`
}

// DockerAuth is one registry's login in the guest's Docker settings.
type DockerAuth struct {
	Registry    string `json:"registry"` // as docker names it: a host[:port], or https://index.docker.io/v1/
	User        string `json:"user"`
	Placeholder string `json:"placeholder"`
}

// ExecRequest describes a process to start in the guest.
type ExecRequest struct {
	// ID names the process so that a new stream can attach to it after the
	// channel broke (a rewind, a restarted supervisor). The agent picks one
	// when it is empty.
	ID   string   `json:"id,omitempty"`
	Argv []string `json:"argv"`
	// Env entries (KEY=VALUE) are added to the agent's base environment
	// (PATH, HOME, USER, LOGNAME, SHELL, LANG, TERM) and override it.
	Env []string `json:"env,omitempty"`
	Dir string   `json:"dir,omitempty"`
	// User is a name or "root"; empty means the sandbox's default user.
	User string `json:"user,omitempty"`
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// Validate reports a request the agent would refuse, so the host can say so
// before a stream is opened.
func (r *ExecRequest) Validate() error {
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return fmt.Errorf("exec: no command given")
	}
	for _, e := range r.Env {
		if !validEnv(e) {
			return fmt.Errorf("exec: environment entry %q is not KEY=VALUE", e)
		}
	}
	if r.ID != "" && !ValidExecID(r.ID) {
		return errors.New("exec: an id is 1 to 64 letters, digits, '-', '_' or '.'")
	}
	return nil
}

// ValidExecID reports whether id can name an exec: 1 to 64 letters,
// digits, '-', '_' or '.' (the agent makes 16 hex digits; a client may
// pick its own). The supervisor writes it into a header line, so a
// guest's answer is held to this too.
func ValidExecID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func validEnv(e string) bool {
	for i := 0; i < len(e); i++ {
		switch c := e[i]; {
		case c == '=':
			return i > 0
		case c == 0:
			return false
		}
	}
	return false
}

// Response answers a Request. Error is empty on success.
type Response struct {
	Error string `json:"error,omitempty"`
	// ExitCode goes with Error when a command could not be started: 127
	// not found, 126 found but not runnable (as a shell and docker run say).
	ExitCode int `json:"exit_code,omitempty"`

	Info *Info      `json:"info,omitempty"`
	Stat *FileInfo  `json:"stat,omitempty"`
	List []FileInfo `json:"list,omitempty"`
	Pid  int        `json:"pid,omitempty"`
	ID   string     `json:"id,omitempty"`
	// Failed lists the entries of a ws_put that could not be written.
	Failed map[string]string `json:"failed,omitempty"`
}

// Info describes the guest.
type Info struct {
	Kernel   string  `json:"kernel"` // uname -r
	Machine  string  `json:"machine"`
	Hostname string  `json:"hostname"`
	User     string  `json:"user"`
	UID      int     `json:"uid"`
	GID      int     `json:"gid"`
	Uptime   float64 `json:"uptime_seconds"`
	// Boot records how long the agent's own start-up took inside the guest.
	AgentStartMillis float64 `json:"agent_start_ms"`
}

// FileInfo is what stat and list report.
type FileInfo struct {
	Name    string      `json:"name"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
	Link    string      `json:"link,omitempty"`
}

// WindowSize is a terminal's size in character cells.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExitStatus ends an exec stream.
type ExitStatus struct {
	Code   int    `json:"code"`             // exit code, or 128+signal
	Signal string `json:"signal,omitempty"` // set when the process was killed by a signal
	Error  string `json:"error,omitempty"`  // the agent failed to run or wait for it
}

func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own types are marshalled
	}
	return b
}

// WriteJSON writes a frame whose payload is v as JSON.
func WriteJSON(w interface{ Write([]byte) (int, error) }, kind FrameKind, v any) error {
	return WriteFrame(w, kind, marshal(v))
}

func fileMode(m uint32) fs.FileMode { return fs.FileMode(m).Perm() }
