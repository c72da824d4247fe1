"""Tenants on one daemon keep working beside a hostile neighbour (spec §16.4, §16.5; issue 39).

Topology three_vrdma_fabric_spare_device (three vrdma guests on one daemon, plus a spare
device no QEMU uses):

- flood_beside_a_pair: vm2 floods raw full-size frames (unicast at vm0's MAC and broadcast)
  while vm1 runs ib_write_bw to vm0. The pair's runs complete with no QP error, the fabric
  drops none of the pair's frames for their share of vm0's receive queue (`over_share` of vm0
  and vm1 stay 0; the flooder's broadcasts beyond its rate bound go as `bcast_rate`). Each of
  the three guests' QEMUs gets the same fixed CPU share (a cgroup quota, `VM.limit_cpu`), as a
  cloud gives each guest its own vCPUs, so that the flooder's guest cannot simply take the
  pair's guests' CPU on this 2-core host; the server guest runs a busy loop at nice 19 and
  the paused flooder polls, so every guest uses its whole share in both phases and the
  daemon's CPU is the same alone and flooded. The pair keeps 70 % of its bandwidth: one pair's
  bandwidth under TCG varies between runs by a factor of two (590-1160 MB/s alone), so a
  single "alone" and a single "flooded" run compared nothing; the pair runs ROUNDS times
  alone then beside the flood, one after the other (the flooder pauses on /tmp/flood.pause),
  and what it moved beside the flood against what it moved alone is checked (the ratio of
  the sums: the median of the ROUNDS ratios, checked before, swung from 59 % to 106 % with
  the same daemon, that ratio from 73 % to 99 %). The daemon's own CPU is shared by its
  tenants (README, what one daemon does not protect); `make bench`'s fairness headline
  measures the daemon's share alone. Then a slow guest beside a fast flooder: the server's
  QEMU on a 0.2 CPU quota, the flooder's on none, so that the flood outruns the server's
  netdev and its backlog in the daemon stays full; vm1's pings to vm0 must still be answered
  (at most 2 of 20 lost): the backlog drops the flooder's excess, not other senders' frames
  (spec §16.4 rule 4). With the drop-tail backlog it replaced, 4 of 20 were lost.
- refused_frontend_beside_traffic: a frontend that is not QEMU (the backend's example
  `hostile_frontend`, the vhost crate's frontend) connects to the spare device's socket and
  offers a memory region larger than its memfd, then an unsealed memfd, while vm0 and vm1 run
  ib_write_bw. The daemon refuses both ("vhost-user frontend refused"), ends those
  connections, stays alive, and the pair's traffic completes.
"""

import glob
import os
import re
import subprocess

from harness import (expect, pair, push_guest_script, roce_v2_gid_index, run_ok, scenario,
                     spawn_server)
from scenarios.perftest import ROW
from scenarios.tenancy import fabric_counters, port_name
from vrdmavm import stats

FLOOD_SECONDS = 60  # an upper bound: the flood stops once the loaded run is over
BW_SECONDS = 3
# Alternated runs alone and beside the flood. The pair keeps ~88 % on average here with a
# spread of about 10 points between scenario runs at 5 rounds (73-103 % over twelve runs):
# eight rounds put 70 % further out of the noise.
ROUNDS = 8
PINGS = 20
SLOW_GUEST_CPUS = 0.2


def write_bw(ctx, server, client):
    """ib_write_bw for BW_SECONDS from client to server; returns its average MB/s."""
    g = roce_v2_gid_index(server, "vrdma0")
    base = "ib_write_bw -d vrdma0 -x %d -s 65536 -D %d" % (g, BW_SECONDS)
    _, cout = pair(server, client, base, base + " " + server.ip, timeout=120)
    rows = ROW.findall(cout)
    expect(rows, "ib_write_bw printed a result row", cout)
    expect(not re.search(r"Completion with error|IBV_WC_\w+_ERR", cout),
           "ib_write_bw reported no completion error", cout)
    return float(rows[-1][3])


def retransmits(vm):
    """vm's RC retransmissions so far (the driver's hw_counters, spec §11.9)."""
    return int(run_ok(vm, "cat /sys/class/infiniband/vrdma0/ports/1/hw_counters/retransmits"))


def delta(after, before, vm, reason):
    key = (port_name(vm), reason)
    return after.get(key, 0) - before.get(key, 0)


@scenario("three_vrdma_fabric_spare_device", ci=True, timeout=360)
def flood_beside_a_pair(ctx):
    """A neighbour floods raw frames while a pair runs ib_write_bw, every guest on the same fixed
    CPU share: the pair keeps 70 % of its bandwidth (what it moved in alternated runs with the
    flood on, against the same number of runs with it paused), completes without a QP error
    and the fabric drops none of its frames; then a slow guest's netdev flooded beyond what it drains still answers pings
    (spec §16.4)."""
    server, client, flooder = ctx.a, ctx.b, ctx.c
    cores = guest_cpu_share(3)
    ctx.note("each guest's QEMU limited to %.2f CPUs (host: %d)" % (cores, os.cpu_count()))
    limits = []
    runs = []  # (alone, beside the flood) MB/s, measured one after the other

    # The daemon's CPU per thread kind in each phase: where the flood's cost lands.
    cpu = {"alone": {}, "flooded": {}}

    def measured(phase):
        t0 = daemon_cpu(ctx.cluster)
        mbs = write_bw(ctx, server, client)
        for kind, secs in daemon_cpu(ctx.cluster).items():
            cpu[phase][kind] = cpu[phase].get(kind, 0.0) + secs - t0.get(kind, 0.0)
        return mbs

    def alternate():
        for _ in range(ROUNDS):
            run_ok(flooder, "touch /tmp/flood.pause")
            alone = measured("alone")
            run_ok(flooder, "rm -f /tmp/flood.pause")
            runs.append((alone, measured("flooded")))

    # The server's vCPU busy at its quota in both phases (a loop at nice 19 in the guest, which
    # its kernel's receive path preempts): idle while alone, it lent its quota to the daemon
    # on this 2-core host, and flooded it took it back to take the flood's frames in, so
    # what the pair lost measured the server's CPU as much as the daemon's isolation (the
    # client spins in ib_write_bw and the paused flooder polls: both at their quota always).
    burner = None
    try:
        for vm in (server, client, flooder):
            limits.append(vm.limit_cpu(cores))
        burner = server.spawn("exec nice -n 19 sh -c 'while :; do :; done'",
                              timeout=ROUNDS * 60 + 300)
        # A first run warms the guests' code up (TCG translates it on first use), so that
        # "alone" is not the slowest run for reasons of its own.
        write_bw(ctx, server, client)
        before, _ = fabric_counters(server)
        resent = retransmits(client)
        _, fout = beside_a_flood(flooder, server, alternate, seconds=ROUNDS * 60)
        expect(not burner.done(), "the server's busy loop ran through the runs",
               burner.result.out if burner.done() else "")
    finally:
        if burner is not None:
            burner.kill()
        for limit in limits:
            limit.close()
    after, text = fabric_counters(server)
    resent = retransmits(client) - resent
    # A slow guest beside a fast flooder: the server's QEMU on a small quota, the flooder's
    # on none, so the flood outruns the server's netdev and its backlog in the daemon fills.
    # The other senders' frames must still get in (spec §16.4 rule 4).
    slow = server.limit_cpu(SLOW_GUEST_CPUS)
    try:
        answered, _ = beside_a_flood(flooder, server, lambda: pings_answered(client, server))
    finally:
        slow.close()
    lost = {vm.name: delta(after, before, vm, "over_share") for vm in (server, client)}
    # The bandwidth kept: all the flooded runs moved against all the runs alone (each as long
    # as the other). One run of a TCG pair varies by up to a factor of two, and a ratio of two
    # such runs twice that: at 5 rounds the median of per-pair ratios went from 59 % to 106 %
    # over eleven runs of this host, the ratio of the sums from 73 % to 99 %.
    ratio = sum(f for _, f in runs) / sum(a for a, _ in runs)
    ratios = sorted(flooded / alone for alone, flooded in runs)
    ctx.note("ib_write_bw %s -> %s, alone / beside the flood (MB/s): %s; kept %.0f %% "
             "(target 70 %%; median of the pairs' ratios %.0f %%), %d retransmissions" % (
                 client.name, server.name, ", ".join("%.0f / %.0f" % r for r in runs),
                 100 * ratio, 100 * ratios[len(ratios) // 2], resent))
    for phase, by_kind in cpu.items():
        ctx.note("daemon CPU %s (s, %d runs of %d s): %s; host load %s" % (
            phase, ROUNDS, BW_SECONDS, ", ".join("%s %.2f" % kv for kv in sorted(by_kind.items())),
            open("/proc/loadavg").read().split()[0]))
    ctx.note("flooder: %s; fabric: over_share %d, bcast_rate %d of %s, full %d at %s" % (
        fout.strip().splitlines()[-1], delta(after, before, flooder, "over_share"),
        delta(after, before, flooder, "bcast_rate"), flooder.name,
        delta(after, before, server, "full"), server.name))
    expect(not any(lost.values()),
           "the fabric dropped none of the pair's frames for their share (%s)" % lost, text)
    expect(ratio >= 0.7, "the pair kept 70 %% of its bandwidth beside the flood (%d alternated "
           "runs: %.0f %%)" % (ROUNDS, 100 * ratio))
    ctx.note("ping %s -> %s beside the flood: %d of %d answered" % (
        client.name, server.name, answered, PINGS))
    expect(answered >= PINGS - 2, "the flooded guest's netdev still takes its other senders' "
           "frames: %d of %d pings answered (spec §16.4 rule 4)" % (answered, PINGS))


def daemon_cpu(cluster):
    """CPU seconds the shared daemon's threads used so far, summed per kind of thread (the
    name without its digits: vrdma-engine, vhost-user threads, ...)."""
    tick = os.sysconf("SC_CLK_TCK")
    kinds = {}
    for stat in glob.glob("/proc/%d/task/*/stat" % cluster.fabric_backend.pid):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:  # a thread that ended meanwhile
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        kind = re.sub(r"[0-9]+", "", comm)
        kinds[kind] = kinds.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return kinds


def pings_answered(src, dst):
    """How many of PINGS echo requests from src to dst got a reply."""
    _, out = src.run("busybox ping -c %d -i 0.1 -W 2 %s" % (PINGS, dst.ip), timeout=60)
    m = re.search(r"(\d+) packets received", out)
    expect(m is not None, "ping printed its summary", out)
    return int(m.group(1))


def guest_cpu_share(guests):
    """The CPUs each of `guests` guests gets so that all of them fit on this host with some
    left for the daemon: (host CPUs - 0.5) / guests, at most one core each."""
    return min(1.0, max(0.2, (os.cpu_count() - 0.5) / guests))


def beside_a_flood(flooder, target, work, seconds=FLOOD_SECONDS):
    """Run `work()` while `flooder` floods `target`'s port with raw full-size frames (unicast
    at its MAC and broadcast, guest/flood_frames.py), started before and stopped after, at most
    `seconds`; the flood must last through the work. Returns (work's result, the flooder's
    output, whose last line counts the frames sent)."""
    flood = push_guest_script([flooder], "flood_frames.py")
    push_guest_script([flooder], "spray_attack.py")
    run_ok(flooder, "rm -f /tmp/flood.started /tmp/flood.stop /tmp/flood.pause")
    f = flooder.spawn("cd /tmp && python3 %s eth0 %s %s %s %d" % (
        flood, flooder.ip, target.mac, target.ip, seconds), timeout=seconds + 60)
    try:
        run_ok(flooder, "for i in $(seq 300); do test -e /tmp/flood.started && exit 0; "
               "sleep 0.2; done; exit 1", timeout=90)
        result = work()
        expect(not f.done(), "the flood lasted through the work",
               f.result.out if f.done() else "")
        run_ok(flooder, "touch /tmp/flood.stop")
        rc, fout = f.wait(timeout=60)
    finally:
        f.kill()
    expect(rc == 0 and "sent unicast=" in fout, "the flooder ran", fout)
    return result, fout


def hostile_frontend(cluster):
    """The example program built beside the daemon (make's backend-release builds it)."""
    path = os.path.join(os.path.dirname(cluster.backend), "examples", "hostile_frontend")
    expect(os.path.exists(path), "%s exists (cargo build --release -p vrdma-backend "
           "--example hostile_frontend)" % path)
    return path


def refusals(cluster):
    with open(cluster.fabric_log, errors="replace") as f:
        return [line.strip() for line in f if "vhost-user frontend refused" in line]


@scenario("three_vrdma_fabric_spare_device", ci=True, timeout=240)
def refused_frontend_beside_traffic(ctx):
    """A frontend that is not QEMU offers bad memory regions on the spare device's socket: the
    daemon refuses and ends it, stays up, and a pair's traffic completes (spec §16.5)."""
    server, client, cluster = ctx.a, ctx.b, ctx.cluster
    program = hostile_frontend(cluster)
    spare = cluster.spare_sockets[0]
    seen = len(refusals(cluster))
    g = roce_v2_gid_index(server, "vrdma0")
    base = "ib_write_bw -d vrdma0 -x %d -s 65536 -D 8" % g
    srv = spawn_server(server, base, 120)
    cli = client.spawn(base + " " + server.ip, timeout=120)
    # The pair's run is under way (its client has connected and sends) before the frontends
    # come: wait for the server's RDMA counters to move.
    run_ok(server, "c=/sys/class/infiniband/vrdma0/ports/1/hw_counters/rcvd_pkts; "
           "a=$(cat $c); for i in $(seq 100); do sleep 0.2; "
           "test $(cat $c) -gt $((a + 100)) && exit 0; done; exit 1", timeout=60)
    outs = []
    for how in ("beyond", "unsealed"):
        p = subprocess.run([program, spare, how], capture_output=True, text=True, timeout=30)
        outs.append(p.stdout + p.stderr)
        expect(p.returncode == 0 and "refused:" in p.stdout,
               "the daemon refused the %s region (hostile_frontend exit %d)" % (
                   how, p.returncode), p.stdout + p.stderr)
    expect(not cli.done(), "the pair's run was still going after the refusals",
           cli.result.out if cli.done() else "")
    rc, cout = cli.wait(timeout=90)
    src, sout = srv.wait(timeout=60)
    both = "--- server ---\n%s\n--- client ---\n%s" % (sout, cout)
    expect(rc == 0 and src == 0 and ROW.findall(cout), "the pair's ib_write_bw completed", both)
    expect(not re.search(r"Completion with error|IBV_WC_\w+_ERR", both),
           "the pair's ib_write_bw reported no completion error", both)
    expect(cluster.fabric_backend.poll() is None, "the daemon is alive")
    logged = refusals(cluster)[seen:]
    expect(len(logged) >= 2, "the daemon logged both refusals", "\n".join(logged))
    ctx.note("pair: %s MB/s across the refusals; %s" % (ROW.findall(cout)[-1][3],
                                                        " | ".join(o.strip() for o in outs)))
    ctx.note("daemon: " + " | ".join(logged))
    # The spare device serves nobody, but the daemon still answers on its stats socket.
    run = stats.scrape(cluster.backend, cluster.fabric_stats)
    expect(run.returncode == 0 and "vrdma_fabric" in run.stdout,
           "the daemon's operator socket answers", run.stdout + run.stderr)
