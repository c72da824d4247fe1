#!/usr/bin/env python3
"""Run the VM suite several times in a row and tally the failures per scenario.

    tests/vm/repeat.py RUNS [run.py arguments...]

Each run is `tests/vm/run.py` with the given arguments and its own --results directory under
results/vm-repeat/<start time>/run-<i>. Prints, per run, its pass/fail line and load average,
then a table of every scenario that failed at least once (how often, in which runs), and the
longest streak of green runs. Appends the summary to results/vm-repeat/record.txt, so flakes
stay on record across sessions; a repeat stopped early (SIGINT, SIGTERM) records the runs it
finished and says so. Exit status: 0 if every run asked for ran and passed.
"""

import os
import re
import signal
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
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "run.py"), "--results",
                              results] + args, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            rc = p.wait()
        except KeyboardInterrupt:
            # Stopped: the run shuts its guests down (run.py's SIGTERM handling) before the
            # repeat records what it finished.
            p.terminate()
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
    with open(os.path.join(results, "output.txt")) as log:
        out = log.read()
    failed = sorted(set(re.findall(r"^FAIL (\S+?)(?::| \()", out, re.M)))
    passed = re.findall(r"^ok   (\S+)", out, re.M)
    last = out.strip().splitlines()[-1] if out.strip() else "(no output)"
    if rc != 0 and not failed:
        failed = ["run.py exited %d: %s" % (rc, last)]
    return passed, failed, time.monotonic() - t0


def main():
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    runs, args = int(sys.argv[1]), sys.argv[2:]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out_dir = os.path.join(TOP, "results", "vm-repeat", stamp)
    tally, streak, best = {}, 0, 0
    lines = []
    # SIGTERM as SIGINT: either ends the repeat with what it has, recorded.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    done, stopped = 0, None
    try:
        for i in range(1, runs + 1):
            stopped = i
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
            done, stopped = i, None
    except KeyboardInterrupt:
        pass
    head = "%s: %d runs of run.py %s" % (stamp, runs, " ".join(args) or "(all scenarios)")
    if stopped is not None:
        head += ", stopped during run %d" % stopped
    summary = [head] + lines
    summary += ["  %-50s failed %d of %d (runs %s)" % (n, len(r), done, ",".join(map(str, r)))
                for n, r in sorted(tally.items(), key=lambda kv: -len(kv[1]))]
    summary.append("longest green streak: %d of %d" % (best, done))
    print("\n".join(summary[1 + len(lines):]))
    with open(os.path.join(TOP, "results", "vm-repeat", "record.txt"), "a") as rec:
        rec.write("\n".join(summary) + "\n\n")
    sys.exit(0 if not tally and stopped is None else 1)


if __name__ == "__main__":
    main()
