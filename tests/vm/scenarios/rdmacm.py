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


def mckey_pair(receiver, sender, group="239.1.2.3", count=10):
    """mckey (rdma_cm UD multicast, spec §15.8): `receiver` joins `group` and waits for
    `count` datagrams, `sender` joins and sends them. Returns (receiver, sender) output."""
    rout, sout = pair(
        receiver, sender,
        "mckey -m %s -b %s -C %d" % (group, receiver.ip, count),
        "mckey -m %s -b %s -s -C %d" % (group, sender.ip, count),
        timeout=180, settle=3.0)
    both = rout + sout
    expect_in("joined dgid: ::ffff:%s" % group, rout, "the receiver's join")
    expect_in("joined dgid: ::ffff:%s" % group, sout, "the sender's join")
    expect_in("data transfers complete", rout, "the receiver")
    expect("error" not in rout.lower() and "failed" not in rout.lower(),
           "the receiver reported no error", rout)
    return rout, sout


@scenario("A")
def mckey_multicast(ctx):
    mckey_pair(ctx.a, ctx.b)
    # And the other way round, on another group.
    mckey_pair(ctx.b, ctx.a, group="239.1.2.4")
