#!/usr/bin/env python3
"""check-syscalls.py [--fabric CONF] UNIT DAEMON [TEST...]: every system call the daemon makes is
allowed by the unit's SystemCallFilter= lines. TEST names integration tests of vrdma-backend (`cargo test
--test TEST`; built with $CARGO, default cargo, in the repository this script is in).

A seccomp filter that is too tight only shows in production (the unit answers EPERM), so this
runs the daemon under strace -f — start with a UDP uplink and --pcap, a frame received, the
counters read with `vrdma-backend stats`, SIGTERM — plus the given test executables (the
in-process vhost-user and TAP tests drive the paths a bare daemon cannot: guest memory tables,
vrings, TUNSETIFF), and compares the traced system calls with the filter as systemd expands it
(`systemd-analyze syscall-filter`). The tests' own harness calls are included, so the check errs
on the strict side.

With --fabric CONF (vrdma-fabric.service), the daemon runs the devices of CONF (the example
/etc/vrdma/fabric.conf: VRDMA_DEVICES and VRDMA_OPTS, socket paths moved to a scratch
directory), with the unit's --stats-socket and a UDP uplink on the first device's network; its
sockets get the owner=/group=/mode= of CONF (lchown: run as root), the frame goes to the first
device, and both a device's counters and the operator's are read.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time


def groups():
    out = subprocess.run(["systemd-analyze", "syscall-filter"], check=True,
                         capture_output=True, text=True).stdout
    g, cur = {}, None
    for line in out.splitlines():
        if line.startswith("@"):
            cur = line.strip()
            g[cur] = []
        elif cur and line.strip() and not line.strip().startswith("#"):
            g[cur].append(line.strip())
    return g


def expand(g, names):
    out = set()
    for n in names:
        if n.startswith("@"):
            out |= expand(g, g.get(n, []))
        else:
            out.add(n)
    return out


def allowed_by(unit):
    """The allow list minus the deny lists (`~`), in the order systemd applies them."""
    g = groups()
    allowed = None
    for line in open(unit, encoding="utf-8"):
        m = re.match(r"^SystemCallFilter=(~?)(.*)$", line.strip())
        if not m:
            continue
        names = expand(g, m.group(2).split())
        if m.group(1):
            allowed = (allowed or set()) - names
        else:
            allowed = (allowed or set()) | names
    if allowed is None:
        sys.exit(f"{unit}: no SystemCallFilter=")
    return allowed


def traced(path):
    calls = set()
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"^\d+\s+([a-z0-9_]+)\(", line)
        if m:
            calls.add(m.group(1))
    return calls


def env_file(path):
    """KEY=VALUE lines of a systemd EnvironmentFile (backslash-newline continues a line),
    each value split into words as an unquoted $KEY in ExecStart= is."""
    text = open(path, encoding="utf-8").read().replace("\\\n", "")
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            env[k.strip()] = v.split()
    return env


def fabric_args(conf, tmp):
    """The daemon's arguments for CONF with its sockets under tmp; the first device's socket
    and network."""
    env = env_file(conf)
    words = env.get("VRDMA_DEVICES", [])
    if "--device" not in words:
        sys.exit(f"check-syscalls: {conf} lists no --device")
    words = [re.sub(r"socket=/run/vrdma/fabric/", f"socket={tmp}/", w) for w in words]
    first = words[words.index("--device") + 1]
    keys = dict(kv.split("=", 1) for kv in first.split(","))
    args = words + env.get("VRDMA_OPTS", []) + ["--stats-socket", os.path.join(tmp, "fabric.stats")]
    return args, keys["socket"], keys.get("net", "0"), keys["mac"]


def trace_daemon(daemon, tmp, conf=None):
    sock = os.path.join(tmp, "vrdma9.sock")
    mac = "52:54:00:00:00:09"
    out = os.path.join(tmp, "daemon.strace")
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    local = tx.getsockname()[1]
    tx.close()
    uplink = f"udp:local=127.0.0.1:{local},remote=127.0.0.1:{rx.getsockname()[1]}"
    if conf:
        args, sock, net, mac = fabric_args(conf, tmp)
        args += ["--uplink", f"{uplink},net={net}"]
    else:
        args = ["--socket-path", sock, "--mac", mac, "--uplink", uplink]
    p = subprocess.Popen(["strace", "-f", "-qq", "-o", out, daemon, *args,
                          "--pcap", os.path.join(tmp, "c.pcap"),
                          "--log-file", os.path.join(tmp, "log")])
    try:
        deadline = time.time() + 30
        while not os.path.exists(sock + ".stats"):
            if time.time() > deadline or p.poll() is not None:
                sys.exit("check-syscalls: the daemon did not start")
            time.sleep(0.05)
        arp = bytes.fromhex(mac.replace(":", "") + "525400000002" "0806") + bytes(28)
        rx.sendto(arp, ("127.0.0.1", local))
        subprocess.run([daemon, "stats", "--socket", sock], check=True,
                       stdout=subprocess.DEVNULL)
        if conf:
            ops = subprocess.run([daemon, "stats", "--socket", os.path.join(tmp, "fabric.stats")],
                                 check=True, capture_output=True, text=True).stdout
            if "vrdma_fabric_" not in ops:
                sys.exit("check-syscalls: no fabric counters on the operator socket")
        time.sleep(0.2)
    finally:
        # Stop the daemon itself (strace's only child): strace ends when it does.
        kids = []
        try:
            with open(f"/proc/{p.pid}/task/{p.pid}/children", encoding="ascii") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            pass
        for k in kids:
            os.kill(k, signal.SIGTERM)
        if not kids:
            p.kill()
        p.wait(timeout=30)
    if p.returncode != 0:
        sys.exit(f"check-syscalls: the daemon exited with {p.returncode}")
    return traced(out)


def test_executables(names):
    if not names:
        return []
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [os.environ.get("CARGO", "cargo"), "test", "-p", "vrdma-backend", "--no-run",
           "--message-format=json"]
    for n in names:
        cmd += ["--test", n]
    out = subprocess.run(cmd, cwd=top, check=True, capture_output=True, text=True).stdout
    exes = []
    for line in out.splitlines():
        m = json.loads(line)
        if (m.get("reason") == "compiler-artifact" and m.get("executable")
                and "test" in m["target"]["kind"]):
            exes.append(m["executable"])
    if len(exes) != len(names):
        sys.exit(f"check-syscalls: found {exes} for tests {names}")
    return exes


def main():
    argv, conf = sys.argv[1:], None
    if argv[:1] == ["--fabric"] and len(argv) > 1:
        conf, argv = argv[1], argv[2:]
    if len(argv) < 2:
        sys.exit(__doc__)
    unit, daemon = argv[0], argv[1]
    tests = test_executables(argv[2:])
    allowed = allowed_by(unit)
    with tempfile.TemporaryDirectory() as tmp:
        seen = {"daemon": trace_daemon(daemon, tmp, conf)}
        for t in tests:
            out = os.path.join(tmp, "test.strace")
            subprocess.run(["strace", "-f", "-qq", "-o", out, t, "--test-threads=1"],
                           check=True, stdout=subprocess.DEVNULL)
            seen[os.path.basename(t)] = traced(out)
    bad = False
    for what, calls in seen.items():
        if len(calls) < 10:
            sys.exit(f"check-syscalls: only {len(calls)} system calls traced for {what}")
        denied = sorted(calls - allowed)
        if denied:
            bad = True
            print(f"check-syscalls: {what} uses {', '.join(denied)}, "
                  f"which {unit} does not allow", file=sys.stderr)
    if bad:
        sys.exit(1)
    total = len(set().union(*seen.values()))
    print(f"system call filter: ok ({total} distinct calls traced, all allowed)")


if __name__ == "__main__":
    main()
