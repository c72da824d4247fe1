#!/usr/bin/env python3
"""make bench-vm: a Linux rxe pair and a vrdma pair of TCG guests in the same run, the same
kernel, root filesystem and commands; a table with ratios and an SVG plot.

  tests/bench_vm.py [--results DIR] [--plot FILE] [--iters N] [--vrdma-uplink fabric|udp]
                    [--mtu 1500,9000] [--vrdma-args "--own-engine-threads"]

The rxe pair is two guests linked by QEMU's -netdev dgram (UDP on loopback); the vrdma pair is
two guests whose devices one vrdma-backend serves on its fabric (the default, what a host with
several guests runs), or with --vrdma-uplink udp two backends on the udp uplink. Both pairs are
measured at each Ethernet MTU of --mtu (default 1500 and 9000, i.e. RoCE path MTU 1024 and
4096): vrdma through the backend's --mtu, rxe through the guests' netdev MTU. The machine is
shared and noisy: the figures are a ratio measured side by side, with the load average printed
before and after each pair. Benchmarks, not pass criteria: the script fails only if a tool
fails or prints no result.
"""

import argparse
import os
import re
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "images"))
sys.path.insert(0, os.path.join(HERE, "vm"))

import vrdmavm  # noqa: E402
from harness import ib_dev, pair, roce_v2_gid_index  # noqa: E402

# name, command (server side; the client adds the server's address), how to read the result,
# unit, and whether bigger is better
BW_ROW = r"^\s*%d\s+\d+\s+[\d.]+\s+([\d.]+)"


def tools(iters, seconds=5):
    """The tools, their commands and result patterns: bandwidths run for `seconds` (a
    count of 500 64 KiB messages took 30 ms and varied 2x), latencies for `iters`."""
    return [
        ("ib_write_bw 64 KiB", "ib_write_bw -d {dev} -x {gid} -s 65536 -D %d" % seconds,
         BW_ROW % 65536, "MiB/s", True),
        ("ib_read_bw 64 KiB", "ib_read_bw -d {dev} -x {gid} -s 65536 -D %d" % seconds,
         BW_ROW % 65536, "MiB/s", True),
        ("ib_send_bw 64 KiB", "ib_send_bw -d {dev} -x {gid} -s 65536 -D %d" % seconds,
         BW_ROW % 65536, "MiB/s", True),
        ("ib_atomic_bw 8 B", "ib_atomic_bw -d {dev} -x {gid} -D %d" % seconds,
         r"^\s*8\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", "Mpps", True),
        ("ib_write_lat 8 B typical", "ib_write_lat -d {dev} -x {gid} -s 8 -n %d" % iters,
         r"^\s*8\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", "us", False),
        ("ibv_rc_pingpong 4 KiB", "ibv_rc_pingpong -d {dev} -g {gid} -s 4096 -n %d" % iters,
         r"=\s*([\d.]+) usec/iter", "us/iter", False),
    ]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def set_rxe_mtu(vm, mtu):
    """Give the netdev under the guest's rxe0 the Ethernet MTU `mtu` (rxe follows it)."""
    rc, out = vm.run("rdma link show rxe0/1", timeout=30)
    m = re.search(r"netdev (\S+)", out)
    if rc != 0 or m is None:
        raise SystemExit("%s: no netdev under rxe0:\n%s" % (vm.name, out))
    rc, out = vm.run("ip link set dev %s mtu %d" % (m.group(1), mtu), timeout=30)
    if rc != 0:
        raise SystemExit("%s: cannot set MTU %d:\n%s" % (vm.name, mtu, out))


def measure(kind, iters, log, uplink="udp", mtu=1500, extra=()):
    out = {}
    print("== %s pair, %s, MTU %d%s (load %s)" % (
        kind, uplink, mtu, "".join(" " + x for x in extra), loadavg()), flush=True)
    args = ("--mtu", str(mtu)) + tuple(extra) if kind == "vrdma" else ()
    with vrdmavm.Cluster(n=2, kind=[kind, kind], uplink=uplink, backend_args=args) as c:
        a, b = c.vms
        if kind == "rxe":
            for vm in (a, b):
                set_rxe_mtu(vm, mtu)
        for name, cmd, pattern, unit, _ in tools(iters):
            srv = cmd.format(dev=ib_dev(a), gid=roce_v2_gid_index(a, ib_dev(a)))
            cli = cmd.format(dev=ib_dev(b), gid=roce_v2_gid_index(b, ib_dev(b))) + " " + a.ip
            sout, cout = pair(a, b, srv, cli, timeout=600)
            text = cout if "pingpong" not in cmd else cout + sout
            log.write("### %s MTU %d %s\n%s\n" % (kind, mtu, name, text))
            m = re.search(pattern, text, re.M)
            if m is None:
                raise SystemExit("%s on the %s pair printed no result:\n%s" % (name, kind, text))
            out[name] = float(m.group(1))
            print("   %-26s %12.4g %s" % (name, out[name], unit), flush=True)
    print("   (load %s)" % loadavg(), flush=True)
    return out


def commit():
    """The measured tree: short commit hash, "+changes" if the work tree differs from it."""
    import subprocess
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown"
    return "commit " + head + ("+changes" if dirty else "")


def svg(rows, path, how):
    """Horizontal bars: how many times better vrdma is than rxe per metric (log scale)."""
    import math
    w, bar, gap, left, top = 760, 26, 12, 230, 50
    h = top + len(rows) * (bar + gap) + 40
    vmax = max(r[3] for r in rows)
    span = math.log10(max(vmax, 10)) * 1.1
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
             'font-family="sans-serif" font-size="13">' % (w, h),
             '<rect width="100%" height="100%" fill="white"/>',
             '<text x="%d" y="24" font-size="15" font-weight="bold">vrdma vs Linux rxe, '
             'two TCG guests each (x times better, log scale)</text>' % 10]
    for i, (name, rxe, vr, ratio, unit) in enumerate(rows):
        y = top + i * (bar + gap)
        length = max(2, (w - left - 80) * math.log10(max(ratio, 1.0001)) / span)
        parts.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (
            left - 8, y + bar * 0.7, name))
        parts.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="#3a7bd5"/>' % (
            left, y, length, bar))
        parts.append('<text x="%.1f" y="%d">%.1f×  (%.3g vs %.3g %s)</text>' % (
            left + length + 6, y + bar * 0.7, ratio, vr, rxe, unit))
    parts.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (
        left, top - 6, left, h - 34))
    parts.append('<text x="10" y="%d" font-size="11" fill="#555">measured by make bench-vm on '
                 '%s (%s), 2-core host, QEMU TCG; %s, rxe over -netdev dgram'
                 '</text>' % (h - 12, time.strftime("%Y-%m-%d"), commit(), how))
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=os.path.join(REPO, "results"))
    p.add_argument("--plot", default=None, help="SVG path (default RESULTS/bench-vm.svg)")
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--vrdma-uplink", choices=("fabric", "udp"), default="fabric",
                   help="how the vrdma pair is linked (default: one daemon's fabric)")
    p.add_argument("--mtu", default="1500,9000",
                   help="Ethernet MTUs to measure both pairs at, comma-separated")
    p.add_argument("--vrdma-args", default="",
                   help="more vrdma-backend options for the vrdma pair (e.g. "
                        "--own-engine-threads), to compare a setting with the default")
    a = p.parse_args()
    extra = shlex.split(a.vrdma_args)
    mtus = [int(m) for m in a.mtu.split(",")]
    os.makedirs(a.results, exist_ok=True)
    plot = a.plot or os.path.join(a.results, "bench-vm.svg")
    measured = []
    with open(os.path.join(a.results, "bench-vm.log"), "w") as log:
        for mtu in mtus:
            rxe = measure("rxe", a.iters, log, mtu=mtu)
            vr = measure("vrdma", a.iters, log, a.vrdma_uplink, mtu=mtu, extra=extra)
            measured.append((mtu, rxe, vr))
    rows = []
    print("\n| metric | MTU | rxe pair | vrdma pair | vrdma vs rxe |\n|---|---|---|---|---|")
    for mtu, rxe, vr in measured:
        for name, _, _, unit, bigger in tools(a.iters):
            ratio = vr[name] / rxe[name] if bigger else rxe[name] / vr[name]
            label = name if len(mtus) == 1 else "%s, MTU %d" % (name, mtu)
            rows.append((label, rxe[name], vr[name], ratio, unit))
            print("| %s | %d | %.4g %s | %.4g %s | %.1f× |" % (
                name, mtu, rxe[name], unit, vr[name], unit, ratio))
    how = ("vrdma: both devices on one daemon's fabric" if a.vrdma_uplink == "fabric"
           else "vrdma over its udp uplink") + "".join(" " + x for x in extra)
    svg(rows, plot, how)
    print("plot: %s" % plot)
    print("bench-vm: measured on %s, %s" % (time.strftime("%Y-%m-%d"), commit()))
    for mtu, rxe, vr in measured:
        w = "ib_write_bw 64 KiB"
        print("bench-vm: ib_write_bw 64 KiB at MTU %d: vrdma %.0f MiB/s, rxe %.1f MiB/s" % (
            mtu, vr[w], rxe[w]))
    for mtu, rxe, vr in measured:
        print("bench-vm: ib_write_bw 64 KiB vrdma/rxe = %.1f x (MTU %d)" % (
            vr["ib_write_bw 64 KiB"] / rxe["ib_write_bw 64 KiB"], mtu))

if __name__ == "__main__":
    main()
