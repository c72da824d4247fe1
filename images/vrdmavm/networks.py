"""How the guests' Ethernet meets: one class per uplink kind (Cluster(uplink=...)).

  fabric  (the default) every vrdma guest is a device of ONE vrdma-backend
       process (--device socket=vu-<i>.sock,mac=<mac>, repeated; log
       backend-fabric.log, capture capture-fabric.pcap), whose in-process
       switch links them. At most one other guest (rxe) joins through the
       daemon's UDP uplink (--uplink udp:..., the guest's -netdev dgram).
       Cluster(spare_devices=N) adds N devices no QEMU uses (sockets
       spare-<i>.sock, .spare_sockets), for a test program to connect to.
  fabric+tap  the same daemon, its uplink a TAP (vrtapf) on a Linux bridge in
       a network namespace, where other guests get their own TAPs (as tap);
       so do vrdma guests with a backend of their own (Cluster own_backend=),
       which can migrate as on tap.
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
  fabric+vxlan  tenant networks between hosts (spec §16.3): the daemon on host A with
       one TAP uplink per network N of its guests (tap:vrtapf<N>,net=N), on a
       bridge br<N> with a VXLAN device of VNI 10000+N; host B has the same
       bridge and VXLAN device per network, each other guest's TAP on its
       network's bridge. Needs nets=.
"""

import os
import random
import socket
import subprocess

from .errors import VMError

FABRIC_TAP = "vrtapf"  # the fabric daemon's TAP with uplink fabric+tap


def ip(*args, check=True):
    """Run `ip ARGS...`; VMError with its output when it fails (and check)."""
    r = subprocess.run(["ip"] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if check and r.returncode:
        raise VMError("ip %s: %s" % (" ".join(args), r.stdout.strip()))
    return r


def free_udp_ports(n):
    """n UDP ports on 127.0.0.1 that were free a moment ago."""
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


def udp_uplink(local, remote):
    """A backend's --uplink value for a point-to-point UDP link on 127.0.0.1."""
    return "udp:local=127.0.0.1:%d,remote=127.0.0.1:%d" % (local, remote)


def add_tap(netns, name):
    """A TAP in `netns`, enslaved to its bridge br0 and up."""
    ip("-n", netns, "tuntap", "add", "dev", name, "mode", "tap")
    ip("-n", netns, "link", "set", name, "master", "br0", "up")


def add_host(netns, addr):
    """A namespace standing for a host: loopback and a bridge br0 with address `addr`."""
    ip("netns", "add", netns)
    n = ["-n", netns]
    ip(*n, "link", "set", "lo", "up")
    ip(*n, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0")
    ip(*n, "addr", "add", addr, "dev", "br0")
    ip(*n, "link", "set", "br0", "up")


def namespace_tag():
    """A name for this cluster's namespaces, unique among concurrent launchers."""
    return "vrdma-%d-%04x" % (os.getpid(), random.getrandbits(16))


class Network:
    """The guests' Ethernet of one cluster: what setup() builds on the host, and what each
    guest's backend and QEMU are told about it."""

    name = ""
    # Every vrdma guest is a device of one daemon, linked by its in-process fabric.
    shared_daemon = False
    # A vrdma guest with its own backend on a TAP can move to a new QEMU, backend and TAP
    # on the same bridge (VM.migrate).
    supports_migration = False

    def __init__(self, kinds):
        self.check(kinds)
        self.netns = None  # the namespace of the guests' host side (None: the caller's)
        self.host_netns = []  # vxlan: one namespace per host

    def check(self, kinds):
        """Raise ValueError if this network cannot link guests of these kinds."""

    def setup(self, vms):
        """Build the host side (namespaces, bridges, TAPs, UDP ports) before anything starts."""

    def teardown(self):
        """Remove what setup() built; idempotent."""
        for ns in self.namespaces():
            ip("netns", "del", ns, check=False)
        self.netns, self.host_netns = None, []

    def namespaces(self):
        return [self.netns] if self.netns else list(self.host_netns)

    def netns_of(self, vm):
        """The network namespace of vm's host side (None: the caller's)."""
        return self.netns

    def backend_uplink(self, vm):
        """The --uplink of vm's own backend (networks without a shared daemon)."""
        raise VMError("%s: a %s network has no backend per guest" % (vm.name, self.name))

    def rxe_netdev(self, vm):
        """QEMU's -netdev for an rxe guest's virtio-net NIC."""
        raise NotImplementedError

    def daemon_uplink(self):
        """The shared daemon's --uplink arguments ([] when it has none)."""
        return []


def dgram_netdev(vm):
    """-netdev for an rxe guest on a point-to-point UDP link (its ports set by setup())."""
    return ("dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=%d,"
            "remote.type=inet,remote.host=127.0.0.1,remote.port=%d"
            % (vm.local_port, vm.remote_port))


class Fabric(Network):
    """The vrdma guests on one daemon's fabric; one other guest on its UDP uplink."""

    name = "fabric"
    shared_daemon = True

    def __init__(self, kinds):
        super().__init__(kinds)
        self.daemon_udp = None  # (daemon port, guest port) of the fabric's UDP uplink

    def check(self, kinds):
        if sum(k not in ("vrdma", "none") for k in kinds) > 1:
            raise ValueError("the fabric's UDP uplink links one other guest; use 'fabric+tap'")

    def setup(self, vms):
        others = [vm for vm in vms if vm.kind not in ("vrdma", "none")]
        if others:
            ports = free_udp_ports(2)
            self.daemon_udp = (ports[0], ports[1])
            others[0].local_port, others[0].remote_port = ports[1], ports[0]

    def rxe_netdev(self, vm):
        return dgram_netdev(vm)

    def daemon_uplink(self):
        if self.daemon_udp:
            return ["--uplink", udp_uplink(*self.daemon_udp)]
        return []


class Udp(Network):
    """Two guests point to point over UDP on 127.0.0.1."""

    name = "udp"

    def check(self, kinds):
        if len(kinds) > 2 and any(k != "none" for k in kinds):
            raise ValueError("the udp uplink links exactly two guests; use uplink='tap'")

    def setup(self, vms):
        # one guest: its remote port is a free port nobody listens on
        ports = free_udp_ports(2)
        for i, vm in enumerate(vms):
            vm.local_port = ports[i]
            vm.remote_port = ports[1 - i]

    def backend_uplink(self, vm):
        return udp_uplink(vm.local_port, vm.remote_port)

    def rxe_netdev(self, vm):
        return dgram_netdev(vm)


class BridgedNetwork(Network):
    """Guests' host sides on TAPs (vrtap<i>) on a Linux bridge br0 in a namespace."""

    def make_hosts(self):
        """Create the namespaces and their bridges."""
        raise NotImplementedError

    def needs_own_tap(self, vm):
        return vm.kind != "none"

    def setup(self, vms):
        self.make_hosts()
        for vm in vms:
            if self.needs_own_tap(vm):
                add_tap(self.netns_of(vm), vm.tap)

    def backend_uplink(self, vm):
        return "tap:" + vm.tap

    def rxe_netdev(self, vm):
        return "tap,id=n0,ifname=%s,script=no,downscript=no" % vm.tap


class Tap(BridgedNetwork):
    """Every guest on one bridge in one namespace, each vrdma guest with its own backend."""

    name = "tap"
    supports_migration = True

    def make_hosts(self):
        self.netns = namespace_tag()
        add_host(self.netns, "10.0.0.254/24")


class FabricTap(BridgedNetwork):
    """The vrdma guests on one daemon's fabric, whose uplink is a TAP on the bridge of the
    other guests."""

    name = "fabric+tap"
    shared_daemon = True

    def make_hosts(self):
        self.netns = namespace_tag()
        add_host(self.netns, "10.0.0.254/24")

    def needs_own_tap(self, vm):
        return vm.kind not in ("none", "vrdma") or vm.own_backend

    def setup(self, vms):
        super().setup(vms)
        add_tap(self.netns, FABRIC_TAP)

    def daemon_uplink(self):
        return ["--uplink", "tap:" + FABRIC_TAP]


class Vxlan(BridgedNetwork):
    """Two hosts (namespaces with a bridge each) joined by VXLAN over a veth underlay; guest
    i lives on host i % 2."""

    name = "vxlan"
    supports_migration = True

    def make_hosts(self):
        # Two hosts, an underlay link between them and a VXLAN segment bridged on each.
        tag = namespace_tag()
        self.host_netns = [tag + "-a", tag + "-b"]
        for i, ns in enumerate(self.host_netns):
            add_host(ns, "10.0.0.%d/24" % (253 - i))
        a, b = self.host_netns
        ip("link", "add", "vrul0", "netns", a, "type", "veth", "peer", "vrul1", "netns", b)
        for i, ns in enumerate(self.host_netns):
            n, dev = ["-n", ns], "vrul%d" % i
            ip(*n, "link", "set", dev, "mtu", "1550", "up")
            ip(*n, "addr", "add", "192.168.42.%d/24" % (i + 1), "dev", dev)
            ip(*n, "link", "add", "vxlan42", "type", "vxlan", "id", "42", "dstport", "4789",
               "local", "192.168.42.%d" % (i + 1), "remote", "192.168.42.%d" % (2 - i),
               "dev", dev)
            ip(*n, "link", "set", "vxlan42", "mtu", "1500", "master", "br0", "up")

    def netns_of(self, vm):
        if self.host_netns:
            return self.host_netns[vm.index % len(self.host_netns)]
        return self.netns


def vni_of(net):
    """The VXLAN network identifier that carries tenant network (VLAN) `net` between hosts."""
    return 10000 + net


class FabricVxlan(FabricTap):
    """Tenant networks across hosts: host A runs the daemon with one TAP uplink per network
    (`--uplink tap:vrtapf<N>,net=N`), each on a bridge br<N> with a VXLAN device of VNI
    10000+N; host B, the other guests' host, has the same bridge and VXLAN device per network,
    and each guest's TAP on its network's bridge. (A single trunk TAP with `vlans=` would need
    802.1Q in the host kernel, which this development host lacks.)"""

    name = "fabric+vxlan"

    def check(self, kinds):
        if "vrdma" not in kinds:
            raise ValueError("fabric+vxlan: the fabric needs a vrdma guest")

    def namespaces(self):
        return list(self.host_netns)

    def netns_of(self, vm):
        return self.host_netns[1] if vm.kind not in ("vrdma", "none") else self.netns

    def setup(self, vms):
        nets = vms[0].cluster.nets or [0] * len(vms)
        self.fabric_nets = sorted({nets[vm.index] for vm in vms if vm.kind == "vrdma"})
        tag = namespace_tag()
        a, b = tag + "-a", tag + "-b"
        self.netns, self.host_netns = a, [a, b]
        for ns in (a, b):
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", "vrul0", "netns", a, "type", "veth", "peer", "vrul1", "netns", b)
        for i, ns in enumerate((a, b)):
            ip("-n", ns, "link", "set", "vrul%d" % i, "mtu", "1550", "up")
            ip("-n", ns, "addr", "add", "192.168.42.%d/24" % (i + 1), "dev", "vrul%d" % i)
        for net in sorted(set(nets)):
            for i, ns in enumerate((a, b)):
                n, br, vx = ["-n", ns], "br%d" % net, "vxlan%d" % net
                ip(*n, "link", "add", br, "type", "bridge", "forward_delay", "0",
                   "stp_state", "0")
                ip(*n, "link", "set", br, "up")
                ip(*n, "link", "add", vx, "type", "vxlan", "id", str(vni_of(net)), "dstport",
                   "4789", "local", "192.168.42.%d" % (i + 1), "remote",
                   "192.168.42.%d" % (2 - i), "dev", "vrul%d" % i)
                ip(*n, "link", "set", vx, "mtu", "1500", "master", br, "up")
        for net in self.fabric_nets:
            tap_on_bridge(a, "%s%d" % (FABRIC_TAP, net), "br%d" % net)
        for vm in vms:
            if vm.kind not in ("vrdma", "none"):
                tap_on_bridge(b, vm.tap, "br%d" % nets[vm.index])

    def daemon_uplink(self):
        out = []
        for net in self.fabric_nets:
            out += ["--uplink", "tap:%s%d,net=%d" % (FABRIC_TAP, net, net)]
        return out


def tap_on_bridge(netns, tap, bridge):
    """A TAP in `netns`, enslaved to `bridge` and up."""
    ip("-n", netns, "tuntap", "add", "dev", tap, "mode", "tap")
    ip("-n", netns, "link", "set", tap, "master", bridge, "up")


# Cluster(uplink=...) -> its network class, in the order --help lists them.
NETWORKS = {cls.name: cls for cls in (Fabric, FabricTap, Udp, Tap, Vxlan, FabricVxlan)}
UPLINKS = tuple(NETWORKS)
