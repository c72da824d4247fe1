"""Affiliated async events at the responder (IBTA C9-222.1.1), checked with pyverbs,
completion event moderation (ibv_modify_cq), and traffic on a thread domain's parent domain
(ibv_alloc_td), which pyverbs cannot create: the last two are small C programs."""

import os
import re
import subprocess
import tempfile

import vrdmavm

from harness import (HERE, REPO, expect, expect_in, push_guest_script, roce_v2_gid_index,
                     scenario, spawn_server)

SCRIPT = "/tmp/bad_rkey.py"


def bad_rkey(ctx, imm):
    push_guest_script((ctx.a, ctx.b), "bad_rkey.py")
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    flag = " --imm" if imm else ""
    resp = spawn_server(ctx.a, "python3 -u %s responder vrdma0 %d%s" % (SCRIPT, g, flag), 90)
    rc, rout = ctx.b.run("python3 -u %s requester vrdma0 %d %s%s" % (SCRIPT, g, ctx.a.ip, flag),
                         timeout=90)
    try:
        src, sout = resp.wait(timeout=90)
    except vrdmavm.CommandTimeout as e:
        src, sout = None, "%s\n%s" % (e, getattr(e, "out", ""))
    both = "--- responder (rc %s) ---\n%s\n--- requester (rc %s) ---\n%s" % (src, sout, rc, rout)
    expect_in("send completion: REM_ACCESS_ERR", both, "the requester's completion")
    return both


@scenario("two_vrdma_fabric", ci=True)
def async_bad_rkey_write(ctx):
    """An RDMA WRITE with a bad rkey gives the responder's QP the QP_ACCESS_ERR async event
    (IBTA C9-222.1.1)."""
    both = bad_rkey(ctx, imm=False)
    expect_in("async event: QP_ACCESS_ERR", both, "the responder's async events")


@scenario("two_vrdma_fabric", ci=True)
def async_bad_rkey_write_with_imm(ctx):
    """A WRITE_WITH_IMM with a bad rkey completes the responder's receive with LOC_ACCESS_ERR
    and raises no async event (IBTA C9-222.1.1)."""
    both = bad_rkey(ctx, imm=True)
    expect_in("recv completion: LOC_ACCESS_ERR", both, "the responder's receive completion")
    expect_in("async event: none", both, "the responder's async events (none expected)")


def build_guest_c(name):
    """Compile tests/vm/guest/<name>.c on the host against the rdma-core 56.1 tree that
    guest-driver/provider/build.sh keeps for this checkout (the guest has no compiler; its
    libibverbs is the same 56.1). Returns the binary's bytes."""
    build = subprocess.run(["sh", os.path.join(REPO, "guest-driver", "provider", "build.sh")],
                           capture_output=True, text=True, timeout=1200)
    expect(build.returncode == 0, "guest-driver/provider/build.sh", build.stderr[-3000:])
    lib = os.path.dirname(build.stdout.strip().splitlines()[-1])  # <tree>/build/lib
    inc = os.path.join(os.path.dirname(lib), "include")
    out = os.path.join(tempfile.mkdtemp(prefix="vrdma-guest-c-"), name)
    cc = subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-I", inc,
                         os.path.join(HERE, "guest", name + ".c"), "-L", lib, "-libverbs",
                         "-o", out], capture_output=True, text=True, timeout=120)
    expect(cc.returncode == 0, "compile %s.c" % name, cc.stderr[-3000:])
    with open(out, "rb") as f:
        return f.read()


@scenario("two_vrdma_fabric", ci=True)
def cq_moderation_modify_cq(ctx):
    """ibv_modify_cq (spec §5.5): with count 4 three CQEs do not signal and the fourth does;
    with count 1000 and period 60 ms one CQE signals when the period ends, not before."""
    vm = ctx.a
    vm.write_file("/tmp/cq_moderation", build_guest_c("cq_moderation"), mode=0o755)
    g = roce_v2_gid_index(vm, "vrdma0")
    rc, out = vm.run("/tmp/cq_moderation vrdma0 %d" % g, timeout=120)
    for line in out.strip().splitlines():
        ctx.note(line)
    expect_in("count: held 3, event after the 4th", out, "cq_moderation")
    m = re.search(r"period: event after (\d+) us", out)
    expect(m is not None and int(m.group(1)) >= 55000, "the period held the event back", out)
    expect(rc == 0, "cq_moderation exited with %s" % rc, out)


@scenario("two_vrdma_fabric", ci=True)
def thread_domain_traffic(ctx):
    """A self-connected RC QP and an extended CQ on a parent domain with a thread domain
    (libvrdma takes no SQ/RQ/CQ lock for them) carry SENDs and RDMA WRITEs; the PD and the TD
    cannot go while the parent domain uses them (EBUSY)."""
    vm = ctx.a
    vm.write_file("/tmp/thread_domain", build_guest_c("thread_domain"), mode=0o755)
    g = roce_v2_gid_index(vm, "vrdma0")
    rc, out = vm.run("/tmp/thread_domain vrdma0 %d" % g, timeout=120)
    for line in out.strip().splitlines():
        ctx.note(line)
    expect_in("busy: pd EBUSY, td EBUSY", out, "thread_domain")
    expect_in("traffic: 200 sends, 200 writes", out, "thread_domain")
    expect_in("teardown: ok", out, "thread_domain")
    expect(rc == 0, "thread_domain exited with %s" % rc, out)
