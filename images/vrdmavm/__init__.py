"""Boot vrdma test guests under QEMU and drive them through the guest agent.

Stdlib only. A command line (`python3 images/vrdmavm --help`, module cli) and a library:

    import sys; sys.path.insert(0, "images")
    import vrdmavm

    with vrdmavm.Cluster(n=2, kind="vrdma") as c:      # or kind="rxe"
        a, b = c.vms
        srv = a.spawn("ibv_rc_pingpong -g 1")          # runs in the background
        rc, out = b.run("sleep 1; ibv_rc_pingpong -g 1 %s" % a.ip, timeout=60)
        rc2, out2 = srv.wait(timeout=30)
        print(a.dmesg())

Modules, one concept each:
  cluster    Cluster: a set of guests on one network, started and cleaned up together
  vm         VM: one guest (QEMU, its backend, its agent); guest kinds vrdma, rxe, none
  networks   one class per uplink kind (fabric, fabric+tap, udp, tap, vxlan, fabric+vxlan)
  agent      the guest agent's host side (JSON lines over virtio-serial)
  qmp        a minimal QMP client
  migration  live migration of one guest (VM.migrate)
  stats      the backends' stats sockets (`vrdma-backend stats`)
  process    starting and stopping host processes; paths: where the images are
  cpu_limit  a CPU quota on host processes (cgroups), to give guests a fixed CPU share
  cli        the command line (__main__ runs it)

Environment: VRDMA_CACHE (default /var/cache/vrdma) locates the images,
VRDMA_QEMU / VRDMA_KERNEL / VRDMA_INITRD / VRDMA_BACKEND override single
paths, VRDMA_KVM=1 uses KVM instead of TCG, VRDMA_KEEP=1 keeps the run
directory, RUST_LOG is passed to the backends (default "info").
"""

from .agent import AGENT_PORT, Handle, Result
from .cluster import Cluster
from .errors import CommandTimeout, VMError
from .networks import FABRIC_TAP, UPLINKS
from .paths import REPO, cache_dir, checkout_dir, default_paths
from .vm import KINDS, RECONNECT_MS, VM

__all__ = ["AGENT_PORT", "Handle", "Result", "Cluster", "CommandTimeout", "VMError",
           "FABRIC_TAP", "UPLINKS", "REPO", "cache_dir", "checkout_dir", "default_paths",
           "KINDS", "RECONNECT_MS", "VM"]
