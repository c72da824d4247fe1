#!/usr/bin/python3
"""Races in vrdma.ko (issue [hardening] item 8), made deterministic by a backend that answers
chosen commands late (vrdma-backend --delay-commands, TEST ONLY).

  driver_races.py resize DEV GIDX
      Two RESIZE_CQ of one CQ at once (raw uverbs writes: libvrdma serialises its own resizes, the
      kernel must not rely on that). The backend holds the first one's response 3 s and answers
      the second (sent once the first one's thread sleeps in write()) at once, so the device
      executes them in one order and the driver sees their responses in the other. Then a
      loopback RC QP on that CQ completes N sends: every CQE must be in the ring the driver
      keeps (of the two new rings, the one it still lets us mmap), and a canary allocated after
      the resizes must not be written (a freed ring the device uses).
  driver_races.py timeout DEV GIDX
      RESIZE_CQ times out (cmd_timeout_ms lowered by the caller, the backend answers after 3 s)
      while a send to a QP that does not exist is being retried; its error CQE arrives after the
      timeout in the ring that RESIZE_CQ handed over. That ring must not have been freed: a
      canary allocated after the timeout must stay intact.

Prints one verdict line per check; exits 0 only if all hold."""

import ctypes
import mmap
import os
import struct
import sys
import threading
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import RecvWR, SGE, SendWR

IB_USER_VERBS_CMD_RESIZE_CQ = 19  # enum ib_uverbs_write_cmds (rdma/ib_user_verbs.h)
CQE_SIZE = 64                     # sizeof(struct vrdma_cqe)
PAGE = 4096
CANARY_BYTES = 64 << 20
PATTERN = bytes([0xA5]) * (1 << 20)
WR_ID_BASE = 0x5652444D41000000   # "VRDMA" << 24


def cmd_fd():
    """The uverbs file of this process's (only) device context."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd).startswith("/dev/infiniband/uverbs"):
                return int(fd)
        except OSError:
            continue
    raise SystemExit("no uverbs file open")


def cq_handle(cq):
    """The CQ's uverbs handle (pyverbs prints it, it has no attribute)."""
    for line in str(cq).splitlines():
        if line.startswith("Handle"):
            return int(line.split(":")[1])
    raise SystemExit("no handle in %r" % str(cq))


def raw_resize(fd, handle, cqe):
    """IB_USER_VERBS_CMD_RESIZE_CQ through write(), bypassing libvrdma's per-CQ lock.
    Returns (errno or 0, mmap_offset, mmap_size) from struct vrdma_resize_cq_resp."""
    resp = ctypes.create_string_buffer(8 + 24)  # ib_uverbs_resize_cq_resp + driver data
    body = struct.pack("<QII", ctypes.addressof(resp), handle, cqe)
    hdr = struct.pack("<IHH", IB_USER_VERBS_CMD_RESIZE_CQ, (8 + len(body)) // 4,
                      len(resp) // 4)
    try:
        os.write(fd, hdr + body)
    except OSError as ex:
        return ex.errno, 0, 0
    _cqe, _res, depth, _r, off, size = struct.unpack("<IIIIQQ", resp.raw)
    return 0, off, size


class Canary:
    """Anonymous memory filled with a pattern right after the driver may have freed pages: the
    page allocator hands recently freed pages out first, so a ring freed while the device still
    writes it ends up here and the device's writes show."""

    def __init__(self):
        self.m = mmap.mmap(-1, CANARY_BYTES, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.m.madvise(mmap.MADV_NOHUGEPAGE)  # 4 KiB pages, like the freed ring pages
        for off in range(0, CANARY_BYTES, len(PATTERN)):
            self.m[off:off + len(PATTERN)] = PATTERN

    def damage(self):
        """(page offset, offset in the page, changed bytes, first 64 of them) of each damaged
        4 KiB page."""
        bad = []
        for off in range(0, CANARY_BYTES, len(PATTERN)):
            if self.m[off:off + len(PATTERN)] == PATTERN:
                continue
            for p in range(off, off + len(PATTERN), PAGE):
                page = self.m[p:p + PAGE]
                if page != PATTERN[:PAGE]:
                    diff = [i for i, b in enumerate(page) if b != 0xA5]
                    bad.append((p, diff[0], len(diff), page[diff[0]:diff[0] + 64]))
        return bad


def verdict_canary(canary, what):
    bad = canary.damage()
    if not bad:
        print("canary: %d MiB intact after %s" % (CANARY_BYTES >> 20, what))
        return True
    print("canary: %d pages WRITTEN after %s (memory the driver freed is still used by the "
          "device)" % (len(bad), what))
    for off, first, n, data in bad[:4]:
        print("  page +%#x: %d bytes changed from +%#x: %s" % (off, n, first, data.hex()))
    return False


def loopback_qp(ctx, pd, cq, gidx, dest_qpn=None, timeout=14, retry_cnt=7):
    """An RC QP in RTS towards itself (or `dest_qpn` on this device's own GID)."""
    cap = QPCap(max_send_wr=32, max_recv_wr=32, max_send_sge=4, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1))
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE
    attr.path_mtu = e.IBV_MTU_1024
    attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.timeout = timeout
    attr.retry_cnt = retry_cnt
    attr.rnr_retry = 7
    gr = GlobalRoute(dgid=ctx.query_gid(1, gidx), sgid_index=gidx)
    attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=gr)
    attr.dest_qp_num = qp.qp_num if dest_qpn is None else dest_qpn
    attr.rq_psn = attr.sq_psn = 0
    qp.to_rts(attr)
    return qp


def post_sends(qp, mr, n, recv=True):
    for i in range(n):
        if recv:
            qp.post_recv(RecvWR(wr_id=WR_ID_BASE + 0x1000 + i, num_sge=1,
                                sg=[SGE(mr.buf + 64 * i, 64, mr.lkey)]))
    for i in range(n):
        qp.post_send(SendWR(wr_id=WR_ID_BASE + i, opcode=e.IBV_WR_SEND, num_sge=1,
                            sg=[SGE(mr.buf + 4096 + 64 * i, 64, mr.lkey)]))


def asleep_in_write(tid):
    """True if thread `tid` of this process sleeps inside write(2) (x86-64 syscall 1)."""
    try:
        with open("/proc/self/task/%d/syscall" % tid) as f:
            nr = f.read().split()[0]
        with open("/proc/self/task/%d/stat" % tid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return nr == "1" and state in ("S", "D")


def wait_asleep_in_write(thread, tids, name, timeout=10.0):
    """Seconds until `thread` was seen asleep in write(), or None if it never was (it ended,
    or `timeout` passed)."""
    t0 = time.monotonic()
    while thread.is_alive() and time.monotonic() - t0 < timeout:
        if name in tids and asleep_in_write(tids[name]):
            return time.monotonic() - t0
        time.sleep(0.005)
    return None


def resize(dev, gidx):
    ctx = Context(name=dev)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    qp = loopback_qp(ctx, pd, cq, gidx)
    mr = MR(pd, 8192, e.IBV_ACCESS_LOCAL_WRITE)
    fd, handle = cmd_fd(), cq_handle(cq)
    results = {}

    tids = {}

    def one(name, cqe):
        tids[name] = threading.get_native_id()
        t0 = time.monotonic()
        results[name] = raw_resize(fd, handle, cqe) + (t0, time.monotonic())

    # A's response is held 3 s by the backend (--delay-commands resize_cq=3000:0); B is sent
    # once A's thread sleeps in its write() (its RESIZE_CQ is with the device) and is
    # answered at once.
    a = threading.Thread(target=one, args=("A", 128))
    b = threading.Thread(target=one, args=("B", 256))
    a.start()
    waited = wait_asleep_in_write(a, tids, "A")
    if waited is None:
        a.join()
        print("resize A: its thread was never seen asleep in write(): no overlap to test")
        return 1
    print("resize A: asleep in write() after %.2fs, B sent" % waited)
    b.start()
    a.join()
    b.join()
    ok = True
    for name in ("A", "B"):
        err, off, size, t0, t1 = results[name]
        print("resize %s: errno %d, %.2fs, ring at mmap offset %#x (%d bytes)" % (
            name, err, t1 - t0, off, size))
        ok &= err == 0 and size > 0
    if results["A"][4] - results["A"][3] < 2.5:
        print("resize A answered in under 2.5 s: the backend did not delay it (no "
              "--delay-commands resize_cq=3000:0?)")
        return 1
    first = min(results, key=lambda k: results[k][4])
    print("resize %s returned first" % first)

    canary = Canary()
    n = 8
    post_sends(qp, mr, n)
    time.sleep(2)  # the loopback sends complete within milliseconds
    # The driver keeps one ring mapping per CQ and drops the one a resize replaced: the ring
    # it keeps is the one still mappable, and the device must write every CQE there.
    kept = []
    for name in ("A", "B"):
        _, off, size, _, _ = results[name]
        try:
            ring = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ, offset=off)
        except OSError:
            continue
        kept.append((name, ring[:]))
        ring.close()
    if len(kept) != 1:
        print("%d of the two new rings are mappable (want exactly 1)" % len(kept))
        return 1
    name, data = kept[0]
    found = {struct.unpack_from("<Q", data, PAGE + i * CQE_SIZE)[0]
             for i in range((len(data) - PAGE) // CQE_SIZE)}
    want = {WR_ID_BASE + i for i in range(n)} | {WR_ID_BASE + 0x1000 + i for i in range(n)}
    got = len(want & found)
    producer = struct.unpack_from("<I", data, 0)[0]
    print("ring the driver keeps (resize %s): %d of %d completions, producer index %d" % (
        name, got, len(want), producer))
    ok &= got == len(want)
    ok &= verdict_canary(canary, "the completions")
    del qp, cq
    return 0 if ok else 1


# The send to a QP that does not exist: 4 tries (retry_cnt 3) of 4.096 us << 18 = 1.07 s each
# before the device writes its RETRY_EXC error CQE.
ERROR_CQE_AFTER = 4 * 4.096e-6 * (1 << 18)


def timeout(dev, gidx):
    ctx = Context(name=dev)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    mr = MR(pd, 8192, e.IBV_ACCESS_LOCAL_WRITE)
    # No QP has this number: every try goes unanswered, and the device writes the error CQE
    # ERROR_CQE_AFTER (~4.3 s) from now, well after the canary below is in place.
    probe = loopback_qp(ctx, pd, cq, gidx)
    qp = loopback_qp(ctx, pd, cq, gidx, dest_qpn=(probe.qp_num + 0x777) & 0xFFFFFF,
                     timeout=18, retry_cnt=3)
    t0 = time.monotonic()
    post_sends(qp, mr, 1, recv=False)
    try:
        cq.resize(1024)  # 16 pages of CQEs: the device switches to them at once
        print("resize: succeeded after %.2fs (expected a timeout: is cmd_timeout_ms lowered "
              "and --delay-commands resize_cq set?)" % (time.monotonic() - t0))
        return 1
    except PyverbsRDMAError as ex:
        print("resize: failed after %.2fs: %s" % (time.monotonic() - t0, ex))
    canary = Canary()
    filled = time.monotonic() - t0
    print("canary filled %.2fs after the send was posted (its error CQE comes after %.2fs)" % (
        filled, ERROR_CQE_AFTER))
    if filled > ERROR_CQE_AFTER - 0.3:
        # A write into a freed ring before the canary was in place would go unseen.
        print("canary filled too late to catch the error CQE: no verdict")
        return 1
    time.sleep(max(0.0, ERROR_CQE_AFTER + 3.0 - (time.monotonic() - t0)))  # past the error CQE
    ok = verdict_canary(canary, "the send's error completion")
    return 0 if ok else 1


def buf_addr(m):
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def odp(dev, gidx, rounds=6):
    ctx = Context(name=dev)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    qp = loopback_qp(ctx, pd, cq, gidx)
    odp_mr = MR(pd, 0, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_ON_DEMAND, implicit=True)
    recv_mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    chunks = mmap.mmap(-1, 3 * PAGE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # X, Y, Z
    spacer = mmap.mmap(-1, 16 * PAGE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = buf_addr(chunks)
    # Four SENDs, each needing at most 2 chunks (the budget): [X] [Y] [Y, Z] [X]. Z comes in
    # over the budget and drops X, the least recently used (RECLAIM X); the last SEND faults X
    # in again right after (FAULT X). The device ends with Z and X resident.
    sends = [[0], [1], [1, 2], [0]]
    ok = True
    for r in range(rounds):
        # New pages for X, Y, Z: the old ones are freed (the MMU notifier must revoke them
        # from the device) and go to the spacer, so a stale translation reads spacer bytes.
        spacer.madvise(mmap.MADV_DONTNEED, 0, len(spacer))
        chunks.madvise(mmap.MADV_DONTNEED, 0, len(chunks))
        for p in range(16):
            spacer[p * PAGE:p * PAGE + 64] = bytes([0xEE]) * 64
        for c in range(3):
            chunks[c * PAGE:c * PAGE + 64] = bytes([0x10 * (c + 1) + r]) * 64
        recv_mr.write(bytes(4096), 4096)
        for i in range(len(sends)):
            qp.post_recv(RecvWR(wr_id=0x100 + i, num_sge=1,
                                sg=[SGE(recv_mr.buf + 512 * i, 512, recv_mr.lkey)]))
        for i, cs in enumerate(sends):
            sges = [SGE(base + c * PAGE, 64, odp_mr.lkey) for c in cs]
            qp.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=len(sges), sg=sges))
        seen = {}
        t0 = time.monotonic()
        deadline = t0 + 20
        while len(seen) < 2 * len(sends) and time.monotonic() < deadline:
            n, wcs = cq.poll(8)
            for wc in wcs[:n]:
                seen[wc.wr_id] = wc.status
            if not n:
                time.sleep(0.005)
        if len(seen) < 2 * len(sends) or any(st != e.IBV_WC_SUCCESS for st in seen.values()):
            print("round %d: completions %r (want %d successful)" % (r, seen, 2 * len(sends)))
            ok = False
            break
        stale = []
        for i, cs in enumerate(sends):
            want = b"".join(chunks[c * PAGE:c * PAGE + 64] for c in cs)
            got = recv_mr.read(len(want), 512 * i)
            if got != want:
                stale.append("send %d: got %s, want %s" % (
                    i, got[::64].hex(), want[::64].hex()))
        if stale:
            print("round %d: STALE data (pages freed since): %s" % (r, "; ".join(stale)))
            ok = False
        else:
            print("round %d: data right (%.2fs)" % (r, time.monotonic() - t0))
        # Let the driver act on every page request of this round (a RECLAIM takes
        # test_reclaim_delay_ms) before the pages are replaced.
        time.sleep(0.5)
    del qp
    return 0 if ok else 1


if __name__ == "__main__":
    os.sched_setaffinity(0, {0})  # frees and the canary's faults on one CPU's page lists
    what, dev, gidx = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.exit({"resize": resize, "timeout": timeout, "odp": odp}[what](dev, gidx))
