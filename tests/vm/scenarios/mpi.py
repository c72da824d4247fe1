"""MPI users: UCX's verbs transports (ucx_perftest over rc_verbs and ud_verbs) and an MPI
ping-pong over UCX (Open MPI's pml ucx, mpi4py) between the two guests."""

import re

from harness import expect, expect_in, ib_dev, pair, push_guest_script, run_ok, scenario

UCX_PORT = 13337


def ucx_env(vm, tls):
    """UCX restricted to the guest's RDMA device (vrdma0 or rxe0) and the given transports."""
    return "UCX_NET_DEVICES=%s:1 UCX_TLS=%s UCX_WARN_UNUSED_ENV_VARS=n" % (ib_dev(vm), tls)


def ucx_perftest(ctx, tl, test, size, iters, layout="short"):
    srv, cli = ctx.a, ctx.b
    # -P 0: client/server mode (Debian's ucx_perftest defaults to MPI mode)
    base = "ucx_perftest -P 0 -p %d -d %s:1 -x %s -t %s -D %s -s %d -n %d" % (
        UCX_PORT, ib_dev(srv), tl, test, layout, size, iters)
    sout, cout = pair(srv, cli, "%s %s" % (ucx_env(srv, tl), base),
                      "%s %s %s" % (ucx_env(cli, tl), base, srv.ip), timeout=400)
    final = [l for l in cout.splitlines() if "Final:" in l]
    expect(final, "ucx_perftest %s %s printed its Final: row" % (tl, test), cout)
    ctx.note("ucx_perftest %s %s %d B: %s" % (tl, test, size, " ".join(final[-1].split())))


@scenario("two_vrdma_fabric", ci=True, timeout=600)
def ucx_perftest_rc_verbs_put_bw(ctx):
    """`ucx_perftest` put_bw (zero copy, 64 KiB) over UCX's rc_verbs transport."""
    ucx_perftest(ctx, "rc_verbs", "put_bw", 65536, 2000, layout="zcopy")


@scenario("two_vrdma_fabric", ci=True, timeout=600)
def ucx_perftest_rc_verbs_am_lat(ctx):
    """`ucx_perftest` am_lat (8 B active messages) over UCX's rc_verbs transport."""
    ucx_perftest(ctx, "rc_verbs", "am_lat", 8, 2000)


@scenario("two_vrdma_fabric", ci=True, timeout=600)
def ucx_perftest_ud_verbs_am_lat(ctx):
    """`ucx_perftest` am_lat (8 B) over UCX's ud_verbs transport."""
    ucx_perftest(ctx, "ud_verbs", "am_lat", 8, 500)


@scenario("two_vrdma_fabric", ci=True, timeout=900)
def mpi_pingpong_over_ucx(ctx):
    """An MPI ping-pong (Open MPI over UCX rc_verbs, mpi4py) between the two guests."""
    a, b = ctx.a, ctx.b
    rsh = push_guest_script([a, b], "mini_rsh.py")
    script = push_guest_script([a, b], "mpi_pingpong.py")
    hosts = "".join("%s %s\n" % (vm.ip, vm.name) for vm in (a, b))
    for vm in (a, b):
        # PRRTE tells the local node from the others by name
        run_ok(vm, "grep -q ' %s$' /etc/hosts || printf '%s' >> /etc/hosts" % (b.name, hosts))
        vm.spawn("python3 %s --serve %s 2222" % (rsh, vm.ip))
    run_ok(a, "for i in $(seq 20); do %s %s true && exit 0; sleep 0.5; done; exit 1"
           % (rsh, b.name), timeout=60)
    # rc_verbs carries the messages; ud_verbs is UCX's auxiliary transport for the RC wireup.
    env = {"UCX_NET_DEVICES": "vrdma0:1", "UCX_TLS": "rc_verbs,ud_verbs,self",
           "UCX_WARN_UNUSED_ENV_VARS": "n"}
    cmd = ("mpirun --allow-run-as-root -np 2 --host %s:1,%s:1 "
           "--prtemca plm_ssh_agent %s "
           "--mca pml ucx --mca btl ^vader,tcp,openib,uct %s "
           "python3 %s" % (a.name, b.name, rsh, " ".join("-x " + k for k in env), script))
    out = run_ok(a, "%s %s" % (" ".join("%s=%s" % kv for kv in env.items()), cmd), timeout=600)
    expect_in("pingpong data OK", out, "mpirun output")
    expect_in("ranks on %s and %s" % (a.name, b.name), out, "mpirun output")
    rows = re.findall(r"pingpong\s+(\d+) B.*?([\d.]+) us/round trip", out)
    expect(len(rows) == 4, "a round-trip time for each of 4 sizes", out)
    ctx.note("MPI ping-pong over UCX rc_verbs: " + ", ".join("%s B %s us" % r for r in rows))
