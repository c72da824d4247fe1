"""The device as the guest sees it: virtio binding, ibv_devices, ibv_devinfo, rdma link."""

import re

from harness import expect, expect_in, roce_v2_gid_index, run_ok, scenario


@scenario("A")
def boot_device_bound(ctx):
    """Virtio device 42 is bound to vrdma and the backend negotiated with QEMU."""
    for vm in (ctx.a, ctx.b):
        out = run_ok(vm, "for d in /sys/bus/virtio/devices/*; do "
                         "echo $(cat $d/device) $(basename $(readlink -f $d/driver)); done")
        expect_in("0x002a vrdma", out, "%s's virtio devices" % vm.name)
        with open(vm.backend_log, errors="replace") as f:
            log = f.read()
        expect(re.search(r"(?i)features", log) is not None,
               "%s: backend log shows no feature negotiation" % vm.name, log[-3000:])
        expect(re.search(r"(?i)mem(ory)?[ _-]?(table|region)", log) is not None,
               "%s: backend log shows no memory table" % vm.name, log[-3000:])


@scenario("A")
def device_ibv_devices(ctx):
    out = run_ok(ctx.a, "ibv_devices")
    expect(re.search(r"^\s*vrdma0\s+[0-9a-f]{16}\s*$", out, re.M) is not None,
           "ibv_devices lists vrdma0 with its node GUID", out)


@scenario("A")
def device_ibv_devinfo(ctx):
    vm = ctx.a
    out = run_ok(vm, "ibv_devinfo -v -d vrdma0")
    expect_in("PORT_ACTIVE", out, "ibv_devinfo -v")
    expect(re.search(r"link_layer:\s+Ethernet", out) is not None, "link layer Ethernet", out)
    expect_in("ODP_SUPPORT_IMPLICIT", out, "ibv_devinfo -v (general ODP caps)")
    expect(re.search(r"rc_odp_caps:\s*\n(\s+SUPPORT_\w+\s*\n)+", out) is not None,
           "RC ODP caps listed", out)
    idx = roce_v2_gid_index(vm, "vrdma0")
    ctx.note("RoCE v2 GID of %s at index %d" % (vm.ip, idx))
    expect(re.search(r"GID\[\s*%d\]:\s+::ffff:%s, RoCE v2" % (idx, re.escape(vm.ip)), out)
           is not None, "ibv_devinfo shows the IPv4-mapped RoCE v2 GID", out)


@scenario("A")
def device_rdma_link(ctx):
    out = run_ok(ctx.a, "rdma link show")
    expect(re.search(r"link vrdma0/1 state ACTIVE .*netdev \w+", out) is not None,
           "rdma link shows vrdma0/1 ACTIVE with its netdev", out)
