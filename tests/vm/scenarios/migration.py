"""Live migration of a vrdma guest with open RC QPs (device spec §17).

Topology two_vrdma_tap: each guest has its own vrdma-backend with a TAP uplink on one bridge. The
migrating guest moves to a new QEMU (-incoming) with a new backend (same MAC) on a new TAP of
that bridge (vrdmavm.VM.migrate); the destination's RARP moves the bridge's entry for the MAC.
They run last: the guest's TAP, QEMU and backend change under the other scenarios."""

import re
import subprocess
import time

from harness import (expect, expect_in, pair, push_guest_script, roce_v2_gid_index, run_ok,
                     scenario, spawn_server)

GO = "/tmp/mig-go"


def _migrate_with_rc_qp(ctx, busy):
    info, wall = migrate_with_rc_qp(ctx.a, ctx.b, busy)
    ram = info.get("ram", {})
    ctx.note("migration: downtime %s ms, total %s ms (%.1f s wall), %s MiB transferred, "
             "%s dirty-sync rounds" % (
                 info.get("downtime"), info.get("total-time"), wall,
                 ram.get("transferred", 0) >> 20, ram.get("dirty-sync-count")))
    return info


def migrate_with_rc_qp(a, b, busy):
    """Migrate a while an RC QP connects it to b (idle or echoing all through), check every
    echo round and a new pingpong afterwards; QEMU's query-migrate answer and the wall time
    of the migration. Also the soak's migration step (tests/vm/soak.py)."""
    script = push_guest_script([a, b], "mig_peer.py")
    run_ok(a, "rm -f %s %s.ready" % (GO, GO))
    ga, gb = roce_v2_gid_index(a, "vrdma0"), roce_v2_gid_index(b, "vrdma0")
    resp = spawn_server(b, "python3 %s responder vrdma0 %d" % (script, gb), 900)
    req = a.spawn("python3 %s requester vrdma0 %d %s %s%s" % (
        script, ga, b.ip, GO, " --busy" if busy else ""), timeout=900)
    deadline = time.monotonic() + 180
    while a.run("test -e %s.ready" % GO, timeout=30)[0] != 0:
        expect(not req.done() and not resp.done(), "the QP pair connects",
               "%s\n%s" % (req.wait(5)[1] if req.done() else "",
                           resp.wait(5)[1] if resp.done() else ""))
        expect(time.monotonic() < deadline, "the QP pair connected within 180 s")
        time.sleep(0.5)
    t0 = time.monotonic()
    info = a.migrate()
    wall = time.monotonic() - t0
    a.write_file(GO, "")
    rc, rout = req.wait(600)
    src, sout = resp.wait(120)
    both = "--- requester ---\n%s\n--- responder ---\n%s" % (rout, sout)
    expect(rc == 0 and src == 0, "both ends of the QP finished (%s, %s)" % (rc, src), both)
    m = re.search(r"rounds ok: (\d+)", rout)
    expect(m is not None and int(m.group(1)) >= 40, "40 or more echo rounds verified", both)
    expect_in("rounds ok: %s" % m.group(1), sout, "the responder's count")
    # The port's addresses moved with the guest: new connections work too.
    srv = "ibv_rc_pingpong -d vrdma0 -g %d -n 50" % gb
    _, cout = pair(b, a, srv, "ibv_rc_pingpong -d vrdma0 -g %d -n 50 %s" % (ga, b.ip),
                   timeout=180)
    expect(re.search(r"50 iters in", cout) is not None, "a new pingpong after the migration", cout)
    log = open(a.backend_log, errors="replace").read()
    expect_in("device state loaded", log, "the destination backend's log")
    return info, wall


@scenario("two_vrdma_tap", ci=True, timeout=900, last=True)
def migrate_idle_rc_qp(ctx):
    """An RC QP that is connected and idle while its guest migrates carries on afterwards."""
    _migrate_with_rc_qp(ctx, busy=False)


@scenario("two_vrdma_tap", ci=True, timeout=900, last=True)
def migrate_busy_rc_qp(ctx):
    """Echo rounds run all through the migration: WQEs in flight move with the guest, the
    peer retransmits what the switch-over lost, every byte comes back intact."""
    _migrate_with_rc_qp(ctx, busy=True)


@scenario("two_vrdma_tap", ci=True, timeout=900, last=True)
def migrate_during_pingpong_and_write_bw(ctx):
    """The distro's tools against a peer while the guest migrates: ibv_rc_pingpong and
    ib_write_bw both finish without an error (the peer may retransmit)."""
    a, b = ctx.a, ctx.b
    ga, gb = roce_v2_gid_index(a, "vrdma0"), roce_v2_gid_index(b, "vrdma0")
    ping_srv = spawn_server(b, "ibv_rc_pingpong -d vrdma0 -g %d -n 20000 -s 4096 -p 18800"
                            % gb, 900)
    bw_srv = spawn_server(b, "ib_write_bw -d vrdma0 -x %d -D 40 -s 65536 -p 18801 -F" % gb, 900)
    ping = a.spawn("ibv_rc_pingpong -d vrdma0 -g %d -n 20000 -s 4096 -p 18800 %s" % (
        ga, b.ip), timeout=900)
    bw = a.spawn("ib_write_bw -d vrdma0 -x %d -D 40 -s 65536 -p 18801 -F %s" % (
        ga, b.ip), timeout=900)
    time.sleep(8)
    expect(not ping.done() and not bw.done(), "both clients still run when the migration "
           "starts", "%s\n%s" % (ping.wait(1)[1] if ping.done() else "",
                                 bw.wait(1)[1] if bw.done() else ""))
    info = a.migrate()
    ram = info.get("ram", {})
    ctx.note("migration under traffic: downtime %s ms, total %s ms, %s MiB transferred, %s "
             "dirty-sync rounds" % (info.get("downtime"), info.get("total-time"),
                                    ram.get("transferred", 0) >> 20,
                                    ram.get("dirty-sync-count")))
    outs, rcs = [], []
    for name, h in (("pingpong client", ping), ("pingpong server", ping_srv),
                    ("write_bw client", bw), ("write_bw server", bw_srv)):
        rc, out = h.wait(600)
        rcs.append((name, rc))
        outs.append("--- %s (rc %s) ---\n%s" % (name, rc, out))
    # Where the peers' packets went: the RC counters of both guests and the TAPs' drops (a
    # TAP whose reader, the backend, falls behind drops what the bridge gives it).
    ctx.note(path_counters(a, b))
    for name, rc in rcs:
        expect(rc == 0, "%s exited with %s" % (name, rc), "\n".join(outs))
    text = "\n".join(outs)
    expect(re.search(r"20000 iters in", text) is not None, "the pingpong ran all iterations", text)
    expect_in("BW average", text, "ib_write_bw's report")


def path_counters(*vms):
    """One line per guest: its RC counters (spec §11.9) and its TAP's drops on the host."""
    lines = []
    for vm in vms:
        rc, out = vm.run("cd /sys/class/infiniband/vrdma0/ports/1/hw_counters && "
                         "grep -H . retransmits local_ack_timeouts rcvd_seq_naks "
                         "sent_seq_naks rcvd_rnr_naks rcvd_dropped", timeout=30)
        rdma = " ".join(out.split()) if rc == 0 else "(no counters: %s)" % out.strip()
        link = subprocess.run(["ip", "-n", vm.netns, "-s", "link", "show", vm.tap],
                              capture_output=True, text=True)
        drops = re.findall(r"(RX|TX):.*\n\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", link.stdout)
        tap = ", ".join("%s %s pkts %s dropped" % (d[0], d[2], d[4]) for d in drops)
        lines.append("%s: %s; tap %s: %s" % (vm.name, rdma, vm.tap, tap or link.stdout.strip()))
    return "\n    ".join(lines)
