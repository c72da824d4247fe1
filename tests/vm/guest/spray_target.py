#!/usr/bin/python3
"""The two ends of an RC connection that a third guest attacks (tests/vm/scenarios/trust.py).

  spray_target.py victim DEV GIDX PORT     responder: a 64 KiB MR (remote write) filled with 0xA5;
                                           writes its QPN/rkey/address to /tmp/victim.json, then
                                           waits for the peer's genuine WRITE and checks the MR
  spray_target.py peer DEV GIDX VICTIM_IP PORT
                                           requester: connects, waits for /tmp/go, then WRITEs
                                           4 KiB of 0x3C at the start of the victim's MR

The victim exits 0 only if the MR holds exactly the peer's 4 KiB followed by untouched 0xA5."""

import json
import os
import random
import sys
import time

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

from rc_peer import accept, dial, exchange, poll_one, to_rts

MR_LEN = 65536
GENUINE = 4096
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


def setup(dev, gidx):
    ctx = Context(name=dev)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                           cap=QPCap(max_send_wr=16, max_recv_wr=16)))
    mr = MR(pd, MR_LEN, ACCESS)
    gid = str(ctx.query_gid(1, gidx))
    return ctx, pd, cq, qp, mr, gid


def victim(dev, gidx, port):
    ctx, pd, cq, qp, mr, gid = setup(dev, gidx)
    mr.write(b"\xa5" * MR_LEN, MR_LEN)
    conn = accept(port)
    mine = {"qpn": qp.qp_num, "psn": random.randrange(1 << 24), "gid": gid,
            "rkey": mr.rkey, "addr": mr.buf}
    peer = exchange(conn, mine)
    to_rts(qp, gidx, mine, peer, ACCESS)
    with open("/tmp/victim.json.tmp", "w") as f:
        json.dump(dict(mine, epsn=peer["psn"]), f)
    os.rename("/tmp/victim.json.tmp", "/tmp/victim.json")
    line = conn.makefile().readline().strip()
    data = mr.read(MR_LEN, 0)
    want = b"\x3c" * GENUINE + b"\xa5" * (MR_LEN - GENUINE)
    if line != "WROTE":
        verdict = "the peer's WRITE failed: %s" % line
    elif data == want:
        verdict = "INTACT"
    else:
        bad = next(i for i in range(MR_LEN) if data[i] != want[i])
        verdict = "CHANGED at offset %d: %02x" % (bad, data[bad])
    conn.sendall((verdict + "\n").encode())
    print(verdict, flush=True)
    return 0 if verdict == "INTACT" else 1


def peer(dev, gidx, victim_ip, port):
    ctx, pd, cq, qp, mr, gid = setup(dev, gidx)
    mr.write(b"\x3c" * GENUINE, GENUINE)
    conn = dial(victim_ip, port)
    mine = {"qpn": qp.qp_num, "psn": random.randrange(1 << 24), "gid": gid}
    v = exchange(conn, mine)
    to_rts(qp, gidx, mine, v, ACCESS)
    while not os.path.exists("/tmp/go"):
        time.sleep(0.2)
    wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                sg=[SGE(mr.buf, GENUINE, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(v["rkey"], v["addr"])
    qp.post_send(wr)
    wc = poll_one(cq, 60)
    if wc is None:
        status = "no completion"
    else:
        status = "WROTE" if wc.status == e.IBV_WC_SUCCESS else "status %d" % wc.status
    conn.sendall((status + "\n").encode())
    verdict = conn.makefile().readline().strip()
    print("peer: %s; victim: %s" % (status, verdict), flush=True)
    return 0 if status == "WROTE" and verdict == "INTACT" else 1


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "victim":
        sys.exit(victim(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    sys.exit(peer(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])))
