"""A minimal QMP client (QEMU's machine protocol), for live migration."""

import json
import socket

from .errors import VMError


class Qmp:
    """One command at a time on a QEMU's -qmp unix socket; events are skipped."""

    def __init__(self, path, timeout=30):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self._read()  # the greeting
        self.execute("qmp_capabilities")

    def _read(self):
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if line.strip():
                    msg = json.loads(line)
                    if "event" not in msg:
                        return msg
            chunk = self.sock.recv(65536)
            if not chunk:
                raise VMError("QMP connection closed")
            self.buf += chunk

    def execute(self, cmd, args=None):
        req = {"execute": cmd}
        if args is not None:
            req["arguments"] = args
        self.sock.sendall((json.dumps(req) + "\n").encode())
        reply = self._read()
        if "error" in reply:
            raise VMError("QMP %s: %s" % (cmd, reply["error"].get("desc", reply)))
        return reply.get("return", {})

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
