"""The Python client against a real sandbox. It boots a VM, so it runs only
with KOSA8_E2E=1 and KOSA8_BIN naming the folder of kosa8 and kosa8-agent
(test/e2e's TestPythonClient runs it with a private KOSA8_HOME)."""

import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kosa8  # noqa: E402


@unittest.skipUnless(os.environ.get("KOSA8_E2E") == "1" and os.environ.get("KOSA8_BIN"),
                     "boots a VM: set KOSA8_E2E=1 and KOSA8_BIN (see README)")
class VMTest(unittest.TestCase):
    def test_sandbox(self):
        c = kosa8.Client(binary=os.path.join(os.environ["KOSA8_BIN"], "kosa8"))
        ws = tempfile.mkdtemp(dir=c.home, prefix="py-ws-")
        self.addCleanup(shutil.rmtree, ws, True)
        with open(os.path.join(ws, "hello.txt"), "w") as f:
            f.write("from the host\n")
        sb = c.create(name="py", workspace=ws, memory="512M")
        self.addCleanup(lambda: c.remove("py", force=True))
        self.assertFalse(sb.running())
        sb.start()
        self.assertTrue(sb.running())

        self.assertEqual(sb.output("cat", "hello.txt"), b"from the host\n")
        r = sb.exec(["sh", "-c", "cat; echo oops >&2; exit 5"], stdin=b"piped in\n")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (5, b"piped in\n", b"oops\n"))
        r = sb.exec(["sleep", "600"], timeout=2)
        self.assertTrue(r.timed_out)
        self.assertEqual(r.signal, "SIGKILL")

        sb.write_file("out/result.txt", "done\n")
        self.assertEqual(sb.read_file("out/result.txt"), b"done\n")
        self.assertEqual([(e["name"], e["type"]) for e in sb.list_dir("out")], [("result.txt", "file")])
        host = os.path.join(ws, "out", "result.txt")
        deadline = time.monotonic() + 15
        while not os.path.exists(host) and time.monotonic() < deadline:
            time.sleep(0.1)
        with open(host) as f:
            self.assertEqual(f.read(), "done\n")

        cp = sb.checkpoint("before")
        sb.write_file("/tmp/state", "changed\n")
        res = sb.rewind(cp["id"])
        self.assertEqual(res["to"], cp["id"])
        with self.assertRaisesRegex(kosa8.Error, "No such file"):
            sb.read_file("/tmp/state")
        ids = [x["id"] for x in sb.checkpoints()]
        self.assertIn(cp["id"], ids)
        self.assertIn(res["saved"]["id"], ids)

        self.assertEqual(sb.rules(), [])
        self.assertEqual(sb.allow("example.com"), ["example.com"])
        self.assertEqual(sb.remove_rules("example.com"), [])
        self.assertIn("path", sb.sync_status())

        sb.stop()
        self.assertFalse(sb.running())
        self.assertEqual(sb.allow("pypi.org"), ["pypi.org"])  # edited in the state of a stopped sandbox
        self.assertIn("py", [s["name"] for s in c.list()])


if __name__ == "__main__":
    unittest.main()
