"""The command line: boot guests, run commands in them, or open a guest's console.

    python3 images/vrdmavm --help      (or python3 -m vrdmavm with images/ on sys.path)
"""

import argparse
import shlex
import sys
import time

import guest_images

from .cluster import Cluster
from .errors import VMError
from .networks import UPLINKS
from .paths import cache_dir, default_paths


def add_common(p):
    g = p.add_argument_group("guests")
    g.add_argument("-n", "--guests", type=int, default=1, help="number of guests (default 1)")
    g.add_argument("-k", "--kind", default="vrdma",
                   help="vrdma, rxe or none; or a comma list, one per guest (default vrdma)")
    g.add_argument("--uplink", choices=UPLINKS, default="fabric",
                   help="fabric: the vrdma guests on one daemon's in-process switch (default); "
                        "fabric+tap: that daemon's uplink on a bridge in a netns; udp: two guests "
                        "point to point; tap: bridge in a netns; vxlan: two netns hosts joined by VXLAN; "
                        "fabric+vxlan: the daemon's networks (--nets) to another netns host, a "
                        "VNI each")
    g.add_argument("--nets", default=None,
                   help="comma list, the tenant network of each guest (fabric uplinks, spec "
                        "§16.3; default all 0)")
    g.add_argument("--mem", default="1G", help="guest RAM (default 1G)")
    g.add_argument("--smp", type=int, default=1, help="guest CPUs (default 1)")
    g.add_argument("--append", default="", help="extra kernel command line")
    g.add_argument("--kvm", action="store_true", default=None,
                   help="use KVM (default TCG; also VRDMA_KVM=1)")
    g.add_argument("--boot-timeout", type=float, default=300)
    g.add_argument("--lifetime", type=float, default=None,
                   help="stop everything after this many seconds")
    f = p.add_argument_group("files (defaults from VRDMA_CACHE=%s)" % cache_dir())
    d = default_paths()
    f.add_argument("--qemu", default=d["qemu"])
    f.add_argument("--kernel", default=d["kernel"])
    f.add_argument("--initrd", default=d["initrd"])
    f.add_argument("--image", default=None,
                   help="guest OS instead of --kernel/--initrd: %s; or a comma list, one per "
                   "guest (make guest-images builds them)" % ", ".join(guest_images.names()))
    f.add_argument("--backend", default=d["backend"], help="vrdma-backend binary")
    f.add_argument("--backend-arg", action="append", default=[],
                   help="extra vrdma-backend argument (repeatable)")
    f.add_argument("--workdir", default=None, help="run directory (default a new /tmp/vrdma-run-*)")
    f.add_argument("--keep", action="store_true", default=None, help="keep the run directory")
    f.add_argument("--rust-log", default=None, help="RUST_LOG for the backends")


def cluster_from(a, shell=None):
    kinds = a.kind.split(",")
    if len(kinds) == 1:
        kinds = kinds * a.guests
    return Cluster(n=a.guests, kind=kinds, uplink=a.uplink, workdir=a.workdir,
                   qemu=a.qemu, kernel=a.kernel, initrd=a.initrd, backend=a.backend,
                   backend_args=a.backend_arg, kvm=a.kvm, mem=a.mem, smp=a.smp,
                   append=a.append, boot_timeout=a.boot_timeout, lifetime=a.lifetime,
                   keep=a.keep, rust_log=a.rust_log, shell=shell,
                   nets=a.nets.split(",") if a.nets else None, image=_images(a))


def _images(a):
    """--image as Cluster's image argument (one name, or one per guest)."""
    if not a.image:
        return None
    names = a.image.split(",")
    return names[0] if len(names) == 1 else names


def print_info(c, t0):
    print("vrdmavm: %d guest(s) up in %.1fs, run directory %s%s" % (
        len(c), time.monotonic() - t0, c.workdir,
        ", netns " + " ".join(c.network.namespaces()) if c.network.namespaces() else ""),
        file=sys.stderr)
    for vm in c.vms:
        print("  %s kind=%s ip=%s mac=%s agent up after %.1fs  console %s" % (
            vm.name, vm.kind, vm.ip, vm.mac, vm.boot_time, vm.serial_log), file=sys.stderr)


def parse_job(spec):
    """'[N][&]:CMD' -> (guest, background, cmd); plain CMD runs on guest 0."""
    head, sep, cmd = spec.partition(":")
    h = head.strip()
    if sep and (h == "&" or h.rstrip("&").isdigit()):
        bg = h.endswith("&")
        g = int(h.rstrip("&")) if h.rstrip("&") else 0
        return g, bg, cmd
    return 0, False, spec


def cmd_run(a):
    jobs = [parse_job(s) for s in a.cmd]
    if a.command:
        jobs.append((a.on, False, " ".join(shlex.quote(x) for x in a.command)
                     if len(a.command) > 1 else a.command[0]))
    if not jobs:
        raise SystemExit("run: nothing to run (give -c '[N][&]:CMD' or a command)")
    t0 = time.monotonic()
    rc_all = 0
    with cluster_from(a) as c:
        print_info(c, t0)
        bg = []
        for g, background, cmd in jobs:
            vm = c[g]
            if background:
                print("--- %s& %s" % (vm.name, cmd), file=sys.stderr)
                bg.append((vm, cmd, vm.spawn(cmd, timeout=a.timeout)))
                time.sleep(a.bg_delay)
                continue
            print("--- %s: %s" % (vm.name, cmd), file=sys.stderr)
            rc, out = vm.run(cmd, timeout=a.timeout)
            sys.stdout.write(out)
            print("--- %s: rc=%s" % (vm.name, rc), file=sys.stderr)
            rc_all = rc_all or rc
        for vm, cmd, h in bg:
            rc, out = h.wait(a.timeout + 15)
            print("--- %s& %s" % (vm.name, cmd), file=sys.stderr)
            sys.stdout.write(out)
            print("--- %s&: rc=%s" % (vm.name, rc), file=sys.stderr)
            rc_all = rc_all or rc
    return 1 if rc_all else 0


def cmd_boot(a):
    t0 = time.monotonic()
    with cluster_from(a) as c:
        print_info(c, t0)
        if a.repl:
            print("commands: 'N: CMD' runs CMD on guest N (default 0); Ctrl-D ends",
                  file=sys.stderr)
            for line in sys.stdin:
                line = line.strip()
                if not line:
                    continue
                g, bg, cmd = parse_job(line)
                try:
                    rc, out = c[g].run(cmd, timeout=a.timeout)
                    sys.stdout.write(out)
                    print("[rc=%s]" % rc, file=sys.stderr)
                except (VMError, IndexError) as e:
                    print("error: %s" % e, file=sys.stderr)
            return 0
        print("vrdmavm: running; Ctrl-C stops", file=sys.stderr)
        try:
            if a.duration:
                time.sleep(a.duration)
            else:
                while all(vm._alive() for vm in c.vms):
                    time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_shell(a):
    c = cluster_from(a, shell=a.guest)
    t0 = time.monotonic()
    with c:
        print_info(c, t0)
        print("vrdmavm: console of %s on this terminal (exit the shell or Ctrl-A x to quit)"
              % c[a.guest].name, file=sys.stderr)
        c[a.guest].qemu.wait()
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="vrdmavm", description="Boot vrdma test guests (QEMU + vrdma-backend, "
        "or Linux rxe) and run commands in them through the guest agent.",
        epilog="examples:\n"
        "  python3 images/vrdmavm run -- ibv_devinfo\n"
        "  python3 images/vrdmavm run -n 2 -k rxe -c '0&:ibv_rc_pingpong -g 1' "
        "-c '1:ibv_rc_pingpong -g 1 10.0.0.1'\n"
        "  python3 images/vrdmavm boot -n 2 --repl       (type '1: rdma link')\n"
        "  python3 images/vrdmavm shell -n 2 --guest 1  (guest 1's console here)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="sub", required=True)
    p = sub.add_parser("run", help="boot, run commands, print their output, stop",
                       description="Boot the guests, run the -c jobs in order, then COMMAND "
                       "on guest --on; exit status 1 if any failed.")
    add_common(p)
    p.add_argument("-c", "--cmd", action="append", default=[],
                   help="'[N][&]:CMD': run CMD on guest N (default 0); with & in the "
                   "background (collected at the end). Repeatable, run in order.")
    p.add_argument("--on", type=int, default=0, help="guest for COMMAND (default 0)")
    p.add_argument("--timeout", type=float, default=120, help="per command (default 120 s)")
    p.add_argument("--bg-delay", type=float, default=1.0,
                   help="pause after starting a background job (default 1 s)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("boot", help="boot and wait (Ctrl-C stops), or --repl")
    add_common(p)
    p.add_argument("--repl", action="store_true", help="read 'N: CMD' lines from stdin")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--timeout", type=float, default=120, help="per --repl command")
    p.set_defaults(func=cmd_boot)
    p = sub.add_parser("shell", help="a guest's console (root shell) on this terminal")
    add_common(p)
    p.add_argument("--guest", type=int, default=0)
    p.set_defaults(func=cmd_shell)
    a = ap.parse_args(argv)
    if getattr(a, "command", None) and a.command[0] == "--":
        a.command = a.command[1:]
    try:
        return a.func(a)
    except VMError as e:
        print("vrdmavm: %s" % e, file=sys.stderr)
        return 2
