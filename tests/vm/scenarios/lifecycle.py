"""Driver lifecycle: rmmod/modprobe of vrdma with verbs objects open in another process, and
a vrdma-backend that dies under a running guest.

Both run last in topology A: they reload the driver, resp. kill a backend, under the other
scenarios' feet."""

import re
import time

from harness import expect, expect_in, pair, run_ok, scenario


@scenario("A", last=True)
def module_reload_with_objects_open(ctx):
    a, b = ctx.a, ctx.b
    # A server that holds a PD, MR, CQs, a QP and mmapped rings while it waits for a client.
    holder = a.spawn("ibv_rc_pingpong -d vrdma0 -g 1 -n 5", timeout=120)
    time.sleep(3)
    expect(not holder.done(), "the ibv_rc_pingpong server is waiting with its objects open")
    for i in range(2):
        out = run_ok(a, "rmmod vrdma && modprobe vrdma && sleep 1 && "
                        "ip link set eth0 up && ip addr add %s dev eth0 && sleep 2 && "
                        "ibv_devinfo -d vrdma0" % a.cidr, timeout=120)
        expect_in("PORT_ACTIVE", out, "ibv_devinfo after reload %d" % (i + 1))
    # The old process lost its device (disassociated) without blocking the unload; it still
    # waits for a TCP peer, and must end on a signal (no task stuck in the driver).
    holder.kill()
    rc, hout = holder.wait(timeout=60)
    ctx.note("the holder exited with %s after SIGTERM" % rc)
    # And the reloaded device carries RDMA again.
    srv = "ibv_rc_pingpong -d vrdma0 -g 1 -n 100 -c"
    _, cout = pair(a, b, srv, srv + " " + a.ip, timeout=180)
    expect(re.search(r"100 iters in", cout) is not None, "pingpong after the reload", cout)


@scenario("A", last=True)
def backend_crash_fails_verbs_cleanly(ctx):
    """SIGKILL the guest's vrdma-backend: the next command times out with a clear message,
    the port goes down, later verbs fail at once, and the driver still unloads."""
    a = ctx.a
    holder = a.spawn("ibv_rc_pingpong -d vrdma0 -g 1 -n 5", timeout=300)
    time.sleep(3)
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
