"""Live migration of one guest (device spec §17) to a new QEMU and a new backend, driven
over QMP."""

import os
import subprocess
import time

from .agent import AgentConnection
from .errors import VMError
from .networks import add_tap, ip
from .process import child_setup, stop, tail
from .qmp import Qmp

# What migrate() moves a VM to: the new processes, agent connection, TAP, sockets and logs.
SWAPPED = ("qemu", "backend", "agent", "tap", "vu_sock", "qmp_sock", "agent_sock",
           "backend_log", "pcap")


def migrate(vm, timeout=600):
    """Live-migrate vm to a new QEMU started with -incoming and its own new vrdma-backend
    (same MAC) on a new TAP of the same bridge, then swap the VM object over to them:
    agent, QMP, serial log, backend. The old QEMU and backend are stopped. Only for a vrdma
    guest with its own backend on a TAP uplink (uplink "tap" or "vxlan", or own_backend on
    "fabric+tap").
    Returns QEMU's final query-migrate answer (status, total-time, downtime in ms, ram);
    raises VMError if the migration fails (the guest then keeps running on the source)."""
    c = vm.cluster
    own = c.network.supports_migration or vm.own_backend
    if vm.kind != "vrdma" or not own or not vm.netns:
        raise VMError("%s: migrate needs a vrdma guest with its own backend on a TAP "
                      "uplink" % vm.name)
    vm._mig_gen = getattr(vm, "_mig_gen", 0) + 1
    tag = "%d-m%d" % (vm.index, vm._mig_gen)
    d = c.workdir
    old = {k: getattr(vm, k) for k in SWAPPED}
    mig_sock = os.path.join(d, "mig-%s.sock" % tag)
    vm.tap = "vrtap%dm%d" % (vm.index, vm._mig_gen)
    vm.vu_sock = os.path.join(d, "vu-%s.sock" % tag)
    vm.qmp_sock = os.path.join(d, "qmp-%s.sock" % tag)
    vm.agent_sock = os.path.join(d, "agent-%s.sock" % tag)
    vm.backend_log = os.path.join(d, "backend-%s.log" % tag)
    vm.pcap = os.path.join(d, "capture-%s.pcap" % tag)
    # vm.agent stays the source's connection until the swap: commands that end
    # meanwhile are reported there.
    vm.backend = vm.qemu = None
    try:
        start_destination(vm, mig_sock)
        src = Qmp(old["qmp_sock"])
        try:
            info = run_migration(src, mig_sock, timeout)
            waiters, next_id = take_waiters(old["agent"])
            wait_running(vm.qmp_sock)
            try:
                src.execute("quit")
            except (OSError, VMError):
                pass
        finally:
            src.close()
    except BaseException:
        stop(vm.qemu)
        stop(vm.backend)
        ip("-n", vm.netns, "link", "del", vm.tap, check=False)
        for k, v in old.items():
            setattr(vm, k, v)
        raise
    if old["agent"]:
        old["agent"].close()  # its waiters were moved: it fails none of them
    stop(old["qemu"])
    stop(old["backend"])
    ip("-n", vm.netns, "link", "del", old["tap"], check=False)
    new = AgentConnection(vm.agent_sock, vm.name)
    new.waiters.update(waiters)
    new.next_id = next_id
    vm.agent = new
    vm.agent.connect(time.monotonic() + 60, vm._alive)
    vm._request({"op": "ping"}, 60)
    return info


def start_destination(vm, mig_sock):
    """vm's new TAP, backend and QEMU (-incoming on mig_sock); returns once QEMU listens."""
    add_tap(vm.netns, vm.tap)
    vm.start_backend()
    with open(vm.qemu_log, "ab") as log:
        vm.qemu = subprocess.Popen(
            vm.qemu_cmd() + ["-incoming", "unix:" + mig_sock],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, preexec_fn=child_setup)
    deadline = time.monotonic() + 60
    while not os.path.exists(mig_sock) or not os.path.exists(vm.qmp_sock):
        if vm.qemu.poll() is not None:
            raise VMError("destination QEMU exited with %s:\n%s" % (
                vm.qemu.returncode, tail(vm.qemu_log)))
        if time.monotonic() > deadline:
            raise VMError("destination QEMU is not listening on " + mig_sock)
        time.sleep(0.05)


def run_migration(src, mig_sock, timeout):
    """Migrate the source QEMU (its QMP `src`) to mig_sock; its final query-migrate answer."""
    src.execute("migrate", {"uri": "unix:" + mig_sock})
    deadline = time.monotonic() + timeout
    while True:
        info = src.execute("query-migrate")
        if info.get("status") in ("completed", "failed", "cancelled"):
            break
        if time.monotonic() > deadline:
            src.execute("migrate_cancel")
            raise VMError("migration did not complete in %ss: %s" % (timeout, info))
        time.sleep(0.1)
    if info.get("status") != "completed":
        raise VMError("migration %s: %s" % (info.get("status"), info.get("error-desc", info)))
    return info


def take_waiters(agent):
    """The waiters and next request id of the source's agent connection, taken from it.

    Commands spawned before the move finish on the destination: their waiters go over to
    the new agent connection (before the old one closes and fails them)."""
    waiters, next_id = {}, 1
    if agent:
        with agent.lock:
            waiters = dict(agent.waiters)
            agent.waiters.clear()
            next_id = agent.next_id
    return waiters, next_id


def wait_running(qmp_sock):
    """Wait until the destination QEMU (its QMP socket) runs the guest."""
    dst = Qmp(qmp_sock)
    deadline = time.monotonic() + 60
    while dst.execute("query-status").get("status") != "running":
        if time.monotonic() > deadline:
            raise VMError("the destination does not run after the migration")
        time.sleep(0.05)
    dst.close()
