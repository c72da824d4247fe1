"""rdma-core's pyverbs test suite (python3-pyverbs) against vrdma0, module by module.

Each module runs in its own Python process (the whole suite in one process has
crashed Python part way on rxe). Counts of passed / failed / skipped tests are
recorded; tests in REQUIRED modules must not fail or error, and every skip is
listed with its reason. Verdicts come from guest/pyverbs_run.py as JSON (a
unittest result class), not from parsing the verbose text.
"""

import json
import os

import vrdmavm

from harness import HERE, expect, roce_v2_gid_index, scenario

SUITE = "/opt/pyverbs-tests"
RUNNER = "/tmp/pyverbs_run.py"
REQUIRED = ["test_device", "test_pd", "test_mr", "test_cq", "test_qp", "test_odp",
            "test_srq", "test_rdmacm", "test_atomic", "test_qpex", "test_cqex",
            "test_cq_events", "test_addr", "test_relaxed_ordering", "test_fork",
            "test_parent_domain", "test_shared_pd",
            # Not vendor-specific, but every test needs what a RoCE device of this kind does
            # not offer (raw packet QPs, RSS, tag matching): they run, and print their skips.
            "test_flow", "test_rss_traffic", "test_tag_matching"]
# Developer runs: VRDMA_PYVERBS_MODULES=test_srq,test_cq runs only those (CI sets nothing).
ONLY = [m for m in os.environ.get("VRDMA_PYVERBS_MODULES", "").split(",") if m]
# Tests of features vrdma offers, which must run (a skip of one of them is a regression, not a
# missing feature): device memory (spec §12.9), parent and thread domains (libvrdma), and
# importing a shared context with its PD, MR and DM. Module -> test class name prefixes.
MUST_RUN = {
    "test_device": ["DMTest.", "SharedDMTest."],
    "test_mr": ["DeviceMemoryAPITest.", "DeviceMemoryTest."],
    "test_parent_domain": ["ParentDomainTrafficTest."],
    "test_shared_pd": ["SharedPDTestCase."],
}
HUGE_POOL = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
HUGE_PAGES = 32


def run_module(vm, module, gid):
    """Run one module; returns (output, counts, skips, fails, tests ran or None)."""
    res = "/tmp/pyverbs-%s.json" % module
    rc, out = vm.run("cd %s && rm -f %s && timeout 600 python3 %s %s --dev vrdma0 --port 1 "
                     "--gid %d -v %s 2>&1" % (SUITE, res, RUNNER, res, gid, module), timeout=660)
    counts = {"ok": 0, "fail": 0, "skip": 0}
    skips, fails = [], []
    try:
        result = json.loads(vm.read_file(res))
    except (ValueError, KeyError, vrdmavm.VMError) as e:
        return out + "\n(no verdicts: %s; exit %s)" % (e, rc), counts, skips, fails, None
    for test, verdict, detail in result["verdicts"]:
        if verdict == "ok":
            counts["ok"] += 1
        elif verdict == "skip":
            counts["skip"] += 1
            skips.append("%s: %s" % (test, detail or "?"))
        else:
            counts["fail"] += 1
            fails.append("%s: %s\n%s" % (test, verdict, detail))
    return out, counts, skips, fails, result["ran"]


def prepare(vm, huge_pages):
    """Copy the runner into the guest and return vrdma0's RoCEv2 GID index; with `huge_pages`,
    reserve the 2 MiB pages test_odp's huge-page cases register (they skip without a pool)."""
    gid = roce_v2_gid_index(vm, "vrdma0")
    with open(os.path.join(HERE, "guest", "pyverbs_run.py")) as f:
        vm.write_file(RUNNER, f.read(), mode=0o755)
    if huge_pages:
        rc, out = vm.run("echo %d > %s && cat %s" % (HUGE_PAGES, HUGE_POOL, HUGE_POOL))
        expect(rc == 0 and out.strip() == str(HUGE_PAGES),
               "the guest reserved %d huge pages of 2 MiB: %r" % (HUGE_PAGES, out))
    return gid


def run_noted(ctx, vm, module, gid):
    """run_module, with its counts, every skip and every failure in the scenario's notes."""
    out, counts, skips, fails, ran = run_module(vm, module, gid)
    ctx.note("%s: %d passed, %d failed, %d skipped (ran %s)" % (
        module, counts["ok"], counts["fail"], counts["skip"], ran))
    for s in skips:
        ctx.note("  skipped %s" % s)
    for f in fails:
        ctx.note("  FAILED  %s" % f)
    return out, counts, skips, fails, ran


def run_wanted(ctx, vm, gid, wanted_by_module, title):
    """Run each module in full: nothing may fail, and none of its wanted tests may skip."""
    problems = []
    for module, wanted in wanted_by_module.items():
        if ONLY and module not in ONLY:
            continue
        out, counts, skips, fails, ran = run_noted(ctx, vm, module, gid)
        if ran is None:
            problems.append("%s did not finish:\n%s" % (module, out[-3000:]))
            continue
        problems += ["%s: %s" % (module, f) for f in fails]
        for t in wanted:
            skipped = [s for s in skips if s.split(":")[0].endswith(t)]
            if skipped:
                problems.append("%s skipped: %s" % (t, skipped[0]))
    expect(not problems, "%s:\n%s" % (title, "\n".join(problems)))


@scenario("two_vrdma_fabric", ci=True, timeout=3600)
def pyverbs_required_modules(ctx):
    """rdma-core's pyverbs suite, the modules vrdma must pass (REQUIRED above): no failure,
    and none of the tests of features vrdma offers (MUST_RUN) skips."""
    vm = ctx.a
    gid = prepare(vm, huge_pages=True)
    total = {"ok": 0, "fail": 0, "skip": 0}
    problems = []
    for module in [m for m in REQUIRED if not ONLY or m in ONLY]:
        out, counts, skips, fails, ran = run_noted(ctx, vm, module, gid)
        for k in total:
            total[k] += counts[k]
        if ran is None:
            problems.append("%s did not finish:\n%s" % (module, out[-3000:]))
        elif fails:
            problems.append("%s: %s" % (module, "; ".join(fails)))
        elif ran != sum(counts.values()):
            problems.append("%s: ran %d tests but %d verdicts were recorded; output:\n%s" % (
                module, ran, sum(counts.values()), out[-6000:]))
        for prefix in MUST_RUN.get(module, []):
            problems += ["%s: must run, skipped %s" % (module, s) for s in skips
                         if s.split(":")[0].split("%s." % module)[-1].startswith(prefix)]
    ctx.note("pyverbs total: %d passed, %d failed, %d skipped" % (
        total["ok"], total["fail"], total["skip"]))
    expect(total["ok"] > 0, "some pyverbs tests passed")
    expect(not problems, "pyverbs required modules:\n" + "\n".join(problems))


# Memory windows (spec §12.8): every pyverbs test that binds, uses or invalidates one.
MW_TESTS = {
    "test_mr": ["MWTest.test_mw_type1", "MWTest.test_invalidate_mw_type1",
                "MWTest.test_mw_type2", "MWTest.test_mw_type2_invalidate_local",
                "MWTest.test_mw_type2_invalidate_remote",
                "MWTest.test_mw_type2_invalidate_dealloc", "MWTest.test_reg_mw_wrong_type"],
    "test_qpex": ["QpExTestCase.test_qp_ex_rc_bind_mw"],
}


@scenario("two_vrdma_fabric", ci=True, timeout=1800)
def pyverbs_memory_windows(ctx):
    """test_mr and test_qpex in full: nothing fails, and every memory-window test runs and
    passes (type 1 via ibv_bind_mw, type 2B via IBV_WR_BIND_MW and ibv_wr_bind_mw, LOCAL_INV,
    SEND_WITH_INV, dealloc, a window without rights)."""
    gid = prepare(ctx.a, huge_pages=False)
    run_wanted(ctx, ctx.a, gid, MW_TESTS, "pyverbs memory windows")


# XRC (spec §13.7): every pyverbs test that runs XRC traffic (XRC_SEND -> XRC_RECV through an
# XRC SRQ of a shared XRCD, ibv_get_srq_num, wr.xrc.remote_srqn and wr_set_xrc_srqn).
XRC_TESTS = {
    "test_qpex": ["QpExTestCase.test_qp_ex_xrc_send", "QpExTestCase.test_qp_ex_xrc_send_imm"],
    "test_cqex": ["CqExTestCase.test_xrc_traffic_cq_ex"],
    "test_atomic": ["AtomicTest.test_xrc_atomic_fetch_and_add",
                    "AtomicTest.test_xrc_atomic_cmp_and_swap"],
    "test_relaxed_ordering": ["RoTestCase.test_ro_xrc_traffic"],
    "test_odp": ["OdpTestCase.test_odp_xrc_traffic"],
}


@scenario("two_vrdma_fabric", ci=True, timeout=1800)
def pyverbs_xrc(ctx):
    """The modules with XRC tests in full: nothing fails, and every XRC traffic test runs
    (none skipped) and passes."""
    vm = ctx.a
    gid = prepare(vm, huge_pages=True)
    rc, out = vm.run("ibv_devinfo -v -d vrdma0 | grep -w XRC")
    expect(rc == 0, "vrdma0 reports IBV_DEVICE_XRC: %r" % out)
    run_wanted(ctx, vm, gid, XRC_TESTS, "pyverbs XRC")
