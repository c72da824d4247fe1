"""The vrdma VM test harness: scenarios, topologies, health checks, results.

A scenario is a function decorated with @scenario(topology, ci=...); its docstring is its
entry in docs/scenarios.md (tests/vm/catalogue.py). The runner boots
each topology once (one to four guests), runs its scenarios one after the other, and
after every scenario checks the guests' health (dmesg free of WARN/BUG/Oops/
hung tasks, backends alive). A failing scenario keeps its evidence (guest
serial logs, dmesg, backend logs, the scenario's own output) under the
results folder. The run ends with the plain line "N passed, N failed".
"""

import os
import re
import shutil
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "images"))

import vrdmavm  # noqa: E402  (the launcher from images/)
import vrdmavm.stats  # noqa: E402

# The device counters scenarios read, from the one stats reader (images/vrdmavm/stats.py).
port_counters = vrdmavm.stats.port_counters
port_drops = vrdmavm.stats.port_drops


class Failure(AssertionError):
    """A scenario's assertion failed; the message says what was expected."""


class Topology:
    """Guests and how they are linked: `doc` says what it is (docs/scenarios.md), `cluster`
    holds the arguments of vrdmavm.Cluster (uplinks: images/vrdmavm/networks.py)."""

    def __init__(self, doc, **cluster):
        self.doc, self.cluster = doc, cluster


# Topologies, named for what they are.
TOPOLOGIES = {
    "two_vrdma_fabric": Topology(
        "Two vrdma guests, both devices of one vrdma-backend; its in-process fabric links them.",
        kind=["vrdma", "vrdma"], uplink="fabric"),
    "two_vrdma_tap": Topology(
        "Two vrdma guests, each with its own backend on a TAP of one bridge in a network "
        "namespace, each backend capturing its port (`--pcap`) for tshark to read.",
        kind=["vrdma", "vrdma"], uplink="tap", pcap=64 << 20),
    "vrdma_and_rxe_udp": Topology(
        "A vrdma guest and a Linux rxe guest (the kernel's own RoCEv2), point to point over "
        "UDP.",
        kind=["vrdma", "rxe"], uplink="udp"),
    "two_vrdma_vxlan": Topology(
        "Two vrdma guests on two \"hosts\" (network namespaces with a bridge each) joined by "
        "VXLAN over a veth underlay; each guest has its own backend on its host.",
        kind=["vrdma", "vrdma"], uplink="vxlan"),
    "two_vrdma_fabric_tap_and_rxe": Topology(
        "Two vrdma guests on one daemon whose fabric has a TAP uplink on a bridge, and a third "
        "party on that bridge: an rxe guest that crafts raw RoCEv2 frames.",
        kind=["vrdma", "vrdma", "rxe"], uplink="fabric+tap"),
    "one_vrdma_delayed_commands": Topology(
        "One vrdma guest for the driver race tests: its backend answers the 1st, 3rd, ... "
        "RESIZE_CQ after 3 s and the others at once (TEST ONLY `--delay-commands`), and keeps "
        "at most 2 ODP chunks of 4 KiB resident.",
        kind=["vrdma"], uplink="udp",
        backend_args=["--delay-commands", "resize_cq=3000:0",
                      "--odp-chunk-shift", "12", "--odp-resident-chunks", "2"]),
    "two_vrdma_fabric_payload_refs": Topology(
        "two_vrdma_fabric with one copy on the fabric (`--payload-refs`: RC WRITE payloads by "
        "reference, behind the DMA fence, spec §16.2 rule 6), two engine workers per device "
        "(`--engine-threads 2`: each QP on one of them, worker 0 handing received frames on) "
        "and the two devices sharing those threads (`--shared-engine`: one thread per worker "
        "index runs both devices' rounds).",
        kind=["vrdma", "vrdma"], uplink="fabric",
        backend_args=["--payload-refs", "--engine-threads", "2", "--shared-engine"]),
    "three_vrdma_fabric_spare_device": Topology(
        "Tenants on one daemon (spec §16.3): three vrdma guests with port security (the "
        "launcher's `ip=`), and a spare device no QEMU uses, for a test frontend (spec §16.5).",
        kind=["vrdma", "vrdma", "vrdma"], uplink="fabric", spare_devices=1),
    "four_vrdma_two_networks": Topology(
        "Two tenant networks on one daemon: vm0, vm1 on network 0, vm2, vm3 on network 5.",
        kind=["vrdma"] * 4, uplink="fabric", nets=[0, 0, 5, 5]),
    "tenants_over_vxlan": Topology(
        "Tenant networks between hosts: vm0, vm1 (vrdma, networks 5 and 6) on one daemon on "
        "host A with a TAP uplink per network, each bridged to the VXLAN device of VNI "
        "10000+N; vm2, vm3 (rxe, networks 5 and 6) on host B, each on its VNI's bridge.",
        kind=["vrdma", "vrdma", "rxe", "rxe"], uplink="fabric+vxlan", nets=[5, 6, 5, 6]),
    # Guest versions (issue 35; images from `make guest-images`, not in CI).
    "bookworm_and_trixie73_fabric": Topology(
        "A Debian 12 guest (kernel 6.1, rdma-core 44) and a trixie guest on kernel 7.3, both "
        "vrdma devices of one daemon's fabric.",
        kind=["vrdma", "vrdma"], uplink="fabric", image=["bookworm", "trixie-7.3"]),
    "bookworm_vrdma_and_trixie73_rxe": Topology(
        "The Debian 12 guest's vrdma (6.1, rdma-core 44) against Linux rxe on kernel 7.3, over "
        "UDP.",
        kind=["vrdma", "rxe"], uplink="udp", image=["bookworm", "trixie-7.3"]),
    "trixie73_vrdma_and_bookworm_rxe": Topology(
        "The 7.3 guest's vrdma against Linux rxe on the Debian 12 guest (6.1), over UDP.",
        kind=["vrdma", "rxe"], uplink="udp", image=["trixie-7.3", "bookworm"]),
}


class Scenario:
    """A registered scenario: its function, the topology it runs in, its declared time limit
    (the runner does not enforce it; the guest commands have their own timeouts), whether CI
    (`make test`) runs it, and whether it runs after the others of its topology. Its
    docstring is its entry in docs/scenarios.md."""

    def __init__(self, fn, topology, timeout, ci, last):
        self.name, self.fn, self.topology = fn.__name__, fn, topology
        self.timeout, self.ci, self.last = timeout, ci, last


# name -> Scenario, in definition order
SCENARIOS = {}


# Kernel messages that mean the guest is unhealthy.
BAD_DMESG = re.compile(
    r"WARNING:|\bBUG[: ]|Oops|general protection|Call Trace:|hung_task|"
    r"blocked for more than|possible circular locking|lockdep|UBSAN|KASAN|"
    r"list_del corruption|refcount_t:")
# A user process's fault ("traps: prog[pid] general protection fault ... in libfoo.so"): the
# command's own exit status reports it; the kernel is fine.
USER_TRAP = re.compile(r"traps: \S+\[\d+\] ")
# ... unless it faulted in our own user space (the provider).
OUR_USER_SPACE = re.compile(r"\bin libvrdma")


def scenario(topology, timeout=300, ci=False, last=False):
    """Register a scenario of `topology` (a TOPOLOGIES name). `ci`: `make test` runs it (a
    scenario that passes reliably). `last`: it leaves the guests changed (a reloaded driver,
    a dead backend), so it runs after the others of its topology."""
    if topology not in TOPOLOGIES:
        raise ValueError("unknown topology %r" % topology)

    def deco(fn):
        if fn.__name__ in SCENARIOS:
            raise ValueError("duplicate scenario " + fn.__name__)
        SCENARIOS[fn.__name__] = Scenario(fn, topology, timeout, ci, last)
        return fn
    return deco


def expect(cond, msg, out=""):
    if not cond:
        raise Failure(msg + ("\n--- output ---\n" + out[-6000:] if out else ""))


def expect_in(needle, out, what=None):
    expect(needle in out, "expected %r in %s" % (needle, what or "the output"), out)


def run_ok(vm, cmd, timeout=120):
    """Run cmd in the guest; it must exit 0. Returns its output."""
    rc, out = vm.run(cmd, timeout=timeout)
    expect(rc == 0, "%s: %r exited with %s" % (vm.name, cmd, rc), out)
    return out


def listeners(vm):
    """What the guest listens on: its TCP listening sockets (local address) and its rdma_cm
    ids in state LISTEN (whole line: device, pid, address), one string each."""
    _, out = vm.run("ss -ltnH; rdma resource show cm_id 2>/dev/null | grep -w LISTEN",
                    timeout=30)
    found = set()
    for line in out.splitlines():
        f = line.split()
        if line.startswith("LISTEN") and len(f) >= 4:
            found.add("tcp " + f[3])
        elif "LISTEN" in f:
            found.add("cm " + line.strip())
    return found


def wait_listening(vm, before, server, timeout=90):
    """Wait until the server spawned in `vm` as `server` (a Handle) listens: a TCP socket or an
    rdma_cm id that was not in `before` (out-of-band exchange or connection
    manager, whichever the tool uses). A client that connects earlier gets a refusal or an
    rdma_cm REJECT (invalid service ID) that most tools do not retry. Returns False when a
    server exited or never listened; the caller says what that means."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not server.done():
        if listeners(vm) - before:
            return True
        time.sleep(0.3)
    return False


def spawn_server(vm, cmd, timeout):
    """Spawn a server in `vm` and return its Handle once it listens (wait_listening); a
    server that exits or never listens is the scenario's failure, with its output."""
    before = listeners(vm)
    srv = vm.spawn(cmd, timeout=timeout)
    if not wait_listening(vm, before, srv):
        out = srv.wait(timeout=10)[1] if srv.done() else "(still running, not listening)"
        raise Failure("%s: %r did not listen\n--- output ---\n%s" % (vm.name, cmd, out[-4000:]))
    return srv


def pair(server_vm, client_vm, server_cmd, client_cmd, timeout=180, again=True):
    """Run a server in one guest and a client in the other; both must exit 0.

    The client starts once the server listens (wait_listening). It still retries its
    connection a few times on a refusal, which a server that listens before it accepts can
    give. A perftest client that could not time its run (below) runs once more, the pair
    with it. Returns (server_output, client_output)."""
    before = listeners(server_vm)
    srv = server_vm.spawn(server_cmd, timeout=timeout)
    if not wait_listening(server_vm, before, srv):
        print("    %s: the server did not listen (%s)" % (
            server_vm.name, "it exited" if srv.done() else "timeout"), flush=True)
    rc = out = None
    for _ in range(5):
        rc, out = client_vm.run(client_cmd, timeout=timeout)
        if rc == 0 or srv.done() or "Couldn't connect" not in out and \
                "Connection refused" not in out:
            break
        time.sleep(1.0)
    # A failed client leaves the server waiting for a peer that will not come:
    # give it a short grace period, then stop it.
    try:
        src, sout = srv.wait(timeout=60 if rc == 0 else 10)
    except vrdmavm.CommandTimeout as e:
        src, sout = None, "%s\n%s" % (e, getattr(e, "out", ""))
    both = "--- server (%s) ---\n%s\n--- client (%s) ---\n%s" % (
        server_vm.name, sout, client_vm.name, out)
    # perftest turns cycles into its report with a CPU clock it samples against the wall
    # clock, and gives up when the samples do not line up ("Correlation coefficient ... Can't
    # produce a report"): a loaded TCG host does that now and then, after the transfer. The
    # second run must pass on its own.
    if rc != 0 and again and "Can't produce a report" in out:
        print("    %s: perftest could not time its run (CPU clock samples), once more" %
              client_vm.name, flush=True)
        return pair(server_vm, client_vm, server_cmd, client_cmd, timeout, again=False)
    # perftest -R connects twice: a control connection, then, after a handshake over it, the
    # data QPs to a second listener the server creates only after the handshake. A client
    # faster than the server there gets a REJ with reason 8 (invalid service ID: nobody
    # listens yet) that perftest does not retry, and the server waits forever. The first -R
    # run after boot loses that race now and then under TCG. The second run must pass.
    if rc != 0 and again and "RDMA_CM_EVENT_REJECTED; error: 8" in out and src is None:
        print("    %s: perftest's data connection came before the server listened for it "
              "(REJ invalid service ID), once more" % client_vm.name, flush=True)
        return pair(server_vm, client_vm, server_cmd, client_cmd, timeout, again=False)
    expect(rc == 0, "client %r exited with %s" % (client_cmd, rc), both)
    expect(src == 0, "server %r exited with %s" % (server_cmd, src), both)
    return sout, out


def push_guest_script(vms, name):
    """Copy tests/vm/guest/<name> and the module the two-guest scripts share (rc_peer.py) to
    /tmp in each guest; returns the script's path there."""
    for f in (name, "rc_peer.py"):
        with open(os.path.join(HERE, "guest", f)) as src:
            text = src.read()
        for vm in vms:
            vm.write_file("/tmp/" + f, text, mode=0o755)
    return "/tmp/" + name


def roce_v2_gid_index(vm, dev):
    """The GID index of the port's IPv4 address as a RoCE v2 GID (cached per guest).

    Two greps read the whole GID table: a process per GID is slow under TCG."""
    cache = vm.__dict__.setdefault("_gid_index", {})
    if dev in cache:
        return cache[dev]
    base = "/sys/class/infiniband/%s/ports/1" % dev
    out = run_ok(vm, "grep -H . %s/gids/* %s/gid_attrs/types/* 2>/dev/null; true" % (base, base))
    gids, types = {}, {}
    for line in out.splitlines():
        path, _, value = line.partition(":")
        idx = path.rsplit("/", 1)[-1]
        if not idx.isdigit():
            continue
        if "/gids/" in path:
            gids[int(idx)] = value.strip()
        elif "/types/" in path:
            types[int(idx)] = value.strip()
    hexip = "".join("%02x" % int(x) for x in vm.ip.split("."))
    want = "0000:0000:0000:0000:0000:ffff:%s:%s" % (hexip[:4], hexip[4:])
    for idx in sorted(gids):
        if gids[idx] == want and "v2" in types.get(idx, ""):
            cache[dev] = idx
            return idx
    raise Failure("%s: no RoCE v2 GID for %s on %s\n%s" % (vm.name, vm.ip, dev, out))


def ib_dev(vm):
    return "rxe0" if vm.kind == "rxe" else "vrdma0"


class Context:
    """What a scenario gets: the guests (a, b unless the topology has one guest, and, in
    three- and four-guest topologies, c and d) and a place for its notes."""

    def __init__(self, cluster, results):
        self.cluster = cluster
        self.a = cluster.vms[0]
        self.b = cluster.vms[1] if len(cluster.vms) > 1 else None
        self.c = cluster.vms[2] if len(cluster.vms) > 2 else None
        self.d = cluster.vms[3] if len(cluster.vms) > 3 else None
        self.results = results
        self.notes = []

    def note(self, text):
        self.notes.append(text)
        print("    " + text, flush=True)


def health(cluster):
    """Problems with the guests or backends that appeared since the last call (empty when
    healthy): a kernel or backend message is reported once, with the scenario during which it
    appeared, not again with every scenario after it."""
    problems = []
    for vm in cluster.vms:
        seen = vm.__dict__.setdefault("health_reported", set())
        if vm.qemu is None or vm.qemu.poll() is not None:
            problems.append("%s: QEMU is not running" % vm.name)
            continue
        if vm.backend is not None and vm.backend.poll() is not None:
            problems.append("%s: vrdma-backend exited with %s" % (vm.name, vm.backend.returncode))
        try:
            d = vm.dmesg()
        except vrdmavm.VMError as e:
            problems.append("%s: cannot read dmesg: %s" % (vm.name, e))
            continue
        found = ["%s dmesg: %s" % (vm.name, line.strip())
                 for line in d.splitlines()
                 if BAD_DMESG.search(line)
                 and (not USER_TRAP.search(line) or OUR_USER_SPACE.search(line))]
        for problem in found:
            if problem not in seen:
                seen.add(problem)
                problems.append(problem)
        # The backend's log lines carry no unique stamp: read only what was written since
        # the last look (a panic after a restart repeats an earlier one word for word).
        if vm.backend is not None and os.path.exists(vm.backend_log):
            with open(vm.backend_log, "rb") as f:
                offset = vm.__dict__.get("health_log_offset", 0)
                if offset > os.fstat(f.fileno()).st_size:
                    offset = 0  # a new file
                f.seek(offset)
                new = f.read().decode(errors="replace")
                vm.health_log_offset = f.tell()
            problems += ["%s backend: %s" % (vm.name, line.strip())
                         for line in new.splitlines() if "panicked" in line]
    return problems


def save_evidence(cluster, dest, text):
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "failure.txt"), "w") as f:
        f.write(text)
    for vm in cluster.vms:
        for p in (vm.serial_log, vm.qemu_log, vm.backend_log):
            if os.path.exists(p):
                shutil.copy(p, dest)
        try:
            with open(os.path.join(dest, "dmesg-%d.txt" % vm.index), "w") as f:
                f.write(vm.dmesg())
        except Exception as e:  # the guest may be gone; say so in the file
            with open(os.path.join(dest, "dmesg-%d.txt" % vm.index), "w") as f:
                f.write("dmesg unavailable: %s\n" % e)
        if vm.kind == "vrdma":
            # The device's counters as its backend counts them (drops by reason, frames by
            # path): the guest's hw_counters sum the drops into one number.
            with open(os.path.join(dest, "stats-%d.txt" % vm.index), "w") as f:
                try:
                    f.write(vrdmavm.stats.device_stats(vm).text or "stats socket gave nothing\n")
                except Exception as e:  # the backend may be gone
                    f.write("stats unavailable: %s\n" % e)


def tail(text, n):
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-n:]


def print_evidence(cluster, err):
    """The end of a failure's output, of each backend's log and of each guest's kernel log,
    and each vrdma device's loss counters, in the run's own output: a CI log is often all that
    is left of a failure."""
    for line in tail(err, 24)[1:]:
        print("  | " + line, flush=True)
    for vm in cluster.vms:
        if vm.backend_log and os.path.exists(vm.backend_log):
            with open(vm.backend_log, errors="replace") as f:
                for line in tail(f.read(), 8):
                    print("  | %s backend: %s" % (vm.name, line), flush=True)
        try:
            for line in tail(vm.dmesg(), 8):
                print("  | %s dmesg: %s" % (vm.name, line), flush=True)
        except Exception as e:  # the guest may be gone
            print("  | %s dmesg unavailable: %s" % (vm.name, e), flush=True)
        for line in loss_counters(vm):
            print("  | %s counters: %s" % (vm.name, line), flush=True)
        for line in backend_drops(vm):
            print("  | %s backend drops: %s" % (vm.name, line), flush=True)


def loss_counters(vm):
    """The port counters of vm's vrdma device that tell loss and recovery apart from a
    guest-side error (spec §11.9, the driver's hw_counters: totals over every QP, destroyed
    ones included), or why they could not be read; nothing for a guest without one."""
    if vm.kind != "vrdma":
        return []
    d = "/sys/class/infiniband/vrdma0/ports/1/hw_counters"
    names = ("sent_pkts rcvd_pkts retransmits local_ack_timeouts rcvd_rnr_naks sent_rnr_naks "
             "rcvd_seq_naks sent_seq_naks rcvd_icrc_err rcvd_dropped")
    try:
        rc, out = vm.run("cd %s && for c in %s; do echo $c $(cat $c); done" % (d, names),
                         timeout=10)
    except Exception as e:  # the guest may be gone
        return ["unavailable: %s" % e]
    if rc != 0:
        return ["unavailable: %s" % out.strip()[-200:]]
    return [", ".join(line.strip() for line in out.splitlines() if line.strip())]


def backend_drops(vm):
    """The frames vm's backend dropped before they reached a QP, by reason (the device's stats
    socket, spec §16.5; `rcvd_dropped` in the guest is their sum), or why they could not be
    read; nothing for a guest without a vrdma device."""
    if vm.kind != "vrdma":
        return []
    try:
        drops = vrdmavm.stats.port_drops(vm)
    except Exception as e:  # the backend may be gone
        return ["unavailable: %s" % e]
    return [", ".join("%s %d" % (k[len("drops_"):], v)
                      for k, v in sorted(drops.items()) if v) or "none"]


def run(selected, results, keep=False):
    """Run the selected scenario names; returns (passed, failed) lists."""
    passed, failed = [], []
    by_topo = {}
    for name in sorted(selected, key=lambda n: SCENARIOS[n].last):  # stable: keeps the order
        by_topo.setdefault(SCENARIOS[name].topology, []).append(name)
    for topo, names in by_topo.items():
        setup = TOPOLOGIES[topo].cluster
        print("== topology %s: %s, %s uplink (%d scenarios)" % (
            topo, "+".join(setup["kind"]), setup["uplink"], len(names)), flush=True)
        cluster = None
        try:
            t0 = time.monotonic()
            cluster = vrdmavm.Cluster(n=len(setup["kind"]), keep=keep, **setup)
            cluster.start()
            print("   booted in %.1fs (%s)" % (time.monotonic() - t0, cluster.workdir), flush=True)
        except Exception as e:
            msg = "topology %s did not come up: %s" % (topo, e)
            print("   " + msg, flush=True)
            for name in names:
                failed.append(name)
                print("FAIL %s: %s" % (name, msg.splitlines()[0]), flush=True)
                if cluster is not None:
                    save_evidence(cluster, os.path.join(results, name), msg)
            if cluster is not None:
                cluster.close(failed=True)
            continue
        broken = None
        for name in names:
            fn = SCENARIOS[name].fn
            if broken:
                failed.append(name)
                print("FAIL %s: not run, the topology broke earlier (%s)" % (name, broken),
                      flush=True)
                continue
            t0 = time.monotonic()
            ctx = Context(cluster, results)
            err = None
            try:
                fn(ctx)
            except Exception as e:  # any exception is this scenario's failure
                err = "%s: %s" % (type(e).__name__, e)
                if not isinstance(e, Failure):
                    err += "\n" + traceback.format_exc()
            problems = health(cluster)
            if problems:
                err = (err + "\nalso " if err else "") + \
                    "unhealthy after the scenario:\n  " + "\n  ".join(problems)
            dt = time.monotonic() - t0
            if err:
                failed.append(name)
                print("FAIL %s (%.1fs): %s" % (name, dt, err.splitlines()[0]), flush=True)
                save_evidence(cluster, os.path.join(results, name),
                              err + "\n\nnotes:\n" + "\n".join(ctx.notes))
                print_evidence(cluster, err)
                if any("QEMU is not running" in p or "backend exited" in p for p in problems):
                    broken = problems[0]
            else:
                passed.append(name)
                print("ok   %s (%.1fs)" % (name, dt), flush=True)
        # Teardown: backends must exit cleanly on SIGTERM.
        cluster.close(failed=bool(failed) or keep)
        for vm in cluster.vms:
            if vm.backend is not None and vm.backend.returncode not in (0, None):
                name = "teardown_%s_%s" % (topo, vm.name)
                failed.append(name)
                print("FAIL %s: vrdma-backend exited with %s on SIGTERM" % (
                    name, vm.backend.returncode), flush=True)
    return passed, failed
