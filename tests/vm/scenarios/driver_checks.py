"""Checks vrdma.ko makes on behalf of the device (issue [hardening] item 8)."""

from harness import expect, expect_in, push_guest_script, roce_v2_gid_index, run_ok, scenario


@scenario("two_vrdma_fabric", ci=True)
def advise_mr_refuses_another_pds_key(ctx):
    """`ibv_advise_mr` accepts an MR of the QP's own PD and refuses one of another PD."""
    script = push_guest_script([ctx.a], "advise_cross_pd.py")
    out = run_ok(ctx.a, "python3 %s vrdma0" % script, timeout=120)
    expect_in("own PD: advice accepted", out, "advise_cross_pd.py")
    expect_in("other PD: advice refused", out, "advise_cross_pd.py")


# Topology one_vrdma_delayed_commands: the backend answers the 1st, 3rd, ... RESIZE_CQ 3 s
# late (--delay-commands resize_cq=3000:0, TEST ONLY), so a race of the driver with a slow device happens every run.

def _races(ctx, what, timeout=120):
    script = push_guest_script([ctx.a], "driver_races.py")
    gidx = roce_v2_gid_index(ctx.a, "vrdma0")
    return ctx.a.run("python3 %s %s vrdma0 %d" % (script, what, gidx), timeout=timeout)


@scenario("one_vrdma_delayed_commands", ci=True)
def resize_cq_concurrent_on_one_cq(ctx):
    """Two RESIZE_CQ of one CQ at once, answered in the opposite order of their execution: the
    ring the driver keeps is the one the device writes, and no ring the device writes is freed
    (vrdma_cq.c resize_mutex).

    With the fix reverted (no resize_mutex lock/unlock in vrdma_resize_cq) it fails, 4 runs of 4:
    `ring the driver keeps (resize A): 0 of 16 completions, producer index 0`, `canary: 1 pages
    WRITTEN after the completions`, dmesg `BUG: Bad page map in process python3`."""
    rc, out = _races(ctx, "resize")
    ctx.note(out.strip().replace("\n", "\n    "))
    expect(rc == 0, "driver_races.py resize exited with %s" % rc, out)
    expect_in("completions, producer index", out, "driver_races.py resize")
    expect_in("canary: 64 MiB intact", out, "driver_races.py resize")


@scenario("one_vrdma_delayed_commands", ci=True)
def odp_reclaim_then_fault_of_one_chunk(ctx):
    """The device drops an ODP chunk and faults it in again at once while the driver is slow to
    act on the drop (test_reclaim_delay_ms): the fault must wait for it, else the driver forgets
    the pages the device installed and never invalidates them (vrdma_odp.c ordered queues).

    With the fix reverted (vrdma_odp_wq_init's queues from alloc_workqueue(WQ_UNBOUND |
    WQ_MEM_RECLAIM, 0) instead of alloc_ordered_workqueue) it fails, 2 runs of 2: `round 1:
    STALE data (pages freed since): send 0: got ee, want 11`, and so every later round. With
    test_reclaim_delay_ms left at 0 the reverted driver passes (1 run): on this 1-vCPU guest
    the delayed RECLAIM is what lets the FAULT's worker run first."""
    a = ctx.a
    run_ok(a, "echo 300 > /sys/module/vrdma/parameters/test_reclaim_delay_ms")
    try:
        rc, out = _races(ctx, "odp", timeout=180)
    finally:
        run_ok(a, "echo 0 > /sys/module/vrdma/parameters/test_reclaim_delay_ms")
    ctx.note(out.strip().replace("\n", "\n    "))
    expect(rc == 0, "driver_races.py odp exited with %s" % rc, out)
    expect_in("round 5: data right", out, "driver_races.py odp")


@scenario("one_vrdma_delayed_commands", ci=True, last=True)
def command_timeout_keeps_device_memory(ctx):
    """RESIZE_CQ times out (cmd_timeout_ms=1000, answered after 3 s) and the device writes a CQE
    into the ring that command handed over after the timeout: that ring stays allocated until
    the device is reset (§14.1, vrdma_cmd.c quarantine). Reloads vrdma afterwards.

    With the fix reverted (vrdma_cmd_unsettled() returns false: the ring and page list of the
    timed-out command are freed at once) it fails, 4 runs of 4: `canary: 1 pages WRITTEN after
    the send's error completion`, dmesg `BUG: Bad page map in process python3`; so it does with
    vrdma_quarantine_ring() freeing the ring at once instead (1 run)."""
    a = ctx.a
    run_ok(a, "echo 1000 > /sys/module/vrdma/parameters/cmd_timeout_ms")
    rc, out = _races(ctx, "timeout")
    ctx.note(out.strip().replace("\n", "\n    "))
    dmesg = a.dmesg()
    # The device is broken until reset: reload the driver (the reset frees the quarantine).
    reload = run_ok(a, "rmmod vrdma && modprobe vrdma && sleep 1 && "
                       "ip link set eth0 up && ip addr replace %s dev eth0 && sleep 2 && "
                       "cat /sys/module/vrdma/parameters/cmd_timeout_ms && "
                       "ibv_devinfo -d vrdma0" % a.cidr, timeout=120)
    expect(rc == 0, "driver_races.py timeout exited with %s" % rc, out)
    expect_in("timed out after 1000 ms", dmesg, "dmesg")
    expect_in("canary: 64 MiB intact", out, "driver_races.py timeout")
    expect_in("PORT_ACTIVE", reload, "ibv_devinfo after the reload")
