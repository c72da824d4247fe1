"""IBTA 1.5 ATOMIC WRITE and FLUSH between two guests, with pyverbs (guest/ibta15_ops.py).

vrdma against vrdma runs the whole sequence (ATOMIC WRITE, range and whole-MR FLUSH, a
persistent FLUSH that fails with REM_ACCESS_ERR). Against Linux rxe only ATOMIC WRITE is checked:
rxe (6.12) computes the ICRC of a FLUSH packet over its 32 header bytes twice (its opcode table
has no payload offset for FLUSH), so rxe drops IBTA-conformant FLUSH requests and vrdma drops
rxe's; see the device-spec §15.2 note.
"""


import vrdmavm

from harness import (expect_in, ib_dev, push_guest_script, roce_v2_gid_index, scenario,
                     spawn_server)

SCRIPT = "/tmp/ibta15_ops.py"


def run_ops(ctx, responder, requester, atomic_write_only):
    push_guest_script((responder, requester), "ibta15_ops.py")
    gr = roce_v2_gid_index(responder, ib_dev(responder))
    gq = roce_v2_gid_index(requester, ib_dev(requester))
    resp = spawn_server(responder, "python3 -u %s responder %s %d" % (
        SCRIPT, ib_dev(responder), gr), 120)
    flag = " --atomic-write-only" if atomic_write_only else ""
    rc, qout = requester.run("python3 -u %s requester %s %d %s%s"
                             % (SCRIPT, ib_dev(requester), gq, responder.ip, flag), timeout=120)
    try:
        _, rout = resp.wait(timeout=120)
    except vrdmavm.CommandTimeout as e:
        rout = "%s\n%s" % (e, getattr(e, "out", ""))
    both = "--- responder (%s) ---\n%s\n--- requester (%s, rc %s) ---\n%s" % (
        responder.kind, rout, requester.kind, rc, qout)
    what = "%s -> %s" % (requester.kind, responder.kind)
    expect_in("completion: ATOMIC_WRITE SUCCESS", both, "the ATOMIC WRITE completion " + what)
    expect_in("target: a1a2a3a4a5a6a7a8", both, "the 8 bytes at the responder " + what)
    if not atomic_write_only:
        expect_in("completion: FLUSH SUCCESS\ncompletion: FLUSH SUCCESS", both,
                  "range and whole-MR FLUSH " + what)
        expect_in("completion: - REM_ACCESS_ERR", both, "the persistent FLUSH " + what)
    ctx.note("%s %s: completions and data as expected"
             % ("ATOMIC WRITE" if atomic_write_only else "ATOMIC WRITE + FLUSH", what))


@scenario("two_vrdma_fabric", ci=True)
def ibta15_atomic_write_flush(ctx):
    """IBTA 1.5 ATOMIC WRITE, range and whole-MR FLUSH, and a refused persistent FLUSH, vrdma to
    vrdma (guest/ibta15_ops.py)."""
    run_ops(ctx, ctx.a, ctx.b, atomic_write_only=False)


@scenario("vrdma_and_rxe_udp", ci=True)
def interop_atomic_write_vrdma_to_rxe(ctx):
    """IBTA 1.5 ATOMIC WRITE from the vrdma guest into the rxe guest's MR."""
    run_ops(ctx, ctx.b, ctx.a, atomic_write_only=True)


@scenario("vrdma_and_rxe_udp", ci=True)
def interop_atomic_write_rxe_to_vrdma(ctx):
    """IBTA 1.5 ATOMIC WRITE from the rxe guest into the vrdma guest's MR."""
    run_ops(ctx, ctx.a, ctx.b, atomic_write_only=True)
