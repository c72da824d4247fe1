"""Driver lifecycle: rmmod/modprobe of vrdma with verbs objects open in another process, a
vrdma-backend restarted under a running guest, and one that dies and stays dead.

Both run last in topology two_vrdma_fabric: they reload the driver, resp. kill a backend,
under the other scenarios' feet."""

import re
import time

from harness import (expect, expect_in, listeners, pair, run_ok, scenario, spawn_server,
                     wait_listening)


# Holds device memory (spec §12.9) mapped and registered, with data in it, across the reloads.
DM_HOLDER = r"""
import time
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.mr import DMMR
from pyverbs.pd import PD
ctx = d.Context(name="vrdma0")
pd = PD(ctx)
dm = d.DM(ctx, d.AllocDmAttr(length=8192))
mr = DMMR(pd, 8192, e.IBV_ACCESS_ZERO_BASED | e.IBV_ACCESS_LOCAL_WRITE |
          e.IBV_ACCESS_REMOTE_WRITE, dm, 0)
dm.copy_to_dm(0, b"vrdma-dm" * 8, 64)
assert dm.copy_from_dm(0, 64) == b"vrdma-dm" * 8
print("holding DM", mr.lkey, flush=True)
time.sleep(600)
"""


@scenario("two_vrdma_fabric", ci=True, last=True)
def module_reload_with_objects_open(ctx):
    """`rmmod vrdma` / `modprobe vrdma` twice while processes hold verbs objects and device
    memory: the holders are disassociated and end on a signal, and RDMA works again."""
    a, b = ctx.a, ctx.b
    # A server that holds a PD, MR, CQs, a QP and mmapped rings while it waits for a client
    # (it listens for the client once it has them).
    before = listeners(a)
    holder = a.spawn("ibv_rc_pingpong -d vrdma0 -g 1 -n 5", timeout=120)
    a.write_file("/tmp/dm_holder.py", DM_HOLDER, mode=0o644)
    run_ok(a, "rm -f /tmp/dm_holder.log")
    # Its output goes to a file the harness can look at while it runs: the reloads start only
    # once it holds its DM (a loaded TCG guest takes seconds to import pyverbs).
    dm_holder = a.spawn("exec python3 -u /tmp/dm_holder.py >/tmp/dm_holder.log 2>&1",
                        timeout=120)
    expect(wait_listening(a, before, holder),
           "the ibv_rc_pingpong server is waiting with its objects open")
    held, out = _wait_for(a, "grep -q 'holding DM' /tmp/dm_holder.log && cat /tmp/dm_holder.log",
                          time.monotonic() + 90)
    expect(held and not dm_holder.done(),
           "the device-memory holder is waiting with its DM mapped", out)
    for i in range(2):
        out = run_ok(a, "rmmod vrdma && modprobe vrdma && sleep 1 && "
                        "ip link set eth0 up && ip addr replace %s dev eth0 && sleep 2 && "
                        "ibv_devinfo -d vrdma0" % a.cidr, timeout=120)
        expect_in("PORT_ACTIVE", out, "ibv_devinfo after reload %d" % (i + 1))
    # The old process lost its device (disassociated) without blocking the unload; it still
    # waits for a TCP peer, and must end on a signal (no task stuck in the driver).
    holder.kill()
    rc, hout = holder.wait(timeout=60)
    ctx.note("the holder exited with %s after SIGTERM" % rc)
    dm_holder.kill()
    rc, _ = dm_holder.wait(timeout=60)
    ctx.note("the DM holder exited with %s after SIGTERM" % rc)
    dout = run_ok(a, "cat /tmp/dm_holder.log")
    expect_in("holding DM", dout, "the DM holder had its DM and DM MR before the reloads")
    # And the reloaded device carries RDMA again.
    srv = "ibv_rc_pingpong -d vrdma0 -g 1 -n 100 -c"
    _, cout = pair(a, b, srv, srv + " " + a.ip, timeout=180)
    expect(re.search(r"100 iters in", cout) is not None, "pingpong after the reload", cout)


def _wait_for(vm, cmd, deadline, step=0.25):
    """Run cmd in vm until it exits 0 or the monotonic deadline passes; returns (ok, out)."""
    while True:
        rc, out = vm.run(cmd, timeout=30)
        if rc == 0 or time.monotonic() > deadline:
            return rc == 0, out
        time.sleep(step)


@scenario("two_vrdma_fabric", ci=True, timeout=400, last=True)
def backend_restart_recovers(ctx):
    """SIGKILL a guest's vrdma-backend under ib_write_bw and start it again (issue #16): QEMU
    reconnects, the device asks for a reset (DEVICE_NEEDS_RESET, spec §2.4), vrdma.ko sends
    IB_EVENT_DEVICE_FATAL, unregisters, resets and registers the device again on its own.
    The old processes' contexts are dead but they exit on a signal; new ones work."""
    a, b = ctx.a, ctx.b
    # The driver's IB_EVENT_DEVICE_FATAL carries port 1 (the one uverbs adds when it
    # disassociates the context carries port 0).
    # (line-buffered: it may end on a signal, its stdout is a pipe)
    watch = a.spawn("stdbuf -oL ibv_asyncwatch -d vrdma0 2>&1", timeout=300)
    bw = "ib_write_bw -d vrdma0 -x 1 -F -D 120 -s 4096 -q 2"
    srv = spawn_server(b, bw + " 2>&1", 300)
    cli = a.spawn("%s %s 2>&1" % (bw, b.ip), timeout=300)
    time.sleep(8)
    expect(not cli.done() and not srv.done(), "ib_write_bw runs when the backend dies")
    before = a.dmesg()

    t_kill = time.monotonic()
    a.kill_backend()
    a.restart_backend()
    t_started = time.monotonic() - t_kill

    # On a fabric the daemon served both guests: both devices recover, and the pingpong
    # below needs both (the server's eth0 address, the client's port).
    t_active = {}
    for vm in (a, b):
        active, out = _wait_for(vm, "ibv_devinfo -d vrdma0 | grep -q PORT_ACTIVE",
                                t_kill + 90)
        t_active[vm.name] = time.monotonic() - t_kill
        expect(active, "%s: vrdma0 is PORT_ACTIVE again within 90 s of the kill" % vm.name,
               out)
        # The netdev came back as a new interface; the guest's init configures it like at
        # boot.
        ready, out = _wait_for(vm, "ip -o addr show eth0 | grep -q 'inet %s'" % vm.cidr,
                               t_kill + 90)
        expect(ready, "%s: eth0 has its address again" % vm.name, out)
    # The guests' neighbour entries went with the old netdevs: resolve again before the
    # pingpong's TCP exchange (pair() waits only for the server to listen).
    ok, out = _wait_for(a, "busybox ping -c 1 -W 1 %s" % b.ip, t_kill + 90)
    expect(ok, "%s reaches %s over the recovered netdevs" % (a.name, b.name), out)
    t_active = t_active[a.name]

    srv_pp = "ibv_rc_pingpong -d vrdma0 -g 1 -n 100 -p 18700"
    _, cout = pair(b, a, srv_pp, srv_pp + " " + b.ip, timeout=180)
    t_pingpong = time.monotonic() - t_kill
    expect(re.search(r"100 iters in", cout) is not None, "a new pingpong after the restart", cout)
    ctx.note("backend restarted %.1fs after the kill; kill -> PORT_ACTIVE %.1fs; "
             "kill -> pingpong passed %.1fs" % (t_started, t_active, t_pingpong))

    d = a.dmesg()[len(before):]
    expect_in("device needs a reset", d, "the driver's dmesg after the restart")
    m = re.search(r"recovered in (\d+) ms", d)
    expect(m is not None, "the driver recovered on its own", d)
    ctx.note("the driver's reset + re-probe took %s ms" % m.group(1))

    # The old processes: their contexts died (disassociated), they end on a signal.
    for name, p in (("ib_write_bw client", cli), ("ib_write_bw server", srv)):
        if not p.done():
            p.kill()
        rc, pout = p.wait(timeout=60)
        ctx.note("%s exited with %s: %s" % (name, rc, pout.strip().splitlines()[-1:]))
    if not watch.done():
        watch.kill()
    _, wout = watch.wait(timeout=60)
    ctx.note("ibv_asyncwatch: %s" % " | ".join(wout.strip().splitlines()[-4:]))
    expect_in("IBV_EVENT_DEVICE_FATAL (8), port 1", wout, "ibv_asyncwatch: the driver's event")


@scenario("two_vrdma_fabric", ci=True, last=True)
def backend_crash_fails_verbs_cleanly(ctx):
    """SIGKILL the guest's vrdma-backend: the next command times out with a clear message,
    the port goes down, later verbs fail at once, and the driver still unloads."""
    a = ctx.a
    holder = spawn_server(a, "ibv_rc_pingpong -d vrdma0 -g 1 -n 5", 300)
    expect(not holder.done(), "a process holds verbs objects when the backend dies")
    a.kill_backend()

    # ALLOC_PD is a command: nobody answers it, the driver gives up after its timeout.
    t0 = time.monotonic()
    rc, out = a.run("ibv_rc_pingpong -d vrdma0 -g 1 -p 18600 2>&1", timeout=90)
    waited = time.monotonic() - t0
    ctx.note("first verb after the crash: exit %s after %.1fs: %s" % (
        rc, waited, out.strip().splitlines()[-1:] or ""))
    expect(rc != 0, "ibv_rc_pingpong fails once the backend is gone", out)
    expect(waited < 60, "the failing verb returned within the command timeout (%.1fs)" % waited)
    expect_in("device marked broken", a.dmesg(), "the driver's message")

    # The port reports the loss (the fatal-device work item has run by now).
    deadline = time.monotonic() + 20
    while True:
        out = run_ok(a, "ibv_devinfo -d vrdma0; ip link show eth0")
        if "PORT_DOWN" in out and "NO-CARRIER" in out or time.monotonic() > deadline:
            break
        time.sleep(1)
    expect_in("PORT_DOWN", out, "ibv_devinfo after the crash")
    expect_in("NO-CARRIER", out, "the netdev's carrier after the crash")

    # From now on verbs fail at once instead of waiting for the timeout again.
    t0 = time.monotonic()
    rc, out = a.run("ibv_rc_pingpong -d vrdma0 -g 1 -p 18601 2>&1", timeout=60)
    expect(rc != 0 and time.monotonic() - t0 < 8,
           "a second verb fails fast (exit %s after %.1fs)" % (rc, time.monotonic() - t0), out)

    holder.kill()
    hrc, _ = holder.wait(timeout=60)
    ctx.note("the holder exited with %s after SIGTERM" % hrc)
    t0 = time.monotonic()
    out = run_ok(a, "rmmod vrdma && ! grep -q '^vrdma ' /proc/modules && echo unloaded",
                 timeout=120)
    ctx.note("rmmod took %.1fs" % (time.monotonic() - t0))
    expect_in("unloaded", out, "rmmod vrdma with a dead backend")
