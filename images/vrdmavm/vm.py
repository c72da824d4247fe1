"""One guest: its QEMU, its backend (vrdma kind) and its agent connection.

Guest i (0-based) gets MAC 52:54:00:76:72:<i+1>, IP 10.0.0.<i+1>/24, hostname vm<i>,
kernel command line vrdmavm.role=<kind> vrdmavm.ip=<ip> vrdmavm.hostname=vm<i>, and files
in the run directory: serial-<i>.log (console), qemu-<i>.log, backend-<i>.log (vrdma
guests with their own backend), agent-<i>.sock, qmp-<i>.sock, vu-<i>.sock,
capture-<i>.pcap (with pcap=N: the backend's --pcap, at most N bytes).
"""

import base64
import os
import subprocess
import threading
import time

import guest_images

from . import migration
from .agent import AGENT_PORT, AgentConnection, Handle, Result
from .cpu_limit import CpuLimit
from .errors import CommandTimeout, VMError
from .process import child_setup, stop, tail

# vrdma: QEMU's vhost-user-rdma-pci device served by a vrdma-backend process;
# rxe: a virtio-net NIC with Linux's soft-RoCE (rdma_rxe, device rxe0);
# none: no network, no RDMA (agent only).
KINDS = ("vrdma", "rxe", "none")
# How often QEMU tries to reach a vrdma backend that went away (-chardev reconnect-ms).
RECONNECT_MS = 250


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
        # a vrdma guest with its own backend on a shared daemon's network (Cluster own_backend)
        self.own_backend = False
        self.qemu = self.backend = None
        self.agent = None
        self.boot_time = None
        self.init_log = ""  # what the guest's init said (/run/vrdmavm-init.log)

    # ---- start
    @property
    def netns(self):
        """The network namespace of this guest's host side (None: the caller's)."""
        return self.cluster.network.netns_of(self)

    def backend_cmd(self):
        c = self.cluster
        cmd = [c.backend, "--socket-path", self.vu_sock, "--mac", self.mac,
               "--uplink", c.network.backend_uplink(self)] + list(c.backend_args)
        if c.pcap:
            cmd += ["--pcap", self.pcap, "--pcap-max-bytes", str(c.pcap)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        return cmd

    def start_backend(self):
        """Start this guest's vrdma-backend (a device of the shared daemon: that daemon, unless
        it runs)."""
        c = self.cluster
        if c.on_fabric(self):
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
                preexec_fn=child_setup)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.vu_sock):
            if self.backend.poll() is not None:
                raise VMError("%s: backend exited with %s:\n%s" % (
                    self.name, self.backend.returncode, tail(self.backend_log)))
            if time.monotonic() > deadline:
                raise VMError("%s: backend did not create %s:\n%s" % (
                    self.name, self.vu_sock, tail(self.backend_log)))
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
            cmd += ["-netdev", c.network.rxe_netdev(self),
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
                start_new_session=not interactive, preexec_fn=child_setup)
        self._t_start = time.monotonic()

    def _alive(self):
        return self.qemu is not None and self.qemu.poll() is None and (
            self.backend is None or self.backend.poll() is None)

    def _why_dead(self):
        msg = []
        if self.qemu is not None and self.qemu.poll() is not None:
            msg.append("QEMU exited with %s:\n%s" % (self.qemu.returncode, tail(self.qemu_log)))
        if self.backend is not None and self.backend.poll() is not None:
            msg.append("backend exited with %s:\n%s" % (
                self.backend.returncode, tail(self.backend_log)))
        msg.append("console (tail):\n" + tail(self.serial_log))
        return "%s: %s" % (self.name, "\n".join(msg))

    def wait_agent(self, deadline):
        """Connect to the agent and wait for its first answer."""
        self.agent = AgentConnection(self.agent_sock, self.name)
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
                    self.name, "console (tail):\n" + tail(self.serial_log)))
        if "error" in box:
            raise VMError("%s: agent: %s\n%s" % (self.name, box["error"], tail(self.serial_log)))
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
        return tail(self.serial_log, 10 ** 9)

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
        """Live-migrate this guest to a new QEMU and backend (see migration.migrate)."""
        return migration.migrate(self, timeout)

    def limit_cpu(self, cores):
        """Give this guest's QEMU at most `cores` CPUs (a fraction of one core is fine) until
        the returned CpuLimit is closed (a context manager)."""
        if self.qemu is None or self.qemu.poll() is not None:
            raise VMError("%s: QEMU is not running" % self.name)
        name = "vrdma-%s-%s" % (os.path.basename(self.cluster.workdir), self.name)
        return CpuLimit(name, [self.qemu.pid], cores)

    def stop(self):
        if self.agent:
            self.agent.close()
        stop(self.qemu)
        stop(self.backend)

