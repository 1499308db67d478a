package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kosa8/kosa8/internal/guest"
)

// The container engine of a sandbox made with --docker: Debian's dockerd,
// started by the agent when the host asks (OpDocker), never by the image.
// containerd is started first, then dockerd on it. Its data lives on a disk of its own (the host's docker.img, serial
// "docker"), so a checkpoint keeps it with the other disks and the synced
// workspace never holds it. The engine and every container run in one
// cgroup subtree, DockerCgroup, frozen and thawed with the workloads: after
// a restore no container runs before the RNG is reseeded.
const (
	DockerSerial = "docker"
	// DockerCgroup holds dockerd and its helpers (DockerCgroup/daemon)
	// and the containers (DockerCgroup/ID: dockerd's --cgroup-parent).
	DockerCgroup = "/sys/fs/cgroup/kosa8-docker"
	dockerRoot   = "/var/lib/docker"
	dockerSocket = "/run/docker.sock"
	// DockerLog is dockerd's output, in the guest.
	DockerLog = "/var/log/kosa8-dockerd.log"
	// dockerStartWait bounds the wait for a new dockerd to answer: under
	// TCG its first start (iptables, the bridge, containerd) takes tens
	// of seconds.
	dockerStartWait = 150 * time.Second
)

// cgroupControllers are enabled for the engine's subtree: what runc sets
// limits with. One the kernel lacks is left out (and logged).
var cgroupControllers = []string{"cpuset", "cpu", "io", "memory", "pids"}

func (a *Agent) handleDocker(ctx context.Context, s net.Conn, req *guest.Request) {
	var dr guest.DockerRequest
	if req.Docker != nil {
		dr = *req.Docker
	}
	a.dockerMu.Lock()
	defer a.dockerMu.Unlock()
	if err := a.startDocker(ctx, dr); err != nil {
		a.respondError(s, err)
		return
	}
	a.respond(s, guest.Response{})
}

// startDocker brings the engine up, or finds it up.
func (a *Agent) startDocker(ctx context.Context, dr guest.DockerRequest) error {
	u, err := a.users.lookup("", a.defaultUser)
	if err != nil {
		return err
	}
	if err := joinGroup(a.users.etc, "docker", u.name); err != nil {
		return fmt.Errorf("docker: add %s to the docker group: %w", u.name, err)
	}
	if err := writeDockerAuths(u, dr.Auths); err != nil {
		return fmt.Errorf("docker: registry logins: %w", err)
	}
	if dockerPing(ctx, 2*time.Second) == nil {
		return nil // running (a restored machine, or a second call)
	}
	if _, err := os.Stat("/usr/sbin/dockerd"); err != nil {
		return errors.New("docker: dockerd is not in this sandbox's image (it is added with --docker when the sandbox is made)")
	}
	dev, err := findDisk("/sys/block", DockerSerial, "vdc", 10*time.Second)
	if err != nil {
		return fmt.Errorf("docker: its disk: %w", err)
	}
	if err := os.MkdirAll(dockerRoot, 0o710); err != nil {
		return err
	}
	if !mounted(dockerRoot) {
		// noinit_itable: the disk is a sparse file, its inode tables read
		// as zeros already; zeroing them in the background would only
		// write (and grow every checkpoint's layer).
		if err := unix.Mount(dev, dockerRoot, "ext4", unix.MS_NOATIME, "noinit_itable"); err != nil {
			return fmt.Errorf("docker: mount its disk %s on %s: %w", dev, dockerRoot, err)
		}
	}
	daemon, err := a.dockerCgroup()
	if err != nil {
		return fmt.Errorf("docker: cgroup: %w", err)
	}
	defer unix.Close(daemon)
	logf, err := os.OpenFile(DockerLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	wctx, cancel := context.WithTimeout(ctx, dockerStartWait)
	defer cancel()
	// containerd first, started here rather than by dockerd: dockerd gives
	// the containerd it starts itself 15 s to answer, which a loaded
	// machine under TCG does not always make (dockerd then exits).
	if err := a.startContainerd(wctx, daemon, logf); err != nil {
		return err
	}
	env := []string{"PATH=" + defaultPath, "HOME=/root"}
	if dr.Proxy != "" {
		// Only dockerd's own requests (pulls, logins): containers get
		// none of its environment.
		env = append(env, "HTTPS_PROXY="+dr.Proxy, "https_proxy="+dr.Proxy, "NO_PROXY=localhost,127.0.0.0/8", "no_proxy=localhost,127.0.0.0/8")
	}
	gone, err := a.startDaemon("dockerd", []string{"/usr/sbin/dockerd",
		"--host=unix://" + dockerSocket, "--group=docker",
		"--data-root=" + dockerRoot, "--storage-driver=overlay2",
		"--containerd=" + containerdSocket,
		"--cgroup-parent=/" + filepath.Base(DockerCgroup),
	}, env, daemon, logf)
	if err != nil {
		return err
	}
	for {
		if dockerPing(wctx, 2*time.Second) == nil {
			return nil
		}
		select {
		case ws := <-gone:
			st := exitStatus(ws)
			return fmt.Errorf("docker: dockerd exited (status %d %s) while starting:\n%s", st.Code, st.Signal, tail(DockerLog, 2048))
		case <-wctx.Done():
			return fmt.Errorf("docker: dockerd did not answer within %s:\n%s", dockerStartWait, tail(DockerLog, 2048))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// containerd runs as dockerd's own would: its data on the engine's disk,
// its state in /run, the CRI plugin (Kubernetes') off.
const (
	containerdSocket = "/run/docker/containerd/containerd.sock"
	containerdConfig = "/run/docker/containerd/kosa8.toml"
)

const containerdTOML = `version = 2
root = "/var/lib/docker/containerd/daemon"
state = "/run/docker/containerd/daemon"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "` + containerdSocket + `"
[debug]
  address = "/run/docker/containerd/containerd-debug.sock"
`

// startContainerd starts containerd (unless it answers already) and
// waits for its socket.
func (a *Agent) startContainerd(ctx context.Context, cgroupFD int, logf *os.File) error {
	if dialUnix(containerdSocket) == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(containerdSocket), 0o711); err != nil {
		return err
	}
	if err := writeFileAtomic(containerdConfig, []byte(containerdTOML), 0o644); err != nil {
		return err
	}
	gone, err := a.startDaemon("containerd", []string{"/usr/bin/containerd", "--config", containerdConfig, "--log-level", "warn"},
		[]string{"PATH=" + defaultPath, "HOME=/root"}, cgroupFD, logf)
	if err != nil {
		return err
	}
	for {
		if dialUnix(containerdSocket) == nil {
			return nil
		}
		select {
		case ws := <-gone:
			st := exitStatus(ws)
			return fmt.Errorf("docker: containerd exited (status %d %s) while starting:\n%s", st.Code, st.Signal, tail(DockerLog, 2048))
		case <-ctx.Done():
			return fmt.Errorf("docker: containerd did not answer within %s:\n%s", dockerStartWait, tail(DockerLog, 2048))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// startDaemon starts one of the engine's daemons as root in the engine's
// cgroup leaf, its output appended to logf; the channel gets its exit.
func (a *Agent) startDaemon(name string, argv, env []string, cgroupFD int, logf *os.File) (<-chan unix.WaitStatus, error) {
	fmt.Fprintf(logf, "--- kosa8: %s starting %s\n", name, time.Now().UTC().Format(time.RFC3339))
	attr := &os.ProcAttr{Dir: "/", Env: env, Files: []*os.File{nil, logf, logf},
		Sys: &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: cgroupFD}}
	p, exited, err := a.reaper.start(func() (*os.Process, error) {
		old := unix.Umask(0o022)
		defer unix.Umask(old)
		return os.StartProcess(argv[0], argv, attr)
	})
	if err != nil {
		return nil, fmt.Errorf("docker: start %s: %w", name, err)
	}
	pid := p.Pid
	_ = p.Release()
	a.log.Info("engine daemon started", "name", name, "pid", pid)
	gone := make(chan unix.WaitStatus, 1)
	go func() {
		ws := <-exited
		a.log.Warn("engine daemon exited", "name", name, "status", exitStatus(ws))
		gone <- ws
	}()
	return gone, nil
}

// dialUnix reports whether a unix socket accepts a connection.
func dialUnix(path string) error {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// dockerCgroup makes the engine's cgroup subtree, with the controllers
// runc needs delegated to it, and returns its daemon leaf opened for
// CLONE_INTO_CGROUP.
func (a *Agent) dockerCgroup() (int, error) {
	for _, parent := range []string{"/sys/fs/cgroup", DockerCgroup} {
		if parent == DockerCgroup {
			if err := os.Mkdir(DockerCgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return -1, err
			}
		}
		avail, _ := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
		have := strings.Fields(string(avail))
		for _, c := range cgroupControllers {
			if !slices.Contains(have, c) {
				a.log.Warn("cgroup controller missing", "controller", c, "in", parent)
				continue
			}
			if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+c), 0o644); err != nil {
				a.log.Warn("cgroup controller not enabled", "controller", c, "in", parent, "err", err)
			}
		}
	}
	leaf := filepath.Join(DockerCgroup, "daemon")
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return -1, err
	}
	return unix.Open(leaf, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// dockerPing asks dockerd's socket for /_ping.
func dockerPing(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", dockerSocket)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(io.LimitReader(c, 4096)).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.Contains(line, " 200 ") {
		return fmt.Errorf("dockerd answered %q", strings.TrimSpace(line))
	}
	return nil
}

// mounted reports whether dir is a mount point (its device differs from
// its parent's).
func mounted(dir string) bool {
	var a, b unix.Stat_t
	if unix.Lstat(dir, &a) != nil || unix.Lstat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

// tail is the last n bytes of a file, for an error.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

// joinGroup adds user to group in etc/group (idempotent), so that its
// commands reach the engine's socket without sudo.
func joinGroup(etc, group, user string) error {
	p := filepath.Join(etc, "group")
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if len(b) > maxAccountFile {
		return fmt.Errorf("%s is larger than %d bytes", p, maxAccountFile)
	}
	lines := strings.Split(string(b), "\n")
	found := false
	for i, l := range lines {
		f := strings.Split(l, ":")
		if len(f) != 4 || f[0] != group {
			continue
		}
		found = true
		members := []string{}
		if f[3] != "" {
			members = strings.Split(f[3], ",")
		}
		for _, m := range members {
			if m == user {
				return nil
			}
		}
		f[3] = strings.Join(append(members, user), ",")
		lines[i] = strings.Join(f, ":")
	}
	if !found {
		return fmt.Errorf("no group %q in %s", group, p)
	}
	return writeFileAtomic(p, []byte(strings.Join(lines, "\n")), 0o644)
}

// writeDockerAuths records registry logins in the user's Docker settings
// (~/.docker/config.json): the user and the secret's placeholder, which
// the host's broker swaps for the value on the way to the registry's
// token endpoint. Other settings in the file are kept.
func writeDockerAuths(u *user, auths []guest.DockerAuth) error {
	if len(auths) == 0 {
		return nil
	}
	dir := filepath.Join(u.home, ".docker")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	_ = os.Lchown(dir, u.uid, u.gid)
	p := filepath.Join(dir, "config.json")
	cfg := map[string]any{}
	if b, err := readNoFollow(p, 1<<20); err == nil {
		_ = json.Unmarshal(b, &cfg)
	}
	m, _ := cfg["auths"].(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	for _, au := range auths {
		m[au.Registry] = map[string]any{"auth": base64.StdEncoding.EncodeToString([]byte(au.User + ":" + au.Placeholder))}
	}
	cfg["auths"] = m
	b, err := json.MarshalIndent(cfg, "", "\t")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(p, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Lchown(p, u.uid, u.gid)
}

// readNoFollow reads at most max bytes of a regular file, never through a
// link.
func readNoFollow(p string, max int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	_, err = io.Copy(&buf, io.LimitReader(f, max))
	return buf.Bytes(), err
}

// writeFileAtomic replaces p with data through a temporary file beside
// it (a link at p is replaced, never followed).
func writeFileAtomic(p string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".kosa8-")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), p)
}
