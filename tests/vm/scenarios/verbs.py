"""rdma-core's verbs examples (ibverbs-utils) between two vrdma guests."""

from harness import expect_in, pair, roce_v2_gid_index, scenario


def pingpong(ctx, tool, extra, timeout=240):
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    srv = "%s -d vrdma0 -g %d %s" % (tool, g, extra)
    sout, cout = pair(ctx.a, ctx.b, srv, srv + " " + ctx.a.ip, timeout=timeout)
    expect_in("iters in", cout, "%s client output" % tool)
    ctx.note(cout.strip().splitlines()[-1])
    return sout, cout


@scenario("A")
def rc_pingpong_sizes_checked(ctx):
    for size, iters in ((1, 200), (4096, 200), (65536, 50), (1048576, 10)):
        pingpong(ctx, "ibv_rc_pingpong", "-s %d -n %d -c" % (size, iters))


@scenario("A")
def rc_pingpong_new_send_api(ctx):
    pingpong(ctx, "ibv_rc_pingpong", "-N -n 200 -c")


@scenario("A")
def rc_pingpong_events(ctx):
    pingpong(ctx, "ibv_rc_pingpong", "-e -n 200")


@scenario("A")
def rc_pingpong_odp_explicit(ctx):
    pingpong(ctx, "ibv_rc_pingpong", "-o -n 200 -c")


@scenario("A")
def rc_pingpong_odp_implicit(ctx):
    pingpong(ctx, "ibv_rc_pingpong", "-O -n 200 -c")


@scenario("A")
def rc_pingpong_odp_implicit_prefetch(ctx):
    pingpong(ctx, "ibv_rc_pingpong", "-O -P -n 200 -c")


@scenario("A")
def uc_pingpong(ctx):
    pingpong(ctx, "ibv_uc_pingpong", "-n 200")


@scenario("A")
def ud_pingpong(ctx):
    pingpong(ctx, "ibv_ud_pingpong", "-s 512 -n 200")


@scenario("A")
def srq_pingpong_several_qps(ctx):
    pingpong(ctx, "ibv_srq_pingpong", "-q 4 -n 100")


@scenario("A")
def xsrq_pingpong(ctx):
    """XRC (spec §13.7) between the two guests: ibv_xsrq_pingpong opens an XRCD, creates an
    XRC SRQ, XRC_RECV and XRC_SEND QPs and sends through the peer's SRQ number."""
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    srv = "ibv_xsrq_pingpong -d vrdma0 -g %d -n 50" % g
    sout, cout = pair(ctx.a, ctx.b, srv, srv + " " + ctx.a.ip)
    expect_in("success", cout, "ibv_xsrq_pingpong client output")
    expect_in("success", sout, "ibv_xsrq_pingpong server output")
    ctx.note(cout.strip().splitlines()[-1])
