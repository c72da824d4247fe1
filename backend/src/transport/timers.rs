//! Per-QP transport timers: the RC retransmission timer (IBTA 9.7.6.1.3: 4.096 µs × 2^timeout)
//! and the RNR back-off (IBTA 9.7.5.2.8, table 45). Deadlines live in
//! [`super::RequesterState`]; [`on_tick`] fires the expired ones and returns the next deadline so
//! the engine can program its timerfd.
//!
//! The cost of a tick does not grow with idle QPs: a [`TimerQueue`] (one shard per engine worker,
//! `qp::worker_of`) holds a min-heap of `(deadline, qpn)` entries, fed when the requester state
//! goes back into its QP (`ctx::put_req`) with a deadline not queued yet, and a worklist of QPs
//! that need a tick without a deadline (READ responses to pace, sends after SQD → RTS). Entries are
//! deleted lazily: an entry is live only while it matches the QP's `TickMarks::queued`; re-arming
//! pushes a new entry and makes the old one stale, which is dropped when it reaches the top. A tick
//! visits the expired entries (live or stale) and the worklist, nothing else.

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use super::ctx::{self, QpCtx};
use super::{completer, requester, with_req};
use crate::qp::worker_of;
use crate::transport::Device;

/// Floor for the retransmission timeout. IBTA allows timeout codes down to 1 (8.192 µs), which
/// would make a software engine retransmit before the peer's engine thread is even scheduled;
/// 1 ms keeps the semantics (a finite timeout) without retransmission storms.
pub const MIN_RETRANS: Duration = Duration::from_millis(1);

/// Local ACK timeout for the `timeout` QP attribute: 4.096 µs × 2^timeout; 0 means infinite
/// (IBTA 9.7.6.1: no retransmission timer), returned as `None`.
pub fn retrans_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let t = timeout.min(31) as u32;
    let ns = 4096u64 << t;
    Some(Duration::from_nanos(ns).max(MIN_RETRANS))
}

/// RNR NAK timer code → delay (IBTA table 45, "RNR NAK timer field encoding").
pub fn rnr_timeout(code: u8) -> Duration {
    // In units of 10 µs: 0 is the largest value, 655.36 ms.
    const T: [u32; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    Duration::from_micros(T[(code & 0x1f) as usize] as u64 * 10)
}

/// Earliest deadline of a requester state.
pub fn next_deadline(st: &super::RequesterState) -> Option<Instant> {
    [st.retrans_deadline, st.rnr_deadline, st.moved_resend]
        .into_iter()
        .flatten()
        .min()
}

/// Per-QP bookkeeping of the [`TimerQueue`], kept in the `Qp` (outside the requester and
/// responder states, which are taken out while the transport works on them).
#[derive(Debug, Default, Clone, Copy)]
pub struct TickMarks {
    /// The deadline of this QP's live heap entry, if any.
    pub queued: Option<Instant>,
    /// The QP is on the worklist.
    pub listed: bool,
}

/// Called when QP `qpn`'s requester state has been put back: queue its earliest deadline if it is
/// not queued yet, and put the QP on the worklist if it has fetched WQEs that nothing else will
/// start (the old per-tick scan's condition, minus the QP state, which the tick checks).
pub(crate) fn note_req(dev: &Device, qpn: u32) {
    note_req_with(dev, qpn, |_| ());
}

/// [`note_req`], first running `f` on the QP under the same lock (`ctx::put_req` puts the
/// requester state back there: one lookup and lock of the QP per unit of work, not two).
/// `None` if the QP is gone.
pub(crate) fn note_req_with<R>(
    dev: &Device,
    qpn: u32,
    f: impl FnOnce(&mut crate::qp::Qp<super::Rocev2>) -> R,
) -> Option<R> {
    let Device { qps, timers, .. } = dev;
    let w = worker_of(qpn, timers.shards());
    let workers = timers.shards();
    // Lock order: a shard, then a QP (ARCHITECTURE.md "Locks").
    let mut timers = timers.shard(w);
    let mut guard = qps.get(qpn)?;
    let qp = &mut *guard;
    let r = f(qp);
    let st = &qp.req;
    if let Some(d) = next_deadline(st) {
        // A live entry at or before `d` stays: it fires early, the tick finds nothing due and
        // queues the QP's deadline then. Every ACK moves the retransmit deadline later, so
        // pushing on each move filled the heap with stale entries, up to the rebuild bound
        // below (which grows with the QP count: the 10000-idle-QP slowdown of the 64 B path).
        if qp.tick.queued.is_none_or(|q| d < q) {
            qp.tick.queued = Some(d);
            timers.heap.push(Reverse((d, qpn)));
        }
    }
    // `wqes[..sent_prefix]` are all sent (requester.rs): only the WQEs after them can be
    // waiting for their first send, so the check is not O(window) per call.
    let pending = st.odp_wait.is_none()
        && st.rnr_deadline.is_none()
        && !st.stopped
        && st.psn.wrapping_sub(st.una) & super::PSN_MASK < st.window()
        && st
            .wqes
            .iter()
            .skip(st.sent_prefix)
            .any(|w| !w.sent_once && !w.is_local());
    if pending && !qp.tick.listed {
        qp.tick.listed = true;
        timers.work.push(qpn);
    }
    // The rebuild below locks every QP of the shard, this one too.
    drop(guard);
    // Stale entries are bounded by the re-arm rate × the timeout; rebuild the heap from the live
    // entries when they dominate (amortised O(1) per push).
    if timers.heap.len() > 2 * qps.len() as usize + 1024 {
        timers.heap.clear();
        for q in qps.iter().filter(|q| worker_of(q.qpn, workers) == w) {
            if let Some(d) = q.tick.queued {
                timers.heap.push(Reverse((d, q.qpn)));
            }
        }
    }
    Some(r)
}

/// Spread the device's QPs and timers over `workers` engine workers (`qp::worker_of`): new
/// QPNs round robin, and each live QP's deadline and worklist entry moved to its worker's shard.
pub fn set_workers(dev: &mut Device, workers: usize) {
    dev.set_workers(workers);
    let Device { qps, timers, .. } = dev;
    timers.reshard(workers);
    let n = timers.shards();
    for qp in qps.iter_mut() {
        let shard = timers.shard_mut(worker_of(qp.qpn, n));
        if let Some(d) = qp.tick.queued {
            shard.heap.push(Reverse((d, qp.qpn)));
        }
        if qp.tick.listed {
            shard.work.push(qp.qpn);
        }
    }
}

/// Called as QP `qpn`'s responder state is put back (by `f`, under the same lock:
/// `ctx::put_resp`, see [`note_req_with`]): READ responses still queued need the next tick
/// (responder/ READ_BURST pacing).
pub(crate) fn note_resp<R>(
    dev: &Device,
    qpn: u32,
    f: impl FnOnce(&mut crate::qp::Qp<super::Rocev2>) -> R,
) -> Option<R> {
    let Device { qps, timers, .. } = dev;
    let mut timers = timers.shard(worker_of(qpn, timers.shards()));
    let mut qp = qps.get(qpn)?;
    let r = f(&mut qp);
    if !qp.resp.replies.is_empty() && !qp.tick.listed {
        qp.tick.listed = true;
        timers.work.push(qpn);
    }
    Some(r)
}

/// Fire expired timers of every worker's shard; run the worklists; return the earliest
/// pending deadline (for callers that are not one engine worker: unit tests, one worker).
pub fn on_tick(dev: &Device, now: Instant) -> Option<Instant> {
    let mut next: Option<Instant> = None;
    for w in 0..dev.timers.shards() {
        if let Some(d) = on_worker_tick(dev, now, w) {
            next = Some(next.map_or(d, |n: Instant| n.min(d)));
        }
    }
    next
}

/// Fire the expired timers of worker `w`'s QPs; run its worklist; return its earliest pending
/// deadline. Work is proportional to the expired heap entries and the listed QPs, not to the
/// number of QPs.
pub fn on_worker_tick(dev: &Device, now: Instant, w: usize) -> Option<Instant> {
    let mut next = fire_expired(dev, now, w);
    if run_worklist(dev, now, w) {
        next = Some(now);
    }
    // Listed QPs that could not proceed (e.g. SQD) wait for a kick, like before; an expired
    // deadline re-queued during the tick fires on the next one.
    let first = dev.timers.shard(w).heap.peek().map(|&Reverse((d, _))| d);
    if let Some(d) = first {
        next = Some(next.map_or(d, |n: Instant| n.min(d)));
    }
    next
}

/// Pops and fires worker `w`'s heap entries due by `now`; returns the first one not yet due.
fn fire_expired(dev: &Device, now: Instant, w: usize) -> Option<Instant> {
    loop {
        // The shard is locked only to take an entry: firing it locks the QP (and may queue
        // deadlines in this shard again).
        let (d, qpn) = {
            let mut shard = dev.timers.shard(w);
            let &Reverse((d, qpn)) = shard.heap.peek()?;
            if d > now {
                return Some(d);
            }
            shard.heap.pop();
            shard.visited += 1;
            (d, qpn)
        };
        let live = match dev.qps.get(qpn) {
            Some(mut qp) if qp.tick.queued == Some(d) => {
                qp.tick.queued = None;
                true
            }
            _ => false,
        };
        if live {
            fire(dev, qpn, now);
        }
    }
}

/// The QP's retransmission and RNR deadlines that passed: time out, or end the back-off, and
/// send again. `note_req` (through `with_req`) queues whatever deadline the QP has afterwards.
fn fire(dev: &Device, qpn: u32, now: Instant) {
    with_req(dev, qpn, |dev, ctx: &QpCtx, st| {
        let mut fired = false;
        if st.moved_resend.is_some_and(|d| d <= now) {
            completer::resend_after_move(ctx, st, now);
            fired = true;
        }
        if st.retrans_deadline.is_some_and(|d| d <= now) {
            if let Some(mut s) = ctx::qp_stats(dev, ctx.qpn) {
                s.timeouts += 1;
            }
            completer::on_retrans_timeout(ctx, st, now);
            fired = true;
        }
        if st.rnr_deadline.is_some_and(|d| d <= now) {
            st.rnr_deadline = None;
            fired = true;
        }
        if fired {
            requester::process(dev, ctx, st, now);
        }
    });
}

/// The worklist: sends that nothing else will trigger (SQD → RTS) and paced READ responses.
/// QPs that still need a tick are listed again by note_req / note_resp. Returns whether READ
/// responses are left to pace (tick again at once).
fn run_worklist(dev: &Device, now: Instant, w: usize) -> bool {
    let mut more_replies = false;
    let mut work = {
        let mut shard = dev.timers.shard(w);
        let mut work = std::mem::take(&mut shard.spare);
        std::mem::swap(&mut work, &mut shard.work);
        work
    };
    for &qpn in &work {
        dev.timers.shard(w).visited += 1;
        let rts = {
            let Some(mut qp) = dev.qps.get(qpn) else {
                continue;
            };
            qp.tick.listed = false;
            qp.state == crate::qp::QpState::Rts
        };
        if rts {
            super::requester::run(dev, qpn, now);
        }
        if dev.qps.get(qpn).is_some_and(|q| !q.resp.replies.is_empty()) {
            let more = super::with_resp(dev, qpn, |dev, c, st| {
                super::responder::pump_replies(dev, c, st, super::responder::READ_BURST)
            });
            if more == Some(true) {
                more_replies = true;
            }
        }
        // Still pending (e.g. in SQD until MODIFY_QP → RTS, which kicks the engine): stay listed.
        note_req(dev, qpn);
    }
    work.clear();
    dev.timers.shard(w).spare = work;
    more_replies
}
