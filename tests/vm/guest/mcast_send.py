#!/usr/bin/env python3
"""Send datagrams to an IPv4 multicast group over rdma_cm, the way mckey's sender does, but
keep the address handle until each send has completed.

    mcast_send.py GROUP BIND_ADDR COUNT [SIZE]

Joins GROUP from BIND_ADDR, then posts COUNT signaled UD sends of SIZE bytes (default 100,
mckey's size) to the multicast QPN, one at a time, each polled to a successful completion
before the next. Prints "sent N" and exits 0, or the first failure and exits 1.

Why not `mckey -s`: mckey posts its sends unsignaled, then leaves the group and destroys the
AH at once, without waiting for them. Linux rxe builds a datagram later, on a work queue, and
looks its AH up by number then; when the AH is already gone it drops the datagram
("rxe_get_av: Unable to find AH matching ah_num" with rdma_rxe's dynamic debug on), so an rxe
sender put 0 or 1 of mckey's datagrams on the wire, depending on scheduling. vrdma orders
DESTROY_AH after the doorbells posted before it (spec §8), so mckey keeps working as a vrdma
sender.
"""

import sys

import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.addr import AH
from pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, UDParam
from pyverbs.qp import QPCap, QPInitAttr

MULTICAST_QPN = 0xFFFFFF


def next_event(channel, expected):
    event = CMEvent(channel)
    kind = event.event_type
    ud = UDParam(event) if kind == ce.RDMA_CM_EVENT_MULTICAST_JOIN else None
    event.ack_cm_event()
    if kind != expected:
        sys.exit("mcast_send: expected rdma_cm event %d, got %d" % (expected, kind))
    return ud


def main():
    group, bind, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 100
    channel = CMEventChannel()
    cmid = CMID(creator=channel, port_space=ce.RDMA_PS_UDP)
    cmid.bind_addr(AddrInfo(src=bind, port_space=ce.RDMA_PS_UDP))
    cmid.resolve_addr(AddrInfo(src=bind, dst=group, port_space=ce.RDMA_PS_UDP))
    next_event(channel, ce.RDMA_CM_EVENT_ADDR_RESOLVED)
    cmid.create_qp(QPInitAttr(qp_type=e.IBV_QPT_UD, cap=QPCap(max_send_wr=1, max_recv_wr=1)))
    cmid.join_multicast(addr=AddrInfo(src=group, port_space=ce.RDMA_PS_UDP))
    ud = next_event(channel, ce.RDMA_CM_EVENT_MULTICAST_JOIN)
    print("mcast_send: joined %s, qkey 0x%x" % (group, ud.qkey), flush=True)
    mr = cmid.reg_msgs(size)
    ah = AH(cmid.pd, attr=ud.ah_attr)
    for i in range(count):
        mr.write(bytes([i & 0xFF]) * size, size)
        cmid.post_ud_send(mr, ah, rqpn=MULTICAST_QPN, length=size)
        wc = cmid.get_send_comp()
        if wc is None or wc.status != e.IBV_WC_SUCCESS:
            sys.exit("mcast_send: send %d of %d completed with %s" % (
                i + 1, count, "nothing" if wc is None else "status %d" % wc.status))
    print("sent %d" % count, flush=True)
    cmid.leave_multicast(AddrInfo(src=group, port_space=ce.RDMA_PS_UDP))


if __name__ == "__main__":
    main()
