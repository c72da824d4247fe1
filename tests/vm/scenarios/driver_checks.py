"""Checks vrdma.ko makes on behalf of the device (issue [hardening] item 8)."""

from harness import expect_in, push_guest_script, run_ok, scenario


@scenario("A")
def advise_mr_refuses_another_pds_key(ctx):
    script = push_guest_script([ctx.a], "advise_cross_pd.py")
    out = run_ok(ctx.a, "python3 %s vrdma0" % script, timeout=120)
    expect_in("own PD: advice accepted", out, "advise_cross_pd.py")
    expect_in("other PD: advice refused", out, "advise_cross_pd.py")
