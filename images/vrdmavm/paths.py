"""Where the images, QEMU and the backend binary are (environment overrides)."""

import hashlib
import os

# images/vrdmavm/paths.py -> the checkout
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cache_dir():
    return os.environ.get("VRDMA_CACHE", "/var/cache/vrdma")


def checkout_dir():
    """Where images/ puts what it builds from this checkout's sources (images/lib.sh computes
    the same name)."""
    real = os.path.realpath(REPO)
    return os.path.join(cache_dir(), "checkout-" + hashlib.sha256(real.encode()).hexdigest()[:8])


def default_paths():
    """Paths of the images built by images/ (make images). The initrd is
    this checkout's (with its vrdma.ko and provider) when it was built."""
    c = cache_dir()
    initrd = os.path.join(checkout_dir(), "guest-initrd.cpio")
    if not os.path.exists(initrd):
        initrd = os.path.join(c, "guest-initrd.cpio")
    return {
        "qemu": os.environ.get("VRDMA_QEMU", os.path.join(c, "qemu-system-x86_64")),
        "kernel": os.environ.get("VRDMA_KERNEL", os.path.join(c, "vmlinuz")),
        "initrd": os.environ.get("VRDMA_INITRD", initrd),
        "backend": os.environ.get(
            "VRDMA_BACKEND", os.path.join(REPO, "target", "release", "vrdma-backend")),
    }
