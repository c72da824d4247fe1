"""Driver lifecycle: rmmod/modprobe of vrdma with verbs objects open in another process.

Runs last in topology A (it reloads the driver under the other scenarios' feet)."""

import re
import time

from harness import expect, expect_in, pair, run_ok, scenario


@scenario("A")
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
