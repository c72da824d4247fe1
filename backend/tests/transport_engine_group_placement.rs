//! Placement in an engine group (`--shared-engine-threads`, `EngineGroup::place`): the devices
//! of one placement key (a tenant network) share a slot's thread, keys spread over the slots.
//! One test per file: it counts the threads named `vrdma-engine*` in the process.

mod common;

use std::time::Duration;

use common::engine::*;
use common::*;
use vrdma_backend::transport::engine::{EngineGroup, EngineOptions};

/// Two slots, three pairs: the pairs of keys 0 and 1 get a slot each (two threads, named
/// apart), the third pair, of key 0 again, joins key 0's thread; every pair moves its data
/// with no retransmission (a frame left on a thread that does not serve its device would
/// show as one), and the threads end with the engines and the group.
#[test]
fn a_key_keeps_its_slot_and_new_keys_spread_over_the_slots() {
    assert_eq!(threads_named("vrdma-engine"), 0, "no engine before");
    assert_eq!(threads_named("vrdma-engine0s1"), 0, "no engine before");
    let opts = EngineOptions::default();
    let group = EngineGroup::new(opts.poll, 2);
    let (mut p1, mut p2, mut p3) = (
        patient_pair(1, 64 << 10),
        patient_pair(2, 64 << 10),
        patient_pair(3, 64 << 10),
    );
    let (s1, s2) = (
        (group.place(0), group.place(0)),
        (group.place(1), group.place(1)),
    );
    assert_eq!(s1.0, s1.1, "one key, one slot");
    assert_ne!(s1.0, s2.0, "a new key goes to the emptier slot");
    let (ea1, eb1, d1) = fabric_engines_in(Some((&group, s1.0)), &mut p1, opts);
    let (ea2, eb2, d2) = fabric_engines_in(Some((&group, s2.0)), &mut p2, opts);
    let s3 = group.place(0);
    assert_eq!(s3, s1.0, "key 0 again");
    let (ea3, eb3, d3) = fabric_engines_in(Some((&group, s3)), &mut p3, opts);
    let patience = Duration::from_secs(20);
    for i in 0..50u64 {
        write_and_wait(&ea1, &mut p1, i, 64, patience, "pair 1, 64 B");
        write_and_wait(&ea2, &mut p2, i, 64, patience, "pair 2, 64 B");
        write_and_wait(&ea3, &mut p3, i, 64, patience, "pair 3, 64 B");
    }
    for (i, (ea, p)) in [(&ea1, &mut p1), (&ea2, &mut p2), (&ea3, &mut p3)]
        .into_iter()
        .enumerate()
    {
        write_and_wait(ea, p, 100, 64 << 10, patience, "64 KiB");
        assert_eq!(
            p.b.read(p.dst, 64 << 10),
            pattern(i as u64 + 1, 64 << 10),
            "pair {}'s data",
            i + 1
        );
    }
    assert_eq!(threads_named("vrdma-engine"), 1, "the first slot's thread");
    assert_eq!(
        threads_named("vrdma-engine0s1"),
        1,
        "the second slot's thread"
    );
    for (i, d) in d1.iter().chain(&d2).chain(&d3).enumerate() {
        let s = d.lock().qps.stats_total();
        assert_eq!((s.retransmits, s.timeouts), (0, 0), "device {i}");
    }
    for e in [ea1, eb1, ea2, eb2, ea3, eb3] {
        e.stop();
    }
    drop(group);
    assert_eq!(
        threads_named("vrdma-engine") + threads_named("vrdma-engine0s1"),
        0,
        "the group's threads ended"
    );
}
