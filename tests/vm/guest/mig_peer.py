#!/usr/bin/env python3
"""An RC QP pair that lives through a live migration of one guest (spec §17), with pyverbs.

    mig_peer.py responder DEV GIDX                     (run first)
    mig_peer.py requester DEV GIDX PEER_IP GO_FILE [--busy]

The requester connects (QP numbers, PSNs and GIDs over TCP) and runs ROUNDS echo rounds: a
SEND of SIZE bytes with a pattern that depends on the round, which the responder checks and
sends back, which the requester checks. Then it waits until GO_FILE exists (the host creates
it in the guest after the migration; GO_FILE.ready tells the host the QP is connected) — idle,
or with --busy running rounds all the while — and runs ROUNDS more. Printed (checked by the host):

    requester:  "rounds ok: <n>"            every round's data came back intact
    responder:  "rounds ok: <n>"
    either:     "FAIL: <what>"              and exit status 1
"""

import os
import sys
import time

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import RecvWR, SendWR, SGE

from rc_peer import accept, dial, exchange, poll_one, to_rts

PORT = 18700
SIZE = 8192
ROUNDS = 20
# Long enough for a migration's downtime plus the peer's retransmissions.
WAIT = 120


def pattern(n):
    return bytes((n * 131 + i * 7) & 0xff for i in range(SIZE))


def setup(dev, gidx):
    ctx = Context(name=dev)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    mr = MR(pd, 2 * SIZE, e.IBV_ACCESS_LOCAL_WRITE)
    cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    gid = str(ctx.query_gid(1, gidx))
    return ctx, pd, cq, mr, qp, gid


def fail(what):
    print("FAIL: " + what, flush=True)
    sys.exit(1)


def post_recv(qp, mr):
    qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf, SIZE, mr.lkey)]))


def send(qp, mr, data):
    mr.write(data, SIZE, SIZE)
    wr = SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1,
                sg=[SGE(mr.buf + SIZE, SIZE, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
    qp.post_send(wr)


def wait_both(cq, want):
    """Wait for completions of the wr_ids in `want` (1 = recv, 2 = send); all must succeed."""
    want = set(want)
    while want:
        wc = poll_one(cq, WAIT)
        if wc is None:
            fail("no completion in %ss (waiting for %s)" % (WAIT, sorted(want)))
        if wc.status != e.IBV_WC_SUCCESS:
            fail("completion wr_id %d status %d" % (wc.wr_id, wc.status))
        want.discard(wc.wr_id)


def responder(dev, gidx):
    ctx, pd, cq, mr, qp, gid = setup(dev, gidx)
    conn = accept(PORT)
    mine = {"qpn": qp.qp_num, "psn": 0x1234, "gid": gid}
    peer = exchange(conn, mine)
    to_rts(qp, gidx, mine, peer, e.IBV_ACCESS_LOCAL_WRITE)
    post_recv(qp, mr)  # before the requester hears we are ready (no RNR)
    exchange(conn, {"ready": True})
    n = 0
    while True:
        wc = poll_one(cq, 3 * WAIT)
        if wc is None:
            fail("no SEND from the requester in %ss" % (3 * WAIT))
        if wc.status != e.IBV_WC_SUCCESS:
            fail("recv status %d" % wc.status)
        data = mr.read(SIZE, 0)
        if data[:4] == b"DONE":
            break
        expect = pattern(int.from_bytes(data[SIZE - 4:], "little"))
        if data[:SIZE - 4] != expect[:SIZE - 4]:
            fail("round %d: data differs" % n)
        post_recv(qp, mr)
        send(qp, mr, data)
        wait_both(cq, [2])
        n += 1
    print("rounds ok: %d" % n, flush=True)


def rounds(qp, mr, cq, first, count):
    for r in range(first, first + count):
        data = pattern(r)[:SIZE - 4] + r.to_bytes(4, "little")
        post_recv(qp, mr)
        send(qp, mr, data)
        wait_both(cq, [1, 2])
        if mr.read(SIZE, 0) != data:
            fail("round %d: echo differs" % r)
    return first + count


def requester(dev, gidx, peer_ip, go_file, busy):
    ctx, pd, cq, mr, qp, gid = setup(dev, gidx)
    conn = dial(peer_ip, PORT)
    mine = {"qpn": qp.qp_num, "psn": 0x5678, "gid": gid}
    peer = exchange(conn, mine)
    to_rts(qp, gidx, mine, peer, e.IBV_ACCESS_LOCAL_WRITE)
    exchange(conn, {"ready": True})
    r = rounds(qp, mr, cq, 0, ROUNDS)
    print("connected, %d rounds before the migration" % r, flush=True)
    with open(go_file + ".ready", "w"):
        pass
    t0 = time.monotonic()
    while not os.path.exists(go_file):
        if busy:
            r = rounds(qp, mr, cq, r, 1)
        else:
            time.sleep(0.2)
        if time.monotonic() - t0 > 10 * WAIT:
            fail("no %s after %ss" % (go_file, 10 * WAIT))
    r = rounds(qp, mr, cq, r, ROUNDS)
    mr.write(b"DONE".ljust(SIZE, b"\0"), SIZE, SIZE)
    qp.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1,
                        sg=[SGE(mr.buf + SIZE, SIZE, mr.lkey)],
                        send_flags=e.IBV_SEND_SIGNALED))
    wait_both(cq, [2])
    print("rounds ok: %d" % r, flush=True)


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "responder":
        responder(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) >= 6 and sys.argv[1] == "requester":
        requester(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5],
                  "--busy" in sys.argv[6:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
