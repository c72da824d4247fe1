#!/usr/bin/env python3
"""Capture real Linux rxe RoCEv2 frames for backend/tests/wire_rxe.rs.

Boots two TCG guests (images/ kernel + initramfs, vrdma.role=rxe) whose virtio-net NICs use QEMU
`-netdev dgram` towards a relay in this script; the relay forwards frames between them and records
every UDP/4791 frame. The guests then run ibv_{rc,uc,ud}_pingpong (IPv4 and IPv6 GIDs), rping
(CM MADs over QP1) and perftest write/read/atomic tests.

Output: one line per frame, "<A>B|B>A> <hex>", to the file given as argv[1].

Usage: capture_rxe.py OUT [QEMU] [KERNEL] [INITRD]
Defaults use $VRDMA_CACHE (/var/cache/vrdma): vmlinuz, guest-initrd.cpio and the QEMU build.
"""
import glob
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

CACHE = os.environ.get("VRDMA_CACHE", "/var/cache/vrdma")
OUT = sys.argv[1]
QEMU = sys.argv[2] if len(sys.argv) > 2 else (
    glob.glob(f"{CACHE}/qemu-system-x86_64") + ["qemu-system-x86_64"])[0]
KERNEL = sys.argv[3] if len(sys.argv) > 3 else f"{CACHE}/vmlinuz"
INITRD = sys.argv[4] if len(sys.argv) > 4 else f"{CACHE}/guest-initrd.cpio"
BIOS = ["-L", "/usr/share/seabios", "-L", "/usr/share/qemu"]

frames = []
lock = threading.Lock()


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def relay(sa, sb, pa, pb, stop):
    """Frames from A arrive on sa and go to B (port pb), and vice versa."""
    while not stop.is_set():
        r, _, _ = select.select([sa, sb], [], [], 0.2)
        for s in r:
            data = s.recv(65536)
            a_to_b = s is sa
            eth = int.from_bytes(data[12:14], "big")
            off = 14
            if eth == 0x8100:
                eth = int.from_bytes(data[16:18], "big")
                off = 18
            roce = False
            if eth == 0x0800 and data[off + 9] == 17:
                ihl = (data[off] & 0xF) * 4
                roce = int.from_bytes(data[off + ihl + 2:off + ihl + 4], "big") == 4791
            elif eth == 0x86DD and data[off + 6] == 17:
                roce = int.from_bytes(data[off + 42:off + 44], "big") == 4791
            if roce:
                with lock:
                    frames.append(("A>B" if a_to_b else "B>A", data.hex()))
            (sb if a_to_b else sa).sendto(data, ("127.0.0.1", pb if a_to_b else pa))


class Guest:
    def __init__(self, name, mac, ip, local, remote):
        self.name = name
        self.buf = b""
        self.log = open(f"/tmp/capture-rxe-{name}.log", "wb")
        cmd = [QEMU, *BIOS, "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "1536", "-smp", "1",
               "-nodefaults", "-nographic", "-serial", "stdio",
               "-kernel", KERNEL, "-initrd", INITRD,
               "-append", f"console=ttyS0 quiet vrdmavm.role=rxe vrdmavm.ip={ip}/24 "
                          f"vrdmavm.mode=shell vrdmavm.hostname={name}",
               "-netdev", f"dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port={local},"
                          f"remote.type=inet,remote.host=127.0.0.1,remote.port={remote}",
               "-device", f"virtio-net-pci,netdev=n0,mac={mac},romfile="]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        while True:
            b = self.p.stdout.read1(4096)
            if not b:
                return
            self.log.write(b)
            self.log.flush()
            with lock:
                self.buf += b

    def wait_for(self, text, timeout=120):
        t = time.time() + timeout
        while time.time() < t:
            with lock:
                if text.encode() in self.buf:
                    return
            time.sleep(0.2)
        raise SystemExit(f"{self.name}: timeout waiting for {text!r}")

    def run(self, cmd, wait=None, timeout=120):
        """Type a command; with wait, block until its end marker appears."""
        marker = f"__done_{time.time_ns()}__"
        self.p.stdin.write(f"{cmd}\necho {marker[:6]}''{marker[6:]}\n".encode())
        self.p.stdin.flush()
        if wait:
            self.wait_for(marker, timeout)

    def stop(self):
        try:
            self.p.stdin.write(b"exit\n")
            self.p.stdin.flush()
            self.p.wait(20)
        except Exception:
            self.p.kill()


def main():
    global KERNEL, INITRD
    # Private copies: the shared cache may be rebuilt while the guests boot.
    tmp = tempfile.mkdtemp(prefix="capture-rxe-")
    for src, dst in ((KERNEL, "vmlinuz"), (INITRD, "initrd.cpio")):
        shutil.copyfile(src, os.path.join(tmp, dst))
    KERNEL, INITRD = os.path.join(tmp, "vmlinuz"), os.path.join(tmp, "initrd.cpio")
    pa, pb, ra, rb = free_port(), free_port(), free_port(), free_port()
    sa = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sa.bind(("127.0.0.1", ra))
    sb = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sb.bind(("127.0.0.1", rb))
    stop = threading.Event()
    threading.Thread(target=relay, args=(sa, sb, pa, pb, stop), daemon=True).start()
    a = Guest("rxea", "02:00:00:00:00:0a", "10.0.0.1", pa, ra)
    b = Guest("rxeb", "02:00:00:00:00:0b", "10.0.0.2", pb, rb)
    try:
        for g in (a, b):
            g.wait_for("starting a shell", 180)
        time.sleep(2)
        tests = [
            # (server cmd on B, client cmd on A)
            ("ibv_rc_pingpong -d rxe0 -g 1 -n 2 -s 100", "ibv_rc_pingpong -d rxe0 -g 1 -n 2 -s 100 10.0.0.2"),
            ("ibv_rc_pingpong -d rxe0 -g 0 -n 2 -s 3000 -m 1024", "ibv_rc_pingpong -d rxe0 -g 0 -n 2 -s 3000 -m 1024 10.0.0.2"),
            ("ibv_uc_pingpong -d rxe0 -g 1 -n 2 -s 2500 -m 1024", "ibv_uc_pingpong -d rxe0 -g 1 -n 2 -s 2500 -m 1024 10.0.0.2"),
            ("ibv_ud_pingpong -d rxe0 -g 1 -n 2 -s 200", "ibv_ud_pingpong -d rxe0 -g 1 -n 2 -s 200 10.0.0.2"),
            ("ib_write_bw -d rxe0 -x 1 -n 5 -s 2500 -m 1024 -F", "ib_write_bw -d rxe0 -x 1 -n 5 -s 2500 -m 1024 -F 10.0.0.2"),
            ("ib_read_bw -d rxe0 -x 1 -n 5 -s 2500 -m 1024 -F", "ib_read_bw -d rxe0 -x 1 -n 5 -s 2500 -m 1024 -F 10.0.0.2"),
            ("ib_atomic_bw -d rxe0 -x 1 -n 5 -A CMP_AND_SWAP -F", "ib_atomic_bw -d rxe0 -x 1 -n 5 -A CMP_AND_SWAP -F 10.0.0.2"),
            ("ib_write_bw -d rxe0 -x 1 -n 5 -s 2500 -m 1024 --write_with_imm -F", "ib_write_bw -d rxe0 -x 1 -n 5 -s 2500 -m 1024 --write_with_imm -F 10.0.0.2"),
            ("ib_write_bw -d rxe0 -x 0 -n 5 -s 64 --write_with_imm -F", "ib_write_bw -d rxe0 -x 0 -n 5 -s 64 --write_with_imm -F 10.0.0.2"),
            ("ib_write_bw -d rxe0 -x 1 -n 5 -s 2500 -m 1024 -c UC -F", "ib_write_bw -d rxe0 -x 1 -n 5 -s 2500 -m 1024 -c UC -F 10.0.0.2"),
            ("ib_send_bw -d rxe0 -x 0 -n 5 -s 301 -c UD -F", "ib_send_bw -d rxe0 -x 0 -n 5 -s 301 -c UD -F 10.0.0.2"),
            ("ib_atomic_bw -d rxe0 -x 1 -n 5 -A FETCH_AND_ADD -F", "ib_atomic_bw -d rxe0 -x 1 -n 5 -A FETCH_AND_ADD -F 10.0.0.2"),
            ("ib_send_bw -d rxe0 -x 1 -n 5 -s 300 -F", "ib_send_bw -d rxe0 -x 1 -n 5 -s 300 -F 10.0.0.2"),
            ("rping -s -C 1 -S 64", "rping -c -a 10.0.0.2 -C 1 -S 64"),
        ]
        for srv, cli in tests:
            b.run(f"timeout 60 {srv} > /tmp/srv.log 2>&1 &")
            time.sleep(3)
            a.run(f"timeout 60 {cli}", wait=True, timeout=90)
            b.run("wait", wait=True, timeout=90)
            with lock:
                print(f"after {cli.split()[0]}: {len(frames)} RoCE frames", flush=True)
    finally:
        for g in (a, b):
            g.stop()
        stop.set()
    with lock:
        with open(OUT, "w") as f:
            for d, h in frames:
                f.write(f"{d} {h}\n")
    print(f"wrote {len(frames)} frames to {OUT}")
    shutil.rmtree(tmp, ignore_errors=True)


main()
