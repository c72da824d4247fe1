#!/usr/bin/env python3
"""IBTA 1.5 ATOMIC WRITE and FLUSH between two guests, with pyverbs.

    ibta15_ops.py responder DEV GIDX                 (run first)
    ibta15_ops.py requester DEV GIDX PEER_IP [--atomic-write-only]

The responder owns an MR (REMOTE_WRITE | FLUSH_GLOBAL) and an RC QP; the
requester connects (QP numbers, PSNs, GIDs, rkey and address are exchanged
over TCP) and posts, with the ibv_wr_* API: ATOMIC WRITE of 8 known bytes at
offset 64, a range FLUSH (GLOBAL) of the first 4 KiB, a whole-MR FLUSH, then a
persistent FLUSH that must fail (--atomic-write-only: the ATOMIC WRITE alone).
Printed results (checked by the host):

    requester:  "completion: <opcode> <status>" per WR, in order
    responder:  "target: <16 hex digits>"      the 8 bytes at offset 64
"""

import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QPCap, QPEx, QPInitAttrEx

from rc_peer import accept, dial, exchange, poll_one, to_rts

PORT = 18610
SIZE = 8192
VALUE = bytes(range(0xa1, 0xa9))

OPS = {e.IBV_WC_ATOMIC_WRITE: "ATOMIC_WRITE", e.IBV_WC_FLUSH: "FLUSH"}
STATUS = {getattr(e, n): n[len("IBV_WC_"):] for n in dir(e)
          if n.startswith("IBV_WC_") and n.endswith("ERR") or n == "IBV_WC_SUCCESS"}
QP_ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
             e.IBV_ACCESS_FLUSH_GLOBAL | e.IBV_ACCESS_FLUSH_PERSISTENT)


def setup(dev, gidx):
    ctx = Context(name=dev)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    mr = MR(pd, SIZE, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
            e.IBV_ACCESS_FLUSH_GLOBAL)
    cap = QPCap(max_send_wr=8, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    init = QPInitAttrEx(cap=cap, qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, pd=pd,
                        send_ops_flags=e.IBV_QP_EX_WITH_ATOMIC_WRITE | e.IBV_QP_EX_WITH_FLUSH,
                        comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
    qp = QPEx(ctx, init)
    gid = str(ctx.query_gid(1, gidx))
    return ctx, pd, cq, mr, qp, gid


def responder(dev, gidx):
    ctx, pd, cq, mr, qp, gid = setup(dev, gidx)
    mr.write(b"\0" * SIZE, SIZE)
    conn = accept(PORT)
    mine = {"qpn": qp.qp_num, "psn": 300, "gid": gid, "rkey": mr.rkey, "addr": mr.buf}
    peer = exchange(conn, mine)
    to_rts(qp, gidx, mine, peer, QP_ACCESS, rd_atomic=4)
    exchange(conn, {"ready": 1})
    exchange(conn, {"done": 1})
    print("target: %s" % mr.read(8, 64).hex())
    sys.stdout.flush()


def post(qp, wr_id, build):
    qp.wr_start()
    qp.wr_id = wr_id
    qp.wr_flags = e.IBV_SEND_SIGNALED
    build()
    qp.wr_complete()


def requester(dev, gidx, peer_ip, atomic_write_only):
    ctx, pd, cq, mr, qp, gid = setup(dev, gidx)
    sock = dial(peer_ip, PORT)
    mine = {"qpn": qp.qp_num, "psn": 400, "gid": gid}
    peer = exchange(sock, mine)
    to_rts(qp, gidx, mine, peer, QP_ACCESS, rd_atomic=4)
    exchange(sock, {"ready": 1})
    rkey, addr = peer["rkey"], peer["addr"]
    steps = [
        lambda: qp.wr_atomic_write(rkey, addr + 64, VALUE),
        lambda: qp.wr_flush(rkey, addr, 4096, e.IBV_FLUSH_GLOBAL, e.IBV_FLUSH_RANGE),
        lambda: qp.wr_flush(rkey, addr, 0, e.IBV_FLUSH_GLOBAL, e.IBV_FLUSH_MR),
        lambda: qp.wr_flush(rkey, addr, 64, e.IBV_FLUSH_PERSISTENT, e.IBV_FLUSH_RANGE),
    ]
    if atomic_write_only:
        steps = steps[:1]
    for i, build in enumerate(steps):
        post(qp, i + 1, build)
        wc = poll_one(cq, 30)
        if wc is None:
            print("completion: none")
            break
        print("completion: %s %s" % (OPS.get(wc.opcode, wc.opcode) if wc.status == 0 else "-",
                                     STATUS.get(wc.status, wc.status)))
        if wc.status != e.IBV_WC_SUCCESS:
            break
    exchange(sock, {"done": 1})
    sys.stdout.flush()


def main(argv):
    if len(argv) >= 3 and argv[0] == "responder":
        responder(argv[1], int(argv[2]))
    elif len(argv) >= 4 and argv[0] == "requester":
        requester(argv[1], int(argv[2]), argv[3], "--atomic-write-only" in argv)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
