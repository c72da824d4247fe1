"""A set of guests on one network: start them, stop them and clean up after them."""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import guest_images

from .errors import VMError
from .networks import NETWORKS, UPLINKS
from .paths import default_paths
from .process import child_setup, stop, tail
from .vm import VM


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
                 image=None, own_backend=()):
        kinds = [kind] * n if isinstance(kind, str) else list(kind)
        if len(kinds) != n:
            raise ValueError("need one kind per guest")
        # image: the guest OS of every guest, or a list of one per guest (None in it: the
        # kernel and initrd given here); names from images/guest_images.py
        images = [image] * n if image is None or isinstance(image, str) else list(image)
        if len(images) != n:
            raise ValueError("need one image per guest")
        if uplink not in UPLINKS:
            raise ValueError("uplink must be one of %s" % (UPLINKS,))
        self.network = NETWORKS[uplink](kinds)
        shared = self.network.shared_daemon
        # nets: the fabric's tenant network of each guest (spec §16.3), default all 0
        if nets is not None and (len(nets) != n or not shared):
            raise ValueError("nets: one network per guest, on a fabric uplink only")
        self.nets = None if nets is None else [int(x) for x in nets]
        # spare_devices: devices of the shared daemon that no QEMU uses, for a test program
        # to connect to as a frontend (their sockets: .spare_sockets)
        if spare_devices and not shared:
            raise ValueError("spare_devices: on a fabric uplink only")
        self.spare_devices = int(spare_devices)
        # own_backend: indices of vrdma guests that, on a fabric+tap network, get a backend
        # of their own on their own TAP of the bridge the shared daemon's uplink is on (as on
        # a tap network), instead of a device of the shared daemon: such a guest can migrate
        # (VM.migrate) while its peers stay on the fabric
        own = set(int(i) for i in own_backend)
        if own and uplink != "fabric+tap":
            raise ValueError("own_backend: on a fabric+tap uplink only")
        if any(i < 0 or i >= n or kinds[i] != "vrdma" for i in own):
            raise ValueError("own_backend: indices of vrdma guests")
        p = default_paths()
        self.qemu = qemu or p["qemu"]
        self.kernel = kernel or p["kernel"]
        self.initrd = initrd or p["initrd"]
        self.backend = backend or p["backend"]
        self.backend_args, self.qemu_args = tuple(backend_args), tuple(qemu_args)
        self.kvm = (os.environ.get("VRDMA_KVM") == "1") if kvm is None else kvm
        self.mem, self.smp, self.machine, self.append = mem, smp, machine, append
        self.uplink, self.boot_timeout, self.lifetime = uplink, boot_timeout, lifetime
        self.fabric_backend = None
        self.rust_log, self.shell = rust_log, shell
        # > 0: every vrdma backend captures its port to capture-<i>.pcap, at most this many bytes
        self.pcap = pcap
        self.keep = (os.environ.get("VRDMA_KEEP") == "1") if keep is None else keep
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="vrdma-run-")
        os.makedirs(self.workdir, exist_ok=True)
        self.fabric_log = os.path.join(self.workdir, "backend-fabric.log")
        self.vms = [VM(self, i, k, g) for i, (k, g) in enumerate(zip(kinds, images))]
        for i in own:
            self.vms[i].own_backend = True
        if shared:
            for vm in self.vms:
                if self.on_fabric(vm):
                    vm.backend_log = self.fabric_log
                    vm.pcap = os.path.join(self.workdir, "capture-fabric.pcap")
        self._closed = False
        self._old_handlers = {}
        self._timer = None

    def on_fabric(self, vm):
        """Is vm a device of the shared daemon?"""
        return self.network.shared_daemon and vm.kind == "vrdma" and not vm.own_backend

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

    def start(self):
        """Start every backend and QEMU, then wait until every agent answers."""
        self._check_files()
        self._install_signals()
        atexit.register(self.close)
        try:
            self.network.setup(self.vms)
            if self.network.shared_daemon:
                self.start_fabric_backend()
            for vm in self.vms:
                if vm.kind == "vrdma" and not self.on_fabric(vm):
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
            if self.on_fabric(vm):
                spec = "socket=%s,mac=%s,ip=%s" % (vm.vu_sock, vm.mac, vm.ip)
                if self.nets is not None:
                    spec += ",net=%d" % self.nets[vm.index]
                cmd += ["--device", spec]
        for i, sock in enumerate(self.spare_sockets):
            # MACs beyond the guests' (52:54:00:76:72:<index+1>)
            cmd += ["--device", "socket=%s,mac=52:54:00:76:73:%02x" % (sock, i + 1)]
        cmd += self.network.daemon_uplink()
        # The fabric's per-port counters are only on the operator socket (spec §16.5).
        cmd += ["--stats-socket", self.fabric_stats]
        cmd += list(self.backend_args)
        if self.pcap:
            cmd += ["--pcap", os.path.join(self.workdir, "capture-fabric.pcap"),
                    "--pcap-max-bytes", str(self.pcap)]
        if self.network.netns:
            cmd = ["ip", "netns", "exec", self.network.netns] + cmd
        return cmd

    def start_fabric_backend(self):
        """Start the daemon that serves every vrdma guest (no-op while it runs); each vrdma
        VM's .backend is that process."""
        proc = self.fabric_backend
        if proc is None or proc.poll() is not None:
            env = dict(os.environ)
            env["RUST_LOG"] = self.rust_log or env.get("RUST_LOG") or "info"
            socks = [vm.vu_sock for vm in self.vms if self.on_fabric(vm)] + self.spare_sockets
            for s in socks:
                try:
                    os.unlink(s)
                except OSError:
                    pass
            with open(self.fabric_log, "ab") as log:
                proc = subprocess.Popen(
                    self.fabric_backend_cmd(), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                    preexec_fn=child_setup)
            self.fabric_backend = proc
            deadline = time.monotonic() + 20
            while not all(os.path.exists(s) for s in socks):
                if proc.poll() is not None:
                    raise VMError("fabric backend exited with %s:\n%s" % (
                        proc.returncode, tail(self.fabric_log)))
                if time.monotonic() > deadline:
                    raise VMError("fabric backend did not create %s:\n%s" % (
                        " ".join(socks), tail(self.fabric_log)))
                time.sleep(0.02)
        for vm in self.vms:
            if self.on_fabric(vm):
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
        stop(self.fabric_backend)
        self.network.teardown()
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

