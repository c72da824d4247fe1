"""vrdma across guest versions (issue 35): a Debian 12 guest (kernel 6.1, rdma-core 44) and a
trixie guest on trixie-backports' kernel 7.3 (rdma-core 56.1), devices of one daemon whose
fabric links them, the 6.1 guest's vrdma against Linux rxe on 7.3 and the 7.3 guest's vrdma
against rxe on 6.1.

Their images are not part of `make images`: `make guest-images` builds them
(images/build-guest-image.sh, catalogue images/guest_images.py). Every scenario's name starts
with "guests_", so `tests/vm/run.py -k guests_` runs these only. One provider binary,
libvrdma-rdmav34.so built in rdma-core 56.1, serves both libibverbs (guest-driver/provider/
README.md says why): the 6.1 guest loads it into rdma-core 44.
"""

from harness import expect, expect_in, ib_dev, pair, roce_v2_gid_index, run_ok, scenario

from .nvmeof import nvmeof_round_trip
from .perftest import ROW, perf

BOOKWORM, TRIXIE_73 = "bookworm", "trixie-7.3"
# Topologies (tests/vm/harness.py): bookworm_and_trixie73_fabric (vm0 the Debian 12 guest,
# vm1 the 7.3 one), bookworm_vrdma_and_trixie73_rxe, trixie73_vrdma_and_bookworm_rxe.

# what each guest image must be running: kernel release prefix, libibverbs1's version prefix
EXPECTED = {BOOKWORM: ("6.1.0-", "44."), TRIXIE_73: ("7.3.", "56.")}


def versions(vm):
    """(kernel release, libibverbs1 version) of a guest."""
    out = run_ok(vm, "uname -r; dpkg-query -W -f '${Version}\\n' libibverbs1")
    kernel, lib = out.split()[:2]
    return kernel, lib


def check_versions(ctx):
    for vm in (ctx.a, ctx.b):
        kernel, lib = versions(vm)
        want_kernel, want_lib = EXPECTED[vm.image]
        expect(kernel.startswith(want_kernel) and lib.startswith(want_lib),
               "%s (%s): kernel %s, libibverbs %s; expected %s*, %s*" % (
                   vm.name, vm.image, kernel, lib, want_kernel, want_lib))
        ctx.note("%s: %s, kernel %s, libibverbs1 %s" % (vm.name, vm.image, kernel, lib))


@scenario("bookworm_and_trixie73_fabric")
def guests_6_1_and_7_3_list_vrdma0(ctx):
    """Both guests run the kernel and rdma-core of their image, and ibv_devices / ibv_devinfo
    list vrdma0 with an active Ethernet port (the provider loaded into libibverbs 44 and 56)."""
    check_versions(ctx)
    for vm in (ctx.a, ctx.b):
        expect_in("vrdma0", run_ok(vm, "ibv_devices"), "%s's ibv_devices" % vm.name)
        info = run_ok(vm, "ibv_devinfo -d vrdma0")
        expect_in("PORT_ACTIVE", info, "%s's ibv_devinfo" % vm.name)
        expect_in("Ethernet", info, "%s's ibv_devinfo" % vm.name)


def pingpong_between(ctx, server, client, tool, extra):
    g = roce_v2_gid_index(server, ib_dev(server))
    gc = roce_v2_gid_index(client, ib_dev(client))
    srv = "%s -d %s -g %d %s" % (tool, ib_dev(server), g, extra)
    cli = "%s -d %s -g %d %s %s" % (tool, ib_dev(client), gc, extra, server.ip)
    _, cout = pair(server, client, srv, cli, timeout=240)
    expect_in("iters in", cout, "%s client output" % tool)
    ctx.note("%s %s -> %s: %s" % (tool, client.image, server.image,
                                  cout.strip().splitlines()[-1]))


@scenario("bookworm_and_trixie73_fabric")
def guests_rc_pingpong_6_1_with_7_3(ctx):
    """ibv_rc_pingpong with checked payloads, the 6.1 guest serving and then the 7.3 one."""
    for size, iters in ((1, 100), (4096, 100), (1048576, 5)):
        pingpong_between(ctx, ctx.a, ctx.b, "ibv_rc_pingpong", "-s %d -n %d -c" % (size, iters))
    pingpong_between(ctx, ctx.b, ctx.a, "ibv_rc_pingpong", "-s 65536 -n 50 -c")


@scenario("bookworm_and_trixie73_fabric")
def guests_ud_and_srq_pingpong_6_1_with_7_3(ctx):
    """UD and SRQ between the versions."""
    pingpong_between(ctx, ctx.a, ctx.b, "ibv_ud_pingpong", "-s 512 -n 100")
    pingpong_between(ctx, ctx.b, ctx.a, "ibv_srq_pingpong", "-q 4 -n 50")


@scenario("bookworm_and_trixie73_fabric")
def guests_rping_6_1_with_7_3(ctx):
    """rdma_cm (rping, rdmacm-utils 44 and 56) from the 7.3 guest to the 6.1 guest."""
    ip = ctx.a.ip
    sout, cout = pair(ctx.a, ctx.b, "rping -s -a %s -v -V -C 20" % ip,
                      "rping -c -a %s -v -V -C 20" % ip, timeout=240)
    pings = [line for line in cout.splitlines() if "ping data: rdma-ping-" in line]
    expect(len(pings) == 20, "rping client printed 20 verified pings (got %d)" % len(pings), cout)
    expect_in("rdma-ping-19: ", sout, "rping server output")


@scenario("bookworm_and_trixie73_fabric")
def guests_rc_pingpong_odp_6_1_with_7_3(ctx):
    """On-demand paging: explicit ODP MRs (-o) on both kernels, implicit (-O) on both."""
    pingpong_between(ctx, ctx.a, ctx.b, "ibv_rc_pingpong", "-o -n 100 -c")
    pingpong_between(ctx, ctx.b, ctx.a, "ibv_rc_pingpong", "-O -n 100 -c")


@scenario("bookworm_and_trixie73_fabric", timeout=600)
def guests_perftest_6_1_with_7_3(ctx):
    """perftest 4.5 (bookworm) serving perftest 25.01 (trixie): WRITE, READ, SEND, atomics;
    figures recorded, not asserted."""
    for tool, size in (("ib_write_bw", 65536), ("ib_read_bw", 65536), ("ib_send_bw", 65536),
                       ("ib_atomic_bw", 8)):
        perf(ctx, tool, size=size)


@scenario("bookworm_and_trixie73_fabric", timeout=900)
def guests_nvmeof_6_1_host_7_3_target(ctx):
    """NVMe-oF: the 6.1 guest's nvme-rdma against the 7.3 guest's nvmet-rdma: connect, fio
    write + verify, disconnect, reconnect and verify again, teardown within seconds."""
    nvmeof_round_trip(ctx, ctx.b, ctx.a)


@scenario("bookworm_and_trixie73_fabric", timeout=900)
def guests_nvmeof_7_3_host_6_1_target(ctx):
    """The same with the roles swapped."""
    nvmeof_round_trip(ctx, ctx.a, ctx.b)


@scenario("bookworm_vrdma_and_trixie73_rxe")
def guests_rc_pingpong_6_1_vrdma_with_7_3_rxe(ctx):
    """The 6.1 guest's vrdma device against Linux rxe in the 7.3 guest, both directions."""
    check_versions(ctx)
    pingpong_between(ctx, ctx.a, ctx.b, "ibv_rc_pingpong", "-s 4096 -n 100 -c")
    pingpong_between(ctx, ctx.b, ctx.a, "ibv_rc_pingpong", "-s 65536 -n 50 -c")


@scenario("bookworm_vrdma_and_trixie73_rxe", timeout=600)
def guests_perftest_6_1_vrdma_with_7_3_rxe(ctx):
    """perftest WRITE and READ between the 6.1 guest's vrdma and rxe on 7.3."""
    for tool in ("ib_write_bw", "ib_read_bw"):
        perf_between(ctx, ctx.a, ctx.b, tool)


@scenario("trixie73_vrdma_and_bookworm_rxe")
def guests_rc_pingpong_7_3_vrdma_with_6_1_rxe(ctx):
    """The 7.3 guest's vrdma device against Linux rxe in the 6.1 guest, both directions."""
    check_versions(ctx)
    pingpong_between(ctx, ctx.a, ctx.b, "ibv_rc_pingpong", "-s 4096 -n 100 -c")
    pingpong_between(ctx, ctx.b, ctx.a, "ibv_rc_pingpong", "-s 65536 -n 50 -c")


@scenario("trixie73_vrdma_and_bookworm_rxe", timeout=600)
def guests_perftest_7_3_vrdma_with_6_1_rxe(ctx):
    """perftest WRITE and READ between the 7.3 guest's vrdma and rxe on 6.1."""
    for tool in ("ib_write_bw", "ib_read_bw"):
        perf_between(ctx, ctx.a, ctx.b, tool)


def perf_between(ctx, server, client, tool, size=65536, iters=200):
    """perftest between two guests of any kinds (perftest.perf assumes two vrdma0)."""
    base = "%s -s %d -n %d" % (tool, size, iters)
    srv = "%s -d %s -x %d" % (base, ib_dev(server), roce_v2_gid_index(server, ib_dev(server)))
    cli = "%s -d %s -x %d %s" % (base, ib_dev(client), roce_v2_gid_index(client, ib_dev(client)),
                                 server.ip)
    _, cout = pair(server, client, srv, cli, timeout=300)
    rows = ROW.findall(cout)
    expect(rows, "%s printed a result row" % tool, cout)
    ctx.note("%s %s %s -> %s %s: %s" % (tool, client.image, client.kind, server.image,
                                         server.kind, " ".join(rows[-1])))
