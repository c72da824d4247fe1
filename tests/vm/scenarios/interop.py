"""Topology vrdma_and_rxe_udp: a vrdma guest against a Linux rxe guest (the kernel's own RoCEv2)."""

import re

from harness import (expect, expect_in, ib_dev, pair, push_guest_script, roce_v2_gid_index,
                     scenario)


def pp(ctx, server, client, tool, extra):
    gs = roce_v2_gid_index(server, ib_dev(server))
    gc = roce_v2_gid_index(client, ib_dev(client))
    srv = "%s -d %s -g %d %s" % (tool, ib_dev(server), gs, extra)
    cli = "%s -d %s -g %d %s %s" % (tool, ib_dev(client), gc, extra, server.ip)
    sout, cout = pair(server, client, srv, cli, timeout=240)
    expect_in("iters in", cout, "%s client" % tool)
    ctx.note("%s %s -> %s: %s" % (tool, client.kind, server.kind, cout.strip().splitlines()[-1]))


@scenario("vrdma_and_rxe_udp", ci=True)
def interop_rc_pingpong_vrdma_server(ctx):
    """`ibv_rc_pingpong -c` with the vrdma guest as server and the rxe guest as client."""
    pp(ctx, ctx.a, ctx.b, "ibv_rc_pingpong", "-n 200 -c")


@scenario("vrdma_and_rxe_udp", ci=True)
def interop_rc_pingpong_vrdma_client(ctx):
    """`ibv_rc_pingpong -c -s 65536` with the rxe guest as server and the vrdma guest as client."""
    pp(ctx, ctx.b, ctx.a, "ibv_rc_pingpong", "-n 200 -c -s 65536")


@scenario("vrdma_and_rxe_udp", ci=True)
def interop_ud_pingpong(ctx):
    """`ibv_ud_pingpong`, 512 B datagrams, between the vrdma and the rxe guest."""
    pp(ctx, ctx.a, ctx.b, "ibv_ud_pingpong", "-s 512 -n 200")


def perf(ctx, tool):
    srv, cli = ctx.a, ctx.b
    gs = roce_v2_gid_index(srv, ib_dev(srv))
    gc = roce_v2_gid_index(cli, ib_dev(cli))
    s = "%s -d %s -x %d -s 65536 -n 100" % (tool, ib_dev(srv), gs)
    c = "%s -d %s -x %d -s 65536 -n 100 %s" % (tool, ib_dev(cli), gc, srv.ip)
    sout, cout = pair(srv, cli, s, c, timeout=300)
    row = re.search(r"^\s*65536\s+100\s+([\d.]+)\s+([\d.]+)", cout, re.M)
    expect(row is not None, "%s printed a result row" % tool, cout)
    ctx.note("%s rxe -> vrdma: %s MB/s avg" % (tool, row.group(2)))


@scenario("vrdma_and_rxe_udp", ci=True)
def interop_write_bw(ctx):
    """`ib_write_bw` 64 KiB from the rxe guest to the vrdma guest prints a result row."""
    perf(ctx, "ib_write_bw")


@scenario("vrdma_and_rxe_udp", ci=True)
def interop_read_bw(ctx):
    """`ib_read_bw` 64 KiB between the rxe guest and the vrdma guest prints a result row."""
    perf(ctx, "ib_read_bw")


@scenario("vrdma_and_rxe_udp", ci=True)
def interop_mckey_multicast(ctx):
    """UD multicast between vrdma and Linux rxe, each side receiving once (spec §15.8)."""
    from scenarios.rdmacm import mckey_pair
    vrdma, rxe = ctx.a, ctx.b
    mckey_pair(rxe, vrdma, group="239.2.0.1")
    # An rxe sender runs mcast_send.py instead of `mckey -s`: mckey destroys its AH right
    # after posting, and rxe, which looks the AH up later on a work queue, then drops the
    # datagrams (the script's docstring has the evidence). mckey still receives.
    script = push_guest_script([rxe], "mcast_send.py")
    mckey_pair(vrdma, rxe, group="239.2.0.2",
               send_cmd="python3 %s {group} {ip} {count}" % script)
