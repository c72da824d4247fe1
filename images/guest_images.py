"""The guest images that images/ builds: which kernel, root filesystem and vrdma.ko each has.

One entry per guest operating system a VM can run (issue 35: where users are):

  trixie      the default image (make images): Debian 13 userspace, rdma-core 56.1,
              bookworm-backports' kernel 6.12 (images/build-guest-base.sh + overlay)
  bookworm    Debian 12: bookworm's kernel 6.1, rdma-core 44 (guest/mkrootfs-bookworm.sh)
  trixie-7.3  the trixie root filesystem on trixie-backports' kernel 7.3

The other images are built by images/build-guest-image.sh NAME (make guest-images), which
reads this catalogue (`python3 guest_images.py --shell NAME`), and the launcher asks it for a
guest's kernel and initrd (python3 images/vrdmavm --image NAME, Cluster(image=...)). Paths follow the
cache layout of images/lib.sh: kernels in $VRDMA_CACHE/kernel-<kver>/, the named guests'
shared parts in $VRDMA_CACHE/guests/<name>/, and what is built from a checkout's sources (the
initrd with its vrdma.ko) in that checkout's directory.
"""

import hashlib
import os
import sys

DEFAULT = "trixie"

# name: (kernel release, where its linux-image comes from, root filesystem script, vrdma.ko builder)
#   kernel source "host": the host's apt sources (bookworm); "buildroot": apt inside the trixie
#     build root (images/build-trixie-buildroot.sh), which has trixie-backports
#   rootfs: the script under images/guest/ that makes the root filesystem
#   kmod: "host" (the host's gcc-12 and /usr/src headers) or "buildroot" (gcc-14 in the root);
#     images/build-kmod-matrix.sh builds either
IMAGES = {
    "trixie": ("6.12.95+deb12-amd64", "host", "mkrootfs.sh", "host"),
    "bookworm": ("6.1.0-57-amd64", "host", "mkrootfs-bookworm.sh", "host"),
    "trixie-7.3": ("7.3.4+deb13-amd64", "buildroot", "mkrootfs.sh", "buildroot"),
}

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cache_dir():
    return os.environ.get("VRDMA_CACHE", "/var/cache/vrdma")


def checkout_dir():
    """Where images/ puts what it builds from this checkout's sources (as images/lib.sh)."""
    real = os.path.realpath(REPO)
    return os.path.join(cache_dir(), "checkout-" + hashlib.sha256(real.encode()).hexdigest()[:8])


def names():
    return sorted(IMAGES)


def image(name):
    """The catalogue entry of one guest image as a dict (ValueError for an unknown name)."""
    if name not in IMAGES:
        raise ValueError("unknown guest image %r (known: %s)" % (name, ", ".join(names())))
    kver, kernel_from, rootfs, kmod = IMAGES[name]
    c = cache_dir()
    if name == DEFAULT:
        initrd = os.path.join(checkout_dir(), "guest-initrd.cpio")
        if not os.path.exists(initrd):
            initrd = os.path.join(c, "guest-initrd.cpio")
        kernel = os.path.join(c, "vmlinuz")
    else:
        initrd = os.path.join(checkout_dir(), "guest-%s" % name, "initrd.cpio")
        kernel = os.path.join(c, "kernel-%s" % kver, "vmlinuz")
    return {
        "name": name,
        "kver": kver,
        "kernel_from": kernel_from,
        "rootfs_script": rootfs,
        "kmod": kmod,
        "kernel": kernel,
        "initrd": initrd,
    }


def paths(name):
    """(kernel, initrd) of guest image NAME, for QEMU's -kernel and -initrd."""
    i = image(name)
    return i["kernel"], i["initrd"]


def _shell(name):
    """KEY=value lines for images/build-guest-image.sh (values have no spaces or quotes)."""
    i = image(name)
    return "".join("GUEST_%s=%s\n" % (k.upper(), i[k])
                   for k in ("name", "kver", "kernel_from", "rootfs_script", "kmod",
                             "kernel", "initrd"))


def main(argv):
    if len(argv) == 2 and argv[0] == "--shell":
        sys.stdout.write(_shell(argv[1]))
        return 0
    if argv == ["--list"]:
        for n in names():
            i = image(n)
            print("%-11s kernel %-20s %s" % (n, i["kver"], i["initrd"]))
        return 0
    print("usage: guest_images.py --list | --shell NAME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ValueError as e:
        print("guest_images: %s" % e, file=sys.stderr)
        sys.exit(2)
