"""What the two-guest pyverbs scripts share: bring an RC QP to RTS against a peer whose
QP number, PSN and GID came over a TCP side channel (one JSON line per message)."""

import json
import socket
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.qp import QPAttr


def to_rts(qp, gidx, mine, peer, access, rd_atomic=1):
    """INIT → RTR → RTS towards `peer` ({"qpn", "psn", "gid"}); we send from mine["psn"]."""
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = access
    attr.path_mtu = e.IBV_MTU_1024
    attr.max_dest_rd_atomic = rd_atomic
    attr.max_rd_atomic = rd_atomic
    attr.min_rnr_timer = 12
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    gr = GlobalRoute(dgid=GID(peer["gid"]), sgid_index=gidx)
    attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=gr)
    attr.dest_qp_num = peer["qpn"]
    attr.rq_psn = peer["psn"]  # we receive what the peer sends
    attr.sq_psn = mine["psn"]
    qp.to_rts(attr)


# Bytes received past the last line returned, per socket: a fast peer may send its next
# message before we read the current one, and both can arrive in one recv().
_pending = {}


def exchange(sock, mine):
    """Send our JSON line, return the peer's next one."""
    sock.sendall((json.dumps(mine) + "\n").encode())
    buf = _pending.pop(sock.fileno(), b"")
    while b"\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise SystemExit("peer closed the connection")
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    if rest:
        _pending[sock.fileno()] = rest
    return json.loads(line)


def accept(port):
    """Wait for the requester's TCP connection."""
    lst = socket.create_server(("0.0.0.0", port), reuse_port=True)
    conn, _ = lst.accept()
    return conn


def dial(peer_ip, port, patience=60):
    """Connect to the responder, which may still be starting (Python + pyverbs under TCG)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return socket.create_connection((peer_ip, port), timeout=patience)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def poll_one(cq, timeout):
    """The next completion of `cq`, or None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n, wcs = cq.poll(1)
        if n:
            return wcs[0]
        time.sleep(0.001)
    return None
