"""rdma-core's pyverbs test suite (python3-pyverbs) against vrdma0, module by module.

Each module runs in its own Python process (the whole suite in one process has
crashed Python part way on rxe). Counts of passed / failed / skipped tests are
recorded; tests in REQUIRED modules must not fail or error, and every skip is
listed with its reason.
"""

import re

from harness import expect, roce_v2_gid_index, scenario

SUITE = "/opt/pyverbs-tests"
REQUIRED = ["test_device", "test_pd", "test_mr", "test_cq", "test_qp", "test_odp",
            "test_srq", "test_rdmacm", "test_atomic"]
HUGE_POOL = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
HUGE_PAGES = 32
RESULT = re.compile(r"^(test\w+) \(([\w.]+)\)(?:\s*\n.*?)?\s\.\.\.\s(ok|FAIL|ERROR|skipped(?: '(.*)')?|"
                    r"expected failure|unexpected success)\s*$", re.M)


def run_module(vm, module, gid):
    rc, out = vm.run("cd %s && timeout 600 python3 run_tests.py --dev vrdma0 --port 1 "
                     "--gid %d -v %s 2>&1" % (SUITE, gid, module), timeout=660)
    counts = {"ok": 0, "fail": 0, "skip": 0}
    skips, fails = [], []
    for m in RESULT.finditer(out):
        name, cls, verdict, reason = m.group(1), m.group(2), m.group(3), m.group(4)
        if verdict == "ok" or verdict == "expected failure":
            counts["ok"] += 1
        elif verdict.startswith("skipped"):
            counts["skip"] += 1
            skips.append("%s.%s: %s" % (cls, name, reason or "?"))
        else:
            counts["fail"] += 1
            fails.append("%s.%s: %s" % (cls, name, verdict))
    ran = re.search(r"^Ran (\d+) tests?", out, re.M)
    return rc, out, counts, skips, fails, int(ran.group(1)) if ran else None


@scenario("A", timeout=3600)
def pyverbs_required_modules(ctx):
    vm = ctx.a
    gid = roce_v2_gid_index(vm, "vrdma0")
    # test_odp's huge-page cases register MRs on 2 MiB pages; they skip without a pool.
    rc, out = vm.run("echo %d > %s && cat %s" % (HUGE_PAGES, HUGE_POOL, HUGE_POOL))
    expect(rc == 0 and out.strip() == str(HUGE_PAGES),
           "the guest reserved %d huge pages of 2 MiB: %r" % (HUGE_PAGES, out))
    total = {"ok": 0, "fail": 0, "skip": 0}
    problems = []
    for module in REQUIRED:
        rc, out, counts, skips, fails, ran = run_module(vm, module, gid)
        for k in total:
            total[k] += counts[k]
        ctx.note("%s: %d passed, %d failed, %d skipped (ran %s)" % (
            module, counts["ok"], counts["fail"], counts["skip"], ran))
        for s in skips:
            ctx.note("  skipped %s" % s)
        for f in fails:
            ctx.note("  FAILED  %s" % f)
        if ran is None:
            problems.append("%s did not finish:\n%s" % (module, out[-3000:]))
        elif fails:
            problems.append("%s: %s" % (module, "; ".join(fails)))
        elif ran != sum(counts.values()):
            problems.append("%s: ran %d tests but %d verdicts were parsed" % (
                module, ran, sum(counts.values())))
    ctx.note("pyverbs total: %d passed, %d failed, %d skipped" % (
        total["ok"], total["fail"], total["skip"]))
    expect(total["ok"] > 0, "some pyverbs tests passed")
    expect(not problems, "pyverbs required modules:\n" + "\n".join(problems))
