#!/usr/bin/env python3
"""Run the vrdma VM test suite.

    tests/vm/run.py                 every scenario
    tests/vm/run.py --ci            the scenarios CI runs (@scenario(..., ci=True); make test)
    tests/vm/run.py -k rping        scenarios whose name contains "rping"
    tests/vm/run.py --list          list the scenarios (topology, name, "ci" if CI runs it)
    tests/vm/run.py --topology two_vrdma_fabric   only that topology (tests/vm/harness.py)

Needs the images (`make images`) and a release build of vrdma-backend. Evidence
of each failing scenario is kept under --results (default tests/results/<time>).
The last line is "N passed, N failed".
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import scenarios  # noqa: E402,F401  (registers the scenarios)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-k", action="append", default=[], help="only scenarios whose name contains this")
    p.add_argument("--topology", action="append", default=[],
                   choices=sorted(harness.TOPOLOGIES), metavar="TOPOLOGY",
                   help="only these topologies (harness.TOPOLOGIES)")
    p.add_argument("--ci", action="store_true", help="only the scenarios CI runs")
    p.add_argument("--scenarios", help="a file naming the scenarios to run, one per line "
                   "(# starts a comment); an unknown name is an error")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--results", default=None, help="where failing scenarios keep their evidence")
    p.add_argument("--keep", action="store_true", help="keep every run directory")
    a = p.parse_args()
    names = [n for n, s in harness.SCENARIOS.items()
             if (not a.k or any(k in n for k in a.k))
             and (not a.topology or s.topology in a.topology) and (s.ci or not a.ci)]
    if a.scenarios:
        with open(a.scenarios) as f:
            wanted = [line.split("#")[0].strip() for line in f]
        wanted = [w for w in wanted if w]
        unknown = [w for w in wanted if w not in harness.SCENARIOS]
        if unknown:
            print("unknown scenarios in %s: %s" % (a.scenarios, ", ".join(unknown)))
            print("0 passed, 1 failed")
            return 1
        names = [n for n in names if n in wanted]
    if a.list:
        for n in names:
            s = harness.SCENARIOS[n]
            print("%s  %s%s" % (s.topology, n, "  ci" if s.ci else ""))
        return 0
    if not names:
        print("no scenario matches")
        print("0 passed, 1 failed")
        return 1
    results = a.results or os.path.join(harness.REPO, "tests", "results",
                                        time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(results, exist_ok=True)
    t0 = time.monotonic()
    passed, failed = harness.run(names, results, keep=a.keep)
    print("")
    if failed:
        print("failed: %s" % ", ".join(failed))
        print("evidence in %s" % results)
    print("time: %.0fs" % (time.monotonic() - t0))
    print("%d passed, %d failed" % (len(passed), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
