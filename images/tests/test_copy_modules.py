"""Offline tests of guest/copy-modules.py: globs, the modules.dep closure, unmatched globs."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "guest", "copy-modules.py")


class CopyModules(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="copy-modules-test-")
        self.src = os.path.join(self.tmp, "src")
        mods = {"kernel/drivers/infiniband/core/ib_core.ko.xz": [],
                "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz":
                    ["kernel/drivers/infiniband/core/ib_core.ko.xz", "kernel/net/udp_tunnel.ko"],
                "kernel/net/udp_tunnel.ko": [],
                "kernel/fs/unrelated.ko": []}
        with open(self._mk("modules.dep"), "w") as f:
            for m, deps in mods.items():
                open(self._mk(m), "w").close()
                f.write("%s: %s\n" % (m, " ".join(deps)))
        open(self._mk("modules.builtin"), "w").close()

    def _mk(self, rel):
        path = os.path.join(self.src, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_script(self, patterns, *flags):
        lst = os.path.join(self.tmp, "list")
        with open(lst, "w") as f:
            f.write("# comment\n" + "\n".join(patterns) + "\n")
        dst = os.path.join(self.tmp, "dst")
        p = subprocess.run([sys.executable, SCRIPT] + list(flags) + [self.src, dst, lst],
                           capture_output=True, text=True)
        files = sorted(os.path.relpath(os.path.join(d, n), dst)
                       for d, _, names in os.walk(dst) for n in names)
        return p, files

    def test_a_glob_brings_its_dependencies(self):
        p, files = self.run_script(["drivers/infiniband/sw/**"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(files, ["kernel/drivers/infiniband/core/ib_core.ko.xz",
                                 "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz",
                                 "kernel/net/udp_tunnel.ko", "modules.builtin"])

    def test_an_unmatched_glob_fails_unless_skipped(self):
        p, _ = self.run_script(["net/udp_tunnel", "arch/x86/crypto/crc32*"])
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no module matches arch/x86/crypto/crc32*", p.stderr)
        p, files = self.run_script(["net/udp_tunnel", "arch/x86/crypto/crc32*"],
                                   "--skip-unmatched")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(files, ["kernel/net/udp_tunnel.ko", "modules.builtin"])


if __name__ == "__main__":
    unittest.main()
