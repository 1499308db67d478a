"""The package installs as pyproject.toml describes it (pip, offline: no
build isolation, so setuptools and wheel must be installed) and the installed copy
imports and is this one."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _have(module):
    return subprocess.run([sys.executable, "-c", "import " + module],
                          capture_output=True).returncode == 0


@unittest.skipUnless(_have("pip") and _have("setuptools")
                     and (_have("wheel") or _have("setuptools.command.bdist_wheel")),
                     "needs pip, setuptools and wheel (Debian: python3-pip python3-setuptools python3-wheel)")
class InstallTest(unittest.TestCase):
    def test_pip_install(self):
        target = tempfile.mkdtemp(prefix="kosa8-py-install-")
        self.addCleanup(shutil.rmtree, target, True)
        work = tempfile.mkdtemp(prefix="kosa8-py-src-")
        self.addCleanup(shutil.rmtree, work, True)
        # A copy: pip and setuptools write build/ and *.egg-info beside
        # the sources, which must not land in the repository.
        src = os.path.join(work, "python")
        shutil.copytree(HERE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation",
                            "--no-deps", "--no-cache-dir", "--target", target, src],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        env = dict(os.environ, PYTHONPATH=target)
        r = subprocess.run([sys.executable, "-c",
                            "import kosa8, sys; print(kosa8.__file__); print(sorted(kosa8.__all__))"],
                           capture_output=True, text=True, cwd=target, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        path, names = r.stdout.splitlines()
        self.assertTrue(path.startswith(target), path)
        self.assertIn("Client", names)
        self.assertIn("Sandbox", names)


if __name__ == "__main__":
    unittest.main()
