"""rdma-core's verbs examples (ibverbs-utils) between two vrdma guests."""

from harness import expect_in, pair, roce_v2_gid_index, scenario


def pingpong(ctx, tool, extra, timeout=240):
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    srv = "%s -d vrdma0 -g %d %s" % (tool, g, extra)
    sout, cout = pair(ctx.a, ctx.b, srv, srv + " " + ctx.a.ip, timeout=timeout)
    expect_in("iters in", cout, "%s client output" % tool)
    ctx.note(cout.strip().splitlines()[-1])
    return sout, cout


@scenario("two_vrdma_fabric", ci=True)
def rc_pingpong_sizes_checked(ctx):
    """`ibv_rc_pingpong -c` (data checked) at 1 B, 4 KiB, 64 KiB and 1 MiB messages."""
    for size, iters in ((1, 200), (4096, 200), (65536, 50), (1048576, 10)):
        pingpong(ctx, "ibv_rc_pingpong", "-s %d -n %d -c" % (size, iters))


# One scenario per row: (scenario name, ibverbs example, its options). A failure names the row's
# scenario, as a hand-written function of that name would.
PINGPONGS = (
    ("rc_pingpong_new_send_api", "ibv_rc_pingpong", "-N -n 200 -c"),
    ("rc_pingpong_events", "ibv_rc_pingpong", "-e -n 200"),
    ("rc_pingpong_odp_explicit", "ibv_rc_pingpong", "-o -n 200 -c"),
    ("rc_pingpong_odp_implicit", "ibv_rc_pingpong", "-O -n 200 -c"),
    ("rc_pingpong_odp_implicit_prefetch", "ibv_rc_pingpong", "-O -P -n 200 -c"),
    ("uc_pingpong", "ibv_uc_pingpong", "-n 200"),
    ("ud_pingpong", "ibv_ud_pingpong", "-s 512 -n 200"),
    ("srq_pingpong_several_qps", "ibv_srq_pingpong", "-q 4 -n 100"),
)


def _pingpong_scenario(name, tool, extra):
    def run(ctx):
        pingpong(ctx, tool, extra)
    run.__name__ = name
    run.__doc__ = "`%s %s` between the two guests." % (tool, extra)
    return scenario("two_vrdma_fabric", ci=True)(run)


for _row in PINGPONGS:
    _pingpong_scenario(*_row)


@scenario("two_vrdma_fabric", ci=True)
def xsrq_pingpong(ctx):
    """XRC (spec §13.7) between the two guests: ibv_xsrq_pingpong opens an XRCD, creates an
    XRC SRQ, XRC_RECV and XRC_SEND QPs and sends through the peer's SRQ number."""
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    srv = "ibv_xsrq_pingpong -d vrdma0 -g %d -n 50" % g
    sout, cout = pair(ctx.a, ctx.b, srv, srv + " " + ctx.a.ip)
    expect_in("success", cout, "ibv_xsrq_pingpong client output")
    expect_in("success", sout, "ibv_xsrq_pingpong server output")
    ctx.note(cout.strip().splitlines()[-1])
