#!/usr/bin/python3
"""A minimal remote shell between the test guests, for launchers that want ssh (Open MPI's
PRRTE). The guests have no sshd; this is not a security boundary (test guests on a private link).

  mini_rsh.py --serve ADDR PORT      run commands for clients (forever)
  mini_rsh.py [-x ...] HOST CMD...    run CMD under /bin/sh -c on HOST, relay its output and
                                      exit with its status (ssh-style options are ignored)

Wire format: the client sends one JSON line {"cmd": "..."}; the server answers with frames of
a 4-byte big-endian length and that many output bytes, then a zero length and a 4-byte status.
"""

import json
import os
import socket
import struct
import subprocess
import sys
import threading

PORT = 2222


def serve_one(conn):
    with conn:
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                return
            line += chunk
        cmd = json.loads(line)["cmd"]
        p = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for chunk in iter(lambda: p.stdout.read1(65536), b""):
            try:
                conn.sendall(struct.pack(">I", len(chunk)) + chunk)
            except OSError:
                break
        rc = p.wait()
        try:
            conn.sendall(struct.pack(">Ii", 0, rc if rc >= 0 else 128 - rc))
        except OSError:
            pass


def serve(addr, port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(16)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve_one, args=(conn,), daemon=True).start()


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise EOFError
        b += chunk
    return b


def client(argv):
    # Skip ssh-style options a launcher may add (-x, -T, -o Opt=val, ...).
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in ("-o", "-p", "-l", "-i") else 1
    host, cmd = argv[i], " ".join(argv[i + 1:])
    s = socket.create_connection((host, PORT), timeout=30)
    s.settimeout(None)
    s.sendall(json.dumps({"cmd": cmd}).encode() + b"\n")
    out = os.fdopen(sys.stdout.fileno(), "wb", closefd=False)
    try:
        while True:
            (n,) = struct.unpack(">I", recv_exact(s, 4))
            if n == 0:
                (rc,) = struct.unpack(">i", recv_exact(s, 4))
                return rc
            out.write(recv_exact(s, n))
            out.flush()
    except EOFError:
        return 255


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], int(sys.argv[3]))
    sys.exit(client(sys.argv[1:]))
