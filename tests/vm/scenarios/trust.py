"""Topology E: a third guest on the victims' TAP bridge attacks a connected RC QP (spec §16).

It knows the victim's QPN and the index part of its rkey, guesses the key variant and the PSN,
and sprays RDMA WRITEs from its own address and with the genuine peer's IP spoofed. Not a byte
of the victim's MR may change, the genuine peer's WRITE must still land, and the victim's
backend must have counted the frames from the foreign address as dropped at intake."""

import json
import re
import subprocess
import time

from harness import expect, expect_in, push_guest_script, roce_v2_gid_index, run_ok, scenario

PORT = 18515
SPRAY = 4000


def drops(vm):
    """The victim backend's intake drops by reason, from its stats socket."""
    out = subprocess.run([vm.cluster.backend, "stats", "--socket", vm.vu_sock],
                         capture_output=True, text=True, timeout=30).stdout
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r'vrdma_port_drops_total\{[^}]*reason="(\w+)"\} (\d+)', out)}


@scenario("E", timeout=600)
def third_guest_cannot_write_into_a_connected_qp(ctx):
    victim, peer, attacker = ctx.a, ctx.b, ctx.c
    script = push_guest_script([victim, peer], "spray_target.py")
    attack = push_guest_script([attacker], "spray_attack.py")
    gv = roce_v2_gid_index(victim, "vrdma0")
    gp = roce_v2_gid_index(peer, "vrdma0")
    v = victim.spawn("python3 %s victim vrdma0 %d %d" % (script, gv, PORT), timeout=400)
    p = peer.spawn("python3 %s peer vrdma0 %d %s %d" % (script, gp, victim.ip, PORT), timeout=400)
    run_ok(victim, "for i in $(seq 120); do test -s /tmp/victim.json && exit 0; sleep 0.5; done; "
           "exit 1", timeout=90)
    info = json.loads(victim.read_file("/tmp/victim.json"))
    before = drops(victim)
    spec = {"own_ip": attacker.ip, "victim_ip": victim.ip, "victim_mac": victim.mac,
            "peer_ip": peer.ip, "qpn": info["qpn"], "rkey": info["rkey"], "addr": info["addr"],
            "count": SPRAY}
    out = run_ok(attacker, "python3 %s eth0 '%s'" % (attack, json.dumps(spec)), timeout=300)
    expect_in("sent own=%d spoofed=%d" % (SPRAY // 2, SPRAY // 2), out, "the attacker")
    time.sleep(2)  # let the victim's backend drain its socket
    after = drops(victim)
    foreign = after.get("bad_address", 0) - before.get("bad_address", 0)
    ctx.note("victim qpn %#x: %d frames from the attacker's address dropped at intake" % (
        info["qpn"], foreign))
    expect(foreign >= SPRAY // 2,
           "the victim dropped every frame from the foreign address as bad_address "
           "(%d of %d; a crafting error would show as malformed: %s)" % (
               foreign, SPRAY // 2, after))
    run_ok(peer, "touch /tmp/go")
    rc_p, out_p = p.wait(timeout=120)
    rc_v, out_v = v.wait(timeout=60)
    expect(rc_v == 0 and "INTACT" in out_v, "the victim's MR is intact", out_v + out_p)
    expect(rc_p == 0, "the genuine peer's WRITE landed after the spray", out_p)
