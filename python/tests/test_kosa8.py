"""Unit tests for the kosa8 Python client, against a fake supervisor on a
unix socket and a fake kosa8 command. Run: cd python && python3 -m unittest"""

import fcntl
import json
import os
import shutil
import socketserver
import stat
import struct
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kosa8  # noqa: E402


def frame(kind, payload=b""):
    return struct.pack(">BI", kind, len(payload)) + payload


class FakeGuest:
    """What the fake supervisor's guest knows: files and the signals it got."""

    def __init__(self):
        self.files = {}
        self.signals = []
        self.requests = []


def make_handler(guest):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def address_string(self):
            return "unix"

        def body(self):
            n = int(self.headers.get("Content-Length", "0"))
            return json.loads(self.rfile.read(n)) if n else None

        def reply(self, code, val):
            b = json.dumps(val).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

        def do_GET(self):
            if self.path == "/v1/status":
                self.reply(200, {"name": "x", "status": "running"})
            elif self.path == "/v1/net":
                self.reply(200, {"rules": ["pypi.org"]})
            elif self.path == "/v1/ports":
                self.reply(200, [{"host_port": 3000, "guest_port": 3000}])
            else:
                self.reply(404, {"error": "no route"})

        def do_DELETE(self):
            self.reply(200, {})

        def do_POST(self):
            req = self.body()
            guest.requests.append((self.path, req))
            if self.path == "/v1/checkpoints":
                self.reply(200, {"id": "cp1", "message": req["message"], "pause_ms": 12.5})
            elif self.path == "/v1/rewind":
                if req["id"] != "cp1":
                    self.reply(404, {"error": "rewind: checkpoint not found: " + req["id"]})
                else:
                    self.reply(200, {"to": "cp1", "saved": {"id": "cp2"}, "ms": 400})
            elif self.path == "/v1/net/allow":
                self.reply(200, {"rules": ["pypi.org"] + req["rules"]})
            elif self.path == "/v1/exec":
                self.exec(req)
            else:
                self.reply(404, {"error": "no route " + self.path})

        def read_frame(self):
            hdr = self.rfile.read(5)
            if len(hdr) < 5:
                return None, None
            kind, n = struct.unpack(">BI", hdr)
            return kind, self.rfile.read(n)

        def exec(self, req):
            self.close_connection = True  # frames follow, not another request
            if self.headers.get("Upgrade") != "kosa8-exec":
                self.reply(400, {"error": "exec needs Upgrade: kosa8-exec"})
                return
            argv = req["argv"]
            if argv[0] == "missing":
                self.reply(422, {"error": "exec missing: no such file"})
                return
            self.send_response(101)
            self.send_header("Upgrade", "kosa8-exec")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            if argv[0] == "early":
                # Done before reading any input (as cat FILE is), and the
                # stream closed: the client's stdin meets a closed socket.
                self.wfile.write(frame(kosa8.FRAME_STDOUT, b"early\n"))
                self.wfile.write(frame(kosa8.FRAME_EXIT, b'{"code": 0}'))
                self.wfile.flush()
                time.sleep(0.1)  # closed with the client's stdin unread: a reset
                os.close(self.connection.detach())
                return
            if argv[0] == "chatty":
                # Writes a lot before it reads its input, then echoes how
                # much it got: a client that sends all of stdin before
                # reading waits on it while it waits on the client.
                self.wfile.flush()
                for _ in range(64):
                    self.wfile.write(frame(kosa8.FRAME_STDOUT, b"o" * (64 << 10)))
                self.wfile.flush()
                got = 0
                while True:
                    kind, p = self.read_frame()
                    if kind == kosa8.FRAME_STDIN:
                        got += len(p)
                    if kind in (kosa8.FRAME_STDIN_EOF, None):
                        break
                self.wfile.write(frame(kosa8.FRAME_STDERR, str(got).encode()))
                self.wfile.write(frame(kosa8.FRAME_EXIT, b'{"code": 0}'))
                self.wfile.flush()
                return
            if argv[0] == "reset":
                # The stream dies before any output (the supervisor or the
                # agent gone): nothing but a closed, reset socket to read.
                self.wfile.flush()
                time.sleep(0.1)  # the client's stdin (or its end) is here, unread
                os.close(self.connection.detach())
                return
            self.wfile.flush()
            stdin = b""
            while True:  # stdin up to EOF, as the agent reads it
                kind, p = self.read_frame()
                if kind == kosa8.FRAME_STDIN:
                    stdin += p
                if kind in (kosa8.FRAME_STDIN_EOF, None):
                    break
            w = self.wfile
            if argv[0] == "echo":
                w.write(frame(kosa8.FRAME_STDOUT, " ".join(argv[1:]).encode() + b"\n"))
                w.write(frame(kosa8.FRAME_STDERR, b"warn\n"))
                w.write(frame(kosa8.FRAME_EXIT, b'{"code": 3}'))
            elif argv[0] == "big":
                for _ in range(3):
                    w.write(frame(kosa8.FRAME_STDOUT, b"x" * 100000))
                w.write(frame(kosa8.FRAME_EXIT, b'{"code": 0}'))
            elif argv[0] == "cat":
                if argv[2] in guest.files:
                    w.write(frame(kosa8.FRAME_STDOUT, guest.files[argv[2]]))
                    w.write(frame(kosa8.FRAME_EXIT, b'{"code": 0}'))
                else:
                    w.write(frame(kosa8.FRAME_STDERR, b"cat: No such file or directory\n"))
                    w.write(frame(kosa8.FRAME_EXIT, b'{"code": 1}'))
            elif argv[0] == "sh" and argv[2] == kosa8.WRITE_SCRIPT:
                guest.files[argv[4]] = argv[5].encode() + b":" + stdin
                w.write(frame(kosa8.FRAME_EXIT, b'{"code": 0}'))
            elif argv[0] == "sh" and argv[2] == kosa8.LIST_SCRIPT:
                w.write(frame(kosa8.FRAME_STDOUT, b"f\x005\x00644\x001700000000.5\x00b\x00\x00d\x004096\x00755\x001.0\x00a\x00\x00"))
                w.write(frame(kosa8.FRAME_EXIT, b'{"code": 0}'))
            elif argv[0] == "sleep":
                kind, p = self.read_frame()  # the kill
                if kind == kosa8.FRAME_SIGNAL:
                    guest.signals.append(p[0])
                    w.write(frame(kosa8.FRAME_EXIT, json.dumps({"code": 128 + p[0], "signal": "SIGKILL"}).encode()))
            elif argv[0] == "hang":
                time.sleep(3)  # never answers the kill within the test's grace
            else:
                w.write(frame(kosa8.FRAME_ERROR, b'{"error": "agent: cannot run"}'))
            w.flush()

    return Handler


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class ClientTest(unittest.TestCase):
    def setUp(self):
        # A short path: unix socket names are at most 107 bytes.
        self.home = tempfile.mkdtemp(prefix="k8py-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.home)
        self.dir = os.path.join(self.home, "sandboxes", "x")
        os.makedirs(self.dir)
        with open(os.path.join(self.dir, "sandbox.json"), "w") as f:
            json.dump({"name": "x"}, f)
        # Hold the supervisor lock, as a live supervisor does.
        self.lock = open(os.path.join(self.dir, "supervisor.lock"), "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.addCleanup(self.lock.close)
        self.guest = FakeGuest()
        self.srv = Server(os.path.join(self.dir, "api.sock"), make_handler(self.guest))
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.addCleanup(self.srv.server_close)
        self.addCleanup(self.srv.shutdown)
        self.client = kosa8.Client(home=self.home, binary="/nonexistent/kosa8")
        self.sb = self.client.sandbox("x")

    def test_exec_output_and_exit_code(self):
        r = self.sb.exec(["echo", "hi", "there"])
        self.assertEqual(r.exit_code, 3)
        self.assertEqual(r.stdout, b"hi there\n")
        self.assertEqual(r.stderr, b"warn\n")
        self.assertFalse(r.timed_out)
        # Streams go to callables as they come.
        chunks = []
        r = self.sb.exec(["big"], stdout=chunks.append)
        self.assertEqual(r.stdout, b"")
        self.assertEqual(sum(len(c) for c in chunks), 300000)
        with self.assertRaises(kosa8.Error) as e:
            self.sb.output("echo", "x")
        self.assertIn("exit status 3", str(e.exception))

    def test_exec_that_ends_before_reading_stdin(self):
        # Seen in the VM tests: read_file's cat ended and the stream closed
        # before the client had sent its stdin's end, a broken pipe.
        r = self.sb.exec(["early"], stdin=b"x" * (4 << 20))
        self.assertEqual((r.exit_code, r.stdout), (0, b"early\n"))
        r = self.sb.exec(["early"])
        self.assertEqual((r.exit_code, r.stdout), (0, b"early\n"))

    def test_exec_stream_reset_before_output(self):
        # The write's broken pipe is let pass for the output still to come;
        # when none comes, the reset must be the client's own error, saying
        # the stream ended, not a bare OSError, and never a hang.
        for stdin in (b"x" * (4 << 20), b"", None):
            with self.assertRaisesRegex(kosa8.Error, "stream ended"):
                self.sb.exec(["reset"], stdin=stdin, timeout=5)

    def test_exec_stdin_and_output_both_large(self):
        # 4 MiB each way, the output first: stdin must go in while the
        # output is read, or both sides wait for ever.
        r = self.sb.exec(["chatty"], stdin=b"i" * (4 << 20), timeout=30)
        self.assertEqual((r.exit_code, len(r.stdout), r.stderr, r.timed_out), (0, 4 << 20, b"4194304", False))

    def test_exec_errors(self):
        with self.assertRaisesRegex(kosa8.Error, "no such file"):
            self.sb.exec(["missing"])
        with self.assertRaisesRegex(kosa8.Error, "cannot run"):
            self.sb.exec(["other"])
        with self.assertRaises(kosa8.Error):
            self.sb.exec([])

    def test_exec_timeout_kills(self):
        t = time.monotonic()
        r = self.sb.exec(["sleep", "600"], timeout=0.3)
        self.assertTrue(r.timed_out)
        self.assertEqual(r.exit_code, 137)
        self.assertEqual(r.signal, "SIGKILL")
        self.assertEqual(self.guest.signals, [9])
        self.assertLess(time.monotonic() - t, 5)

    def test_exec_timeout_without_answer(self):
        old = kosa8.KILL_GRACE
        kosa8.KILL_GRACE = 0.3
        self.addCleanup(setattr, kosa8, "KILL_GRACE", old)
        with self.assertRaisesRegex(kosa8.Error, "did not report its end"):
            self.sb.exec(["hang"], timeout=0.2)

    def test_files(self):
        self.sb.write_file("notes/a.txt", b"data\x00bin", mode=0o600)
        self.assertEqual(self.guest.files["./notes/a.txt"], b"600:data\x00bin")
        self.guest.files["/etc/x"] = b"content"
        self.assertEqual(self.sb.read_file("/etc/x"), b"content")
        with self.assertRaisesRegex(kosa8.Error, "No such file"):
            self.sb.read_file("/missing")
        with self.assertRaises(kosa8.Error):
            self.sb.read_file("")
        entries = self.sb.list_dir("src")
        self.assertEqual([(e["name"], e["type"], e["mode"]) for e in entries], [("a", "dir", 0o755), ("b", "file", 0o644)])

    def test_parse_list_rejects_garbage(self):
        for bad in [b"f\x001\x00", b"f\x00x\x00644\x001\x00n\x00\x00", b"f\x001\x00644\x001\x00a/b\x00\x00"]:
            with self.assertRaises(kosa8.Error):
                kosa8.parse_list(bad)
        self.assertEqual(kosa8.parse_list(b"f\x001\x00644\x001\x00new\nline\x00\x00")[0]["name"], "new\nline")

    def test_checkpoint_rewind(self):
        cp = self.sb.checkpoint("before")
        self.assertEqual(cp["id"], "cp1")
        self.assertEqual(self.guest.requests[-1], ("/v1/checkpoints", {"message": "before"}))
        self.assertEqual(self.sb.rewind("cp1")["saved"]["id"], "cp2")
        with self.assertRaisesRegex(kosa8.Error, "checkpoint not found: nope"):
            self.sb.rewind("nope")

    def test_network_and_ports(self):
        self.assertEqual(self.sb.rules(), ["pypi.org"])
        self.assertEqual(self.sb.allow("example.com"), ["pypi.org", "example.com"])
        self.assertEqual(self.sb.ports()[0]["host_port"], 3000)
        self.assertTrue(self.sb.running())

    def test_not_running(self):
        self.lock.close()
        self.srv.shutdown()
        self.srv.server_close()
        os.unlink(os.path.join(self.dir, "api.sock"))
        with self.assertRaises(kosa8.NotRunning):
            self.sb.exec(["echo"])
        self.assertFalse(self.sb.running())
        self.sb.stop()  # nothing to stop

    def test_unknown_sandbox(self):
        with self.assertRaisesRegex(kosa8.Error, "no such sandbox"):
            self.client.sandbox("nope")


class CLITest(unittest.TestCase):
    """What goes through the kosa8 command: a fake one records its arguments."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        self.bin = os.path.join(self.tmp, "kosa8")
        self.log = os.path.join(self.tmp, "args")
        with open(self.bin, "w") as f:
            f.write('#!/bin/sh\nprintf "%%s\\n" "$KOSA8_HOME" "$PWD" "$@" > %s\n'
                    'case "$1" in create) echo made-1;; ls) echo \'[{"name":"a"}]\';; rm) echo "kosa8: no such sandbox" >&2; exit 1;; esac\n' % self.log)
        os.chmod(self.bin, stat.S_IRWXU)
        self.client = kosa8.Client(home=os.path.join(self.tmp, "home"), binary=self.bin)

    def args(self):
        with open(self.log) as f:
            return f.read().splitlines()

    def test_create(self):
        ws = os.path.join(self.tmp, "ws")
        os.mkdir(ws)
        sb = self.client.create(workspace=ws, cpus=4, allow=["pypi.org", "github.com:22"], env=["A=b"])
        self.assertEqual(sb.name, "made-1")
        a = self.args()
        self.assertEqual(a[0], self.client.home)  # the client's home reaches the command
        self.assertEqual(os.path.realpath(a[1]), os.path.realpath(ws))  # kosa8.toml is read from there
        self.assertEqual(a[2:], ["create", "--workspace", ws, "--cpus", "4", "--allow", "pypi.org", "--allow", "github.com:22", "--env", "A=b"])

    def test_list_and_errors(self):
        self.assertEqual(self.client.list(), [{"name": "a"}])
        self.assertEqual(self.args()[2:], ["ls", "--json"])
        with self.assertRaisesRegex(kosa8.Error, "^no such sandbox$"):
            self.client.remove("zz")

    def test_missing_binary(self):
        c = kosa8.Client(home=self.tmp, binary=None)
        old = os.environ.get("PATH", "")
        os.environ["PATH"] = self.tmp + "/nothing"
        self.addCleanup(os.environ.__setitem__, "PATH", old)
        with self.assertRaisesRegex(kosa8.Error, "not found on PATH"):
            c.list()


if __name__ == "__main__":
    unittest.main()
