"""rdma_cm: rping, ucmatose, udaddy and perftest over rdma_cm (kernel verbs + QP1)."""

import re

from harness import expect, expect_in, pair, scenario


@scenario("A")
def rping_payload(ctx):
    ip = ctx.a.ip
    sout, cout = pair(ctx.a, ctx.b, "rping -s -a %s -v -V -C 100" % ip,
                      "rping -c -a %s -v -V -C 100" % ip, timeout=240)
    pings = re.findall(r"ping data: rdma-ping-(\d+): ", cout)
    expect(len(pings) == 100, "rping client printed 100 verified pings (got %d)" % len(pings), cout)
    expect_in("rdma-ping-99: ", sout, "rping server output")


@scenario("A")
def ucmatose_connect(ctx):
    sout, cout = pair(ctx.a, ctx.b, "ucmatose", "ucmatose -s %s" % ctx.a.ip, timeout=240)
    expect_in("test complete", cout, "ucmatose client")
    expect_in("return status 0", cout, "ucmatose client")


@scenario("A")
def udaddy_datagrams(ctx):
    sout, cout = pair(ctx.a, ctx.b, "udaddy", "udaddy -s %s" % ctx.a.ip, timeout=240)
    expect_in("test complete", cout, "udaddy client")
    expect_in("return status 0", cout, "udaddy client")


@scenario("A")
def perftest_send_bw_rdma_cm(ctx):
    base = "ib_send_bw -d vrdma0 -R -s 4096 -n 200"
    sout, cout = pair(ctx.a, ctx.b, base, base + " " + ctx.a.ip, timeout=300, settle=2.0)
    expect(re.search(r"^\s*4096\s+200\s+[\d.]+", cout, re.M) is not None,
           "ib_send_bw -R printed a result row", cout)
