"""perftest (short runs) between two vrdma guests; figures are recorded, not asserted."""

import glob
import re

from harness import expect, pair, port_counters, roce_v2_gid_index, scenario

# A perftest result line: "#bytes #iterations BW peak BW average MsgRate" or a latency line.
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)", re.M)


def perf(ctx, tool, extra="", size=65536, iters=200):
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    base = "%s -d vrdma0 -x %d -s %d -n %d %s" % (tool, g, size, iters, extra)
    sout, cout = pair(ctx.a, ctx.b, base, base + " " + ctx.a.ip, timeout=300)
    rows = ROW.findall(cout)
    expect(rows, "%s printed a result row" % tool, cout)
    ctx.note("%s %s: %s" % (tool, extra, " ".join(rows[-1])))
    return rows[-1]


@scenario("two_vrdma_fabric", ci=True)
def perftest_write_bw(ctx):
    """`ib_write_bw`, 64 KiB messages, prints a result row (figure noted, not asserted)."""
    perf(ctx, "ib_write_bw")


def engine_threads(cluster):
    """The names of the shared daemon's engine threads (vrdma-engine, vrdma-engine1, ...)."""
    names = []
    for comm in glob.glob("/proc/%d/task/*/comm" % cluster.fabric_backend.pid):
        try:
            with open(comm) as f:
                names.append(f.read().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    return sorted(n for n in names if n.startswith("vrdma-engine"))


@scenario("two_vrdma_fabric_payload_refs", ci=True)
def perftest_write_bw_qps_two_engine_workers(ctx):
    """4 QPs over a daemon with two engine workers per device (--engine-threads 2): the QPs
    are spread over the workers, worker 0 hands the frames of the others' QPs on: on the
    client the ACKs, on the server the WRITEs, which arrive by reference (its topology runs
    --payload-refs) and go on with their references. The two devices share the daemon's two
    engine threads (--shared-engine): two threads, not four."""
    threads = engine_threads(ctx.cluster)
    expect(threads == ["vrdma-engine", "vrdma-engine1"],
           "the two devices' workers run in one thread per worker index", str(threads))
    perf(ctx, "ib_write_bw", "-q 4")
    for vm, what in ((ctx.a, "the server's WRITE segments"), (ctx.b, "the client's ACKs")):
        c = port_counters(vm)
        handed = c.get("vrdma_port_worker_handoff_frames_total", 0)
        ctx.note("%s: %d of %d received RoCEv2 frames handed to another worker" % (
            vm.name, handed, c.get("vrdma_port_rx_engine_frames_total", 0)))
        expect(handed > 0, "%s reached the QPs of worker 1 through worker 0" % what, str(c))


@scenario("two_vrdma_fabric", ci=True)
def perftest_read_bw(ctx):
    """`ib_read_bw`, 64 KiB messages, prints a result row. The daemon's two devices share one
    engine thread (a fabric daemon's engine group, the default: one network's two devices go
    to one slot)."""
    threads = engine_threads(ctx.cluster)
    expect(threads == ["vrdma-engine"],
           "the fabric's two devices share one engine thread by default", str(threads))
    perf(ctx, "ib_read_bw")


@scenario("two_vrdma_fabric", ci=True)
def perftest_send_bw(ctx):
    """`ib_send_bw`, 64 KiB messages, prints a result row."""
    perf(ctx, "ib_send_bw")


@scenario("two_vrdma_fabric", ci=True)
def perftest_atomic_bw(ctx):
    """`ib_atomic_bw` (8-byte atomics) prints a result row."""
    perf(ctx, "ib_atomic_bw", size=8)


@scenario("two_vrdma_fabric", ci=True)
def perftest_write_lat(ctx):
    """`ib_write_lat`, 64 B, 500 iterations, prints a result row."""
    perf(ctx, "ib_write_lat", size=64, iters=500)


@scenario("two_vrdma_fabric", ci=True)
def perftest_send_lat(ctx):
    """`ib_send_lat`, 64 B, 500 iterations, prints a result row."""
    perf(ctx, "ib_send_lat", size=64, iters=500)


@scenario("two_vrdma_fabric", ci=True)
def perftest_send_bw_ud(ctx):
    """`ib_send_bw -c UD`, 512 B datagrams, prints a result row."""
    perf(ctx, "ib_send_bw", "-c UD", size=512)


@scenario("two_vrdma_fabric", ci=True)
def perftest_write_bw_odp(ctx):
    """`ib_write_bw --odp`: RDMA WRITE into on-demand-paging MRs."""
    perf(ctx, "ib_write_bw", "--odp")
