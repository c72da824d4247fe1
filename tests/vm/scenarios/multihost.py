"""Topology two_vrdma_vxlan: vrdma guests on two "hosts" (network namespaces, a Linux bridge
each) joined by a kernel VXLAN tunnel over a veth underlay — RoCEv2 inside VXLAN, as across real hosts."""

import re

from harness import expect, expect_in, pair, roce_v2_gid_index, scenario
from . import nvmeof


@scenario("two_vrdma_vxlan", ci=True)
def vxlan_underlay_carries_the_guests(ctx):
    """The two guests live on different netns hosts and reach each other with `ping` across the
    VXLAN."""
    # The guests' frames cross the tunnel: each backend sits in its own host namespace.
    a, b = ctx.a, ctx.b
    expect(a.netns != b.netns, "the two guests live on different hosts (%s, %s)" % (
        a.netns, b.netns))
    out = b.run("busybox ping -c 3 -W 5 %s" % a.ip, timeout=30)[1]
    expect(re.search(r"3 packets received", out) is not None, "ping across the VXLAN", out)


@scenario("two_vrdma_vxlan", ci=True)
def vxlan_rc_pingpong(ctx):
    """`ibv_rc_pingpong -c`, 16 KiB messages, across the VXLAN between the two hosts."""
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    srv = "ibv_rc_pingpong -d vrdma0 -g %d -n 200 -c -s 16384" % g
    sout, cout = pair(ctx.a, ctx.b, srv, srv + " " + ctx.a.ip, timeout=240)
    expect_in("iters in", cout, "ibv_rc_pingpong client")


@scenario("two_vrdma_vxlan", ci=True)
def vxlan_write_bw(ctx):
    """`ib_write_bw` 64 KiB across the VXLAN prints a result row."""
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    s = "ib_write_bw -d vrdma0 -x %d -s 65536 -n 200" % g
    sout, cout = pair(ctx.a, ctx.b, s, s + " " + ctx.a.ip, timeout=300)
    row = re.search(r"^\s*65536\s+200\s+[\d.]+\s+([\d.]+)", cout, re.M)
    expect(row is not None, "ib_write_bw printed a result row", cout)
    ctx.note("ib_write_bw 64 KiB across VXLAN: %s MB/s avg" % row.group(1))


@scenario("two_vrdma_vxlan", ci=True, timeout=900)
def vxlan_nvmeof(ctx):
    """NVMe-oF/RDMA across the VXLAN: discover, connect, fio with verify, disconnect."""
    target, host = ctx.a, ctx.b
    nvmeof.target_up(target)
    try:
        nvmeof.host_prepare(host)
        nvmeof.discover(host, target)
        dev = nvmeof.connect(host, target)
        rates = nvmeof.fio_write_verify(host, dev, nvmeof.PATTERNS_RXE)
        ctx.note("NVMe-oF across VXLAN: " + ", ".join("%s %s" % r for r in rates))
        nvmeof.disconnect(host)
    finally:
        host.run("nvme disconnect -n %s" % nvmeof.NQN, timeout=60)
        nvmeof.target_down(target)
