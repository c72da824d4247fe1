#!/usr/bin/env python3
"""The soak (issue 38 item 4): three vrdma guests on one vrdma-backend and a fourth that
migrates, in a loop for N minutes.

    tests/vm/soak.py --minutes 3            (make soak SOAK_MINUTES=3)

Each round, with the guests' roles turning (server, client, neighbour):
  churn     ROUND_PINGPONGS ibv_rc_pingpong runs with the data check (-c), each a new context,
            PD, MR, CQ and RC QP on both sides, created and destroyed;
  perftest  ib_write_bw for BW_SECONDS while the neighbour floods the server's port with raw
            full-size frames (flood_frames.py, unicast and broadcast);
  nvmeof    an NVMe-oF target on the server (null_blk, nvmet-rdma), the client connects,
            writes and verifies a region with fio's checksums, disconnects; the target is
            taken down again (the modules unloaded);
  restart   after the round that ends past the run's half (runs up to 40 minutes) or past
            every RESTART_MINUTES, once the daemon's life has had a round beyond its warm-up
            (below), the daemon is killed (SIGKILL) and started again; the guests' drivers
            reset and re-register their devices, the next round runs on them.

It fails on any failed operation (a tool's exit status, pingpong's data check and iteration
count, fio's verify, a completion error in perftest's output), on any kernel warning in a
guest or a daemon panic (harness.health, after every round), on daemon RSS growth beyond
RSS_BOUND_MIB (RssAnon: VmRSS also counts the guests' RAM the daemon has touched, shared
memfd pages that are not its own and grow as it reaches more of them) over its value after
the first WARMUP_ROUNDS rounds of the daemon's life (the
warm-up: every guest has been server, client and neighbour once, so every device's queues and
pools have had their peak load), and on a descriptor leak: more open descriptors in the daemon
at the end of its life (before a restart, at the end) than after its warm-up. A life shorter
than the warm-up (a run of a few minutes) is sampled but not checked. Every round prints a row: time, the daemon's
pid, RSS and descriptors, and the operations done so far.

  migrate   a fourth vrdma guest, the mover, has a backend of its own on a TAP of the bridge
            that the shared daemon's TAP uplink is on (Cluster own_backend): after a round
            that ends past a quarter of the run (at most MIGRATE_MINUTES in) and then every
            MIGRATE_MINUTES, it live-migrates to a new QEMU and backend while an RC QP echoes
            verified rounds with one of the three (their turn), through the daemon's uplink;
            every round before, during and after the switch-over must come back intact, and a
            new pingpong must work afterwards (scenarios/migration.py). The migration tests
            the shared daemon as the peer of a moving guest: a device cannot move between two
            devices of one daemon (the launcher starts the destination's own backend).

A run that ends before its first restart, or before its first migration, fails: it did not
test them.
"""

import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
from harness import Failure, expect, pair, roce_v2_gid_index, run_ok  # noqa: E402
import vrdmavm  # noqa: E402  (harness put images/ on the path)
from scenarios import migration, neighbours, nvmeof  # noqa: E402

# Growth of the daemon's own resident memory (RssAnon: not the guests' RAM it maps, which
# VmRSS counts as the daemon touches more of it) over its warm-up value that fails the soak.
# A leak of one object per operation shows within an hour far beyond this.
RSS_BOUND_MIB = 64
ROUND_PINGPONGS = 3
PINGPONG_ITERS = 50
BW_SECONDS = 5
RESTART_MINUTES = 20
MIGRATE_MINUTES = 10
WARMUP_ROUNDS = 3
FLOOD_SECONDS = 120  # an upper bound: the flood is stopped once ib_write_bw is done
FIO_REGION = ("4k", "4m", "0")
# The table's columns: the daemon's RssAnon, VmRSS, RssShmem (KiB) and descriptors after the
# round, and its RssAnon change in KiB over each step (churn, ib_write_bw beside the flood,
# NVMe-oF).
HEAD = "%5s %8s %5s %7s %8s %8s %8s %4s %7s %7s %7s  %s" % (
    "round", "minutes", "life", "pid", "anon KiB", "VmRSS", "shmem", "fds", "churn", "bw+fl",
    "nvmeof", "operations so far")


class Daemon:
    """The shared daemon's resources over time, per life (a restart starts a new life)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.rows = []
        self.life = 0
        self.rounds = 0  # rounds of this life
        self.warm = None  # (rss_kib, fds) after the warm-up of this life
        self.checks = 0  # rounds whose memory and descriptors were checked, over every life

    def pid(self):
        return self.cluster.fabric_backend.pid

    def sample(self):
        """(RssAnon, VmRSS, RssShmem) in KiB and the open descriptors. RssShmem is the guests'
        RAM the daemon has touched (shared memfd mappings, up to every guest's whole RAM,
        not the daemon's own); the bound applies to RssAnon, the daemon's own memory."""
        pid = self.pid()
        with open("/proc/%d/status" % pid) as f:
            status = f.read()
        kib = [int(re.search(r"^%s:\s+(\d+) kB" % k, status, re.M).group(1))
               for k in ("RssAnon", "VmRSS", "RssShmem")]
        return kib + [len(os.listdir("/proc/%d/fd" % pid))]

    def check(self, rss, fds, end_of_life):
        """Against this life's warm-up: the RSS bound always, descriptors at its end."""
        self.rounds += 1
        if self.rounds <= WARMUP_ROUNDS:
            if self.rounds == WARMUP_ROUNDS:
                self.warm = (rss, fds)
            return
        self.checks += 1
        grown = (rss - self.warm[0]) / 1024.0
        expect(grown <= RSS_BOUND_MIB, "daemon RssAnon grew %.1f MiB over its warm-up value "
               "(%d KiB), more than %d MiB" % (grown, self.warm[0], RSS_BOUND_MIB),
               self.table())
        if end_of_life:
            expect(fds <= self.warm[1], "daemon descriptors: %d at the end of its life, %d "
                   "after its warm-up (a leak)" % (fds, self.warm[1]), self.table())

    def restarted(self):
        self.life += 1
        self.rounds = 0
        self.warm = None

    def table(self):
        return "\n".join([HEAD] + self.rows)


class Ops(dict):
    def add(self, what, n=1):
        self[what] = self.get(what, 0) + n

    def __str__(self):
        return ", ".join("%s %d" % kv for kv in sorted(self.items()))


def churn(server, client, ops):
    """ROUND_PINGPONGS pingpongs with the data check; every one creates and destroys a
    context, PD, MR, CQ and QP on both sides."""
    gs, gc = roce_v2_gid_index(server, "vrdma0"), roce_v2_gid_index(client, "vrdma0")
    for i in range(ROUND_PINGPONGS):
        port = 18900 + i
        size = (4096, 1024, 65536)[i % 3]
        base = "ibv_rc_pingpong -d vrdma0 -c -n %d -s %d -p %d" % (PINGPONG_ITERS, size, port)
        _, cout = pair(server, client, "%s -g %d" % (base, gs),
                       "%s -g %d %s" % (base, gc, server.ip), timeout=180)
        expect(re.search(r"\b%d iters in" % PINGPONG_ITERS, cout) is not None,
               "the pingpong ran all %d iterations" % PINGPONG_ITERS, cout)
        ops.add("pingpongs")
        ops.add("pingpong iterations", PINGPONG_ITERS)


def perftest_beside_a_flood(server, client, neighbour, ops):
    """ib_write_bw from client to server while the neighbour floods the server's port."""
    def bw():
        g = roce_v2_gid_index(server, "vrdma0")
        # -R: the pair meets over rdma_cm, not a TCP exchange through the flooded guest's
        # netdev. A TCG guest whose netdev the flood saturates loses TCP segments in its own
        # kernel (the daemon's backlog lets them in, spec §16.4 rule 4): perftest's exchange
        # after the run then failed now and then ("Couldn't read remote address"), which says
        # nothing about RDMA beside a flood, what this step is for.
        base = "ib_write_bw -d vrdma0 -x %d -s 65536 -D %d -F -R" % (g, BW_SECONDS)
        _, cout = pair(server, client, base, base + " " + server.ip, timeout=180)
        expect(not re.search(r"Completion with error|IBV_WC_\w+_ERR", cout),
               "ib_write_bw reported no completion error", cout)
        expect("BW average" in cout or re.search(r"^\s*65536\s+\d+", cout, re.M),
               "ib_write_bw printed its result", cout)
        ops.add("ib_write_bw runs")

    _, fout = neighbours.beside_a_flood(neighbour, server, bw, seconds=FLOOD_SECONDS)
    m = re.search(r"sent unicast=(\d+) broadcast=(\d+)", fout)
    expect(m is not None, "the flooder counted its frames", fout)
    ops.add("flood frames", int(m.group(1)) + int(m.group(2)))


def nvmeof_round(target, host, ops):
    """Target up, connect, write and verify with fio, disconnect, target down."""
    nvmeof.target_up(target, size_mb=64)
    try:
        nvmeof.host_prepare(host)
        dev = nvmeof.connect(host, target)
        ops.add("nvme connects")
        bs, size, off = FIO_REGION
        out = run_ok(host, nvmeof.FIO.format(name="soak", dev=dev, qd=16, bs=bs, size=size,
                                             off=off, rw="randwrite", extra=""), timeout=600)
        expect(" err= 0" in out, "fio write+verify over NVMe-oF: no errors", out)
        ops.add("fio verified MiB", int(size.rstrip("m")))
        nvmeof.disconnect(host)
    finally:
        host.run("nvme disconnect -n %s" % nvmeof.NQN, timeout=nvmeof.TEARDOWN_S + 30)
        nvmeof.target_down(target)


def wait_for(vm, cmd, deadline):
    out = ""
    while time.monotonic() < deadline:
        rc, out = vm.run(cmd, timeout=30)
        if rc == 0:
            return True, out
        time.sleep(1.0)
    return False, out


def restart(cluster, ops):
    """SIGKILL the shared daemon and start it again; every guest's device recovers."""
    a = cluster.vms[0]
    t0 = time.monotonic()
    a.kill_backend()
    a.restart_backend()
    for vm in cluster.vms:
        ok, out = wait_for(vm, "ibv_devinfo -d vrdma0 | grep -q PORT_ACTIVE", t0 + 120)
        expect(ok, "%s: vrdma0 is PORT_ACTIVE again within 120 s of the restart" % vm.name, out)
        ok, out = wait_for(vm, "ip -o addr show eth0 | grep -q 'inet %s'" % vm.cidr, t0 + 120)
        expect(ok, "%s: eth0 has its address again" % vm.name, out)
        # The GID table was filled again; look its index up anew.
        vm.__dict__.pop("_gid_index", None)
    for vm in cluster.vms:
        peer = cluster.vms[(vm.index + 1) % len(cluster.vms)]
        ok, out = wait_for(vm, "busybox ping -c 1 -W 1 %s" % peer.ip, t0 + 120)
        expect(ok, "%s reaches %s after the restart" % (vm.name, peer.name), out)
    ops.add("restarts")
    return time.monotonic() - t0


def migrate(mover, peer, ops):
    """The mover migrates while an RC QP echoes with peer (scenarios/migration.py)."""
    info, wall = migration.migrate_with_rc_qp(mover, peer, busy=True)
    ops.add("migrations")
    ram = info.get("ram", {})
    return "%s migrated in %.1f s (downtime %s ms, %s MiB) echoing with %s" % (
        mover.name, wall, info.get("downtime"), ram.get("transferred", 0) >> 20, peer.name)


def soak(cluster, daemon, minutes, log):
    # The shared daemon's three guests take turns; the fourth has its own backend and moves.
    vms, mover = cluster.vms[:3], cluster.vms[3]
    ops = Ops()
    t0 = time.monotonic()
    end = t0 + minutes * 60
    rnd = 0
    # The first restart at half the run (a short run) or after RESTART_MINUTES, then every
    # RESTART_MINUTES.
    next_restart = t0 + 60 * min(minutes / 2.0, RESTART_MINUTES)
    next_migration = t0 + 60 * min(minutes / 4.0, MIGRATE_MINUTES)
    while True:
        server, client, neighbour = (vms[(rnd + k) % len(vms)] for k in range(3))
        # The daemon's RssAnon change over each step of the round (where growth comes from).
        steps = []
        for step in (lambda: churn(server, client, ops),
                     lambda: perftest_beside_a_flood(server, client, neighbour, ops),
                     lambda: nvmeof_round(server, client, ops)):
            before = daemon.sample()[0]
            step()
            steps.append(daemon.sample()[0] - before)
        problems = harness.health(cluster)
        expect(not problems, "unhealthy after round %d:\n  %s" % (rnd, "\n  ".join(problems)))
        now = time.monotonic()
        last = now >= end
        # A life is checked only after its warm-up: restart once this one has had a round
        # beyond it (this round is its rounds + 1st).
        restart_now = not last and now >= next_restart and daemon.rounds >= WARMUP_ROUNDS
        rss, vmrss, shmem, fds = daemon.sample()
        daemon.rows.append("%5d %8.1f %5d %7d %8d %8d %8d %4d %+7d %+7d %+7d  %s" % (
            rnd, (time.monotonic() - t0) / 60, daemon.life, daemon.pid(), rss, vmrss, shmem,
            fds, steps[0], steps[1], steps[2], ops))
        daemon.check(rss, fds, end_of_life=restart_now or last)
        if daemon.rounds == WARMUP_ROUNDS:
            daemon.rows[-1] += "  (warm-up)"
        log(daemon.rows[-1])
        if last:
            break
        if now >= next_migration:
            log("      " + migrate(mover, vms[rnd % len(vms)], ops))
            next_migration += 60 * MIGRATE_MINUTES
        if restart_now:
            dt = restart(cluster, ops)
            daemon.restarted()
            next_restart += 60 * RESTART_MINUTES
            log("      daemon restarted, every device back in %.1f s" % dt)
        rnd += 1
    return ops, rnd + 1


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=3.0,
                   help="start no new round after this many minutes (the last one finishes)")
    p.add_argument("--results", default=None, help="where a failure keeps its evidence")
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    a = p.parse_args()
    results = a.results or os.path.join(harness.REPO, "tests", "results",
                                        time.strftime("soak-%Y%m%d-%H%M%S"))

    def log(line):
        print(line, flush=True)

    log("soak: 3 vrdma guests on one daemon's fabric and one that migrates, %.1f minutes; "
        "RSS bound %d MiB over the warm-up" % (a.minutes, RSS_BOUND_MIB))
    t0 = time.monotonic()
    cluster = vrdmavm.Cluster(n=4, kind="vrdma", uplink="fabric+tap", own_backend=(3,),
                              keep=a.keep)
    failed = True
    daemon = Daemon(cluster)
    try:
        cluster.start()
        log("booted in %.1f s (%s)" % (time.monotonic() - t0, cluster.workdir))
        log(HEAD)
        ops, rounds = soak(cluster, daemon, a.minutes, log)
        # A run too slow to get past a warm-up checked nothing: that is not a pass.
        expect(daemon.checks > 0, "no round after a warm-up of %d rounds: the daemon's memory "
               "and descriptors were never checked (%d rounds in all); run longer" % (
                   WARMUP_ROUNDS, rounds), daemon.table())
        for what in ("restarts", "migrations"):
            expect(ops.get(what, 0) > 0, "no %s in %d rounds; run longer" % (what, rounds),
                   daemon.table())
        failed = False
        log("soak passed: %d rounds in %.1f minutes (boot included); %s" % (
            rounds, (time.monotonic() - t0) / 60, ops))
    except (Failure, vrdmavm.VMError) as e:
        text = "%s: %s" % (type(e).__name__, e)
        log("soak FAILED: " + text.splitlines()[0])
        harness.save_evidence(cluster, results, text)
        harness.print_evidence(cluster, text)
        log("evidence in %s" % results)
        # Again after the evidence, so that the tail of a CI log says why, with the rounds
        # run so far.
        log(daemon.table())
        log("soak FAILED: " + text.splitlines()[0])
    finally:
        cluster.close(failed=failed or a.keep)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
