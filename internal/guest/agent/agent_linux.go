// Package agent is kosa8-agent: the guest's PID 1. It brings the guest up
// (boot_linux.go), then serves the host over the virtio-serial channel:
// processes, files, the clock, power.
package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/guest"
)

// Agent serves the host's requests.
type Agent struct {
	log         *slog.Logger
	reaper      *reaper
	users       userDB
	defaultUser string
	extraEnv    []string
	poweroff    func()
	startup     time.Duration
	rootGrown   <-chan struct{} // nil: nothing to wait for

	mu       sync.Mutex
	procs    map[string]*proc
	hashes   *wsHashes
	cgroupFD int // the workload cgroup, 0 when none
	// dockerMu makes one engine start at a time (docker_linux.go).
	dockerMu sync.Mutex
	// machineID is the sandbox's, as the host last named it ("" until).
	machineID string
}

// Config configures an Agent.
type Config struct {
	Log         *slog.Logger
	DefaultUser string
	Etc         string   // accounts directory, /etc in the guest
	Env         []string // added to every process's environment
	PID1        bool     // the agent is the guest's init: it may power off
	Startup     time.Duration
	// RootGrown, when set, is closed once the root filesystem has grown
	// to its disk: a command waits for it (up to rootGrowWait), so that
	// none finds the disk smaller than asked for.
	RootGrown <-chan struct{}
}

// rootGrowWait bounds an exec's wait for the root filesystem to grow.
const rootGrowWait = 30 * time.Second

// freezeGrowWait bounds a checkpoint's wait for the root filesystem to
// grow: the host waits 15 s for the freeze.
const freezeGrowWait = 10 * time.Second

// New returns an agent. Only one per process: it reaps all children.
func New(cfg Config) *Agent {
	if cfg.Etc == "" {
		cfg.Etc = "/etc"
	}
	a := &Agent{
		log:         cfg.Log,
		reaper:      newReaper(),
		users:       userDB{etc: cfg.Etc},
		defaultUser: cfg.DefaultUser,
		extraEnv:    cfg.Env,
		startup:     cfg.Startup,
		rootGrown:   cfg.RootGrown,
		procs:       map[string]*proc{},
	}
	if cfg.PID1 {
		a.poweroff = a.shutdown
	}
	return a
}

// Handle serves one stream: it reads the request and dispatches it.
func (a *Agent) Handle(ctx context.Context, s net.Conn) {
	defer s.Close()
	f, err := guest.ReadFrame(s)
	if err != nil {
		return
	}
	if f.Kind != guest.FrameRequest {
		a.respondError(s, fmt.Errorf("expected a request frame, got kind %d", f.Kind))
		return
	}
	var req guest.Request
	if err := json.Unmarshal(f.Payload, &req); err != nil {
		a.respondError(s, fmt.Errorf("bad request: %w", err))
		return
	}
	switch req.Op {
	case guest.OpPing:
		a.respond(s, guest.Response{})
	case guest.OpInfo:
		a.respond(s, guest.Response{Info: a.info()})
	case guest.OpExec:
		a.handleExec(ctx, s, req.Exec)
	case guest.OpAttach:
		a.handleAttach(s, req.ID)
	case guest.OpReadFile:
		a.handleReadFile(s, req.Path)
	case guest.OpWrite:
		a.handleWriteFile(s, &req)
	case guest.OpStat:
		fi, err := statFile(req.Path)
		if err != nil {
			a.respondError(s, err)
			return
		}
		a.respond(s, guest.Response{Stat: fi})
	case guest.OpList:
		list, err := listDir(req.Path)
		if err != nil {
			a.respondError(s, err)
			return
		}
		a.respond(s, guest.Response{List: list})
	case guest.OpWSMount:
		a.handleWSMount(s, &req)
	case guest.OpWSScan:
		a.handleWSScan(s, &req)
	case guest.OpWSOp:
		a.handleWSOp(s, &req)
	case guest.OpFreeze, guest.OpThaw:
		began := time.Now()
		if req.Op == guest.OpFreeze {
			// A checkpoint's disks never catch the root filesystem
			// halfway through its online resize (started at boot, in the
			// background): a start from those disks alone (another QEMU
			// build, a failed rewind) found it broken (a 64 GiB disk's
			// filesystem stuck at 6 GiB and full, a kernel warning in
			// ext4_resize_fs; an I/O error on mkdir). Bounded well within
			// the host's deadline for the call: a freeze that answered
			// after the host gave up (and thawed) would stay.
			a.waitRootGrown(freezeGrowWait, "the checkpoint goes on")
		}
		err := a.freeze(req.Op == guest.OpFreeze)
		if req.Op == guest.OpFreeze && a.cgroupFD > 0 {
			// Also after a failed freeze: the host checkpoints anyway.
			a.syncDisks(min(freezeSyncWait, freezeBudget-time.Since(began)))
		}
		if err != nil {
			a.respondError(s, err)
			return
		}
		a.respond(s, guest.Response{})
	case guest.OpRestored:
		if err := a.restored(&req); err != nil {
			a.respondError(s, err)
			return
		}
		a.respond(s, guest.Response{})
	case guest.OpDocker:
		a.handleDocker(ctx, s, &req)
	case guest.OpWSPut:
		a.handleWSPut(s, &req)
	case guest.OpWSWatch:
		a.handleWSWatch(ctx, s, &req)
	case guest.OpSetTime:
		ts := unix.NsecToTimespec(req.Time.UnixNano())
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			a.respondError(s, fmt.Errorf("set clock: %w", err))
			return
		}
		if err := takeHostname(req.Hostname); err != nil {
			a.respondError(s, err)
			return
		}
		if err := a.takeMachineID(req.MachineID); err != nil {
			a.respondError(s, err)
			return
		}
		a.respond(s, guest.Response{})
	case guest.OpPoweroff:
		if a.poweroff == nil {
			a.respondError(s, errors.New("poweroff: not PID 1"))
			return
		}
		a.respond(s, guest.Response{})
		go a.poweroff()
	default:
		a.respondError(s, fmt.Errorf("unknown operation %q", req.Op))
	}
}

func (a *Agent) respond(w io.Writer, r guest.Response) {
	_ = guest.WriteJSON(w, guest.FrameResponse, r)
}

func (a *Agent) respondError(w io.Writer, err error) {
	r := guest.Response{Error: err.Error()}
	var se *startError
	if errors.As(err, &se) {
		r.ExitCode = se.code
	}
	_ = guest.WriteJSON(w, guest.FrameError, r)
}

func (a *Agent) info() *guest.Info {
	var u unix.Utsname
	_ = unix.Uname(&u)
	var si unix.Sysinfo_t
	_ = unix.Sysinfo(&si)
	in := &guest.Info{
		Kernel:           unix.ByteSliceToString(u.Release[:]),
		Machine:          unix.ByteSliceToString(u.Machine[:]),
		Hostname:         unix.ByteSliceToString(u.Nodename[:]),
		Uptime:           float64(si.Uptime),
		AgentStartMillis: float64(a.startup.Microseconds()) / 1000,
	}
	if usr, err := a.users.lookup("", a.defaultUser); err == nil {
		in.User, in.UID, in.GID = usr.name, usr.uid, usr.gid
	}
	return in
}

func statFile(p string) (*guest.FileInfo, error) {
	if !filepath.IsAbs(p) {
		return nil, fmt.Errorf("stat: path %q is not absolute", p)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	return fileInfo(p, fi), nil
}

func fileInfo(p string, fi os.FileInfo) *guest.FileInfo {
	out := &guest.FileInfo{Name: fi.Name(), Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime()}
	if fi.Mode()&os.ModeSymlink != 0 {
		out.Link, _ = os.Readlink(p)
	}
	return out
}

func listDir(p string) ([]guest.FileInfo, error) {
	if !filepath.IsAbs(p) {
		return nil, fmt.Errorf("list: path %q is not absolute", p)
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	out := make([]guest.FileInfo, 0, len(entries))
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, *fileInfo(filepath.Join(p, e.Name()), fi))
	}
	return out, nil
}

func (a *Agent) handleReadFile(s net.Conn, p string) {
	if !filepath.IsAbs(p) {
		a.respondError(s, fmt.Errorf("read: path %q is not absolute", p))
		return
	}
	f, err := os.Open(p)
	if err != nil {
		a.respondError(s, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		a.respondError(s, err)
		return
	}
	if fi.IsDir() {
		a.respondError(s, fmt.Errorf("read %s: is a directory", p))
		return
	}
	a.respond(s, guest.Response{Stat: fileInfo(p, fi)})
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if guest.WriteFrame(s, guest.FrameData, buf[:n]) != nil {
				return
			}
		}
		if err == io.EOF {
			_ = guest.WriteFrame(s, guest.FrameEOF, nil)
			return
		}
		if err != nil {
			a.respondError(s, err)
			return
		}
	}
}

// handleWriteFile writes the data frames that follow the request to a new
// file beside the target and renames it into place, so a reader never sees
// half a file. The file belongs to the request's user.
func (a *Agent) handleWriteFile(s net.Conn, req *guest.Request) {
	p := req.Path
	if !filepath.IsAbs(p) {
		a.respondError(s, fmt.Errorf("write: path %q is not absolute", p))
		return
	}
	u, err := a.users.lookup(req.User, a.defaultUser)
	if err != nil {
		a.respondError(s, err)
		return
	}
	mode := req.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	if err := mkdirAllOwned(filepath.Dir(p), u); err != nil {
		a.respondError(s, err)
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".kosa8-write-*")
	if err != nil {
		a.respondError(s, err)
		return
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	sum := sha256.New()
	for {
		f, err := guest.ReadFrame(s)
		if err != nil {
			return
		}
		if f.Kind == guest.FrameEOF {
			break
		}
		if f.Kind != guest.FrameData {
			a.respondError(s, fmt.Errorf("write: unexpected frame kind %d", f.Kind))
			return
		}
		sum.Write(f.Payload)
		if _, err := tmp.Write(f.Payload); err != nil {
			a.respondError(s, err)
			return
		}
	}
	if req.Hash != "" && hex.EncodeToString(sum.Sum(nil)) != req.Hash {
		// As in ws_put: content other than announced never replaces p.
		a.respondError(s, errChangedInTransit)
		return
	}
	if err := tmp.Chmod(mode); err != nil {
		a.respondError(s, err)
		return
	}
	if err := tmp.Chown(u.uid, u.gid); err != nil {
		a.respondError(s, err)
		return
	}
	if err := tmp.Close(); err != nil {
		a.respondError(s, err)
		return
	}
	// p's path in the workspace req.Root; "" when it is in none.
	var wsPath string
	if req.Root != "" {
		if rel, err := filepath.Rel(req.Root, p); err == nil && rel != "." && !outside(rel) {
			wsPath = filepath.ToSlash(rel)
		}
	}
	if req.Was != nil {
		err := fmt.Errorf("write: %s is not in the workspace %q", p, req.Root)
		if wsPath != "" {
			err = a.wsStill(req.Root, wsPath, req.Was)
		}
		if err != nil {
			a.respondError(s, err)
			return
		}
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		a.respondError(s, err)
		return
	}
	ok = true
	if req.Hash != "" && wsPath != "" {
		// The host knows what it sent: the next scan need not read it.
		a.wsCache().remember(wsPath, p, req.Hash)
	}
	a.respond(s, guest.Response{})
}

// outside tells whether rel, from filepath.Rel, leaves its base: ".." or
// "../…", not a name that starts with two dots ("..notes").
func outside(rel string) bool {
	return rel == ".." || strings.HasPrefix(rel, "../")
}

// mkdirAllOwned creates dir and missing parents, the new ones owned by u.
func mkdirAllOwned(dir string, u *user) error {
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return nil
	}
	if err := mkdirAllOwned(filepath.Dir(dir), u); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	return os.Chown(dir, u.uid, u.gid)
}

// shutdown ends every process and powers the machine off. Only for PID 1.
func (a *Agent) shutdown() {
	a.log.Info("power off")
	_ = unix.Kill(-1, syscall.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && othersAlive() {
		time.Sleep(50 * time.Millisecond)
	}
	_ = unix.Kill(-1, syscall.SIGKILL)
	PowerOffNow()
}

// PowerOffNow syncs the disks and powers off at once.
func PowerOffNow() {
	unix.Sync()
	_ = unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

// othersAlive reports whether any process but PID 1 and kernel threads runs.
func othersAlive() bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == 1 {
			continue
		}
		// Kernel threads have an empty cmdline.
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(b) > 0 {
			return true
		}
	}
	return false
}
