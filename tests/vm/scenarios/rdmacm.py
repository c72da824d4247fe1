"""rdma_cm: rping, ucmatose, udaddy and perftest over rdma_cm (kernel verbs + QP1)."""

import re
import time

import vrdmavm
from harness import expect, expect_in, pair, port_counters, port_drops, scenario


def wait_quiet(vm, quiet=1.0, limit=20.0):
    """Wait until vm's eth0 has received nothing for `quiet` seconds (at most `limit`)."""
    last, since, deadline = None, time.monotonic(), time.monotonic() + limit
    while time.monotonic() < deadline:
        now = vm.run("cat /sys/class/net/eth0/statistics/rx_packets", timeout=30)[1].strip()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.25)


def host_udp_drops():
    """The host's UDP datagrams dropped for a full receive buffer (RcvbufErrors, host-wide):
    the udp uplink's sockets, the daemon's and QEMU's, are the host's."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return int(dict(zip(rows[0], rows[1])).get("RcvbufErrors", 0)) if len(rows) == 2 else 0


def mckey_counters(vm):
    """Where a multicast datagram may go or be lost in vm: its eth0 (multicast frames, drops),
    the IP and UDP stacks, the RDMA device's counters, and for vrdma its backend's port
    (frames, and drops by reason)."""
    names = ("rx_packets", "multicast", "rx_dropped", "tx_packets", "tx_dropped")
    out = vm.run("cd /sys/class/net/eth0/statistics && cat %s; echo =snmp; "
                 "grep -h '^Ip: \\|^Udp: ' /proc/net/snmp; echo =rdma; "
                 "rdma statistic show 2>/dev/null" % " ".join(names), timeout=30)[1]
    sysfs, _, rest = out.partition("=snmp")
    snmp, _, rdma = rest.partition("=rdma")
    c = {"eth0_" + k: v for k, v in zip(names, sysfs.split())}
    rows = [line.split() for line in snmp.splitlines() if line.strip()]
    for head, values in zip(rows[0::2], rows[1::2]):
        for k, v in zip(head[1:], values[1:]):
            c[head[0] + k] = v
    for m in re.finditer(r"([a-z_]+) (\d+)", rdma):
        c["rdma_" + m.group(1)] = m.group(2)
    if vm.kind == "vrdma":
        c.update(port_counters(vm))
        c.update(port_drops(vm))
    c["host_udp_rcvbuf_errors"] = host_udp_drops()
    return c


def moved(before, after):
    """The counters of `after` that differ from `before`, as differences where numeric."""
    d = {}
    for k, v in after.items():
        if before.get(k) != v:
            try:
                d[k] = int(v) - int(before.get(k, 0))
            except ValueError:
                d[k] = v
    return d


@scenario("two_vrdma_fabric", ci=True)
def rping_payload(ctx):
    """`rping -V` (rdma_cm, verified payload): 100 pings on the client, the last one on the
    server."""
    ip = ctx.a.ip
    sout, cout = pair(ctx.a, ctx.b, "rping -s -a %s -v -V -C 100" % ip,
                      "rping -c -a %s -v -V -C 100" % ip, timeout=240)
    pings = re.findall(r"ping data: rdma-ping-(\d+): ", cout)
    expect(len(pings) == 100, "rping client printed 100 verified pings (got %d)" % len(pings), cout)
    expect_in("rdma-ping-99: ", sout, "rping server output")


@scenario("two_vrdma_fabric", ci=True)
def ucmatose_connect(ctx):
    """`ucmatose` (rdma_cm connect, send, disconnect) completes with status 0."""
    sout, cout = pair(ctx.a, ctx.b, "ucmatose", "ucmatose -s %s" % ctx.a.ip, timeout=240)
    expect_in("test complete", cout, "ucmatose client")
    expect_in("return status 0", cout, "ucmatose client")


@scenario("two_vrdma_fabric", ci=True)
def udaddy_datagrams(ctx):
    """`udaddy` (rdma_cm UD address resolution and datagrams) completes with status 0."""
    sout, cout = pair(ctx.a, ctx.b, "udaddy", "udaddy -s %s" % ctx.a.ip, timeout=240)
    expect_in("test complete", cout, "udaddy client")
    expect_in("return status 0", cout, "udaddy client")


@scenario("two_vrdma_fabric", ci=True)
def perftest_send_bw_rdma_cm(ctx):
    """`ib_send_bw -R`: perftest's connection set up by rdma_cm, 4 KiB SENDs."""
    base = "ib_send_bw -d vrdma0 -R -s 4096 -n 200"
    sout, cout = pair(ctx.a, ctx.b, base, base + " " + ctx.a.ip, timeout=300)
    expect(re.search(r"^\s*4096\s+200\s+[\d.]+", cout, re.M) is not None,
           "ib_send_bw -R printed a result row", cout)


def mckey_pair(receiver, sender, group="239.1.2.3", count=10, send_cmd=None):
    """mckey (rdma_cm UD multicast, spec §15.8): `receiver` joins `group` and waits for
    `count` datagrams, `sender` joins and sends them. Returns (receiver, sender) output.
    `send_cmd` replaces the sender's `mckey -s` (it is formatted with group, ip, count).

    Multicast UD has no retry: a datagram sent before the receiver's QP is attached is
    lost and the receiver waits forever. librdmacm attaches the QP before it reports the
    join, so the sender starts only once the receiver has printed its join (line-buffered
    into a file the harness can look at while mckey runs). A datagram is also lost when the
    receiving guest's queues (or QEMU's socket) still overflow with the tail of an earlier
    bandwidth test, so the receiver starts on a quiet link."""
    log = "/tmp/mckey-%s.log" % group
    wait_quiet(receiver)
    before = [mckey_counters(vm) for vm in (receiver, sender)]
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
    send_cmd = send_cmd or "mckey -m {group} -b {ip} -s -C {count}"
    src, sout = sender.run(send_cmd.format(group=group, ip=sender.ip, count=count),
                           timeout=180)
    try:
        rrc, rout = recv.wait(timeout=60)
    except vrdmavm.CommandTimeout as e:
        rrc, rout = None, "%s\n%s" % (e, getattr(e, "out", ""))
    both = "--- receiver (%s) ---\n%s\n--- sender (%s) ---\n%s" % (
        receiver.name, rout, sender.name, sout)
    if rrc != 0:
        both += "\n--- counters that moved (receiver, sender) ---\n%s" % "\n".join(
            str(moved(b, mckey_counters(vm))) for b, vm in zip(before, (receiver, sender)))
    expect(src == 0, "sender mckey on %s exited with %s" % (sender.name, src), both)
    expect(rrc == 0, "receiver mckey on %s exited with %s" % (receiver.name, rrc), both)
    expect_in(joined, rout, "the receiver's join")
    if send_cmd.startswith("mckey"):
        expect_in(joined, sout, "the sender's join")
    expect_in("data transfers complete", rout, "the receiver")
    expect("error" not in rout.lower() and "failed" not in rout.lower(),
           "the receiver reported no error", rout)
    return rout, sout


@scenario("two_vrdma_fabric", ci=True)
def mckey_multicast(ctx):
    """`mckey` UD multicast (spec §15.8) between the two guests, each way on its own group."""
    mckey_pair(ctx.a, ctx.b)
    # And the other way round, on another group.
    mckey_pair(ctx.b, ctx.a, group="239.1.2.4")
