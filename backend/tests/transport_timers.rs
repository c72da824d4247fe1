//! Transport timers with many idle QPs (transport/timers.rs): a tick's work is proportional to
//! the expired deadlines and the QPs that asked for a tick, not to the number of QPs, and the
//! retransmission timer still fires through the deadline heap.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vrdma_backend::transport;

const IDLE: u32 = 10_000;

/// Two nodes, `IDLE` idle RC QPs on A (most in RESET, some connected in RTS with nothing posted)
/// and one working pair.
fn bed() -> (Node, Node, HealthyPair) {
    let mem = 16 + ((IDLE as u64 * 4 * 4096) >> 20);
    let mut a = Node::new(1, mem, 1500);
    let mut b = Node::new(2, 16, 1500);
    let pda = a.create_pd();
    let pdb = b.create_pd();
    let (ca, _) = a.create_cq(64);
    let tiny = |pd, cq| QpSpec {
        sq_depth: 4,
        rq_depth: 4,
        sq_shift: 7,
        rq_shift: 5,
        max_sge: 1,
        max_inline: 0,
        ..QpSpec::rc(pd, cq)
    };
    for i in 0..IDLE {
        let q = a.create_qp(tiny(pda, ca));
        if i % 100 == 0 {
            let av = a.av_to(&b);
            rts(&mut a, &q, 0x00ab_0000 + i, av, RtsAttrs::mtu(3), (1, 1));
        }
    }
    let pair = HealthyPair::new(&mut a, &mut b, pda, pdb);
    (a, b, pair)
}

#[test]
fn tick_with_ten_thousand_idle_qps_visits_only_expired_entries() {
    let (mut a, mut b, mut pair) = bed();
    let mut link = Link::clean();
    for round in 0..20 {
        pair.round(&mut a, &mut b, &mut link, round, 32768, 4096);
    }
    pump_idle(&mut a, &mut b, &mut link);
    // Everything acknowledged: nothing is armed, so ticks visit nothing at all.
    let v0 = a.dev.timers().visited();
    let now = Instant::now();
    for _ in 0..1000 {
        transport::on_tick(&a.dev, now);
    }
    let per_tick = (a.dev.timers().visited() - v0) as f64 / 1000.0;
    assert!(
        per_tick <= 1.0,
        "{per_tick} entries visited per idle tick with {IDLE} idle QPs"
    );
    // Long after every stale entry expired: one tick drains them (each visited once), later
    // ticks visit nothing.
    let later = now + Duration::from_secs(3600);
    transport::on_tick(&a.dev, later);
    let v1 = a.dev.timers().visited();
    assert!(
        v1 - v0 <= 64,
        "stale entries of 20 rounds: {} visits",
        v1 - v0
    );
    assert_eq!(a.dev.timers().heap_len(), 0, "no live deadline is left");
    for _ in 0..100 {
        transport::on_tick(&a.dev, later);
    }
    assert_eq!(a.dev.timers().visited(), v1);
}

#[test]
fn retransmission_fires_through_the_heap_among_idle_qps() {
    let (mut a, mut b, mut pair) = bed();
    let mut link = Link::clean();
    // Drop the last frame of the round (the SEND after an 8-packet WRITE at path MTU 1024):
    // nothing follows it to trigger a NAK, so only the retransmission timer completes the round.
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    link.filter_ab = Some(Box::new(move |_| c.fetch_add(1, Ordering::Relaxed) != 8));
    let v0 = a.dev.timers().visited();
    pair.round(&mut a, &mut b, &mut link, 1, 8192, 1024);
    let visits = a.dev.timers().visited() - v0;
    assert!(n.load(Ordering::Relaxed) > 9, "the SEND was retransmitted");
    // A scan of every QP would visit 10,000 entries per tick.
    assert!(
        visits < 200,
        "{visits} timer entries visited for one retransmission among {IDLE} idle QPs"
    );
    assert!(visits >= 1, "the retransmission deadline was visited");
}

#[test]
fn rearming_keeps_the_heap_bounded() {
    let (mut a, mut b, pda, pdb) = Sides::new(64, 1500).parts();
    let mut pair = HealthyPair::new(&mut a, &mut b, pda, pdb);
    let mut link = Link::clean();
    // Every acknowledgement re-arms the retransmission deadline (a new heap entry, the old one
    // stale until it expires far in the future): the heap is rebuilt before it grows past
    // 2 × QPs + 1024.
    for round in 0..400 {
        pair.round(&mut a, &mut b, &mut link, round, 32768, 4096);
        assert!(
            a.dev.timers().heap_len() <= 2 * 2 + 1024 + 1,
            "heap holds {} entries",
            a.dev.timers().heap_len()
        );
    }
}

/// A moving retransmit deadline (every ACK moves it later) keeps the QP's earlier heap entry
/// instead of pushing a new one, so among 10,000 idle QPs the heap holds about one entry per
/// working QP: the 64 B path's heap operations stay in cache instead of walking a heap of up to
/// 2 × QPs + 1024 stale entries (the bound of the rebuild).
#[test]
fn an_ack_stream_keeps_the_heap_small_among_idle_qps() {
    let (mut a, mut b, mut pair) = bed();
    let mut link = Link::clean();
    let mut most = 0;
    for round in 0..100 {
        pair.round(&mut a, &mut b, &mut link, round, 32768, 4096);
        most = most.max(a.dev.timers().heap_len());
    }
    assert!(most <= 4, "the heap held up to {most} entries");
}
