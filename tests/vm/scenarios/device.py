"""The device as the guest sees it: virtio binding, ibv_devices, ibv_devinfo, rdma link."""

import re
import time

from harness import expect, expect_in, roce_v2_gid_index, run_ok, scenario


@scenario("two_vrdma_fabric", ci=True)
def boot_device_bound(ctx):
    """Virtio device 42 is bound to vrdma and the backend negotiated with QEMU."""
    for vm in (ctx.a, ctx.b):
        out = run_ok(vm, "for d in /sys/bus/virtio/devices/*; do "
                         "echo $(cat $d/device) $(basename $(readlink -f $d/driver)); done")
        expect_in("0x002a vrdma", out, "%s's virtio devices" % vm.name)
        with open(vm.backend_log, errors="replace") as f:
            log = f.read()
        expect(re.search(r"(?i)features", log) is not None,
               "%s: backend log shows no feature negotiation" % vm.name, log[-3000:])
        expect(re.search(r"(?i)mem(ory)?[ _-]?(table|region)", log) is not None,
               "%s: backend log shows no memory table" % vm.name, log[-3000:])


@scenario("two_vrdma_fabric", ci=True)
def device_ibv_devices(ctx):
    """`ibv_devices` in a guest lists vrdma0 with its node GUID."""
    out = run_ok(ctx.a, "ibv_devices")
    expect(re.search(r"^\s*vrdma0\s+[0-9a-f]{16}\s*$", out, re.M) is not None,
           "ibv_devices lists vrdma0 with its node GUID", out)


@scenario("two_vrdma_fabric", ci=True)
def device_ibv_devinfo(ctx):
    """`ibv_devinfo -v`: port ACTIVE on Ethernet, ODP (general and RC), CQ moderation and SRQ
    resize caps reach user space."""
    vm = ctx.a
    out = run_ok(vm, "ibv_devinfo -v -d vrdma0")
    expect_in("PORT_ACTIVE", out, "ibv_devinfo -v")
    expect(re.search(r"link_layer:\s+Ethernet", out) is not None, "link layer Ethernet", out)
    expect_in("ODP_SUPPORT_IMPLICIT", out, "ibv_devinfo -v (general ODP caps)")
    # CQ moderation (spec §5.5) and SRQ resize (§11.7) reach user space.
    expect(re.search(r"max_cq_count:\s*65535", out) is not None and
           re.search(r"max_cq_period:\s*65535", out) is not None,
           "CQ moderation caps", out)
    expect_in("SRQ_RESIZE", out, "ibv_devinfo -v (device cap flags)")
    expect(re.search(r"rc_odp_caps:\s*\n(\s+SUPPORT_\w+\s*\n)+", out) is not None,
           "RC ODP caps listed", out)
    idx = roce_v2_gid_index(vm, "vrdma0")
    ctx.note("RoCE v2 GID of %s at index %d" % (vm.ip, idx))
    expect(re.search(r"GID\[\s*%d\]:\s+::ffff:%s, RoCE v2" % (idx, re.escape(vm.ip)), out)
           is not None, "ibv_devinfo shows the IPv4-mapped RoCE v2 GID", out)


@scenario("two_vrdma_fabric", ci=True)
def device_rdma_link(ctx):
    """`rdma link show`: vrdma0/1 is ACTIVE with its netdev."""
    out = run_ok(ctx.a, "rdma link show")
    expect(re.search(r"link vrdma0/1 state ACTIVE .*netdev \w+", out) is not None,
           "rdma link shows vrdma0/1 ACTIVE with its netdev", out)


def _port_stats(vm):
    """`rdma statistic show link vrdma0/1` as a dict of counter -> value."""
    out = run_ok(vm, "rdma statistic show link vrdma0/1")
    return dict((k, int(v)) for k, v in re.findall(r"(\w+) (\d+)", out)), out


@scenario("two_vrdma_fabric", ci=True)
def device_rdma_statistic(ctx):
    """Hardware counters (spec §11.9): the port's hw_counters in sysfs and `rdma statistic`
    grow with ibv_rc_pingpong traffic; with auto binding by QP type the running pingpong's QP
    gets its own counter, shown by `rdma statistic qp show`."""
    a, b = ctx.a, ctx.b
    for path in ("/sys/class/infiniband/vrdma0/ports/1/hw_counters/sent_pkts",
                 "/sys/class/infiniband/vrdma0/hw_counters/rcvd_icrc_err"):
        out = run_ok(a, "cat %s" % path)
        expect(re.match(r"^\d+\s*$", out) is not None, "%s is a number" % path, out)
    before, _ = _port_stats(a)
    expect("sent_pkts" in before and "retransmits" in before,
           "rdma statistic lists the port counters", str(before))
    run_ok(a, "rdma statistic qp set link vrdma0/1 auto type on")
    # The pingpong runs until the counter has been seen and is then stopped: a fixed
    # iteration count races the polling (3000 iterations over the fabric take under a
    # second, about as long as two `rdma statistic` calls under TCG).
    counted = None
    try:
        g = roce_v2_gid_index(a, "vrdma0")
        tool = "ibv_rc_pingpong -d vrdma0 -g %d -n 1000000" % g
        srv = a.spawn(tool, timeout=300)
        time.sleep(1.0)
        cli = b.spawn(tool + " " + a.ip, timeout=300)
        seen, out = None, ""
        deadline = time.time() + 120
        while time.time() < deadline and not srv.done() and not cli.done():
            rc, out = a.run("rdma statistic qp show link vrdma0/1")
            m = re.search(r"cntn \d+ qp-type RC\b.*?sent_pkts (\d+)\s.*?rcvd_pkts (\d+)\s", out,
                          re.S)
            if rc == 0 and m and int(m.group(1)) > 0 and int(m.group(2)) > 0:
                seen, counted = out, (int(m.group(1)), int(m.group(2)))
                break
            time.sleep(0.2)
        early = srv.done() or cli.done()
        cli.kill()
        srv.kill()
        crc, cout = cli.wait(timeout=60)
        src, sout = srv.wait(timeout=60)
        expect(not early, "ibv_rc_pingpong kept running while the counter was polled",
               cout + sout)
        expect(seen is not None, "rdma statistic qp show: the pingpong QP's bound counter "
               "counted its packets while it ran", out)
        ctx.note(seen.strip().splitlines()[0][:200])
    finally:
        a.run("rdma statistic qp set link vrdma0/1 auto off")
    after, out = _port_stats(a)
    # The port's counters include what the bound counter counted: its share moves to the
    # port's history when the QP goes away.
    sent = after["sent_pkts"] - before["sent_pkts"]
    rcvd = after["rcvd_pkts"] - before["rcvd_pkts"]
    ctx.note("port: %d packets sent, %d received during the run (the QP's counter had %d, %d)"
             % (sent, rcvd, counted[0], counted[1]))
    expect(sent >= counted[0] and rcvd >= counted[1],
           "the port counted at least the packets of the pingpong QP's counter", out)
    expect(after["rcvd_icrc_err"] == before["rcvd_icrc_err"], "no ICRC errors", out)
