//! Engine groups (`--shared-engine`, `transport/engine/group.rs`): the devices of a daemon
//! share one engine thread per worker index. One test per file: it counts and times the
//! threads named `vrdma-engine` in the process.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::engine::*;
use common::*;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::engine::{EngineGroup, EngineOptions};
use vrdma_backend::transport::Device;

/// Nothing was lost on a lossless fabric: a frame or kick the group thread overlooked would
/// have been recovered by a retransmission (the 20 s patience of each WRITE allows four).
fn assert_no_retransmits<'a>(devs: impl IntoIterator<Item = &'a Arc<HandoffLock<Device>>>) {
    for (i, d) in devs.into_iter().enumerate() {
        let s = d.lock().qps.stats_total();
        assert_eq!(
            (s.retransmits, s.timeouts),
            (0, 0),
            "device {i}: retransmits and timeouts"
        );
    }
}

/// Two pairs of devices (four devices, two fabrics) in one group: one thread serves them all
/// and moves every pair's data (64 B round trips and 256 KiB multi-packet WRITEs); one pair's
/// engines stop and the other pair goes on; idle, the thread does not spin; when the last
/// engine and the group are gone, so is the thread. A group pass that missed a member's work
/// (a frame from the fabric, a kick, a due timer) shows as a retransmission or a WRITE that
/// never completes.
#[test]
fn devices_of_a_group_share_a_thread_and_each_gets_its_rounds() {
    assert_eq!(threads_named("vrdma-engine"), 0, "no engine before");
    let opts = EngineOptions::default();
    let group = EngineGroup::new(opts.poll, 1);
    let slot = group.place(0);
    let (mut p1, mut p2) = (patient_pair(1, 256 << 10), patient_pair(2, 256 << 10));
    let (ea1, eb1, d1) = fabric_engines_in(Some((&group, slot)), &mut p1, opts);
    let (ea2, eb2, d2) = fabric_engines_in(Some((&group, slot)), &mut p2, opts);
    let patience = Duration::from_secs(20);
    for i in 0..100u64 {
        write_and_wait(&ea1, &mut p1, i, 64, patience, "pair 1, 64 B");
        write_and_wait(&ea2, &mut p2, i, 64, patience, "pair 2, 64 B");
    }
    write_and_wait(&ea1, &mut p1, 100, 256 << 10, patience, "pair 1, 256 KiB");
    write_and_wait(&ea2, &mut p2, 100, 256 << 10, patience, "pair 2, 256 KiB");
    assert_eq!(
        p1.b.read(p1.dst, 256 << 10),
        pattern(1, 256 << 10),
        "pair 1's data"
    );
    assert_eq!(
        p2.b.read(p2.dst, 256 << 10),
        pattern(2, 256 << 10),
        "pair 2's data"
    );
    assert_eq!(
        threads_named("vrdma-engine"),
        1,
        "four devices, one engine thread"
    );
    assert_no_retransmits(d1.iter().chain(&d2));

    // Pair 1 leaves the group; pair 2's devices keep their rounds.
    ea1.stop();
    eb1.stop();
    p2.a.write(p2.src, &pattern(3, 256 << 10));
    for i in 200..300u64 {
        write_and_wait(&ea2, &mut p2, i, 64, patience, "pair 2 after pair 1 left");
    }
    write_and_wait(
        &ea2,
        &mut p2,
        300,
        256 << 10,
        patience,
        "pair 2 after pair 1 left",
    );
    assert_eq!(p2.b.read(p2.dst, 256 << 10), pattern(3, 256 << 10));
    assert_no_retransmits(&d2);

    // Idle: the ACK timers and the last spins end within a few ms, then nothing is due.
    std::thread::sleep(Duration::from_millis(50));
    let c0 = threads_cpu_secs("vrdma-engine");
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let used = threads_cpu_secs("vrdma-engine") - c0;
    assert!(
        used < 0.020,
        "an idle group thread used {:.1} ms of CPU in {:.2} s",
        used * 1e3,
        t0.elapsed().as_secs_f64()
    );

    ea2.stop();
    eb2.stop();
    drop(group);
    assert_eq!(threads_named("vrdma-engine"), 0, "the group thread ended");
}
