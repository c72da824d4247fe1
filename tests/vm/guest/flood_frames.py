#!/usr/bin/python3
"""A tenant floods its neighbours with raw frames, as hard as one guest CPU can send them.

  flood_frames.py IFACE OWN_IP TARGET_MAC TARGET_IP SECONDS

Full-size IPv4/UDP frames (port 9, discard) from the guest's own MAC and IP, so the fabric's
port security (spec §16.3) lets them in: every other frame is unicast at TARGET_MAC, the
others broadcast (ff:ff:ff:ff:ff:ff to the /24's broadcast address). They skip the qdisc
(PACKET_QDISC_BYPASS, as spray_attack.py: fq_codel would drop them inside the guest, which
would spare the fabric the flood); a full transmit ring (ENOBUFS) is counted and the loop
goes on. Writes /tmp/flood.started after the first 1024 frames; sends nothing while
/tmp/flood.pause exists (and keeps its CPU busy meanwhile); stops after SECONDS or once /tmp/flood.stop exists, then prints "sent unicast=N broadcast=N enobufs=N seconds=S"."""

import errno
import os
import socket
import struct
import sys
import time

from spray_attack import ip_checksum, mac_bytes

SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20
PAYLOAD = 1472  # a 1514-byte frame


def udp_frame(src_mac, dst_mac, src_ip, dst_ip):
    udp = struct.pack("!HHHH", 40000, 9, 8 + PAYLOAD, 0) + b"\x5a" * PAYLOAD
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    ip = ip[:10] + struct.pack("!H", ip_checksum(ip)) + ip[12:]
    return dst_mac + src_mac + b"\x08\x00" + ip + udp


def main(iface, own_ip, target_mac, target_ip, seconds):
    with open("/sys/class/net/%s/address" % iface) as f:
        own_mac = mac_bytes(f.read().strip())
    bcast_ip = ".".join(own_ip.split(".")[:3] + ["255"])
    frames = [udp_frame(own_mac, mac_bytes(target_mac), own_ip, target_ip),
              udp_frame(own_mac, b"\xff" * 6, own_ip, bcast_ip)]
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    s.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    sent, enobufs, n = [0, 0], 0, 0
    t0 = time.monotonic()
    end = t0 + float(seconds)
    send = s.send
    while True:
        # The clock is read once per 256 frames: the loop is the flood's rate.
        for _ in range(256):
            k = n & 1
            try:
                send(frames[k])
                sent[k] += 1
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                enobufs += 1
            n += 1
        if n == 1024:
            open("/tmp/flood.started", "w").close()
        if time.monotonic() >= end or os.path.exists("/tmp/flood.stop"):
            break
        # Paused, the flooder keeps its vCPU busy (it polls instead of sleeping): an idle
        # neighbour would hand its CPU to the others on a host of two cores, and a run "alone"
        # would then measure a faster machine, not a quieter network.
        while os.path.exists("/tmp/flood.pause") and not os.path.exists("/tmp/flood.stop"):
            pass
    print("sent unicast=%d broadcast=%d enobufs=%d seconds=%.1f" % (
        sent[0], sent[1], enobufs, time.monotonic() - t0), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
