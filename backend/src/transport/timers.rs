//! Per-QP transport timers: the RC retransmission timer (IBTA 9.7.6.1.3: 4.096 µs × 2^timeout)
//! and the RNR back-off (IBTA 9.7.5.2.8, table 45). Deadlines live in
//! [`super::RequesterState`]; [`on_tick`] fires the expired ones and returns the next deadline so
//! the engine can program its timerfd.

use std::time::{Duration, Instant};

use super::ctx::{self, QpCtx};
use super::{completer, requester, with_req};
use crate::device::Device;

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
    match (st.retrans_deadline, st.rnr_deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Fire expired timers of every QP; return the earliest pending deadline.
pub fn on_tick(dev: &mut Device, now: Instant) -> Option<Instant> {
    let mut next: Option<Instant> = None;
    for qpn in ctx::qpns_with_timers(dev) {
        let fired = with_req(dev, qpn, |dev, ctx: &QpCtx, st| {
            let mut fired = false;
            if st.retrans_deadline.is_some_and(|d| d <= now) {
                if let Some(s) = ctx::qp_stats(dev, ctx.qpn) {
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
            next_deadline(st)
        });
        if let Some(Some(d)) = fired {
            next = Some(next.map_or(d, |n: Instant| n.min(d)));
        }
    }
    // Sends that nothing else will trigger (SQD → RTS).
    for qpn in ctx::qpns_with_pending_sends(dev) {
        super::requester::run(dev, qpn, now);
    }
    // Paced READ responses (responder.rs READ_BURST): continue them now.
    for qpn in ctx::qpns_with_replies(dev) {
        let more = super::with_resp(dev, qpn, |dev, c, st| {
            super::responder::pump_replies(dev, c, st, super::responder::READ_BURST)
        });
        if more == Some(true) {
            next = Some(next.map_or(now, |n: Instant| n.min(now)));
        }
    }
    next
}
