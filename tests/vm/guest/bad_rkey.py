#!/usr/bin/env python3
"""RDMA WRITE to a bad rkey between two guests (IBTA C9-222.1.1), with pyverbs.

    bad_rkey.py responder DEV GIDX [--imm]          (run first)
    bad_rkey.py requester DEV GIDX PEER_IP [--imm]

The responder owns an MR and an RC QP; the requester connects (QP numbers,
PSNs and GIDs are exchanged over TCP) and writes with the responder's rkey
with its index bits flipped. Printed results (checked by the host):

    requester:  "send completion: <status name>"   expect REM_ACCESS_ERR
    responder:  "async event: <event name>"        expect QP_ACCESS_ERR (no imm)
                "recv completion: <status name>"   expect LOC_ACCESS_ERR (imm)
                "async event: none"                (imm: no event may arrive)
"""

import os
import select
import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import RecvWR, SendWR, SGE

from rc_peer import accept, dial, exchange, poll_one, to_rts

PORT = 18600
SIZE = 4096
IMM = 0x12345678

WC_NAMES = {getattr(e, n): n[len("IBV_WC_"):] for n in dir(e)
            if n.startswith("IBV_WC_") and n.endswith("ERR") or n == "IBV_WC_SUCCESS"}
QP_ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
EV_NAMES = {getattr(e, n): n[len("IBV_EVENT_"):] for n in dir(e) if n.startswith("IBV_EVENT_")}


def setup(dev, gidx):
    ctx = Context(name=dev)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    mr = MR(pd, SIZE, access)
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    gid = str(ctx.query_gid(1, gidx))
    return ctx, pd, cq, mr, qp, gid


def async_event_fd():
    """The context's async event fd (an anon inode "[infinibandevent]").

    pyverbs does not expose it. Found by scanning our fds, so that the wait can
    be a select() with a timeout: ibv_get_async_event blocks with the GIL held."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + name) == "anon_inode:[infinibandevent]":
                fds.append(int(name))
        except OSError:
            pass
    if len(fds) != 1:
        raise SystemExit("expected one async event fd, found %r" % fds)
    return fds[0]


def wait_async_event(ctx, timeout):
    """The next async event of ctx, or "none" after timeout seconds.

    The event is read and acknowledged in this process: destroying the QP waits
    until every event reported for it has been acknowledged by its owner."""
    ready, _, _ = select.select([async_event_fd()], [], [], timeout)
    if not ready:
        return "none"
    ev = ctx.get_async_event()
    kind = ev.event_type
    ev.ack()
    return EV_NAMES.get(kind, kind)


def responder(dev, gidx, imm):
    ctx, pd, cq, mr, qp, gid = setup(dev, gidx)
    conn = accept(PORT)
    mine = {"qpn": qp.qp_num, "psn": 100, "gid": gid, "rkey": mr.rkey, "addr": mr.buf}
    peer = exchange(conn, mine)
    to_rts(qp, gidx, mine, peer, QP_ACCESS)
    if imm:
        # Receives may be posted once the QP has left RESET.
        qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf, SIZE, mr.lkey)]))
    exchange(conn, {"ready": 1})
    if imm:
        wc = poll_one(cq, 30)
        print("recv completion: %s" % ("none" if wc is None else WC_NAMES.get(wc.status, wc.status)))
        print("async event: %s" % wait_async_event(ctx, 3))
    else:
        print("async event: %s" % wait_async_event(ctx, 30))
    exchange(conn, {"done": 1})
    sys.stdout.flush()


def requester(dev, gidx, peer_ip, imm):
    ctx, pd, cq, mr, qp, gid = setup(dev, gidx)
    sock = dial(peer_ip, PORT)
    mine = {"qpn": qp.qp_num, "psn": 200, "gid": gid}
    peer = exchange(sock, mine)
    to_rts(qp, gidx, mine, peer, QP_ACCESS)
    exchange(sock, {"ready": 1})
    bad_rkey = peer["rkey"] ^ 0x7f00  # another MR index: never a valid key here
    op = e.IBV_WR_RDMA_WRITE_WITH_IMM if imm else e.IBV_WR_RDMA_WRITE
    wr = SendWR(wr_id=7, opcode=op, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)],
                send_flags=e.IBV_SEND_SIGNALED, imm_data=IMM if imm else 0)
    wr.set_wr_rdma(bad_rkey, peer["addr"])
    qp.post_send(wr)
    wc = poll_one(cq, 30)
    print("send completion: %s" % ("none" if wc is None else WC_NAMES.get(wc.status, wc.status)))
    exchange(sock, {"done": 1})
    sys.stdout.flush()


def main(argv):
    imm = "--imm" in argv
    args = [a for a in argv if a != "--imm"]
    if len(args) >= 3 and args[0] == "responder":
        responder(args[1], int(args[2]), imm)
    elif len(args) >= 4 and args[0] == "requester":
        requester(args[1], int(args[2]), args[3], imm)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
