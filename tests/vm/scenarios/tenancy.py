"""Tenants on one daemon (spec §16.3, issue 39): port security and tenant networks.

Topology three_vrdma_fabric_spare_device: three vrdma guests on one daemon's fabric, each
device with its address list (the
launcher's default `ip=`). A guest that claims a neighbour's IPv4 address (adds it to its
netdev, announces it with gratuitous ARP, runs an rdma_cm server on it) gets no connection and
no traffic for it: the client's neighbour entry stays the victim's and its rping reaches the
victim; the fabric counts the refused ARPs.

Topology four_vrdma_two_networks: four vrdma guests on one daemon, two tenant networks
(0: vm0, vm1; 5: vm2, vm3). No
ping, ARP or RDMA connection crosses networks; each guest reaches the other member of its own.
"""

import json
import re
import subprocess
import time

from harness import expect, expect_in, push_guest_script, run_ok, scenario, spawn_server
from vrdmavm import stats


def fabric_counters(vm):
    """The fabric's per-port drop counters from the shared daemon's operator socket (spec
    §16.5: a device's own stats socket shows that device only): ((port, reason) -> n, the
    socket's text)."""
    reading = stats.fabric_stats(vm.cluster)
    return reading.fabric_drops(), reading.text


def port_name(vm):
    """vm's port in the fabric's counters (its vhost-user socket's file stem)."""
    import os
    return os.path.splitext(os.path.basename(vm.vu_sock))[0]


@scenario("three_vrdma_fabric_spare_device", ci=True, timeout=240)
def claiming_a_neighbours_ip_gets_nothing(ctx):
    """A guest that claims a neighbour's IPv4 address (gratuitous ARP, an rdma_cm server on it)
    gets no connection and no traffic; the fabric counts the refused ARPs (spec §16.3)."""
    victim, client, attacker = ctx.a, ctx.b, ctx.c
    claim = push_guest_script([attacker], "claim_ip.py")
    before, _ = fabric_counters(victim)
    server = spawn_server(victim, "rping -s -a %s -v -C 3" % victim.ip, 120)
    run_ok(attacker, "ip addr add %s/32 dev eth0" % victim.ip)
    evil = None
    try:
        # The attacker's rdma_cm server on the claimed address (its kernel adds the GID).
        evil = spawn_server(attacker, "rping -s -a %s -v -C 3" % victim.ip, 120)
        # The client knows the victim (both guests answer its ARP request; the victim's
        # answer is the one that may arrive) ...
        run_ok(client, "ip neigh flush dev eth0")
        run_ok(client, "ping -c 2 -W 5 %s" % victim.ip, timeout=60)
        # ... and the attacker announces the address as its own once the kernel's ARP
        # locktime (1 s) has passed: Linux then updates an existing entry from a gratuitous
        # ARP, which is the attack.
        time.sleep(1.5)
        out = run_ok(attacker, "python3 %s eth0 %s 10" % (claim, victim.ip))
        expect_in("sent 10", out, "the attacker's gratuitous ARPs")
        run_ok(client, "ping -c 2 -W 5 %s" % victim.ip, timeout=60)
        neigh = run_ok(client, "ip neigh show %s" % victim.ip)
        expect(victim.mac in neigh and attacker.mac not in neigh,
               "the client's neighbour entry for %s is the victim's MAC %s" % (
                   victim.ip, victim.mac), neigh)
        rc, cout = client.run("rping -c -a %s -v -C 3" % victim.ip, timeout=60)
        expect(rc == 0 and len(re.findall(r"ping data: rdma-ping-\d+", cout)) == 3,
               "the client's rping to %s completes 3 pings" % victim.ip, cout)
        src, sout = server.wait(timeout=60)
        expect(src == 0 and "rdma-ping-2" in sout, "the victim's server served the pings", sout)
        expect(not evil.done(), "the attacker's rping server got no connection (still waiting)",
               evil.result.out if evil.done() else "")
    finally:
        if evil is not None:
            evil.kill()
        server.kill()
        attacker.run("ip addr del %s/32 dev eth0" % victim.ip)
    after, text = fabric_counters(victim)
    key = (port_name(attacker), "spoofed_arp")
    refused = after.get(key, 0) - before.get(key, 0)
    # The 10 gratuitous ARPs, plus the attacker kernel's answers to the client's ARP request.
    expect(refused >= 10, "the fabric refused the attacker's ARPs for %s (%d)" % (
        victim.ip, refused), text)
    ctx.note("fabric: %d ARP frames of %s refused (spoofed_arp)" % (refused, attacker.name))


def unreachable(vm, ip):
    """True if vm cannot ping ip and holds no neighbour address for it."""
    rc, out = vm.run("ping -c 2 -W 2 %s" % ip, timeout=30)
    neigh = run_ok(vm, "ip neigh show %s" % ip)
    return rc != 0 and "lladdr" not in neigh, out + neigh


@scenario("four_vrdma_two_networks", ci=True, timeout=300)
def tenant_networks_do_not_see_each_other(ctx):
    """Two tenant networks on one daemon: no ping, ARP or rping crosses them, each guest reaches
    its own network's peer (spec §16.3)."""
    a, b, c, d = ctx.a, ctx.b, ctx.c, ctx.d
    for vm in (a, b, c, d):
        run_ok(vm, "ip neigh flush dev eth0")
    # Each reaches the other member of its network.
    for x, y in ((a, b), (c, d)):
        run_ok(x, "ping -c 2 -W 5 %s" % y.ip, timeout=60)
    # No ping, no ARP answer across networks.
    for x, y in ((a, c), (b, d), (c, a), (d, b)):
        ok, out = unreachable(x, y.ip)
        expect(ok, "%s (network of %s) cannot reach %s" % (x.name, x.ip, y.ip), out)
    # RDMA: within a network rping works; across, the connection is never made.
    for (srv, cli) in ((a, b), (c, d)):
        s = spawn_server(srv, "rping -s -a %s -v -C 2" % srv.ip, 120)
        rc, out = cli.run("rping -c -a %s -v -C 2" % srv.ip, timeout=60)
        expect(rc == 0 and "rdma-ping-1" in out, "%s -> %s rping" % (cli.name, srv.name), out)
        s.wait(timeout=60)
    s = spawn_server(a, "rping -s -a %s -v -C 2" % a.ip, 120)
    try:
        rc, out = c.run("rping -c -a %s -v -C 2" % a.ip, timeout=60)
        expect(rc != 0 and "rdma-ping" not in out,
               "%s (network 5) cannot rping %s (network 0)" % (c.name, a.name), out)
        expect(not s.done(), "%s's rping server saw no client" % a.name,
               s.result.out if s.done() else "")
    finally:
        s.kill()
    _, text = fabric_counters(a)
    for vm, net in ((a, 0), (b, 0), (c, 5), (d, 5)):
        expect_in('vrdma_fabric_port_network{port="%s",kind="device",net="%d"} 1' % (
            port_name(vm), net), text, "the fabric's counters")


def vxlan_rx_packets(cluster, net):
    """Packets host B's VXLAN device of network `net` (VNI 10000+net) has received."""
    ns = cluster.network.host_netns[1]
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "vxlan%d" % net],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    return json.loads(out)[0]["stats64"]["rx"]["packets"]


@scenario("tenants_over_vxlan", ci=True, timeout=300)
def tenant_networks_cross_hosts_as_vnis(ctx):
    """A daemon's tenant networks leave the host as one VNI each (an uplink per network,
    spec §16.3): each vrdma guest pings and rpings the rxe guest of its network on the other
    host, whose traffic arrives on that network's VXLAN device; nothing crosses networks."""
    a, b, c, d = ctx.a, ctx.b, ctx.c, ctx.d
    for x, y, net in ((a, c, 5), (b, d, 6)):
        before = vxlan_rx_packets(ctx.cluster, net)
        run_ok(x, "ping -c 3 -W 5 %s" % y.ip, timeout=60)
        got = vxlan_rx_packets(ctx.cluster, net) - before
        expect(got >= 3, "host B's vxlan%d (VNI %d) received %s's pings (%d packets)" % (
            net, 10000 + net, x.name, got))
    for x, y in ((a, d), (b, c), (c, b), (d, a)):
        ok, out = unreachable(x, y.ip)
        expect(ok, "%s cannot reach %s of another network" % (x.name, y.name), out)
    # rdma_cm between vrdma and rxe across the hosts, within each network.
    for srv, cli in ((a, c), (d, b)):
        s = spawn_server(srv, "rping -s -a %s -v -C 3" % srv.ip, 120)
        rc, out = cli.run("rping -c -a %s -v -C 3" % srv.ip, timeout=90)
        expect(rc == 0 and "rdma-ping-2" in out, "%s -> %s rping" % (cli.name, srv.name), out)
        s.wait(timeout=60)
