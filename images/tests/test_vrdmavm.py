"""Offline tests of the launcher: command lines, topology, job parsing, and
the agent protocol against a local agent process (no VM, no QEMU)."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import vrdmavm  # noqa: E402
import vrdmavm.agent  # noqa: E402
import vrdmavm.cli  # noqa: E402
import vrdmavm.stats  # noqa: E402


def opt(cmd, flag):
    """Values following flag in an argv list."""
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


class CommandLines(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="vrdmavm-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def cluster(self, **kw):
        kw.setdefault("workdir", self.tmp)
        kw.setdefault("kvm", False)
        return vrdmavm.Cluster(qemu="/q", kernel="/k", initrd="/i", backend="/b", **kw)

    def test_vrdma_pair_udp(self):
        c = self.cluster(n=2, kind="vrdma", uplink="udp")
        c.network.setup(c.vms)
        a, b = c.vms
        self.assertEqual((a.local_port, a.remote_port), (b.remote_port, b.local_port))
        self.assertNotEqual(a.mac, b.mac)
        self.assertEqual((a.ip, b.ip), ("10.0.0.1", "10.0.0.2"))
        bc = a.backend_cmd()
        self.assertEqual(bc[0], "/b")
        self.assertEqual(opt(bc, "--mac"), [a.mac])
        self.assertEqual(opt(bc, "--socket-path"), [a.vu_sock])
        self.assertEqual(opt(bc, "--uplink"), [
            "udp:local=127.0.0.1:%d,remote=127.0.0.1:%d" % (a.local_port, a.remote_port)])
        q = a.qemu_cmd()
        self.assertIn("vhost-user-rdma-pci,chardev=vu", opt(q, "-device"))
        self.assertIn("memory-backend-memfd,id=mem,size=1G,share=on", opt(q, "-object"))
        self.assertEqual(opt(q, "-accel"), ["tcg,thread=multi"])
        self.assertIn("vrdmavm.role=vrdma", opt(q, "-append")[0])
        self.assertIn("vrdmavm.ip=10.0.0.1/24", opt(q, "-append")[0])
        self.assertEqual(q[0], "/q")  # QEMU stays in the host netns

    def test_mixed_udp_rxe_uses_dgram(self):
        c = self.cluster(n=2, kind=["vrdma", "rxe"], uplink="udp")
        c.network.setup(c.vms)
        q = c[1].qemu_cmd()
        net = opt(q, "-netdev")[0]
        self.assertTrue(net.startswith("dgram,"))
        self.assertIn("local.port=%d" % c[1].local_port, net)
        self.assertIn("remote.port=%d" % c[0].local_port, net)
        self.assertIn("virtio-net-pci,netdev=n0,mac=%s,romfile=" % c[1].mac, opt(q, "-device"))

    def test_fabric_is_the_default_one_daemon_for_every_vrdma_guest(self):
        c = self.cluster(n=3, kind=["vrdma", "vrdma", "rxe"], pcap=1000)
        self.assertEqual(c.uplink, "fabric")
        c.network.setup(c.vms)
        bc = c.fabric_backend_cmd()
        self.assertEqual(bc[0], "/b")
        self.assertEqual(opt(bc, "--device"), [
            "socket=%s,mac=%s,ip=%s" % (vm.vu_sock, vm.mac, vm.ip) for vm in c.vms[:2]])
        self.assertNotIn("--socket-path", bc)
        d, g = c.network.daemon_udp
        self.assertEqual(opt(bc, "--uplink"), [
            "udp:local=127.0.0.1:%d,remote=127.0.0.1:%d" % (d, g)])
        net = opt(c[2].qemu_cmd(), "-netdev")[0]
        self.assertIn("local.port=%d" % g, net)
        self.assertIn("remote.port=%d" % d, net)
        self.assertEqual(opt(bc, "--pcap"), [os.path.join(self.tmp, "capture-fabric.pcap")])
        self.assertEqual(opt(bc, "--stats-socket"), [os.path.join(self.tmp, "fabric.stats")])
        self.assertEqual(c[0].backend_log, c[1].backend_log)
        with self.assertRaises(ValueError):
            self.cluster(n=3, kind=["vrdma", "rxe", "rxe"])

    def test_killing_the_fabric_daemon_is_seen_by_every_vrdma_guest(self):
        c = self.cluster(n=2, kind="vrdma")
        proc = subprocess.Popen(["sleep", "30"])
        for vm in c.vms:
            vm.backend = proc
        c[0].kill_backend()
        self.assertIsNotNone(proc.poll())
        self.assertEqual([vm.backend for vm in c.vms], [None, None])

    def test_fabric_tap_commands(self):
        c = self.cluster(n=3, kind=["vrdma", "vrdma", "rxe"], uplink="fabric+tap")
        c.network.netns = "vrdma-test"  # as network.setup would
        bc = c.fabric_backend_cmd()
        self.assertEqual(bc[:4], ["ip", "netns", "exec", "vrdma-test"])
        self.assertEqual(opt(bc, "--uplink"), ["tap:" + vrdmavm.FABRIC_TAP])
        self.assertEqual(len(opt(bc, "--device")), 2)
        q2 = c[2].qemu_cmd()
        self.assertEqual(opt(q2, "-netdev"), ["tap,id=n0,ifname=vrtap2,script=no,downscript=no"])

    def test_fabric_networks(self):
        c = self.cluster(n=3, kind="vrdma", nets=[0, 0, 7])
        c.network.setup(c.vms)
        self.assertEqual(opt(c.fabric_backend_cmd(), "--device"), [
            "socket=%s,mac=%s,ip=%s,net=%d" % (vm.vu_sock, vm.mac, vm.ip, n)
            for vm, n in zip(c.vms, [0, 0, 7])])
        with self.assertRaises(ValueError):
            self.cluster(n=3, kind="vrdma", nets=[0, 1])
        with self.assertRaises(ValueError):
            self.cluster(n=2, kind="vrdma", uplink="tap", nets=[0, 1])

    def test_udp_needs_two(self):
        with self.assertRaises(ValueError):
            self.cluster(n=3, kind="vrdma", uplink="udp")

    def test_tap_commands(self):
        c = self.cluster(n=3, kind=["vrdma", "rxe", "vrdma"], uplink="tap")
        c.network.netns = "vrdma-test"  # as network.setup would
        self.assertEqual(c[0].backend_cmd()[:4], ["ip", "netns", "exec", "vrdma-test"])
        self.assertEqual(opt(c[0].backend_cmd(), "--uplink"), ["tap:vrtap0"])
        self.assertEqual(c[0].qemu_cmd()[0], "/q")
        q1 = c[1].qemu_cmd()
        self.assertEqual(q1[:4], ["ip", "netns", "exec", "vrdma-test"])
        self.assertEqual(opt(q1, "-netdev"), ["tap,id=n0,ifname=vrtap1,script=no,downscript=no"])

    def test_vxlan_commands(self):
        c = self.cluster(n=2, kind=["vrdma", "rxe"], uplink="vxlan")
        c.network.host_netns = ["h-a", "h-b"]  # as network.setup would
        self.assertEqual(c[0].backend_cmd()[:4], ["ip", "netns", "exec", "h-a"])
        self.assertEqual(opt(c[0].backend_cmd(), "--uplink"), ["tap:vrtap0"])
        q1 = c[1].qemu_cmd()
        self.assertEqual(q1[:4], ["ip", "netns", "exec", "h-b"])
        self.assertEqual(opt(q1, "-netdev"), ["tap,id=n0,ifname=vrtap1,script=no,downscript=no"])

    def test_kvm_opt_in(self):
        c = self.cluster(n=1, kind="none", kvm=True)
        q = c[0].qemu_cmd()
        self.assertEqual(opt(q, "-accel"), ["kvm"])
        self.assertNotIn("vrdmavm.ip", opt(q, "-append")[0])

    def test_missing_files(self):
        c = self.cluster(n=1, kind="vrdma")
        with self.assertRaises(vrdmavm.VMError):
            c.start()

    def test_parse_job(self):
        p = vrdmavm.cli.parse_job
        self.assertEqual(p("1:ls"), (1, False, "ls"))
        self.assertEqual(p("0&:srv"), (0, True, "srv"))
        self.assertEqual(p("&:srv"), (0, True, "srv"))
        self.assertEqual(p("echo a:b"), (0, False, "echo a:b"))


class StatsText(unittest.TestCase):
    """The stats reader on a device's and a fabric's exposition text."""

    DEVICE = """# HELP vrdma_port_rx_engine_frames_total Frames.
# TYPE vrdma_port_rx_engine_frames_total counter
vrdma_port_rx_engine_frames_total{device="vm0"} 12
vrdma_port_tx_frames_total{device="vm0"} 7
vrdma_port_drops_total{device="vm0",reason="bad_address"} 3
vrdma_port_drops_total{device="vm0",reason="malformed"} 0
vrdma_port_queue_depth{device="vm0",queue="rx"} 2
vrdma_build_info 1
"""
    FABRIC = """vrdma_fabric_drops_total{port="vu-0",kind="device",reason="spoofed"} 4
vrdma_fabric_drops_total{port="vrtapf",kind="uplink",reason="foreign_source"} 1
vrdma_fabric_frames_total{port="vu-0",kind="device"} 9
"""

    def test_device_counters(self):
        s = vrdmavm.stats.Stats(self.DEVICE)
        self.assertEqual(s.port_counters(), {"vrdma_port_rx_engine_frames_total": 12,
                                             "vrdma_port_tx_frames_total": 7})
        self.assertEqual(s.port_drops(), {"drops_bad_address": 3, "drops_malformed": 0})
        self.assertEqual(s.frame_counters(), {
            'vrdma_port_rx_engine_frames_total{device="vm0"}': 12,
            'vrdma_port_tx_frames_total{device="vm0"}': 7,
            'vrdma_port_queue_depth{device="vm0",queue="rx"}': 2})

    def test_fabric_counters(self):
        s = vrdmavm.stats.Stats(self.FABRIC)
        self.assertEqual(s.fabric_drops(), {("vu-0", "spoofed"): 4,
                                            ("vrtapf", "foreign_source"): 1})
        self.assertEqual(s.fabric_drops_total(), 5)
        self.assertEqual(s.frame_counters(),
                         {'vrdma_fabric_frames_total{port="vu-0",kind="device"}': 9})


class AgentProtocol(unittest.TestCase):
    """The real guest agent on a socketpair, driven by the launcher's VM."""

    def setUp(self):
        host, guest = socket.socketpair()
        agent = os.path.join(os.path.dirname(HERE), "guest", "vrdma-agent")
        self.proc = subprocess.Popen([sys.executable, agent, "fd:%d" % guest.fileno()],
                                     pass_fds=[guest.fileno()], stderr=subprocess.DEVNULL)
        guest.close()
        self.tmp = tempfile.mkdtemp(prefix="vrdmavm-test-")
        c = vrdmavm.Cluster(n=1, kind="none", workdir=self.tmp, kvm=False)
        self.vm = c[0]
        conn = vrdmavm.agent.AgentConnection("socketpair", "vm0")
        conn.sock = host
        conn.reader = threading.Thread(target=conn._read, daemon=True)
        conn.reader.start()
        self.vm.agent = conn
        self.vm._alive = lambda: self.proc.poll() is None

    def tearDown(self):
        self.vm.agent.close()
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_run_spawn_timeout(self):
        vm = self.vm
        self.assertEqual(vm.run("echo hi; echo err >&2; exit 3", timeout=10), (3, "hi\nerr\n"))
        r = vm.exec("echo o; echo e >&2", merge=False, timeout=10)
        self.assertEqual((r.rc, r.out, r.err), (0, "o\n", "e\n"))
        h = vm.spawn("read x; echo got $x", stdin="42\n", timeout=10)
        self.assertEqual(vm.run("echo meanwhile", timeout=10), (0, "meanwhile\n"))
        self.assertEqual(h.wait(10), (0, "got 42\n"))
        with self.assertRaises(vrdmavm.CommandTimeout):
            vm.run("sleep 30", timeout=1)
        h = vm.spawn("sleep 30")
        h.kill()
        self.assertEqual(h.wait(10)[0], -15)
        path = os.path.join(self.tmp, "f")
        vm.write_file(path, b"\x00data", mode=0o600)
        self.assertEqual(vm.read_file(path), b"\x00data")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        with self.assertRaises(vrdmavm.VMError):
            vm.read_file("/nonexistent/file")


if __name__ == "__main__":
    unittest.main()
