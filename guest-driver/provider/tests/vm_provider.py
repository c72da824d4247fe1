#!/usr/bin/env python3
"""libvrdma in two vrdma guests: stock rdma-core tools and perftest through the
provider, plus system-call counts of the data path.

    python3 guest-driver/provider/tests/vm_provider.py [-k NAME]... [--quick]

Uses the images/vrdmavm package (VRDMA_CACHE, VRDMA_BACKEND, ... as documented there).
Each scenario runs a server in guest 0 and a client in guest 1 and passes
when both exit 0 (and, where stated, their output has the expected lines).
The syscall figure comes from `strace -c -f` of the client at two iteration
counts: (calls(N2) - calls(N1)) / (N2 - N1) removes the set-up cost.
Exit status 1 if any scenario failed.
"""

import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "images"))
import vrdmavm  # noqa: E402

SRV = "10.0.0.1"

# name, server command, client command (server address appended), expect in
# client output (regex), timeout (s)
PINGPONG = [
    ("rc_pingpong", "ibv_rc_pingpong -g 1 -c -n 200", r"200 iters in"),
    ("rc_pingpong_events", "ibv_rc_pingpong -g 1 -c -e -n 200", r"200 iters in"),
    ("rc_pingpong_odp", "ibv_rc_pingpong -g 1 -c -o -n 200", r"200 iters in"),
    ("rc_pingpong_odp_prefetch", "ibv_rc_pingpong -g 1 -c -o -P -n 200", r"200 iters in"),
    ("rc_pingpong_implicit_odp", "ibv_rc_pingpong -g 1 -c -O -n 200", r"200 iters in"),
    ("rc_pingpong_implicit_odp_prefetch", "ibv_rc_pingpong -g 1 -c -O -P -n 200",
     r"200 iters in"),
    ("rc_pingpong_new_send", "ibv_rc_pingpong -g 1 -c -N -n 200", r"200 iters in"),
    ("uc_pingpong", "ibv_uc_pingpong -g 1 -c -n 200", r"200 iters in"),
    ("ud_pingpong", "ibv_ud_pingpong -g 1 -c -s 1024 -n 200", r"200 iters in"),
    ("srq_pingpong", "ibv_srq_pingpong -g 1 -c -n 200", r"iters in"),
    ("srq_pingpong_events", "ibv_srq_pingpong -g 1 -c -e -n 200", r"iters in"),
]

PERF = "-x 1 -F -n 300 -s 4096"
PERFTEST = [
    ("ib_write_bw", "ib_write_bw %s" % PERF, r"^\s*4096\s+300\s"),
    ("ib_read_bw", "ib_read_bw %s" % PERF, r"^\s*4096\s+300\s"),
    ("ib_send_bw", "ib_send_bw %s" % PERF, r"^\s*4096\s+300\s"),
    ("ib_write_bw_old_post_send", "ib_write_bw --use_old_post_send %s" % PERF,
     r"^\s*4096\s+300\s"),
    ("ib_atomic_bw", "ib_atomic_bw -x 1 -F -n 300", r"^\s*8\s+300\s"),
    ("ib_atomic_bw_cmp_swap", "ib_atomic_bw -x 1 -F -n 300 -A CMP_AND_SWAP",
     r"^\s*8\s+300\s"),
    ("ib_send_lat_ud", "ib_send_lat -x 1 -F -n 300 -c UD -s 1024", r"^\s*1024\s+300\s"),
]


def pair(a, b, name, cmd, expect, timeout, log):
    """Server in a, client in b; True when both succeed as expected."""
    srv = a.spawn(cmd, timeout=timeout)
    time.sleep(2)
    try:
        rc, out = b.run("%s %s" % (cmd, a.ip), timeout=timeout)
    except vrdmavm.CommandTimeout as e:
        rc, out = None, "client timed out: %s" % e
    if rc != 0:
        # the server would wait for a partner that gave up
        time.sleep(5)
        if not srv.done():
            srv.kill()
    try:
        src, sout = srv.wait(timeout=timeout)
    except vrdmavm.CommandTimeout as e:
        src, sout = None, "server timed out: %s" % e
    ok = rc == 0 and src == 0 and re.search(expect, out, re.M) is not None
    log.write("=== %s: %s\n--- server rc=%s\n%s\n--- client rc=%s\n%s\n" % (
        name, cmd, src, sout, rc, out))
    log.flush()
    return ok, out


STRACE_TOTAL = re.compile(r"^100\.00\s+\S+\s+\S+\s+(\d+)\s+(\d+\s+)?total$", re.M)
STRACE_ROW = re.compile(r"^\s*\d+\.\d+\s+\S+\s+\S+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", re.M)


def strace_counts(text):
    rows = {m.group(2): int(m.group(1)) for m in STRACE_ROW.finditer(text)}
    rows.pop("total", None)
    return rows


def syscalls(a, b, name, cmd, n1, n2, timeout, log):
    """Per-iteration system calls of the client for cmd (with {n})."""
    counts = []
    for n in (n1, n2):
        c = cmd.format(n=n)
        srv = a.spawn(c, timeout=timeout)
        time.sleep(2)
        rc, out = b.run("strace -c -f -o /tmp/strace.txt %s %s; rc=$?; "
                        "cat /tmp/strace.txt; exit $rc" % (c, a.ip), timeout=timeout)
        if rc != 0 and not srv.done():
            srv.kill()
        try:
            srv.wait(timeout=timeout)
        except vrdmavm.CommandTimeout:
            pass
        log.write("=== syscalls %s n=%d rc=%s\n%s\n" % (name, n, rc, out))
        if rc != 0:
            return None
        counts.append(strace_counts(out))
    per = {}
    for k in set(counts[0]) | set(counts[1]):
        d = counts[1].get(k, 0) - counts[0].get(k, 0)
        if d:
            per[k] = d / float(n2 - n1)
    return per


PYVERBS_MODULES = ["test_device", "test_pd", "test_mr", "test_odp", "test_cq",
                   "test_cq_events", "test_cqex", "test_qp", "test_qpex", "test_srq",
                   "test_atomic", "test_addr", "test_shared_pd", "test_fork"]
PYVERBS_DIR = "/opt/pyverbs-tests"


def pyverbs(vm, modules, timeout, log):
    """rdma-core's pyverbs suite in one guest (QPs looped back on vrdma0),
    one process per module; (module, ran, failures, errors, skipped)."""
    out_rows = []
    for mod in modules:
        cmd = ("cd %s/.. && python3 %s/run_tests.py --dev vrdma0 --gid 1 -v %s"
               % (PYVERBS_DIR, os.path.basename(PYVERBS_DIR), mod))
        try:
            rc, out = vm.run(cmd, timeout=timeout)
        except vrdmavm.CommandTimeout as e:
            rc, out = None, "timed out: %s" % e
        log.write("=== pyverbs %s rc=%s\n%s\n" % (mod, rc, out))
        log.flush()
        ran = re.search(r"^Ran (\d+) tests?", out, re.M)
        fail = re.search(r"failures=(\d+)", out)
        err = re.search(r"errors=(\d+)", out)
        skip = re.search(r"skipped=(\d+)", out)
        row = (mod, int(ran.group(1)) if ran else None,
               int(fail.group(1)) if fail else 0, int(err.group(1)) if err else 0,
               int(skip.group(1)) if skip else 0)
        out_rows.append(row)
        print("pyverbs %-20s ran %s failures %d errors %d skipped %d" % row, flush=True)
    return out_rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", action="append", default=[],
                    help="run only scenarios whose name contains this")
    ap.add_argument("--log", default=os.path.join(REPO, "results", "provider-vm.log"))
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--no-syscalls", action="store_true")
    ap.add_argument("--pyverbs", nargs="*", metavar="MODULE",
                    help="only run pyverbs modules (default: %s)" % " ".join(PYVERBS_MODULES))
    args = ap.parse_args()

    os.makedirs(os.path.dirname(args.log), exist_ok=True)
    sel = lambda name: not args.k or any(k in name for k in args.k)  # noqa: E731
    results = []
    with open(args.log, "w") as log, vrdmavm.Cluster(n=2, kind="vrdma") as c:
        a, b = c.vms
        if args.pyverbs is not None:
            rows = pyverbs(a, args.pyverbs or PYVERBS_MODULES, args.timeout, log)
            for mod, ran, f, e, sk in rows:
                results.append(("pyverbs_" + mod, ran is not None and f == 0 and e == 0,
                                "ran %s, %d skipped, %d failures, %d errors" % (
                                    ran, sk, f, e)))
            args.no_syscalls = True
            args.k = ["-none-"]
        rc, out = a.run("ibv_devinfo -v", timeout=60)
        log.write("=== ibv_devinfo -v rc=%s\n%s\n" % (rc, out))
        dev_ok = (rc == 0 and "vrdma0" in out and "ODP_SUPPORT_IMPLICIT" in out
                  and "atomic_cap:\t\t\tATOMIC_HCA" in out)
        results.append(("ibv_devinfo", dev_ok, ""))

        for name, cmd, expect in PINGPONG + PERFTEST:
            if not sel(name):
                continue
            ok, out = pair(a, b, name, cmd, expect, args.timeout, log)
            m = re.search(r"([\d.]+) usec/iter", out)
            results.append((name, ok, m.group(0) if m else ""))
            print("%-36s %s" % (name, "PASS" if ok else "FAIL"), flush=True)

        if not args.no_syscalls and sel("syscalls"):
            for name, cmd in (
                    ("syscalls_rc_pingpong", "ibv_rc_pingpong -g 1 -n {n}"),
                    ("syscalls_rc_pingpong_new_send", "ibv_rc_pingpong -g 1 -N -n {n}"),
                    ("syscalls_ud_pingpong", "ibv_ud_pingpong -g 1 -s 1024 -n {n}"),
                    ("syscalls_srq_pingpong", "ibv_srq_pingpong -g 1 -n {n}"),
                    ("syscalls_ib_send_bw", "ib_send_bw -x 1 -F -s 64 -n {n}")):
                per = syscalls(a, b, name, cmd, 100, 600, args.timeout, log)
                if per is None:
                    results.append((name, False, "run failed"))
                    continue
                total = sum(per.values())
                detail = ", ".join("%s %.2f" % (k, v) for k, v in
                                   sorted(per.items(), key=lambda kv: -kv[1]))
                # pingpong: one post_send per iteration => <= 1 write
                ok = per.get("write", 0) <= 1.05 and total <= 1.1
                results.append((name, ok, "%.2f syscalls/iter (%s)" % (total, detail)))
                print("%-36s %s %.2f/iter" % (name, "PASS" if ok else "FAIL", total),
                      flush=True)

    print("\nlibvrdma VM scenarios (log: %s)" % args.log)
    for name, ok, info in results:
        print("  %-36s %s  %s" % (name, "PASS" if ok else "FAIL", info))
    failed = [r for r in results if not r[1]]
    print("%d passed, %d failed" % (len(results) - len(failed), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
