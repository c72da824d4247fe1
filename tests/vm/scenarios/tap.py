"""Topology B: the same RDMA over TAP devices on a bridge in a network namespace."""

import re

from harness import expect, expect_in, pair, roce_v2_gid_index, scenario


@scenario("B")
def tap_rc_pingpong(ctx):
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    srv = "ibv_rc_pingpong -d vrdma0 -g %d -n 200 -c -s 16384" % g
    sout, cout = pair(ctx.a, ctx.b, srv, srv + " " + ctx.a.ip, timeout=240)
    expect_in("iters in", cout, "ibv_rc_pingpong client")


@scenario("B")
def tap_write_bw(ctx):
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    s = "ib_write_bw -d vrdma0 -x %d -s 65536 -n 200" % g
    sout, cout = pair(ctx.a, ctx.b, s, s + " " + ctx.a.ip, timeout=300, settle=2.0)
    expect(re.search(r"^\s*65536\s+200\s+[\d.]+", cout, re.M) is not None,
           "ib_write_bw printed a result row", cout)


@scenario("B")
def tap_ping_netdev(ctx):
    out = ctx.b.run("busybox ping -c 3 -W 5 %s" % ctx.a.ip, timeout=30)[1]
    expect(re.search(r"3 packets received", out) is not None, "ping over the vrdma netdev", out)
