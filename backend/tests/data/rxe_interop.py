#!/usr/bin/env python3
"""vrdma engine <-> Linux rxe interop check (manual / VM-level; not part of `cargo test`).

Boots one TCG guest running Linux rxe (images/ kernel + initramfs, vrdmavm.role=rxe, 10.0.0.2)
whose NIC is a QEMU `-netdev dgram` pointed at the `rxe_interop` example (a vrdma device with the
real engine and UDP uplink, GID 10.0.0.1). A pyverbs program in the guest and the example then run
RC SEND both ways, RDMA WRITE, RDMA READ and FETCH_ADD between them and check the data.

Usage: rxe_interop.py [--v6] [QEMU] [KERNEL] [INITRD]   (defaults from $VRDMA_CACHE=/var/cache/vrdma)
--v6: use the link-local IPv6 GIDs (guest GID index 0) instead of the IPv4-mapped ones.
Exit status 0 only if both sides print their DONE ok line.
"""
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

CACHE = os.environ.get("VRDMA_CACHE", "/var/cache/vrdma")
V6 = "--v6" in sys.argv
if V6:
    sys.argv.remove("--v6")
QEMU = sys.argv[1] if len(sys.argv) > 1 else (glob.glob(f"{CACHE}/qemu-system-x86_64") + ["qemu-system-x86_64"])[0]
KERNEL = sys.argv[2] if len(sys.argv) > 2 else f"{CACHE}/vmlinuz"
INITRD = sys.argv[3] if len(sys.argv) > 3 else f"{CACHE}/guest-initrd.cpio"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GMAC = "52:54:00:00:00:02"
HMAC = "52:54:00:00:00:01"  # the test Node with id 1

GUEST_PY = r'''
import sys
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.qp import QPCap, QPInitAttr, QPAttr, QP
from pyverbs.addr import GlobalRoute, AHAttr, GID
from pyverbs.wr import SGE, SendWR, RecvWR
import pyverbs.enums as e

def pat(mul, add, n):
    return bytes((i * mul + add) & 0xff for i in range(n))

def wait(cq, what):
    while True:
        n, wcs = cq.poll(1)
        if n:
            wc = wcs[0]
            print(f"guest: {what}: wr_id={wc.wr_id} status={wc.status} byte_len={wc.byte_len}", flush=True)
            assert wc.status == 0, what
            return wc

ctx = Context(name="rxe0")
pd = PD(ctx)
cq = CQ(ctx, 64)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                       cap=QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)))
acc = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
       | e.IBV_ACCESS_REMOTE_ATOMIC)
mr = MR(pd, 32768, acc)
mr.write(pat(7, 1, 5000), 5000, 8192)
mr.write((100).to_bytes(8, "little"), 8, 16384)
mr.write(pat(11, 3, 3000), 3000, 20480)
psn = 0x1234
print(f"GUEST qpn={qp.qp_num} psn={psn} rkey={mr.rkey} addr={mr.buf}", flush=True)
line = ""
while not line.startswith("HOST "):
    line = sys.stdin.readline()
host = dict(kv.split("=") for kv in line.split()[1:])
gr = GlobalRoute(dgid=GID(sys.argv[1]), sgid_index=int(sys.argv[2]), hop_limit=64)
attr = QPAttr(qp_state=e.IBV_QPS_INIT)
attr.qp_access_flags = acc
attr.dest_qp_num = int(host["qpn"])
attr.rq_psn = int(host["psn"])
attr.sq_psn = psn
attr.path_mtu = e.IBV_MTU_1024
attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=1)
attr.max_dest_rd_atomic = 4
attr.max_rd_atomic = 4
attr.min_rnr_timer = 12
attr.timeout = 14
attr.retry_cnt = 7
attr.rnr_retry = 7
qp.to_rts(attr)
qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf + 24576, 4096, mr.lkey)]))
print("GUEST RTS", flush=True)
while not sys.stdin.readline().startswith("go"):
    pass
qp.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1,
                    sg=[SGE(mr.buf + 20480, 3000, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED))
wait(cq, "SEND")
wc = wait(cq, "recv of host SEND")
assert wc.wr_id == 1 and wc.byte_len == 2000
assert mr.read(2000, 24576) == pat(3, 2, 2000), "host SEND data"
assert mr.read(5000, 0) == pat(13, 5, 5000), "host WRITE data"
assert int.from_bytes(mr.read(8, 16384), "little") == 105, "FETCH_ADD result"
print("GUEST DONE ok", flush=True)
'''


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Proc:
    """A child whose output is collected in the background."""

    def __init__(self, name, cmd):
        self.name, self.buf = name, b""
        self.log = open(f"/tmp/rxe-interop-{name}.log", "wb")
        self.lock = threading.Lock()
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            b = self.p.stdout.read1(4096)
            if not b:
                return
            self.log.write(b)
            self.log.flush()
            with self.lock:
                self.buf += b

    def wait_re(self, pattern, timeout=120):
        t = time.time() + timeout
        while time.time() < t:
            with self.lock:
                m = re.search(pattern.encode(), self.buf)
            if m:
                return m.group(0).decode()
            if self.p.poll() is not None:
                time.sleep(0.5)
                with self.lock:
                    m = re.search(pattern.encode(), self.buf)
                if m:
                    return m.group(0).decode()
                raise SystemExit(f"{self.name} exited ({self.p.returncode}) before {pattern!r}")
            time.sleep(0.1)
        raise SystemExit(f"{self.name}: timeout waiting for {pattern!r}")

    def send(self, text):
        self.p.stdin.write(text.encode())
        self.p.stdin.flush()


def main():
    subprocess.run(["cargo", "build", "-q", "-p", "vrdma-backend", "--example", "rxe_interop"],
                   cwd=REPO, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    example = os.path.join(target, "debug", "examples", "rxe_interop")
    tmp = tempfile.mkdtemp(prefix="rxe-interop-")
    for src, dst in ((KERNEL, "vmlinuz"), (INITRD, "initrd.cpio")):
        shutil.copyfile(src, os.path.join(tmp, dst))
    pg, ph = free_port(), free_port()
    guest = Proc("guest", [
        QEMU, "-L", "/usr/share/seabios", "-L", "/usr/share/qemu", "-accel", "tcg,thread=multi",
        "-cpu", "max", "-m", "1536", "-smp", "1", "-nodefaults", "-nographic", "-serial", "stdio",
        "-kernel", f"{tmp}/vmlinuz", "-initrd", f"{tmp}/initrd.cpio",
        "-append", "console=ttyS0 quiet vrdmavm.role=rxe vrdmavm.ip=10.0.0.2/24 vrdmavm.mode=shell",
        "-netdev", f"dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port={pg},"
                   f"remote.type=inet,remote.host=127.0.0.1,remote.port={ph}",
        "-device", f"virtio-net-pci,netdev=n0,mac={GMAC},romfile="])
    host = None
    ok = False
    try:
        guest.wait_re("starting a shell", 180)
        time.sleep(1)
        # Our device answers no ARP (no guest stack behind it here): a static neighbour.
        if V6:
            dgid, sgid_index = "fe80:0000:0000:0000:5054:00ff:fe00:0001", 0
            guest.send(f"ip -6 neigh replace fe80::5054:ff:fe00:1 lladdr {HMAC} dev eth0 nud permanent\n")
        else:
            dgid, sgid_index = "0000:0000:0000:0000:0000:ffff:0a00:0001", 1
            guest.send(f"ip neigh replace 10.0.0.1 lladdr {HMAC} dev eth0 nud permanent\n")
        guest.send("stty -echo\ncat > /tmp/g.py <<'PYEOF'\n" + GUEST_PY + "PYEOF\n")
        guest.send(f"python3 /tmp/g.py {dgid} {sgid_index}\n")
        gline = guest.wait_re(r"GUEST qpn=\d+ psn=\d+ rkey=\d+ addr=\d+", 120)
        host = Proc("host", [example, f"127.0.0.1:{ph}", f"127.0.0.1:{pg}", GMAC] + (["v6"] if V6 else []))
        hline = host.wait_re(r"HOST qpn=\d+ psn=\d+ rkey=\d+ addr=\d+", 60)
        host.send(gline + "\n")
        guest.send(hline + "\n")
        guest.wait_re("GUEST RTS", 60)
        host.wait_re("HOST READY", 60)
        guest.send("go\n")
        host.wait_re("HOST DONE ok", 180)
        guest.wait_re("GUEST DONE ok", 60)
        ok = True
    finally:
        guest.send("exit\n") if guest.p.poll() is None else None
        for pr in (host, guest):
            if pr and pr.p.poll() is None:
                try:
                    pr.p.wait(15)
                except subprocess.TimeoutExpired:
                    pr.p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print("INTEROP OK" if ok else "INTEROP FAILED (logs: /tmp/rxe-interop-{guest,host}.log)")
    sys.exit(0 if ok else 1)


main()
