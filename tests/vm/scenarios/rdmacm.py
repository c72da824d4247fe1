"""rdma_cm: rping, ucmatose, udaddy and perftest over rdma_cm (kernel verbs + QP1)."""

import re
import time

import vrdmavm
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
    `count` datagrams, `sender` joins and sends them. Returns (receiver, sender) output.

    Multicast UD has no retry: a datagram sent before the receiver's QP is attached is
    lost and the receiver waits forever. librdmacm attaches the QP before it reports the
    join, so the sender starts only once the receiver has printed its join (line-buffered
    into a file the harness can look at while mckey runs)."""
    log = "/tmp/mckey-%s.log" % group
    recv = receiver.spawn(
        "stdbuf -oL mckey -m %s -b %s -C %d >%s 2>&1; rc=$?; cat %s; exit $rc"
        % (group, receiver.ip, count, log, log), timeout=180)
    joined = "joined dgid: ::ffff:%s" % group
    deadline = time.monotonic() + 60
    while not recv.done() and time.monotonic() < deadline:
        if receiver.run("grep -qF '%s' %s" % (joined, log), timeout=30)[0] == 0:
            break
        time.sleep(0.3)
    else:
        rc, out = recv.wait(timeout=10) if recv.done() else (None, "")
        expect(False, "the receiver %s joined %s within 60 s" % (receiver.name, group),
               receiver.run("cat %s" % log, timeout=30)[1] + out)
    src, sout = sender.run("mckey -m %s -b %s -s -C %d" % (group, sender.ip, count),
                           timeout=180)
    try:
        rrc, rout = recv.wait(timeout=60)
    except vrdmavm.CommandTimeout as e:
        rrc, rout = None, "%s\n%s" % (e, getattr(e, "out", ""))
    both = "--- receiver (%s) ---\n%s\n--- sender (%s) ---\n%s" % (
        receiver.name, rout, sender.name, sout)
    expect(src == 0, "sender mckey on %s exited with %s" % (sender.name, src), both)
    expect(rrc == 0, "receiver mckey on %s exited with %s" % (receiver.name, rrc), both)
    expect_in(joined, rout, "the receiver's join")
    expect_in(joined, sout, "the sender's join")
    expect_in("data transfers complete", rout, "the receiver")
    expect("error" not in rout.lower() and "failed" not in rout.lower(),
           "the receiver reported no error", rout)
    return rout, sout


@scenario("A")
def mckey_multicast(ctx):
    mckey_pair(ctx.a, ctx.b)
    # And the other way round, on another group.
    mckey_pair(ctx.b, ctx.a, group="239.1.2.4")
