"""kosa8 for Python: drive kosa8 sandboxes from an agent framework.

A sandbox is a QEMU microVM with its own kernel, one workspace folder synced
both ways with the host, a network closed except for the hosts its
allow-list names, and checkpoints of the whole running machine. Each running
sandbox has a supervisor that answers an HTTP API on a unix socket in the
sandbox's state directory ($KOSA8_HOME/sandboxes/NAME/api.sock); this module
speaks that API with the standard library only. Creating and starting a
sandbox, and what a stopped sandbox answers from its state directory, go
through the kosa8 command (found on PATH, or given as ``binary``).

    import kosa8

    c = kosa8.Client()
    sb = c.create(workspace="/home/me/project", allow=["pypi.org"])
    sb.start()
    r = sb.exec(["make", "test"], timeout=600)
    print(r.exit_code, r.stdout.decode())
    cp = sb.checkpoint("before the migration")
    sb.exec(["sh", "-c", "rm -rf build"])
    sb.rewind(cp["id"])
    sb.stop()
    c.remove(sb.name)

Errors are ``kosa8.Error`` (``NotRunning`` when the sandbox must run
first); a command's non-zero exit is a result, not an error.
"""

import errno
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time

__all__ = ["Client", "Sandbox", "ExecResult", "Error", "NotRunning"]

# Frame kinds of an exec stream (internal/guest/wire.go): a kind byte, a
# big-endian uint32 length, the payload.
FRAME_STDIN = 3
FRAME_STDIN_EOF = 4
FRAME_STDOUT = 5
FRAME_STDERR = 6
FRAME_SIGNAL = 8
FRAME_EXIT = 9
FRAME_ERROR = 12
MAX_FRAME = 1 << 20
SIGKILL = 9

# Bounds what one JSON answer may take in memory.
MAX_BODY = 16 << 20
# How long a killed command gets to report its end.
KILL_GRACE = 10.0
# How long one stdin frame may wait on a command that does not read it.
STDIN_STALL = 3600.0


class Error(Exception):
    """A kosa8 operation failed; the message says what and what to do."""


class NotRunning(Error):
    """The sandbox must be running for this."""


class ExecResult:
    """How a command ended, with what it wrote (unless streamed elsewhere)."""

    def __init__(self, exit_code, stdout, stderr, signal="", timed_out=False, duration=0.0):
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.signal = signal
        self.timed_out = timed_out
        self.duration = duration

    def __repr__(self):
        return "ExecResult(exit_code=%d, signal=%r, timed_out=%r, stdout=%d bytes, stderr=%d bytes)" % (
            self.exit_code, self.signal, self.timed_out, len(self.stdout), len(self.stderr))


def default_home():
    """The state directory the kosa8 command uses."""
    if os.environ.get("KOSA8_HOME"):
        return os.environ["KOSA8_HOME"]
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "kosa8")
    return os.path.join(os.path.expanduser("~"), ".local", "share", "kosa8")


class Client:
    """Finds, creates and starts sandboxes in one state directory.

    home: the state directory ($KOSA8_HOME, else $XDG_DATA_HOME/kosa8, else
    ~/.local/share/kosa8). binary: the kosa8 executable (else on PATH).
    """

    def __init__(self, home=None, binary=None):
        self.home = home or default_home()
        self._binary = binary

    # -- the kosa8 command, for what the API does not cover --

    def binary(self):
        b = self._binary or shutil.which("kosa8")
        if not b:
            raise Error("kosa8 not found on PATH: install it ('make build' puts it in bin/) or pass binary=")
        return b

    def _env(self):
        env = dict(os.environ)
        env["KOSA8_HOME"] = self.home
        return env

    def cli(self, *args, cwd=None, timeout=600):
        """Runs kosa8 with args and returns its standard output."""
        try:
            p = subprocess.run([self.binary()] + [str(a) for a in args], cwd=cwd, env=self._env(),
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Error("kosa8 %s: no answer within %ds" % (args[0], timeout))
        if p.returncode != 0:
            msg = p.stderr.decode(errors="replace").strip().removeprefix("kosa8: ")
            raise Error(msg or "kosa8 %s: exit status %d" % (args[0], p.returncode))
        return p.stdout.decode(errors="replace")

    def cli_json(self, *args, **kw):
        return json.loads(self.cli(*args, "--json", **kw))

    # -- sandboxes --

    def create(self, name=None, workspace=None, cpus=None, memory=None, disk=None, allow=(), preset=None,
               secrets=(), env=(), ports=(), ephemeral=False, review=False, exclude=()):
        """Creates a stopped sandbox; workspace is the host folder it works in
        (None: no folder). A trusted kosa8.toml in that folder supplies
        defaults, as for `kosa8 create`."""
        args = ["create"]
        if name:
            args.append(name)
        if workspace:
            workspace = os.path.abspath(workspace)
            args += ["--workspace", workspace]
        else:
            args.append("--no-workspace")
        for flag, val in (("--cpus", cpus), ("--memory", memory), ("--disk", disk), ("--net", preset)):
            if val is not None:
                args += [flag, str(val)]
        for flag, vals in (("--allow", allow), ("--secret", secrets), ("--env", env), ("--publish", ports), ("--exclude", exclude)):
            for v in vals:
                args += [flag, str(v)]
        if ephemeral:
            args.append("--rm")
        if review:
            args.append("--review")
        out = self.cli(*args, cwd=workspace or "/")
        return Sandbox(self, out.strip().splitlines()[-1])

    def sandbox(self, name):
        """The handle of an existing sandbox."""
        if not os.path.isfile(os.path.join(self.home, "sandboxes", name, "sandbox.json")):
            raise Error("no such sandbox named %r: 'kosa8 ls' lists them" % name)
        return Sandbox(self, name)

    def list(self):
        """Every sandbox as `kosa8 ls --json` describes it."""
        return self.cli_json("ls")

    def for_folder(self, folder):
        """The sandboxes whose workspace is folder."""
        real = os.path.realpath(folder)
        return [s for s in self.list() if (s.get("config", {}).get("workspace") or {}).get("path") == real]

    def remove(self, name, force=False):
        """Deletes a sandbox; a running one only with force."""
        self.cli("rm", *(["-f"] if force else []), name)


class _UnixHTTP:
    """HTTP/1.1 requests over a unix socket, one connection each."""

    def __init__(self, path):
        self.path = path

    def connect(self, timeout):
        if not os.path.exists(self.path):
            raise NotRunning("the sandbox is not running (no supervisor socket): start it first")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(self.path)
        except (ConnectionRefusedError, FileNotFoundError):
            s.close()
            raise NotRunning("the sandbox is not running (its supervisor does not answer): start it first")
        return s

    def request(self, method, path, body=None, headers=None, timeout=600):
        """Sends a request and returns (socket, status, headers, reader) with
        the body unread."""
        data = b"" if body is None else json.dumps(body).encode()
        s = self.connect(timeout)
        head = "%s %s HTTP/1.1\r\nHost: kosa8\r\nContent-Length: %d\r\n" % (method, path, len(data))
        if body is not None:
            head += "Content-Type: application/json\r\n"
        for k, v in (headers or {}).items():
            head += "%s: %s\r\n" % (k, v)
        s.sendall(head.encode() + b"\r\n" + data)
        r = _Reader(s)
        try:
            status_line = r.readline(8192).decode("latin-1")
        except BaseException:
            s.close()
            raise
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            s.close()
            raise Error("supervisor: bad answer %r" % status_line)
        hdrs = {}
        while True:
            line = r.readline(8192).decode("latin-1")
            if line in ("\r\n", "\n", ""):
                break
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
            if len(hdrs) > 100:
                raise Error("supervisor: too many headers")
        return s, int(parts[1]), hdrs, r

    def call(self, method, path, body=None, timeout=600):
        """A JSON request: the decoded answer, or Error with the API's message."""
        s, status, hdrs, r = self.request(method, path, body, timeout=timeout)
        try:
            n = int(hdrs.get("content-length", "-1"))
            if hdrs.get("transfer-encoding", "").lower() == "chunked":
                raw = _read_chunked(r)
            elif n >= 0:
                if n > MAX_BODY:
                    raise Error("supervisor: answer too large (%d bytes)" % n)
                raw = r.read(n)
            else:
                raw = r.read(MAX_BODY)
        finally:
            s.close()
        val = json.loads(raw) if raw.strip() else None
        if status >= 300:
            msg = val.get("error") if isinstance(val, dict) else None
            raise Error(msg or "supervisor: HTTP %d" % status)
        return val


def _read_chunked(r):
    out = b""
    while True:
        size = int(r.readline(100).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            r.readline(100)
            return out
        if len(out) + size > MAX_BODY:
            raise Error("supervisor: answer too large")
        out += r.read(size)
        r.readline(100)


class _Reader:
    """Reads lines and exact byte counts from a socket through its own
    buffer, so that a timeout loses nothing (a socket.makefile reader is
    undefined after one)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self):
        b = self.sock.recv(65536)
        if not b:
            raise EOFError
        self.buf += b

    def readline(self, limit):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                return line
            if len(self.buf) > limit:
                raise Error("supervisor: line too long")
            try:
                self._fill()
            except EOFError:
                line = bytes(self.buf)
                self.buf.clear()
                return line

    def read(self, n):
        while len(self.buf) < n:
            try:
                self._fill()
            except EOFError:
                break
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def _write_frame(s, kind, payload=b""):
    s.sendall(struct.pack(">BI", kind, len(payload)) + payload)


def _feed_stdin(w, lock, data):
    """Sends data as the command's stdin, then its end, a frame at a time
    under lock; stops quietly when the stream ends (the command ended, or
    failed: the reader says which)."""
    try:
        for i in range(0, len(data), 32 << 10):
            with lock:
                _write_frame(w, FRAME_STDIN, data[i:i + (32 << 10)])
        with lock:
            _write_frame(w, FRAME_STDIN_EOF)
    except OSError:
        pass


def _read_frame(r):
    """One frame, or socket.timeout with the buffer intact, or EOFError."""
    while len(r.buf) < 5:
        r._fill()
    kind, n = struct.unpack(">BI", bytes(r.buf[:5]))
    if n > MAX_FRAME:
        raise Error("exec stream: frame of %d bytes exceeds 1 MiB" % n)
    while len(r.buf) < 5 + n:
        r._fill()
    payload = bytes(r.buf[5:5 + n])
    del r.buf[:5 + n]
    return kind, payload


def _guest_path(p):
    """A relative path stays relative to the working directory (the
    workspace) and is never read as an option."""
    if not p or "\0" in p:
        raise Error("bad path %r" % p)
    return p if p.startswith("/") else "./" + p


WRITE_SCRIPT = r'''set -e
dir=$(dirname -- "$1")
mkdir -p -- "$dir"
tmp=$(mktemp -- "$dir/.kosa8-write.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
chmod "$2" -- "$tmp"
mv -f -- "$tmp" "$1"
trap - EXIT'''

LIST_SCRIPT = r'''cd -- "$1" && exec find . -mindepth 1 -maxdepth 1 -printf '%y\0%s\0%m\0%T@\0%f\0%l\0' '''

TYPES = {"f": "file", "d": "dir", "l": "link"}


def parse_list(raw):
    """Reads the listing of list_dir: six NUL-terminated fields an entry."""
    fields = raw.split(b"\0")
    if fields and fields[-1] == b"":
        fields.pop()
    if len(fields) % 6:
        raise Error("list: malformed listing from the guest")
    out = []
    for i in range(0, len(fields), 6):
        t, size, mode, mtime, name, link = fields[i:i + 6]
        name = name.decode(errors="surrogateescape")
        if not name or "/" in name:
            raise Error("list: malformed entry %r" % name)
        try:
            out.append({"name": name, "type": TYPES.get(t.decode(), "other"), "size": int(size),
                        "mode": int(mode, 8), "mtime": float(mtime), "link": link.decode(errors="surrogateescape")})
        except ValueError:
            raise Error("list: malformed entry %r" % name)
    out.sort(key=lambda e: e["name"])
    return out


class Sandbox:
    """One sandbox. Methods ask it (or its state directory) anew each time."""

    def __init__(self, client, name):
        self.client = client
        self.name = name
        self.dir = os.path.join(client.home, "sandboxes", name)
        self._api = _UnixHTTP(os.path.join(self.dir, "api.sock"))

    def __repr__(self):
        return "Sandbox(%r)" % self.name

    # -- life --

    def start(self):
        """Boots the sandbox (a paused one continues where it was)."""
        self.client.cli("start", self.name)

    resume = start

    def stop(self, kill=False):
        """Powers the guest off and waits until the sandbox has stopped."""
        try:
            self._api.call("POST", "/v1/stop" + ("?kill=1" if kill else ""), timeout=120)
        except NotRunning:
            return
        deadline = time.monotonic() + 30
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def pause(self):
        """Writes the machine out to a checkpoint and frees its memory."""
        self._api.call("POST", "/v1/pause", timeout=600)
        deadline = time.monotonic() + 60
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def status(self):
        """The supervisor's status: name and state."""
        return self._api.call("GET", "/v1/status", timeout=10)

    def running(self):
        """Whether a supervisor runs for the sandbox: it holds a lock on
        supervisor.lock for its whole life (the kosa8 command's test too)."""
        try:
            fd = os.open(os.path.join(self.dir, "supervisor.lock"), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except OSError as e:
            return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        finally:
            os.close(fd)

    def info(self):
        """The guest's kernel, user and uptime."""
        return self._api.call("GET", "/v1/info", timeout=30)

    # -- commands --

    def exec(self, argv, stdin=None, env=(), cwd=None, user=None, timeout=None, stdout=None, stderr=None):
        """Runs argv in the guest and returns an ExecResult.

        stdin: bytes fed to the command. stdout/stderr: callables given each
        chunk as it comes (else collected in the result). timeout: seconds
        after which the command's process group is killed (timed_out is then
        set). env: KEY=VALUE entries; cwd: the working directory (default the
        workspace folder); user: a guest user or "root".
        """
        if not argv or not argv[0]:
            raise Error("exec: no command given")
        req = {"argv": [str(a) for a in argv]}
        if env:
            req["env"] = list(env)
        if cwd:
            req["dir"] = cwd
        if user:
            req["user"] = user
        start = time.monotonic()
        w = writer = None
        s, status, hdrs, r = self._api.request("POST", "/v1/exec", req,
                                               headers={"Connection": "Upgrade", "Upgrade": "kosa8-exec"}, timeout=60)
        try:
            if status != 101:
                n = min(int(hdrs.get("content-length", "0") or 0), MAX_BODY)
                raw = r.read(n) if n else b""
                try:
                    msg = json.loads(raw).get("error")
                except ValueError:
                    msg = None
                raise Error("exec in %s: %s" % (self.name, msg or "HTTP %d" % status))
            # Stdin goes in from a thread of its own, on a socket of its own,
            # while this one reads the output: a command that writes much
            # before reading its input would otherwise wait on us while we
            # wait on it. Both sockets keep a timeout: the two share one open
            # file and so its non-blocking flag, which a socket without one
            # would trip on.
            w = s.dup()
            w.settimeout(STDIN_STALL)
            wlock = threading.Lock()
            writer = threading.Thread(target=_feed_stdin, args=(w, wlock, bytes(stdin or b"")), daemon=True)
            writer.start()
            out, err = [], []
            timed_out = False
            deadline = None if timeout is None else start + timeout
            while True:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 and not timed_out:
                        timed_out = True
                        # Never inside a stdin frame; a stdin write stuck on a
                        # command that reads none holds the lock (the kill
                        # could not get past it in the stream anyway).
                        if wlock.acquire(timeout=1):
                            try:
                                _write_frame(w, FRAME_SIGNAL, bytes([SIGKILL]))
                            except OSError:
                                pass  # it ended meanwhile: its exit is there to read
                            finally:
                                wlock.release()
                        deadline = time.monotonic() + KILL_GRACE
                        left = KILL_GRACE
                    s.settimeout(max(left, 0.01))
                else:
                    s.settimeout(60)  # no limit: a timeout only loops
                try:
                    kind, payload = _read_frame(r)
                except (socket.timeout, TimeoutError):
                    if timed_out:
                        raise Error("exec in %s: killed after its time limit but did not report its end" % self.name)
                    continue
                except (EOFError, ConnectionResetError):
                    # Reset: closed with our stdin unread (the frames sent
                    # before the close come first, so nothing is lost).
                    raise Error("exec in %s: the stream ended before the command did" % self.name)
                if kind == FRAME_STDOUT:
                    stdout(payload) if stdout else out.append(payload)
                elif kind == FRAME_STDERR:
                    stderr(payload) if stderr else err.append(payload)
                elif kind == FRAME_EXIT:
                    st = json.loads(payload)
                    if st.get("error"):
                        raise Error("exec in %s: %s" % (self.name, st["error"]))
                    return ExecResult(st.get("code", 0), b"".join(out), b"".join(err), st.get("signal", ""),
                                      timed_out, time.monotonic() - start)
                elif kind == FRAME_ERROR:
                    raise Error("exec in %s: %s" % (self.name, json.loads(payload).get("error", "failed")))
        finally:
            if writer is not None:
                # Unblocks a stdin write still waiting (EPIPE), then ends it.
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                writer.join(5)
                w.close()
            s.close()

    def output(self, *argv, timeout=None):
        """Runs argv and returns its standard output; Error on a non-zero exit."""
        r = self.exec(list(argv), timeout=timeout)
        if r.exit_code != 0:
            raise Error("%s: exit status %d: %s" % (argv[0], r.exit_code, r.stderr.decode(errors="replace").strip()))
        return r.stdout

    # -- files, as the sandbox's user --

    def _file_cmd(self, what, argv, stdin=None):
        r = self.exec(argv, stdin=stdin)
        if r.exit_code != 0:
            raise Error("%s: %s" % (what, r.stderr.decode(errors="replace").strip() or "exit status %d" % r.exit_code))
        return r.stdout

    def read_file(self, path):
        """A file's content (bytes); relative paths are in the workspace."""
        return self._file_cmd("read " + path, ["cat", "--", _guest_path(path)])

    def write_file(self, path, data, mode=0o644):
        """Replaces (or creates) a file, with its parent folders; the content
        appears whole (written beside it and renamed over it)."""
        if isinstance(data, str):
            data = data.encode()
        self._file_cmd("write " + path, ["sh", "-c", WRITE_SCRIPT, "sh", _guest_path(path), "%o" % (mode & 0o777)], stdin=data)

    def list_dir(self, path="."):
        """A folder's entries: name, type (file, dir, link, other), size,
        mode, mtime, link."""
        return parse_list(self._file_cmd("list " + path, ["sh", "-c", LIST_SCRIPT, "sh", _guest_path(path)]))

    # -- checkpoints --

    def checkpoint(self, message=""):
        """Saves the running machine; returns the checkpoint (id, pause_ms, ...)."""
        return self._api.call("POST", "/v1/checkpoints", {"message": message})

    def rewind(self, checkpoint_id):
        """Returns the machine and workspace to a checkpoint; the state before
        is saved as one (result["saved"])."""
        return self._api.call("POST", "/v1/rewind", {"id": checkpoint_id})

    def checkpoints(self):
        """The checkpoints, oldest first, with their sizes on disk (the
        totals: `kosa8 checkpoints NAME --json`'s "totals")."""
        return self.client.cli_json("checkpoints", self.name)["checkpoints"]

    def delete_checkpoint(self, checkpoint_id):
        if self.running():
            self._api.call("DELETE", "/v1/checkpoints/" + checkpoint_id)
        else:
            self.client.cli("checkpoint", "rm", self.name, checkpoint_id)

    # -- network --

    def rules(self):
        """The network allow-list."""
        if self.running():
            return self._api.call("GET", "/v1/net")["rules"]
        return self.client.cli_json("net", "ls", self.name)["rules"]

    def allow(self, *rules, broad=False):
        """Adds rules (example.com, host:22, *.example.com, CIDR); returns the list."""
        if self.running():
            return self._api.call("POST", "/v1/net/allow", {"rules": list(rules), "allow_broad": broad})["rules"]
        self.client.cli("net", "allow", *(["--allow-broad"] if broad else []), self.name, *rules)
        return self.rules()

    def deny(self, *targets):
        """Adds deny rules (they win over allow rules); returns the list."""
        if self.running():
            return self._api.call("POST", "/v1/net/deny", {"rules": list(targets)})["rules"]
        self.client.cli("net", "deny", self.name, *targets)
        return self.rules()

    def remove_rules(self, *targets):
        """Removes the rules (allow, or deny:TARGET) for targets; returns the list."""
        if self.running():
            return self._api.call("POST", "/v1/net/rm", {"rules": list(targets)})["rules"]
        self.client.cli("net", "rm", self.name, *targets)
        return self.rules()

    def blocked(self):
        """Hosts the sandbox was refused, each with the rule that allows it."""
        return self.client.cli_json("net", "blocked", self.name)

    # -- ports and sync --

    def ports(self):
        return self._api.call("GET", "/v1/ports") or []

    def add_port(self, host_port, guest_port=None):
        return self._api.call("POST", "/v1/ports", {"host_port": host_port, "guest_port": guest_port or host_port})

    def remove_port(self, host_port):
        return self._api.call("DELETE", "/v1/ports/%d" % int(host_port))

    def sync_status(self, now=False):
        """The workspace sync: pending, held, conflicts, errors."""
        if now:
            return self._api.call("POST", "/v1/sync/now")
        return self._api.call("GET", "/v1/sync")
