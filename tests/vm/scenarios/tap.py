"""Topology two_vrdma_tap: the same RDMA over TAP devices on a bridge in a network namespace."""

import os
import re
import shutil
import subprocess
import time

import vrdmavm

from harness import expect, expect_in, pair, roce_v2_gid_index, run_ok, scenario


@scenario("two_vrdma_tap", ci=True)
def tap_rc_pingpong(ctx):
    """`ibv_rc_pingpong -c`, 16 KiB messages, over the backends' TAP uplinks on the bridge."""
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    srv = "ibv_rc_pingpong -d vrdma0 -g %d -n 200 -c -s 16384" % g
    sout, cout = pair(ctx.a, ctx.b, srv, srv + " " + ctx.a.ip, timeout=240)
    expect_in("iters in", cout, "ibv_rc_pingpong client")


@scenario("two_vrdma_tap", ci=True)
def tap_write_bw(ctx):
    """`ib_write_bw` 64 KiB over the TAP uplinks prints a result row."""
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    s = "ib_write_bw -d vrdma0 -x %d -s 65536 -n 200" % g
    sout, cout = pair(ctx.a, ctx.b, s, s + " " + ctx.a.ip, timeout=300)
    expect(re.search(r"^\s*65536\s+200\s+[\d.]+", cout, re.M) is not None,
           "ib_write_bw printed a result row", cout)


@scenario("two_vrdma_tap", ci=True)
def tap_ping_netdev(ctx):
    """Plain IP (`ping`) between the guests over the vrdma netdev and the TAP uplinks."""
    out = ctx.b.run("busybox ping -c 3 -W 5 %s" % ctx.a.ip, timeout=30)[1]
    expect(re.search(r"3 packets received", out) is not None, "ping over the vrdma netdev", out)


# Heuristic dissectors for protocols inside InfiniBand payloads (Wireshark 4.0 names): perftest's
# payload is arbitrary bytes that some of them claim and then call malformed. The check is about
# the RoCEv2 headers and the guest's other frames.
PAYLOAD_HEURISTICS = ["rpcrdma_infiniband", "smb_direct_infiniband", "smcr_infiniband",
                      "iser_infiniband", "sdp_infiniband", "fc_infiniband", "eth_over_ib",
                      "lnet_ib", "nvme_rdma"]


@scenario("two_vrdma_tap", ci=True)
def tap_capture_decodes_as_roce(ctx):
    """ib_write_bw through a port captured with --pcap: Wireshark reads it as RoCEv2."""
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    s = "ib_write_bw -d vrdma0 -x %d -s 16384 -n 100" % g
    pair(ctx.a, ctx.b, s, s + " " + ctx.a.ip, timeout=300)
    time.sleep(1)  # the capture thread writes what it has queued
    path = ctx.a.pcap
    expect(shutil.which("tshark") is not None, "tshark is installed (make host-deps installs it)")
    cmd = ["tshark", "-n", "-r", path, "-d", "udp.port==4791,infiniband"]
    for h in PAYLOAD_HEURISTICS:
        cmd += ["--disable-heuristic", h]
    cmd += ["-T", "fields", "-e", "frame.protocols", "-e", "infiniband.bth.opcode",
            "-e", "_ws.malformed", "-e", "_ws.expert.severity"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    expect(r.returncode == 0, "tshark read the capture", r.stderr)
    rows = [l.split("\t") + ["", "", ""] for l in r.stdout.splitlines()]
    opcodes = [row[1] for row in rows]
    writes = sum(op in ("6", "7", "8", "10") for op in opcodes)  # RC RDMA WRITE FIRST..ONLY
    # Malformed: any frame. Expert info: RoCE frames only (the guest's TCP side channel gets
    # TCP analysis notes such as window updates, which say nothing about vrdma).
    bad = ["\t".join(row[:4]) for row in rows
           if row[2] or (row[3] and "infiniband" in row[0])]
    ctx.note("capture of %s: %d frames, %d RDMA WRITE packets, %d flagged" % (
        os.path.basename(path), len(rows), writes, len(bad)))
    expect(not bad, "no malformed frame or expert warning", "\n".join(bad[:20]))
    # 100 WRITEs of 16 KiB at path MTU 1024 are 1600 packets (FIRST/MIDDLE/LAST)
    expect(writes >= 1600, "the capture holds the RDMA WRITE packets (%d)" % writes)
    expect("17" in opcodes, "the capture holds the responder's ACKs (received frames)")


def _port(vm):
    """(ibv_devinfo's port state, rdma link's state) of vrdma0/1."""
    dev = vm.run("ibv_devinfo -d vrdma0", timeout=30)[1]
    link = vm.run("rdma link show vrdma0/1", timeout=30)[1]
    m = re.search(r"state:\s+(PORT_\w+)", dev)
    n = re.search(r"state (\w+)", link)
    return (m.group(1) if m else dev), (n.group(1) if n else link)


def _wait_port(vm, want, secs=20):
    deadline = time.time() + secs
    while True:
        got = _port(vm)
        if got[0] == want or time.time() > deadline:
            return got
        time.sleep(0.5)


@scenario("two_vrdma_tap", ci=True)
def tap_link_down_up(ctx):
    """Spec §2.2/§9: the TAP uplink's link state reaches the guest. `ip link set vrtapN down`
    in the bridge's namespace: ibv_devinfo shows PORT_DOWN, rdma link DOWN, the netdev loses
    carrier and ibv_asyncwatch sees IBV_EVENT_PORT_ERR; `up` brings PORT_ACTIVE and
    IBV_EVENT_PORT_ACTIVE back, and RC traffic runs again."""
    vm = ctx.a
    netdev = re.search(r"netdev (\w+)", run_ok(vm, "rdma link show vrdma0/1")).group(1)
    watch = vm.spawn("stdbuf -oL ibv_asyncwatch -d vrdma0", timeout=90)
    time.sleep(1.0)
    ns = ["ip", "netns", "exec", vm.netns, "ip", "link", "set", vm.tap]
    try:
        subprocess.run(ns + ["down"], check=True, timeout=30)
        down = _wait_port(vm, "PORT_DOWN")
        carrier_down = run_ok(vm, "cat /sys/class/net/%s/carrier" % netdev).strip()
    finally:
        subprocess.run(ns + ["up"], check=True, timeout=30)
    up = _wait_port(vm, "PORT_ACTIVE")
    carrier_up = run_ok(vm, "cat /sys/class/net/%s/carrier" % netdev).strip()
    time.sleep(1.0)
    watch.kill()
    try:
        _, events = watch.wait(timeout=30)
    except vrdmavm.CommandTimeout as e:
        events = getattr(e, "out", "")
    ctx.note("down: %s, carrier %s; up: %s, carrier %s" % (down, carrier_down, up, carrier_up))
    expect(down == ("PORT_DOWN", "DOWN"), "port DOWN after ip link set down", str(down))
    expect(carrier_down == "0", "the netdev lost carrier", carrier_down)
    expect(up == ("PORT_ACTIVE", "ACTIVE"), "port ACTIVE after ip link set up", str(up))
    expect(carrier_up == "1", "the netdev has carrier again", carrier_up)
    expect_in("IBV_EVENT_PORT_ERR", events, "ibv_asyncwatch")
    expect(events.find("IBV_EVENT_PORT_ACTIVE") > events.find("IBV_EVENT_PORT_ERR"),
           "PORT_ACTIVE after PORT_ERR", events)
    g = roce_v2_gid_index(ctx.a, "vrdma0")
    srv = "ibv_rc_pingpong -d vrdma0 -g %d -n 50 -c" % g
    pair(ctx.a, ctx.b, srv, srv + " " + ctx.a.ip)
