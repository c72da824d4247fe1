//! Completer (IBTA 9.7.5.1 requester side of responses): ACKs, NAKs, READ responses and atomic
//! acknowledgements retire send WQEs; NAKs and timeouts drive go-back-N retransmission and RNR
//! back-off; exceeded retries and remote errors complete the WQE in error and move the QP to ERROR
//! (the remaining WQEs are then flushed, spec §13).

use std::time::Instant;

use super::ctx::{abi::*, QpCtx};
use super::packet::RxPkt;
use super::requester::{
    restart, restart_on_loss, sge_copy, OdpWait, RequesterState, SgeError, SgeIo, WqeState,
};
use super::{psn_add, psn_diff, timers};
use crate::transport::Device;
use crate::wire::{NakCode, Operation, Position, Syndrome};

/// A response for `ctx`'s QP arrived (RC only; the caller checked the QP state).
pub(crate) fn on_response(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    pkt: &RxPkt<'_>,
    now: Instant,
) {
    let psn = pkt.psn();
    // Ghost / stale responses (IBTA 9.7.5.1): a PSN older than the oldest outstanding one, or
    // one we never sent, is ignored.
    let last_sent = psn_add(st.psn_high, super::PSN_MASK); // highest PSN sent
    if psn_diff(psn, last_sent) > 0
        || psn_diff(psn, st.una) < -(super::requester::WINDOW as i32 * 2)
    {
        return;
    }
    match pkt.op() {
        Operation::Ack => {
            let Some(aeth) = pkt.aeth else { return };
            match aeth.syndrome {
                Syndrome::Ack { .. } => {
                    if psn_diff(psn, st.una) < -1 {
                        return; // duplicate of an older ACK
                    }
                    ack_upto(ctx, st, psn, now);
                }
                Syndrome::RnrNak { timer } => {
                    if let Some(mut s) = super::ctx::qp_stats(dev, ctx.qpn) {
                        s.rnr_naks_rx += 1;
                    }
                    ack_upto(ctx, st, psn_add(psn, super::PSN_MASK), now);
                    on_rnr(ctx, st, timer, now);
                }
                Syndrome::Nak(code) => {
                    if code == NakCode::PsnSequenceError {
                        if let Some(mut s) = super::ctx::qp_stats(dev, ctx.qpn) {
                            s.seq_naks_rx += 1;
                        }
                    }
                    ack_upto(ctx, st, psn_add(psn, super::PSN_MASK), now);
                    on_nak(ctx, st, psn, code);
                }
                Syndrome::Reserved(_) => {}
            }
        }
        Operation::ReadResponse => on_read_response(dev, ctx, st, pkt, now),
        Operation::AtomicAck => on_atomic_ack(dev, ctx, st, pkt, now),
        _ => {}
    }
}

/// Positive acknowledgement of every PSN up to and including `psn` (IBTA 9.7.5.1.1: ACKs are
/// cumulative). SEND/WRITE WQEs whose last packet is covered complete; a READ/atomic that is
/// covered but has no response yet means its response was lost: go back to it.
fn ack_upto(ctx: &QpCtx, st: &mut RequesterState, psn: u32, now: Instant) {
    let mut progress = false;
    let mut lost_response = false;
    for w in st.wqes.iter_mut() {
        if w.state == WqeState::Done || w.is_local() {
            continue;
        }
        if !w.sent_once || psn_diff(w.last_psn, psn) > 0 {
            break;
        }
        if w.is_rd_atomic() {
            lost_response = true;
            break;
        }
        // Every packet of this SEND/WRITE is acknowledged (even if a rewind queued it again).
        w.state = WqeState::Done;
        w.status = WC_SUCCESS;
        progress = true;
    }
    let next = psn_add(psn, 1);
    if psn_diff(next, st.una) > 0 && psn_diff(next, st.psn_high) <= 0 {
        st.una = next;
        progress = true;
    }
    if progress {
        on_progress(ctx, st, now);
        if psn_diff(st.una, st.psn) > 0 {
            // A rewind is resending packets this ACK covers: skip ahead to `una`.
            restart(ctx, st);
        }
    }
    if lost_response {
        restart_on_loss(ctx, st);
    }
}

/// Forward progress: reload the retry counters (IBTA 9.7.6: the counts apply to consecutive
/// failures) and restart the retransmission timer.
fn on_progress(ctx: &QpCtx, st: &mut RequesterState, now: Instant) {
    st.cwnd_grow();
    st.retry_psn = None;
    st.retry_left = ctx.retry_cnt;
    st.rnr_left = ctx.rnr_retry;
    st.retrans_deadline = timers::retrans_timeout(ctx.timeout).map(|d| now + d);
}

/// RNR NAK (IBTA 9.7.5.2.8): wait the responder's RNR timer, then resend from the NAK'd PSN;
/// after `rnr_retry` consecutive RNR NAKs (7 = infinite) fail with RNR_RETRY_EXC_ERR.
fn on_rnr(ctx: &QpCtx, st: &mut RequesterState, timer: u8, now: Instant) {
    if st.rnr_left == 0 {
        fail_oldest(st, WC_RNR_RETRY_EXC_ERR);
        return;
    }
    if st.rnr_left != 7 {
        st.rnr_left -= 1;
    }
    st.rnr_deadline = Some(now + timers::rnr_timeout(timer));
    st.retrans_deadline = None;
    restart(ctx, st);
}

/// NAK (IBTA 9.7.5.2): PSN sequence error → go-back-N; the others are fatal for the WQE at `psn`.
fn on_nak(ctx: &QpCtx, st: &mut RequesterState, _psn: u32, code: NakCode) {
    let status = match code {
        NakCode::PsnSequenceError => {
            // Spec §14.5: retransmit from the NAK'ed PSN, counted against retry_cnt.
            if st.retry_left == 0 {
                fail_oldest(st, WC_RETRY_EXC_ERR);
                return;
            }
            if restart_on_loss(ctx, st) {
                st.retry_left -= 1;
            }
            return;
        }
        NakCode::InvalidRequest => WC_REM_INV_REQ_ERR,
        NakCode::RemoteAccessError => WC_REM_ACCESS_ERR,
        NakCode::RemoteOperationalError => WC_REM_OP_ERR,
        NakCode::InvalidRdRequest => WC_REM_INV_RD_REQ_ERR,
        NakCode::Reserved(_) => WC_BAD_RESP_ERR,
    };
    fail_oldest(st, status);
}

/// Complete the oldest incomplete WQE with `status` and stop the QP (it goes to ERROR when that WQE
/// retires; everything after it is flushed).
pub(crate) fn fail_oldest(st: &mut RequesterState, status: u8) {
    if let Some(w) = st
        .wqes
        .iter_mut()
        .find(|w| w.state != WqeState::Done && !w.is_local())
    {
        w.state = WqeState::Done;
        w.status = status;
        w.fatal = true;
        st.stopped = true;
        st.retrans_deadline = None;
        st.rnr_deadline = None;
    }
}

/// Index of the oldest incomplete WQE; WQEs before `limit_psn` that are SEND/WRITE and fully sent
/// are implicitly acknowledged by a READ response / atomic ACK (IBTA 9.7.5.1.1).
fn implicit_ack_before(st: &mut RequesterState, psn: u32) -> Option<usize> {
    for (i, w) in st.wqes.iter_mut().enumerate() {
        if w.state == WqeState::Done || w.is_local() {
            continue;
        }
        if !w.sent_once || w.is_rd_atomic() || psn_diff(w.last_psn, psn) >= 0 {
            return Some(i);
        }
        w.state = WqeState::Done;
        w.status = WC_SUCCESS;
    }
    None
}

/// An RDMA READ response packet (IBTA 9.7.5.1): it implicitly acknowledges the SEND/WRITEs
/// before it (9.7.5.1.1), completes an ATOMIC WRITE / FLUSH, or, at the next expected PSN of
/// the oldest READ, scatters its payload there and advances the READ.
fn on_read_response(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    pkt: &RxPkt<'_>,
    now: Instant,
) {
    let psn = pkt.psn();
    let Some(i) = implicit_ack_before(st, psn) else {
        return;
    };
    if st.wqes[i].is_empty_read_like() && st.wqes[i].sent_once {
        on_empty_read_response(ctx, st, i, pkt, now);
        return;
    }
    let Some((offset, length)) = expected_read_position(ctx, st, i, psn) else {
        return;
    };
    let n = pkt.payload.len() as u64;
    if !read_response_len_ok(length - offset, ctx.mtu as u64, n) {
        // Spec §14.5: a response of unexpected length at the expected PSN is BAD_RESP_ERR.
        fail_oldest(st, WC_BAD_RESP_ERR);
        return;
    }
    if n > 0 && !scatter_read_payload(dev, ctx, st, i, offset, pkt.payload) {
        return;
    }
    advance_read(st, i, n, psn);
    on_progress(ctx, st, now);
}

/// The READ of WQE `i` at `psn` (IBTA 9.7.5.1): `Some((offset, length))` of the WQE if `psn` is
/// the next response packet it expects. A response for a READ we are not waiting for, or one
/// past the expected PSN, means one was lost (an implied NAK): the READ is asked for again from
/// there. Duplicates and PSNs outside the READ are ignored.
fn expected_read_position(
    ctx: &QpCtx,
    st: &mut RequesterState,
    i: usize,
    psn: u32,
) -> Option<(u64, u64)> {
    let mtu = ctx.mtu as u64;
    let (expected, first_psn, last_psn, offset, length, is_read) = {
        let w = &st.wqes[i];
        (
            psn_add(w.first_psn, (w.offset / mtu) as u32),
            w.first_psn,
            w.last_psn,
            w.offset,
            w.length,
            w.is_read(),
        )
    };
    if !is_read || !st.wqes[i].sent_once {
        // A response for a READ we are not waiting for at this position: an earlier READ/atomic
        // response is missing.
        if psn_diff(psn, first_psn) > 0 {
            restart_on_loss(ctx, st);
        }
        return None;
    }
    if psn_diff(psn, first_psn) < 0 || psn_diff(psn, last_psn) > 0 {
        return None;
    }
    let d = psn_diff(psn, expected);
    if d < 0 {
        return None; // duplicate response
    }
    if d > 0 {
        // A response packet was lost (IBTA 9.7.5.1: implied NAK): ask again for the rest.
        restart_on_loss(ctx, st);
        return None;
    }
    Some((offset, length))
}

/// The bytes at a given PSN are the same whichever (re)sent READ request produced them, so a
/// response of `n` bytes is accepted by PSN and length alone: a full MTU while more than an MTU
/// remains, exactly the remainder at the end. The AETH-carrying position is not checked because
/// a resent READ restarts at FIRST.
fn read_response_len_ok(remaining: u64, mtu: u64, n: u64) -> bool {
    if remaining > mtu {
        n == mtu
    } else {
        n == remaining
    }
}

/// Scatter a READ response's payload into WQE `i`'s SGEs at `offset`. False when it could not
/// be placed and was handled here: an ODP fault suspends the QP until the chunk is resident
/// (spec §10), an SGE that fails its check completes the WQE LOC_PROT_ERR (spec §14.5).
fn scatter_read_payload(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    i: usize,
    offset: u64,
    payload: &[u8],
) -> bool {
    let sges = std::mem::take(&mut st.wqes[i].sges);
    let r = sge_copy(
        dev,
        Some(ctx.qpn),
        ctx.pdn,
        &sges,
        offset,
        SgeIo::Scatter(payload),
    );
    st.wqes[i].sges = sges;
    match r {
        Ok(()) => true,
        Err(SgeError::Fault { key, iova }) => {
            // Requester-side ODP fault on the READ target: drop, suspend, and re-request from
            // here once the chunk is resident (spec §10).
            st.odp_wait = Some(OdpWait { key, iova });
            restart(ctx, st);
            false
        }
        Err(_) => {
            fail_oldest(st, WC_LOC_PROT_ERR);
            false
        }
    }
}

/// `n` more bytes of WQE `i`'s READ arrived at `psn`: the READ completes when all have, and
/// the oldest unacknowledged PSN moves past `psn` (IBTA 9.7.5.1.1).
fn advance_read(st: &mut RequesterState, i: usize, n: u64, psn: u32) {
    let w = &mut st.wqes[i];
    w.offset += n;
    if w.offset >= w.length {
        w.state = WqeState::Done;
        w.status = WC_SUCCESS;
        st.recount_rd_atomic();
    }
    let next = psn_add(psn, 1);
    if psn_diff(next, st.una) > 0 {
        st.una = next;
    }
}

/// ATOMIC WRITE / FLUSH (IBTA 1.5) complete on an RDMA READ RESPONSE ONLY without payload at
/// their PSN; anything else at that PSN is a bad response (spec §14.5).
fn on_empty_read_response(
    ctx: &QpCtx,
    st: &mut RequesterState,
    i: usize,
    pkt: &RxPkt<'_>,
    now: Instant,
) {
    let psn = pkt.psn();
    let first_psn = st.wqes[i].first_psn;
    if psn != first_psn {
        // A later response: this one's was lost (implied NAK).
        if psn_diff(psn, first_psn) > 0 {
            restart_on_loss(ctx, st);
        }
        return;
    }
    if pkt.pos() != Position::Only || !pkt.payload.is_empty() {
        fail_oldest(st, WC_BAD_RESP_ERR);
        return;
    }
    retire_read_like(ctx, st, i, psn, now);
}

/// WQE `i` (an atomic, ATOMIC WRITE or FLUSH) got its one response at `psn`: it is done, its
/// responder resource is free again, and everything up to `psn` is acknowledged.
fn retire_read_like(ctx: &QpCtx, st: &mut RequesterState, i: usize, psn: u32, now: Instant) {
    let w = &mut st.wqes[i];
    w.state = WqeState::Done;
    w.status = WC_SUCCESS;
    st.recount_rd_atomic();
    let next = psn_add(psn, 1);
    if psn_diff(next, st.una) > 0 {
        st.una = next;
    }
    on_progress(ctx, st, now);
}

fn on_atomic_ack(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    pkt: &RxPkt<'_>,
    now: Instant,
) {
    let psn = pkt.psn();
    let Some(orig) = pkt.atomic_ack.map(|a| a.orig) else {
        return;
    };
    let Some(i) = implicit_ack_before(st, psn) else {
        return;
    };
    let w = &st.wqes[i];
    if !w.is_atomic() || !w.sent_once || w.first_psn != psn {
        if psn_diff(psn, w.first_psn) > 0 {
            restart_on_loss(ctx, st);
        }
        return;
    }
    // The original remote value lands in the local SGE (8 bytes, host order = little-endian).
    let sges = w.sges.clone();
    let buf = orig.to_le_bytes();
    match sge_copy(dev, Some(ctx.qpn), ctx.pdn, &sges, 0, SgeIo::Scatter(&buf)) {
        Ok(()) => {}
        Err(SgeError::Fault { key, iova }) => {
            // The atomic was executed remotely; a resend is answered from the responder's
            // resource cache, not re-executed (IBTA 9.7.5.1).
            st.odp_wait = Some(OdpWait { key, iova });
            restart(ctx, st);
            return;
        }
        Err(_) => {
            fail_oldest(st, WC_LOC_PROT_ERR);
            return;
        }
    }
    retire_read_like(ctx, st, i, psn, now);
}

/// The device was restored by a migration with packets in flight (spec §17.4): resend from
/// the oldest unacknowledged packet and arm the retransmission timer, spending no retry and
/// counting no timeout (the packets were lost with the source's port).
pub(crate) fn resend_after_move(ctx: &QpCtx, st: &mut RequesterState, now: Instant) {
    st.moved_resend = None;
    if !st.outstanding() {
        return;
    }
    st.retry_psn = None;
    restart(ctx, st);
    st.retrans_deadline = timers::retrans_timeout(ctx.timeout).map(|d| now + d);
}

/// The retransmission timer expired (IBTA 9.7.6.1): resend from the oldest
/// unacknowledged packet, or fail with RETRY_EXC_ERR after `retry_cnt` consecutive timeouts.
pub(crate) fn on_retrans_timeout(ctx: &QpCtx, st: &mut RequesterState, now: Instant) {
    st.retrans_deadline = None;
    if !st.outstanding() {
        return;
    }
    if st.retry_left == 0 {
        fail_oldest(st, WC_RETRY_EXC_ERR);
        return;
    }
    st.retry_left -= 1;
    st.cwnd_shrink();
    st.retry_psn = None;
    restart(ctx, st);
    st.retrans_deadline = timers::retrans_timeout(ctx.timeout).map(|d| now + d);
}
