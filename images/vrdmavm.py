#!/usr/bin/env python3
"""Boot vrdma test guests under QEMU and drive them through the guest agent.

Stdlib only. Usable from the command line (see --help) and as a module:

    import sys; sys.path.insert(0, "images")
    import vrdmavm

    with vrdmavm.Cluster(n=2, kind="vrdma") as c:      # or kind="rxe"
        a, b = c.vms
        srv = a.spawn("ibv_rc_pingpong -g 1")          # runs in the background
        rc, out = b.run("sleep 1; ibv_rc_pingpong -g 1 %s" % a.ip, timeout=60)
        rc2, out2 = srv.wait(timeout=30)
        print(a.dmesg())

Each guest i (0-based) gets
  MAC 52:54:00:76:72:<i+1>, IP 10.0.0.<i+1>/24, hostname vm<i>,
  kernel command line vrdmavm.role=<kind> vrdmavm.ip=<ip> vrdmavm.hostname=vm<i>,
  files in the run directory: serial-<i>.log (console), qemu-<i>.log,
  backend-<i>.log (vrdma guests), agent-<i>.sock, qmp-<i>.sock, vu-<i>.sock,
  capture-<i>.pcap (with pcap=N: the backend's --pcap, at most N bytes).

Guest OS: the default image's kernel and initrd (make images), or per guest one of
images/guest_images.py's (Cluster(image="bookworm") or image=["bookworm", "trixie-7.3"],
--image bookworm,trixie-7.3; make guest-images builds them).

Guest kinds:
  vrdma  QEMU's vhost-user-rdma-pci device served by a vrdma-backend process
  rxe    a virtio-net NIC with Linux's soft-RoCE (rdma_rxe, device rxe0)
  none   no network, no RDMA (agent only)

Uplinks (how the guests' Ethernet meets):
  fabric  (the default) every vrdma guest is a device of ONE vrdma-backend
       process (--device socket=vu-<i>.sock,mac=<mac>, repeated; log
       backend-fabric.log, capture capture-fabric.pcap), whose in-process
       switch links them. At most one other guest (rxe) joins through the
       daemon's UDP uplink (--uplink udp:..., the guest's -netdev dgram).
       Cluster(spare_devices=N) adds N devices no QEMU uses (sockets
       spare-<i>.sock, .spare_sockets), for a test program to connect to.
  fabric+tap  the same daemon, its uplink a TAP (vrtapf) on a Linux bridge in
       a network namespace, where other guests get their own TAPs (as tap).
  udp  exactly two guests, linked point to point over UDP on 127.0.0.1: a
       vrdma backend gets --uplink udp:local=127.0.0.1:P,remote=127.0.0.1:Q,
       an rxe guest gets -netdev dgram with the same ports. Both carry one
       Ethernet frame per datagram, so vrdma and rxe guests can be mixed.
  tap  any number of guests on a Linux bridge (br0, 10.0.0.254/24) inside a
       network namespace that the cluster creates and removes. Every guest
       gets a TAP vrtap<i> on that bridge, created beforehand with
       `ip tuntap add mode tap` (no vnet header, single queue); the vrdma
       backend runs in the namespace (ip netns exec) with --uplink tap:vrtap<i>,
       an rxe guest's QEMU too (-netdev tap). QEMU for vrdma guests stays
       in the host namespace: it only talks to the backend's unix socket.
  vxlan  two "hosts" on standard networking: two network namespaces, each
       with its own bridge (br0) and the TAPs of its guests (guest i lives on
       host i % 2), joined by a kernel VXLAN tunnel (VNI 42, UDP 4789) over a
       veth pair (the underlay, 192.168.42.1/.2, MTU 1550 so that the
       bridged Ethernet keeps its MTU of 1500). Each guest's backend (or rxe
       QEMU) runs in its host's namespace, as it would on a real host.

Environment: VRDMA_CACHE (default /var/cache/vrdma) locates the images,
VRDMA_QEMU / VRDMA_KERNEL / VRDMA_INITRD / VRDMA_BACKEND override single
paths, VRDMA_KVM=1 uses KVM instead of TCG, VRDMA_KEEP=1 keeps the run
directory, RUST_LOG is passed to the backends (default "info").
"""

import argparse
import atexit
import base64
import ctypes
import hashlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import guest_images

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("vrdma", "rxe", "none")
AGENT_PORT = "org.vrdma.agent"
UPLINKS = ("fabric", "fabric+tap", "udp", "tap", "vxlan")
FABRIC_TAP = "vrtapf"  # the fabric daemon's TAP with uplink fabric+tap
# How often QEMU tries to reach a vrdma backend that went away (-chardev reconnect-ms).
RECONNECT_MS = 250


def cache_dir():
    return os.environ.get("VRDMA_CACHE", "/var/cache/vrdma")


def checkout_dir():
    """Where images/ puts what it builds from this checkout's sources."""
    real = os.path.realpath(REPO)
    return os.path.join(cache_dir(), "checkout-" + hashlib.sha256(real.encode()).hexdigest()[:8])


def default_paths():
    """Paths of the images built by images/ (make images). The initrd is
    this checkout's (with its vrdma.ko and provider) when it was built."""
    c = cache_dir()
    initrd = os.path.join(checkout_dir(), "guest-initrd.cpio")
    if not os.path.exists(initrd):
        initrd = os.path.join(c, "guest-initrd.cpio")
    return {
        "qemu": os.environ.get("VRDMA_QEMU", os.path.join(c, "qemu-system-x86_64")),
        "kernel": os.environ.get("VRDMA_KERNEL", os.path.join(c, "vmlinuz")),
        "initrd": os.environ.get("VRDMA_INITRD", initrd),
        "backend": os.environ.get(
            "VRDMA_BACKEND", os.path.join(REPO, "target", "release", "vrdma-backend")),
    }


class VMError(Exception):
    """A guest, its QEMU or its backend failed."""


class CommandTimeout(VMError, TimeoutError):
    """A command did not finish in time (it was killed in the guest)."""

    def __init__(self, msg, rc=None, out=""):
        super().__init__(msg)
        self.rc = rc
        self.out = out


class Result:
    """Outcome of a command: rc, out (stdout, with stderr merged when asked),
    err, timed_out."""

    def __init__(self, rc, out, err, timed_out):
        self.rc, self.out, self.err, self.timed_out = rc, out, err, timed_out

    def __iter__(self):  # rc, out = result
        return iter((self.rc, self.out))

    def __repr__(self):
        return "Result(rc=%r, out=%r, err=%r)" % (self.rc, self.out[-200:], self.err[-200:])


# --------------------------------------------------------------------------
# processes

_PR_SET_PDEATHSIG = 1


def _child_setup():
    # Die with the launcher even if it is SIGKILLed (the signal is sent when
    # the *thread* that forked exits: start processes from a long-lived one).
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def _stop(proc, grace=3.0):
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except OSError:
        pass


def _tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _free_udp_ports(n):
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if check and r.returncode:
        raise VMError("ip %s: %s" % (" ".join(args), r.stdout.strip()))
    return r


# --------------------------------------------------------------------------
# guest agent, host side

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


class _AgentConn:
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


# --------------------------------------------------------------------------
# one guest

class Qmp:
    """A minimal QMP client (one command at a time) on a QEMU's -qmp unix socket."""

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


class VM:
    """One guest: its QEMU, its backend (vrdma kind) and its agent."""

    def __init__(self, cluster, index, kind, image=None):
        if kind not in KINDS:
            raise ValueError("kind must be one of %s" % (KINDS,))
        self.cluster, self.index, self.kind = cluster, index, kind
        # the guest OS (images/guest_images.py); None: the cluster's kernel and initrd
        self.image = image
        self.kernel, self.initrd = guest_images.paths(image) if image else (
            cluster.kernel, cluster.initrd)
        self.name = "vm%d" % index
        self.mac = "52:54:00:76:72:%02x" % (index + 1)
        self.ip = "10.0.0.%d" % (index + 1)
        self.cidr = self.ip + "/24"
        d = cluster.workdir
        self.serial_log = os.path.join(d, "serial-%d.log" % index)
        self.qemu_log = os.path.join(d, "qemu-%d.log" % index)
        self.backend_log = os.path.join(d, "backend-%d.log" % index)
        self.agent_sock = os.path.join(d, "agent-%d.sock" % index)
        self.qmp_sock = os.path.join(d, "qmp-%d.sock" % index)
        self.vu_sock = os.path.join(d, "vu-%d.sock" % index)
        self.tap = "vrtap%d" % index
        self.pcap = os.path.join(d, "capture-%d.pcap" % index)
        self.local_port = self.remote_port = None
        self.qemu = self.backend = None
        self.agent = None
        self.boot_time = None
        self.init_log = ""  # what the guest's init said (/run/vrdmavm-init.log)

    # ---- start
    @property
    def netns(self):
        """The network namespace of this guest's host side (None: the caller's)."""
        c = self.cluster
        if c.fabric and self.kind == "vrdma":
            return c.netns
        if c.uplink == "vxlan" and c.host_netns:
            return c.host_netns[self.index % len(c.host_netns)]
        return c.netns

    def _uplink(self):
        if self.cluster.taps:
            return "tap:" + self.tap
        return "udp:local=127.0.0.1:%d,remote=127.0.0.1:%d" % (self.local_port, self.remote_port)

    def backend_cmd(self):
        c = self.cluster
        cmd = [c.backend, "--socket-path", self.vu_sock, "--mac", self.mac,
               "--uplink", self._uplink()] + list(c.backend_args)
        if c.pcap:
            cmd += ["--pcap", self.pcap, "--pcap-max-bytes", str(c.pcap)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        return cmd

    def start_backend(self):
        """Start this guest's vrdma-backend (on a fabric: the shared one, unless it runs)."""
        c = self.cluster
        if c.fabric:
            c.start_fabric_backend()
            return
        env = dict(os.environ)
        env.setdefault("RUST_LOG", c.rust_log or "info")
        if c.rust_log:
            env["RUST_LOG"] = c.rust_log
        with open(self.backend_log, "ab") as log:
            self.backend = subprocess.Popen(
                self.backend_cmd(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                preexec_fn=_child_setup)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.vu_sock):
            if self.backend.poll() is not None:
                raise VMError("%s: backend exited with %s:\n%s" % (
                    self.name, self.backend.returncode, _tail(self.backend_log)))
            if time.monotonic() > deadline:
                raise VMError("%s: backend did not create %s:\n%s" % (
                    self.name, self.vu_sock, _tail(self.backend_log)))
            time.sleep(0.02)

    def cmdline(self):
        c = self.cluster
        args = ["console=ttyS0", "panic=-1", "mitigations=off", "8250.nr_uarts=1",
                "no_timer_check",
                "vrdmavm.role=" + self.kind, "vrdmavm.hostname=" + self.name]
        if self.kind != "none":
            args.append("vrdmavm.ip=" + self.cidr)
        if c.shell == self.index:
            args.append("vrdmavm.mode=shell")
        if c.append:
            args.append(c.append)
        return " ".join(args)

    def qemu_cmd(self):
        c = self.cluster
        accel = ["-accel", "kvm", "-cpu", "host"] if c.kvm else \
            ["-accel", "tcg,thread=multi", "-cpu", "max"]
        cmd = [c.qemu, "-name", self.name, "-machine", c.machine] + accel + [
            "-smp", str(c.smp), "-m", c.mem,
            "-object", "memory-backend-memfd,id=mem,size=%s,share=on" % c.mem,
            "-numa", "node,memdev=mem",
            "-nodefaults", "-nographic", "-no-reboot",
            "-L", "/usr/share/seabios", "-L", "/usr/share/qemu",
            "-kernel", self.kernel, "-initrd", self.initrd, "-append", self.cmdline(),
            "-device", "virtio-serial-pci,id=vser0",
            "-chardev", "socket,id=agent,path=%s,server=on,wait=off" % self.agent_sock,
            "-device", "virtserialport,bus=vser0.0,chardev=agent,name=" + AGENT_PORT,
            "-qmp", "unix:%s,server=on,wait=off" % self.qmp_sock,
        ]
        if c.shell == self.index:
            cmd += ["-serial", "mon:stdio"]
        else:
            # append: a migration's destination QEMU continues the same log
            cmd += ["-chardev", "file,id=ser0,path=%s,append=on" % self.serial_log,
                    "-serial", "chardev:ser0"]
        if self.kind == "vrdma":
            # reconnect-ms: QEMU connects again to a restarted backend, and the
            # device asks the driver for a reset (device spec §2.4).
            cmd += ["-chardev", "socket,id=vu,path=%s,reconnect-ms=%d" % (
                        self.vu_sock, RECONNECT_MS),
                    "-device", "vhost-user-rdma-pci,chardev=vu"]
        elif self.kind == "rxe":
            if c.taps:
                net = "tap,id=n0,ifname=%s,script=no,downscript=no" % self.tap
            else:
                net = ("dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=%d,"
                       "remote.type=inet,remote.host=127.0.0.1,remote.port=%d"
                       % (self.local_port, self.remote_port))
            cmd += ["-netdev", net,
                    "-device", "virtio-net-pci,netdev=n0,mac=%s,romfile=" % self.mac]
        cmd += list(c.qemu_args)
        if self.kind == "rxe" and self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        return cmd

    def start_qemu(self):
        interactive = self.cluster.shell == self.index
        with open(self.qemu_log, "ab") as log:
            self.qemu = subprocess.Popen(
                self.qemu_cmd(), stdin=None if interactive else subprocess.DEVNULL,
                stdout=None if interactive else log, stderr=log,
                start_new_session=not interactive, preexec_fn=_child_setup)
        self._t_start = time.monotonic()

    def _alive(self):
        return self.qemu is not None and self.qemu.poll() is None and (
            self.backend is None or self.backend.poll() is None)

    def _why_dead(self):
        msg = []
        if self.qemu is not None and self.qemu.poll() is not None:
            msg.append("QEMU exited with %s:\n%s" % (self.qemu.returncode, _tail(self.qemu_log)))
        if self.backend is not None and self.backend.poll() is not None:
            msg.append("backend exited with %s:\n%s" % (
                self.backend.returncode, _tail(self.backend_log)))
        msg.append("console (tail):\n" + _tail(self.serial_log))
        return "%s: %s" % (self.name, "\n".join(msg))

    def wait_agent(self, deadline):
        """Connect to the agent and wait for its first answer."""
        self.agent = _AgentConn(self.agent_sock, self.name)
        self.agent.connect(deadline, self._alive)
        done = threading.Event()
        box = {}

        def cb(msg):
            box.update(msg)
            done.set()

        self.agent.send({"op": "ping"}, cb)
        while not done.wait(0.2):
            if not self._alive():
                raise VMError(self._why_dead())
            if time.monotonic() > deadline:
                raise VMError("%s: no answer from the guest agent in time\n%s" % (
                    self.name, "console (tail):\n" + _tail(self.serial_log)))
        if "error" in box:
            raise VMError("%s: agent: %s\n%s" % (self.name, box["error"], _tail(self.serial_log)))
        # the agent starts before the drivers: wait for init to finish
        left = max(1.0, deadline - time.monotonic())
        try:
            self.init_log = self.run(
                "while [ ! -e /run/vrdmavm-ready ]; do sleep 0.1; done; "
                "cat /run/vrdmavm-init.log", timeout=left)[1]
        except CommandTimeout:
            try:
                info = self.run("cat /run/vrdmavm-init.log; echo; dmesg | tail -n 40; "
                                "ps -eo pid,stat,wchan:20,args | grep -v ' \\[' | tail -n 30",
                                timeout=20)[1]
            except VMError as e:
                info = str(e)
            raise VMError("%s: guest init did not finish in time:\n%s" % (self.name, info))
        self.boot_time = time.monotonic() - self._t_start

    # ---- agent requests
    def _agent_wait(self, event, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        while not event.wait(0.2):
            if not self._alive():
                raise VMError(self._why_dead())
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def _request(self, req, timeout):
        done = threading.Event()
        box = {}

        def cb(msg):
            box.update(msg)
            done.set()

        if self.agent is None:
            raise VMError("%s is not running" % self.name)
        rid = self.agent.send(req, cb)
        if not self._agent_wait(done, timeout):
            self.agent.forget(rid)
            raise VMError("%s: agent did not answer %s in %ss" % (self.name, req.get("op"), timeout))
        if "error" in box:
            raise VMError("%s: agent: %s" % (self.name, box["error"]))
        return box

    def spawn(self, cmd, timeout=None, env=None, stdin=None, merge=True, cwd=None):
        """Start cmd (a /bin/sh -c string) in the guest and return a Handle.
        timeout (s) is enforced in the guest. With merge, stderr goes into out.
        Output is collected until the command *and* anything holding its
        stdout/stderr exit: redirect daemons (cmd >/tmp/log 2>&1 &)."""
        if self.agent is None:
            raise VMError("%s is not running" % self.name)
        h = Handle(self, None, cmd, timeout)
        if merge:
            cmd = "exec 2>&1\n" + cmd
        started = threading.Event()

        def cb(msg):
            if msg.get("event") == "started":
                h.pid = msg.get("pid")
                started.set()
                return
            if "error" in msg and "rc" not in msg:
                h.result = Result(None, "", msg["error"], False)
            else:
                h.result = Result(msg.get("rc"), msg.get("out", ""), msg.get("err", ""),
                                  msg.get("timed_out", False))
            self.agent.forget(h.id)
            started.set()
            h._done.set()

        req = {"op": "exec", "cmd": cmd, "timeout": timeout, "env": env or {}, "cwd": cwd}
        if stdin is not None:
            req["stdin"] = stdin
        h.id = self.agent.send(req, cb)
        if not self._agent_wait(started, 30):
            raise VMError("%s: agent did not start %r" % (self.name, cmd))
        if h.result is not None and h.result.rc is None:
            raise VMError("%s: agent: %s" % (self.name, h.result.err))
        return h

    def exec(self, cmd, timeout=60, check=False, **kw):
        """Run cmd to completion; returns a Result (rc, out, err, timed_out)."""
        h = self.spawn(cmd, timeout=timeout, **kw)
        r = h.wait_result(None if timeout is None else timeout + 15)
        if check and r.rc != 0:
            raise VMError("%s: %r exited with %s:\n%s%s" % (self.name, cmd, r.rc, r.out, r.err))
        return r

    def run(self, cmd, timeout=60, check=False, **kw):
        """Run cmd to completion; returns (rc, out) with stderr merged into out.
        Raises CommandTimeout when it takes longer than timeout seconds."""
        r = self.exec(cmd, timeout=timeout, check=check, **kw)
        return r.rc, r.out

    def dmesg(self):
        return self.run("dmesg", timeout=30)[1]

    def write_file(self, path, data, mode=None):
        if isinstance(data, str):
            data = data.encode()
        req = {"op": "write_file", "path": path, "data": base64.b64encode(data).decode()}
        if mode is not None:
            req["mode"] = mode
        self._request(req, 60)

    def read_file(self, path):
        return base64.b64decode(self._request({"op": "read_file", "path": path}, 60)["data"])

    def console(self):
        """The serial console log so far (kernel messages, init output)."""
        return _tail(self.serial_log, 10 ** 9)

    # ---- stop
    def kill_backend(self):
        """SIGKILL this guest's vrdma-backend (a crash, for tests of the guest's side). The
        guest keeps running; from now on the VM counts as alive without a backend."""
        if self.backend is None:
            raise VMError("%s has no backend" % self.name)
        proc = self.backend
        proc.kill()
        proc.wait()
        # On a fabric the daemon served every vrdma guest: all of them lost it.
        for vm in self.cluster.vms:
            if vm.backend is proc:
                vm.backend = None

    def restart_backend(self):
        """Start this guest's backend again after kill_backend() (same socket, uplink
        and log): QEMU reconnects within RECONNECT_MS and the guest's driver recovers. On a
        fabric this restarts the shared daemon: every vrdma guest's device recovers."""
        if self.backend is not None:
            raise VMError("%s: the backend still runs" % self.name)
        # The dead daemon's socket file: start_backend() waits for a new one.
        try:
            os.unlink(self.vu_sock)
        except FileNotFoundError:
            pass
        # The daemon never writes over a capture (spec §16.5): keep the old one aside.
        if self.pcap and os.path.exists(self.pcap):
            n = 1
            while os.path.exists("%s.%d" % (self.pcap, n)):
                n += 1
            os.rename(self.pcap, "%s.%d" % (self.pcap, n))
        self.start_backend()

    def migrate(self, timeout=600):
        """Live-migrate this guest (device spec §17) to a new QEMU started with -incoming and
        its own new vrdma-backend (same MAC) on a new TAP of the same bridge, then swap this
        VM object over to them: agent, QMP, serial log, backend. The old QEMU and backend are
        stopped. Only for a vrdma guest with its own backend on a TAP uplink (uplink "tap").
        Returns QEMU's final query-migrate answer (status, total-time, downtime in ms, ram);
        raises VMError if the migration fails (the guest then keeps running on the source)."""
        c = self.cluster
        if self.kind != "vrdma" or c.fabric or not c.taps or not self.netns:
            raise VMError("%s: migrate needs a vrdma guest with its own backend on a TAP "
                          "uplink" % self.name)
        self._mig_gen = getattr(self, "_mig_gen", 0) + 1
        tag = "%d-m%d" % (self.index, self._mig_gen)
        d = c.workdir
        old = {k: getattr(self, k) for k in (
            "qemu", "backend", "agent", "tap", "vu_sock", "qmp_sock", "agent_sock",
            "backend_log", "pcap")}
        mig_sock = os.path.join(d, "mig-%s.sock" % tag)
        self.tap = "vrtap%dm%d" % (self.index, self._mig_gen)
        self.vu_sock = os.path.join(d, "vu-%s.sock" % tag)
        self.qmp_sock = os.path.join(d, "qmp-%s.sock" % tag)
        self.agent_sock = os.path.join(d, "agent-%s.sock" % tag)
        self.backend_log = os.path.join(d, "backend-%s.log" % tag)
        self.pcap = os.path.join(d, "capture-%s.pcap" % tag)
        # self.agent stays the source's connection until the swap: commands that end
        # meanwhile are reported there.
        self.backend = self.qemu = None

        def undo():
            _stop(self.qemu)
            _stop(self.backend)
            _ip("-n", self.netns, "link", "del", self.tap, check=False)
            for k, v in old.items():
                setattr(self, k, v)

        try:
            _ip("-n", self.netns, "tuntap", "add", "dev", self.tap, "mode", "tap")
            _ip("-n", self.netns, "link", "set", self.tap, "master", "br0", "up")
            self.start_backend()
            with open(self.qemu_log, "ab") as log:
                self.qemu = subprocess.Popen(
                    self.qemu_cmd() + ["-incoming", "unix:" + mig_sock],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True, preexec_fn=_child_setup)
            deadline = time.monotonic() + 60
            while not os.path.exists(mig_sock) or not os.path.exists(self.qmp_sock):
                if self.qemu.poll() is not None:
                    raise VMError("destination QEMU exited with %s:\n%s" % (
                        self.qemu.returncode, _tail(self.qemu_log)))
                if time.monotonic() > deadline:
                    raise VMError("destination QEMU is not listening on " + mig_sock)
                time.sleep(0.05)
            src = Qmp(old["qmp_sock"])
            try:
                src.execute("migrate", {"uri": "unix:" + mig_sock})
                deadline = time.monotonic() + timeout
                while True:
                    info = src.execute("query-migrate")
                    if info.get("status") in ("completed", "failed", "cancelled"):
                        break
                    if time.monotonic() > deadline:
                        src.execute("migrate_cancel")
                        raise VMError("migration did not complete in %ss: %s" % (timeout, info))
                    time.sleep(0.1)
                if info.get("status") != "completed":
                    raise VMError("migration %s: %s" % (info.get("status"),
                                                        info.get("error-desc", info)))
                # Commands spawned before the move finish on the destination: their waiters
                # go over to the new agent connection (before the old one closes and fails
                # them).
                waiters, next_id = {}, 1
                if old["agent"]:
                    with old["agent"].lock:
                        waiters = dict(old["agent"].waiters)
                        old["agent"].waiters.clear()
                        next_id = old["agent"].next_id
                dst = Qmp(self.qmp_sock)
                deadline = time.monotonic() + 60
                while dst.execute("query-status").get("status") != "running":
                    if time.monotonic() > deadline:
                        raise VMError("the destination does not run after the migration")
                    time.sleep(0.05)
                dst.close()
                try:
                    src.execute("quit")
                except (OSError, VMError):
                    pass
            finally:
                src.close()
        except BaseException:
            undo()
            raise
        if old["agent"]:
            old["agent"].close()  # its waiters were moved: it fails none of them
        _stop(old["qemu"])
        _stop(old["backend"])
        _ip("-n", self.netns, "link", "del", old["tap"], check=False)
        new = _AgentConn(self.agent_sock, self.name)
        new.waiters.update(waiters)
        new.next_id = next_id
        self.agent = new
        self.agent.connect(time.monotonic() + 60, self._alive)
        self._request({"op": "ping"}, 60)
        return info

    def stop(self):
        if self.agent:
            self.agent.close()
        _stop(self.qemu)
        _stop(self.backend)


# --------------------------------------------------------------------------
# a set of guests

class Cluster:
    """n guests of one kind (or a list of kinds, one per guest) on one L2.

    Use as a context manager (or call start() / close()): on exit, an
    exception, SIGINT, SIGTERM or SIGHUP every QEMU and backend is stopped,
    sockets, TAPs and the network namespace are removed. The run directory
    (logs) is removed too unless keep=True, VRDMA_KEEP=1, or the block
    raised; its path is in .workdir.
    """

    def __init__(self, n=2, kind="vrdma", uplink="fabric", workdir=None, qemu=None,
                 kernel=None, initrd=None, backend=None, backend_args=(),
                 qemu_args=(), kvm=None, mem="1G", smp=1, machine="q35",
                 append="", boot_timeout=300, lifetime=None, keep=None,
                 rust_log=None, shell=None, pcap=0, nets=None, spare_devices=0,
                 image=None):
        kinds = [kind] * n if isinstance(kind, str) else list(kind)
        if len(kinds) != n:
            raise ValueError("need one kind per guest")
        # image: the guest OS of every guest, or a list of one per guest (None in it: the
        # kernel and initrd given here); names from images/guest_images.py
        images = [image] * n if image is None or isinstance(image, str) else list(image)
        if len(images) != n:
            raise ValueError("need one image per guest")
        # nets: the fabric's tenant network of each guest (spec §16.3), default all 0
        if nets is not None and (len(nets) != n or uplink not in ("fabric", "fabric+tap")):
            raise ValueError("nets: one network per guest, on a fabric uplink only")
        self.nets = None if nets is None else [int(x) for x in nets]
        # spare_devices: devices of the shared daemon that no QEMU uses, for a test program
        # to connect to as a frontend (their sockets: .spare_sockets)
        if spare_devices and uplink not in ("fabric", "fabric+tap"):
            raise ValueError("spare_devices: on a fabric uplink only")
        self.spare_devices = int(spare_devices)
        if uplink not in UPLINKS:
            raise ValueError("uplink must be one of %s" % (UPLINKS,))
        if uplink == "udp" and n > 2 and any(k != "none" for k in kinds):
            raise ValueError("the udp uplink links exactly two guests; use uplink='tap'")
        if uplink == "fabric" and sum(k not in ("vrdma", "none") for k in kinds) > 1:
            raise ValueError("the fabric's UDP uplink links one other guest; use 'fabric+tap'")
        p = default_paths()
        self.qemu = qemu or p["qemu"]
        self.kernel = kernel or p["kernel"]
        self.initrd = initrd or p["initrd"]
        self.backend = backend or p["backend"]
        self.backend_args, self.qemu_args = tuple(backend_args), tuple(qemu_args)
        self.kvm = (os.environ.get("VRDMA_KVM") == "1") if kvm is None else kvm
        self.mem, self.smp, self.machine, self.append = mem, smp, machine, append
        self.uplink, self.boot_timeout, self.lifetime = uplink, boot_timeout, lifetime
        # vrdma guests share one daemon; guests' host sides meet on TAPs on a bridge
        self.fabric = uplink in ("fabric", "fabric+tap")
        self.taps = uplink in ("tap", "vxlan", "fabric+tap")
        self.fabric_backend = None
        self.fabric_log = os.path.join(workdir or "", "backend-fabric.log")
        self.fabric_udp = None  # (daemon port, guest port) of the fabric's UDP uplink
        self.rust_log, self.shell = rust_log, shell
        # > 0: every vrdma backend captures its port to capture-<i>.pcap, at most this many bytes
        self.pcap = pcap
        self.keep = (os.environ.get("VRDMA_KEEP") == "1") if keep is None else keep
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="vrdma-run-")
        os.makedirs(self.workdir, exist_ok=True)
        self.fabric_log = os.path.join(self.workdir, "backend-fabric.log")
        self.netns = None
        self.host_netns = []
        self.vms = [VM(self, i, k, g) for i, (k, g) in enumerate(zip(kinds, images))]
        if self.fabric:
            for vm in self.vms:
                if vm.kind == "vrdma":
                    vm.backend_log = self.fabric_log
                    vm.pcap = os.path.join(self.workdir, "capture-fabric.pcap")
        self._closed = False
        self._old_handlers = {}
        self._timer = None

    def __getitem__(self, i):
        return self.vms[i]

    def __len__(self):
        return len(self.vms)

    def _check_files(self):
        need = [("QEMU", self.qemu, "make images")]
        for vm in self.vms:
            hint = "make images" if vm.image in (None, guest_images.DEFAULT) else \
                "make guest-images GUESTS=%s" % vm.image
            need += [("%s's kernel" % vm.name, vm.kernel, hint),
                     ("%s's initrd" % vm.name, vm.initrd, hint)]
        if any(vm.kind == "vrdma" for vm in self.vms):
            need.append(("vrdma-backend", self.backend, "cargo build --release"))
        for what, path, hint in need:
            if not os.path.exists(path):
                raise VMError("%s not found at %s (%s)" % (what, path, hint))

    def _setup_net(self):
        if self.uplink == "fabric":
            others = [vm for vm in self.vms if vm.kind not in ("vrdma", "none")]
            if others:
                ports = _free_udp_ports(2)
                self.fabric_udp = (ports[0], ports[1])
                others[0].local_port, others[0].remote_port = ports[1], ports[0]
            return
        if self.uplink == "udp":
            # one guest: its remote port is a free port nobody listens on
            ports = _free_udp_ports(2)
            for i, vm in enumerate(self.vms):
                vm.local_port = ports[i]
                vm.remote_port = ports[1 - i]
            return
        tag = "vrdma-%d-%04x" % (os.getpid(), random.getrandbits(16))
        if self.uplink in ("tap", "fabric+tap"):
            self.netns = tag
            self._add_host(self.netns, "10.0.0.254/24")
        else:
            # Two hosts, an underlay link between them and a VXLAN segment bridged on each.
            self.host_netns = [tag + "-a", tag + "-b"]
            for i, ns in enumerate(self.host_netns):
                self._add_host(ns, "10.0.0.%d/24" % (253 - i))
            a, b = self.host_netns
            _ip("link", "add", "vrul0", "netns", a, "type", "veth", "peer", "vrul1", "netns", b)
            for i, ns in enumerate(self.host_netns):
                n, dev = ["-n", ns], "vrul%d" % i
                _ip(*n, "link", "set", dev, "mtu", "1550", "up")
                _ip(*n, "addr", "add", "192.168.42.%d/24" % (i + 1), "dev", dev)
                _ip(*n, "link", "add", "vxlan42", "type", "vxlan", "id", "42", "dstport", "4789",
                    "local", "192.168.42.%d" % (i + 1), "remote", "192.168.42.%d" % (2 - i),
                    "dev", dev)
                _ip(*n, "link", "set", "vxlan42", "mtu", "1500", "master", "br0", "up")
        for vm in self.vms:
            if vm.kind == "none" or self.fabric and vm.kind == "vrdma":
                continue
            n = ["-n", vm.netns]
            _ip(*n, "tuntap", "add", "dev", vm.tap, "mode", "tap")
            _ip(*n, "link", "set", vm.tap, "master", "br0", "up")
        if self.fabric:
            _ip("-n", self.netns, "tuntap", "add", "dev", FABRIC_TAP, "mode", "tap")
            _ip("-n", self.netns, "link", "set", FABRIC_TAP, "master", "br0", "up")

    @staticmethod
    def _add_host(ns, addr):
        """A namespace standing for a host: loopback and a bridge br0 with address `addr`."""
        _ip("netns", "add", ns)
        n = ["-n", ns]
        _ip(*n, "link", "set", "lo", "up")
        _ip(*n, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0")
        _ip(*n, "addr", "add", addr, "dev", "br0")
        _ip(*n, "link", "set", "br0", "up")

    def start(self):
        """Start every backend and QEMU, then wait until every agent answers."""
        self._check_files()
        self._install_signals()
        atexit.register(self.close)
        try:
            self._setup_net()
            if self.fabric:
                self.start_fabric_backend()
            for vm in self.vms:
                if vm.kind == "vrdma" and not self.fabric:
                    vm.start_backend()
            for vm in self.vms:
                vm.start_qemu()
            if self.lifetime:
                self._timer = threading.Timer(self.lifetime, self._expire)
                self._timer.daemon = True
                self._timer.start()
            deadline = time.monotonic() + self.boot_timeout
            for vm in self.vms:
                vm.wait_agent(deadline)
        except BaseException:
            self.close(failed=True)
            raise
        return self

    @property
    def fabric_stats(self):
        """The shared daemon's operator socket: the fabric-wide per-port counters."""
        return os.path.join(self.workdir, "fabric.stats")

    @property
    def spare_sockets(self):
        """The vhost-user sockets of the shared daemon's spare devices (no guest)."""
        return [os.path.join(self.workdir, "spare-%d.sock" % i)
                for i in range(self.spare_devices)]

    def fabric_backend_cmd(self):
        """The shared daemon's command line: one --device per vrdma guest, with the guest's
        address (port security, spec §16.3: the fabric drops the frames of a guest that claims
        another address) and, if the cluster has networks, its network."""
        cmd = [self.backend]
        for vm in self.vms:
            if vm.kind == "vrdma":
                spec = "socket=%s,mac=%s,ip=%s" % (vm.vu_sock, vm.mac, vm.ip)
                if self.nets is not None:
                    spec += ",net=%d" % self.nets[vm.index]
                cmd += ["--device", spec]
        for i, sock in enumerate(self.spare_sockets):
            # MACs beyond the guests' (52:54:00:76:72:<index+1>)
            cmd += ["--device", "socket=%s,mac=52:54:00:76:73:%02x" % (sock, i + 1)]
        if self.uplink == "fabric+tap":
            cmd += ["--uplink", "tap:" + FABRIC_TAP]
        elif self.fabric_udp:
            cmd += ["--uplink", "udp:local=127.0.0.1:%d,remote=127.0.0.1:%d" % self.fabric_udp]
        # The fabric's per-port counters are only on the operator socket (spec §16.5).
        cmd += ["--stats-socket", self.fabric_stats]
        cmd += list(self.backend_args)
        if self.pcap:
            cmd += ["--pcap", os.path.join(self.workdir, "capture-fabric.pcap"),
                    "--pcap-max-bytes", str(self.pcap)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        return cmd

    def start_fabric_backend(self):
        """Start the daemon that serves every vrdma guest (no-op while it runs); each vrdma
        VM's .backend is that process."""
        proc = self.fabric_backend
        if proc is None or proc.poll() is not None:
            env = dict(os.environ)
            env["RUST_LOG"] = self.rust_log or env.get("RUST_LOG") or "info"
            socks = [vm.vu_sock for vm in self.vms if vm.kind == "vrdma"] + self.spare_sockets
            for s in socks:
                try:
                    os.unlink(s)
                except OSError:
                    pass
            with open(self.fabric_log, "ab") as log:
                proc = subprocess.Popen(
                    self.fabric_backend_cmd(), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                    preexec_fn=_child_setup)
            self.fabric_backend = proc
            deadline = time.monotonic() + 20
            while not all(os.path.exists(s) for s in socks):
                if proc.poll() is not None:
                    raise VMError("fabric backend exited with %s:\n%s" % (
                        proc.returncode, _tail(self.fabric_log)))
                if time.monotonic() > deadline:
                    raise VMError("fabric backend did not create %s:\n%s" % (
                        " ".join(socks), _tail(self.fabric_log)))
                time.sleep(0.02)
        for vm in self.vms:
            if vm.kind == "vrdma":
                vm.backend = proc

    def _expire(self):
        sys.stderr.write("vrdmavm: lifetime of %ss over, stopping all guests\n" % self.lifetime)
        for vm in self.vms:
            vm.stop()

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            raise SystemExit(128 + signum)

        for s in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[s] = signal.signal(s, handler)
            except (ValueError, OSError):
                pass

    def close(self, failed=False):
        """Stop everything; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._timer:
            self._timer.cancel()
        for vm in self.vms:
            vm.stop()
        _stop(self.fabric_backend)
        for ns in [self.netns] + self.host_netns:
            if ns:
                _ip("netns", "del", ns, check=False)
        self.netns, self.host_netns = None, []
        for vm in self.vms:
            for p in (vm.agent_sock, vm.qmp_sock, vm.vu_sock):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        if self._own_workdir and not self.keep and not failed:
            shutil.rmtree(self.workdir, ignore_errors=True)
        elif failed or self.keep:
            sys.stderr.write("vrdmavm: logs kept in %s\n" % self.workdir)
        for s, h in self._old_handlers.items():
            try:
                signal.signal(s, h)
            except (ValueError, OSError):
                pass
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        self.close(failed=exc_type is not None)
        return False


# --------------------------------------------------------------------------
# command line

def _add_common(p):
    g = p.add_argument_group("guests")
    g.add_argument("-n", "--guests", type=int, default=1, help="number of guests (default 1)")
    g.add_argument("-k", "--kind", default="vrdma",
                   help="vrdma, rxe or none; or a comma list, one per guest (default vrdma)")
    g.add_argument("--uplink", choices=UPLINKS, default="fabric",
                   help="fabric: the vrdma guests on one daemon's in-process switch (default); "
                        "fabric+tap: that daemon's uplink on a bridge in a netns; udp: two guests "
                        "point to point; tap: bridge in a netns; vxlan: two netns hosts joined by VXLAN")
    g.add_argument("--mem", default="1G", help="guest RAM (default 1G)")
    g.add_argument("--smp", type=int, default=1, help="guest CPUs (default 1)")
    g.add_argument("--append", default="", help="extra kernel command line")
    g.add_argument("--kvm", action="store_true", default=None,
                   help="use KVM (default TCG; also VRDMA_KVM=1)")
    g.add_argument("--boot-timeout", type=float, default=300)
    g.add_argument("--lifetime", type=float, default=None,
                   help="stop everything after this many seconds")
    f = p.add_argument_group("files (defaults from VRDMA_CACHE=%s)" % cache_dir())
    d = default_paths()
    f.add_argument("--qemu", default=d["qemu"])
    f.add_argument("--kernel", default=d["kernel"])
    f.add_argument("--initrd", default=d["initrd"])
    f.add_argument("--image", default=None,
                   help="guest OS instead of --kernel/--initrd: %s; or a comma list, one per "
                   "guest (make guest-images builds them)" % ", ".join(guest_images.names()))
    f.add_argument("--backend", default=d["backend"], help="vrdma-backend binary")
    f.add_argument("--backend-arg", action="append", default=[],
                   help="extra vrdma-backend argument (repeatable)")
    f.add_argument("--workdir", default=None, help="run directory (default a new /tmp/vrdma-run-*)")
    f.add_argument("--keep", action="store_true", default=None, help="keep the run directory")
    f.add_argument("--rust-log", default=None, help="RUST_LOG for the backends")


def _cluster(a, shell=None):
    kinds = a.kind.split(",")
    if len(kinds) == 1:
        kinds = kinds * a.guests
    return Cluster(n=a.guests, kind=kinds, uplink=a.uplink, workdir=a.workdir,
                   qemu=a.qemu, kernel=a.kernel, initrd=a.initrd, backend=a.backend,
                   backend_args=a.backend_arg, kvm=a.kvm, mem=a.mem, smp=a.smp,
                   append=a.append, boot_timeout=a.boot_timeout, lifetime=a.lifetime,
                   keep=a.keep, rust_log=a.rust_log, shell=shell, image=_images(a))


def _images(a):
    """--image as Cluster's image argument (one name, or one per guest)."""
    if not a.image:
        return None
    names = a.image.split(",")
    return names[0] if len(names) == 1 else names


def _info(c, t0):
    print("vrdmavm: %d guest(s) up in %.1fs, run directory %s%s" % (
        len(c), time.monotonic() - t0, c.workdir,
        ", netns " + " ".join([c.netns] if c.netns else c.host_netns) if (c.netns or c.host_netns)
        else ""), file=sys.stderr)
    for vm in c.vms:
        print("  %s kind=%s ip=%s mac=%s agent up after %.1fs  console %s" % (
            vm.name, vm.kind, vm.ip, vm.mac, vm.boot_time, vm.serial_log), file=sys.stderr)


def _parse_job(spec):
    """'[N][&]:CMD' -> (guest, background, cmd); plain CMD runs on guest 0."""
    head, sep, cmd = spec.partition(":")
    h = head.strip()
    if sep and (h == "&" or h.rstrip("&").isdigit()):
        bg = h.endswith("&")
        g = int(h.rstrip("&")) if h.rstrip("&") else 0
        return g, bg, cmd
    return 0, False, spec


def cmd_run(a):
    jobs = [_parse_job(s) for s in a.cmd]
    if a.command:
        jobs.append((a.on, False, " ".join(shlex.quote(x) for x in a.command)
                     if len(a.command) > 1 else a.command[0]))
    if not jobs:
        raise SystemExit("run: nothing to run (give -c '[N][&]:CMD' or a command)")
    t0 = time.monotonic()
    rc_all = 0
    with _cluster(a) as c:
        _info(c, t0)
        bg = []
        for g, background, cmd in jobs:
            vm = c[g]
            if background:
                print("--- %s& %s" % (vm.name, cmd), file=sys.stderr)
                bg.append((vm, cmd, vm.spawn(cmd, timeout=a.timeout)))
                time.sleep(a.bg_delay)
                continue
            print("--- %s: %s" % (vm.name, cmd), file=sys.stderr)
            rc, out = vm.run(cmd, timeout=a.timeout)
            sys.stdout.write(out)
            print("--- %s: rc=%s" % (vm.name, rc), file=sys.stderr)
            rc_all = rc_all or rc
        for vm, cmd, h in bg:
            rc, out = h.wait(a.timeout + 15)
            print("--- %s& %s" % (vm.name, cmd), file=sys.stderr)
            sys.stdout.write(out)
            print("--- %s&: rc=%s" % (vm.name, rc), file=sys.stderr)
            rc_all = rc_all or rc
    return 1 if rc_all else 0


def cmd_boot(a):
    t0 = time.monotonic()
    with _cluster(a) as c:
        _info(c, t0)
        if a.repl:
            print("commands: 'N: CMD' runs CMD on guest N (default 0); Ctrl-D ends",
                  file=sys.stderr)
            for line in sys.stdin:
                line = line.strip()
                if not line:
                    continue
                g, bg, cmd = _parse_job(line)
                try:
                    rc, out = c[g].run(cmd, timeout=a.timeout)
                    sys.stdout.write(out)
                    print("[rc=%s]" % rc, file=sys.stderr)
                except (VMError, IndexError) as e:
                    print("error: %s" % e, file=sys.stderr)
            return 0
        print("vrdmavm: running; Ctrl-C stops", file=sys.stderr)
        try:
            if a.duration:
                time.sleep(a.duration)
            else:
                while all(vm._alive() for vm in c.vms):
                    time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_shell(a):
    c = _cluster(a, shell=a.guest)
    t0 = time.monotonic()
    with c:
        _info(c, t0)
        print("vrdmavm: console of %s on this terminal (exit the shell or Ctrl-A x to quit)"
              % c[a.guest].name, file=sys.stderr)
        c[a.guest].qemu.wait()
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="vrdmavm.py", description="Boot vrdma test guests (QEMU + vrdma-backend, "
        "or Linux rxe) and run commands in them through the guest agent.",
        epilog="examples:\n"
        "  vrdmavm.py run -- ibv_devinfo\n"
        "  vrdmavm.py run -n 2 -k rxe -c '0&:ibv_rc_pingpong -g 1' "
        "-c '1:ibv_rc_pingpong -g 1 10.0.0.1'\n"
        "  vrdmavm.py boot -n 2 --repl          (type '1: rdma link')\n"
        "  vrdmavm.py shell -n 2 --guest 1     (guest 1's console here)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="sub", required=True)
    p = sub.add_parser("run", help="boot, run commands, print their output, stop",
                       description="Boot the guests, run the -c jobs in order, then COMMAND "
                       "on guest --on; exit status 1 if any failed.")
    _add_common(p)
    p.add_argument("-c", "--cmd", action="append", default=[],
                   help="'[N][&]:CMD': run CMD on guest N (default 0); with & in the "
                   "background (collected at the end). Repeatable, run in order.")
    p.add_argument("--on", type=int, default=0, help="guest for COMMAND (default 0)")
    p.add_argument("--timeout", type=float, default=120, help="per command (default 120 s)")
    p.add_argument("--bg-delay", type=float, default=1.0,
                   help="pause after starting a background job (default 1 s)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("boot", help="boot and wait (Ctrl-C stops), or --repl")
    _add_common(p)
    p.add_argument("--repl", action="store_true", help="read 'N: CMD' lines from stdin")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--timeout", type=float, default=120, help="per --repl command")
    p.set_defaults(func=cmd_boot)
    p = sub.add_parser("shell", help="a guest's console (root shell) on this terminal")
    _add_common(p)
    p.add_argument("--guest", type=int, default=0)
    p.set_defaults(func=cmd_shell)
    a = ap.parse_args(argv)
    if getattr(a, "command", None) and a.command[0] == "--":
        a.command = a.command[1:]
    try:
        return a.func(a)
    except VMError as e:
        print("vrdmavm: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
