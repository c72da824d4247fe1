"""The guest agent's host side: JSON lines over the agent's virtio-serial port (through the
unix socket QEMU listens on). The protocol (ops ping, exec, kill, write_file, read_file) is
described at the top of images/guest/vrdma-agent."""

import json
import signal
import socket
import threading
import time

from .errors import CommandTimeout, VMError

# The virtio-serial port name the guest's agent opens.
AGENT_PORT = "org.vrdma.agent"


class Result:
    """Outcome of a command: rc, out (stdout, with stderr merged when asked),
    err, timed_out."""

    def __init__(self, rc, out, err, timed_out):
        self.rc, self.out, self.err, self.timed_out = rc, out, err, timed_out

    def __iter__(self):  # rc, out = result
        return iter((self.rc, self.out))

    def __repr__(self):
        return "Result(rc=%r, out=%r, err=%r)" % (self.rc, self.out[-200:], self.err[-200:])


class Handle:
    """A command running in a guest (from VM.spawn)."""

    def __init__(self, vm, rid, cmd, timeout):
        self.vm, self.id, self.cmd, self.timeout = vm, rid, cmd, timeout
        self.pid = None
        self.result = None
        self._done = threading.Event()

    def done(self):
        return self._done.is_set()

    def wait(self, timeout=None):
        """Wait for the command; returns (rc, out). Raises CommandTimeout
        (after killing it in the guest) when it is still running."""
        r = self.wait_result(timeout)
        return r.rc, r.out

    def wait_result(self, timeout=None):
        if not self.vm._agent_wait(self._done, timeout):
            self.kill(signal.SIGKILL)
            self.vm._agent_wait(self._done, 10)
            out = self.result.out if self.result else ""
            raise CommandTimeout("%s: %r still running after %ss" % (
                self.vm.name, self.cmd, timeout), None, out)
        if self.result.timed_out:
            raise CommandTimeout("%s: %r timed out after %ss (killed)" % (
                self.vm.name, self.cmd, self.timeout), self.result.rc, self.result.out)
        return self.result

    def kill(self, sig=signal.SIGTERM):
        """Signal the command's process group in the guest."""
        if not self.done():
            try:
                self.vm._request({"op": "kill", "target": self.id, "signal": int(sig)}, 10)
            except VMError:
                pass


class AgentConnection:
    """JSON-lines connection to the agent's virtio-serial port (through the
    unix socket QEMU listens on)."""

    def __init__(self, path, name):
        self.path, self.name = path, name
        self.sock = None
        self.lock = threading.Lock()
        self.next_id = 1
        self.waiters = {}  # id -> callback(msg)
        self.dead = None  # reason once the connection is gone
        self.reader = None

    def connect(self, deadline, alive):
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.path)
                break
            except OSError:
                s.close()
                if time.monotonic() > deadline or not alive():
                    raise VMError("%s: cannot connect to the agent socket %s" % (self.name, self.path))
                time.sleep(0.05)
        self.sock = s
        self.reader = threading.Thread(target=self._read, daemon=True,
                                       name="agent-" + self.name)
        self.reader.start()

    def _read(self):
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    with self.lock:
                        cb = self.waiters.get(msg.get("id"))
                    if cb:
                        cb(msg)
        except OSError:
            pass
        self.dead = self.dead or "agent connection closed"
        with self.lock:
            cbs = list(self.waiters.values())
            self.waiters.clear()
        for cb in cbs:
            cb({"error": self.dead})

    def send(self, req, callback):
        with self.lock:
            if self.dead:
                raise VMError("%s: %s" % (self.name, self.dead))
            rid = self.next_id
            self.next_id += 1
            self.waiters[rid] = callback
        req = dict(req, id=rid)
        data = (json.dumps(req) + "\n").encode()
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise VMError("%s: agent send failed: %s" % (self.name, e))
        return rid

    def forget(self, rid):
        with self.lock:
            self.waiters.pop(rid, None)

    def close(self):
        self.dead = self.dead or "closed"
        if self.sock:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()

