"""Affiliated async events at the responder (IBTA C9-222.1.1), checked with pyverbs."""

import time

import vrdmavm

from harness import expect_in, push_guest_script, roce_v2_gid_index, scenario

SCRIPT = "/tmp/bad_rkey.py"


def bad_rkey(ctx, imm):
    push_guest_script((ctx.a, ctx.b), "bad_rkey.py")
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    flag = " --imm" if imm else ""
    resp = ctx.a.spawn("python3 -u %s responder vrdma0 %d%s" % (SCRIPT, g, flag), timeout=90)
    time.sleep(2)
    rc, rout = ctx.b.run("python3 -u %s requester vrdma0 %d %s%s" % (SCRIPT, g, ctx.a.ip, flag),
                         timeout=90)
    try:
        src, sout = resp.wait(timeout=90)
    except vrdmavm.CommandTimeout as e:
        src, sout = None, "%s\n%s" % (e, getattr(e, "out", ""))
    both = "--- responder (rc %s) ---\n%s\n--- requester (rc %s) ---\n%s" % (src, sout, rc, rout)
    expect_in("send completion: REM_ACCESS_ERR", both, "the requester's completion")
    return both


@scenario("A")
def async_bad_rkey_write(ctx):
    both = bad_rkey(ctx, imm=False)
    expect_in("async event: QP_ACCESS_ERR", both, "the responder's async events")


@scenario("A")
def async_bad_rkey_write_with_imm(ctx):
    both = bad_rkey(ctx, imm=True)
    expect_in("recv completion: LOC_ACCESS_ERR", both, "the responder's receive completion")
    expect_in("async event: none", both, "the responder's async events (none expected)")
