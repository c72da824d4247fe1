#!/usr/bin/env python3
"""Run the VM suite several times in a row and tally the failures per scenario.

    tests/vm/repeat.py RUNS [run.py arguments...]

Each run is `tests/vm/run.py` with the given arguments and its own --results directory under
results/vm-repeat/<start time>/run-<i>. Prints, per run, its pass/fail line and load average,
then a table of every scenario that failed at least once (how often, in which runs), and the
longest streak of green runs. Appends the summary to results/vm-repeat/record.txt, so flakes
stay on record across sessions. Exit status: 0 if every run passed.
"""

import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))


def one_run(i, out_dir, args):
    results = os.path.join(out_dir, "run-%d" % i)
    os.makedirs(results, exist_ok=True)
    t0 = time.monotonic()
    with open(os.path.join(results, "output.txt"), "w") as log:
        p = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--results", results]
                           + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log.write(p.stdout)
    failed = sorted(set(re.findall(r"^FAIL (\S+?)(?::| \()", p.stdout, re.M)))
    passed = re.findall(r"^ok   (\S+)", p.stdout, re.M)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "(no output)"
    if p.returncode != 0 and not failed:
        failed = ["run.py exited %d: %s" % (p.returncode, last)]
    return passed, failed, time.monotonic() - t0


def main():
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    runs, args = int(sys.argv[1]), sys.argv[2:]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out_dir = os.path.join(TOP, "results", "vm-repeat", stamp)
    tally, streak, best = {}, 0, 0
    lines = []
    for i in range(1, runs + 1):
        passed, failed, secs = one_run(i, out_dir, args)
        load = open("/proc/loadavg").read().split()[:3]
        line = "run %d: %d passed, %d failed in %.0f s (load %s)%s" % (
            i, len(passed), len(failed), secs, " ".join(load),
            ": " + ", ".join(failed) if failed else "")
        print(line, flush=True)
        lines.append(line)
        for name in failed:
            tally.setdefault(name, []).append(i)
        streak = 0 if failed else streak + 1
        best = max(best, streak)
    summary = ["%s: %d runs of run.py %s" % (stamp, runs, " ".join(args) or "(all scenarios)")]
    summary += lines
    summary += ["  %-50s failed %d of %d (runs %s)" % (n, len(r), runs, ",".join(map(str, r)))
                for n, r in sorted(tally.items(), key=lambda kv: -len(kv[1]))]
    summary.append("longest green streak: %d of %d" % (best, runs))
    print("\n".join(summary[1 + len(lines):]))
    with open(os.path.join(TOP, "results", "vm-repeat", "record.txt"), "a") as rec:
        rec.write("\n".join(summary) + "\n\n")
    sys.exit(0 if not tally else 1)


if __name__ == "__main__":
    main()
