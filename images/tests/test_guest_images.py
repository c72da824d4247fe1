"""Offline tests of the guest image catalogue and the launcher's per-guest image choice."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = os.path.dirname(HERE)
sys.path.insert(0, IMAGES)
import guest_images  # noqa: E402
import vrdmavm  # noqa: E402


def opt(cmd, flag):
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


class Catalogue(unittest.TestCase):
    def setUp(self):
        self.cache = tempfile.mkdtemp(prefix="guest-images-test-")
        self.old = os.environ.get("VRDMA_CACHE")
        os.environ["VRDMA_CACHE"] = self.cache

    def tearDown(self):
        if self.old is None:
            del os.environ["VRDMA_CACHE"]
        else:
            os.environ["VRDMA_CACHE"] = self.old
        shutil.rmtree(self.cache, ignore_errors=True)

    def test_each_guest_has_its_kernel_and_this_checkouts_initrd(self):
        self.assertEqual(guest_images.names(), ["bookworm", "trixie", "trixie-7.3"])
        kernel, initrd = guest_images.paths("bookworm")
        self.assertEqual(kernel, os.path.join(self.cache, "kernel-6.1.0-57-amd64", "vmlinuz"))
        self.assertEqual(initrd, os.path.join(
            vrdmavm.checkout_dir(), "guest-bookworm", "initrd.cpio"))
        kernel, _ = guest_images.paths("trixie-7.3")
        self.assertEqual(kernel, os.path.join(self.cache, "kernel-7.3.4+deb13-amd64", "vmlinuz"))

    def test_the_default_image_is_what_make_images_builds(self):
        d = vrdmavm.default_paths()
        self.assertEqual(guest_images.paths("trixie"), (d["kernel"], d["initrd"]))

    def test_unknown_name(self):
        with self.assertRaises(ValueError):
            guest_images.paths("sid")

    def test_shell_form_for_the_build_script(self):
        out = subprocess.run([sys.executable, os.path.join(IMAGES, "guest_images.py"),
                              "--shell", "trixie-7.3"], check=True, capture_output=True,
                             text=True).stdout
        kv = dict(line.split("=", 1) for line in out.splitlines())
        self.assertEqual(kv["GUEST_KVER"], "7.3.4+deb13-amd64")
        self.assertEqual(kv["GUEST_KMOD"], "buildroot")
        self.assertEqual(kv["GUEST_ROOTFS_SCRIPT"], "mkrootfs.sh")
        self.assertTrue(os.path.exists(os.path.join(IMAGES, "guest", "mkrootfs-bookworm.sh")))

    def test_cluster_boots_each_guest_with_its_image(self):
        c = vrdmavm.Cluster(n=3, kind="vrdma", workdir=self.cache, kvm=False, qemu="/q",
                            kernel="/k", initrd="/i", backend="/b",
                            image=["bookworm", "trixie-7.3", None])
        q = [vm.qemu_cmd() for vm in c.vms]
        self.assertEqual(opt(q[0], "-kernel"), [guest_images.paths("bookworm")[0]])
        self.assertEqual(opt(q[0], "-initrd"), [guest_images.paths("bookworm")[1]])
        self.assertEqual(opt(q[1], "-kernel"), [guest_images.paths("trixie-7.3")[0]])
        self.assertEqual((opt(q[2], "-kernel"), opt(q[2], "-initrd")), (["/k"], ["/i"]))
        with self.assertRaises(ValueError):
            vrdmavm.Cluster(n=2, workdir=self.cache, image=["bookworm"])

    def test_a_missing_image_names_the_guest(self):
        c = vrdmavm.Cluster(n=1, kind="none", workdir=self.cache, kvm=False, qemu="/bin/true",
                            image="bookworm")
        with self.assertRaisesRegex(vrdmavm.VMError,
                                    "vm0's kernel .*make guest-images GUESTS=bookworm"):
            c._check_files()


if __name__ == "__main__":
    unittest.main()
