//! Requester (IBTA 9.7 requester side): takes WQEs from the SQ ring (spec §6.1), validates them,
//! segments them by path MTU and builds request packets.
//!
//! Flow control is a window of [`WINDOW`] outstanding packets (RC); READ and atomic requests are
//! additionally bounded by `max_rd_atomic` (IBTA 9.5.4 / IBTA 9.5). PSNs are assigned in order as
//! packets are first sent; a go-back-N restart (`restart`) re-walks the same WQEs from the oldest
//! unacknowledged PSN, which regenerates exactly the same PSNs because segmentation is a pure
//! function of (WQE, offset, MTU).
//!
//! Completions are written strictly in SQ order (IBTA 10.8): a WQE is first marked
//! [`WqeState::Done`] and retired from the front of the queue by `retire`.
//!
//! Files: `wqe.rs` (the decoded send WQE and its decoding, spec §6.1), `send.rs` (WQEs to
//! packets: the send loop, local operations, SGE gathers, and a WQE's packets as named steps:
//! begin, send a packet, update the state), `request.rs` (what a WQE's next packet is: its
//! destination, opcode, headers and payload, segmented by path MTU), `build.rs` (the one builder
//! that puts a request packet into a frame or a fabric segment); this file holds the state, the
//! entry points, fetching, retiring, restarts and the flush.

use std::collections::VecDeque;
use std::time::Instant;

use super::ctx::{self, abi::*, Cqe, QpCtx};
use super::packet::opcode_for;
use super::{psn_add, psn_diff, Fatal, PSN_MASK};
use crate::budget::Charge;
use crate::memory::mr::MrError;
use crate::memory::{Access, BindMw, FastReg};
use crate::qp::{QpState, QpType};
use crate::transport::Device;
use crate::wire::segment::SegmentWriter;
use crate::wire::{AtomicEth, Deth, Feth, Ieth, ImmDt, Operation, Position, Reth, Xrceth};

mod build;
mod request;
mod send;
mod wqe;

use send::send;
pub(crate) use send::{sge_copy, SgeError, SgeIo};
pub(crate) use wqe::decode_wqe;
pub use wqe::{FlushWqe, SendWqe, Sge, WqeState};

/// Maximum packets outstanding (sent, not acknowledged) per RC QP.
pub const WINDOW: u32 = 128;
/// Smallest congestion window and the initial one.
pub const MIN_CWND: u32 = 4;
const INIT_CWND: u32 = 32;
/// Maximum WQEs held in [`RequesterState::wqes`] (fetched from the ring, not retired).
const MAX_FETCHED: usize = 512;
/// Request an ACK at least every this many packets within a long message (ACK coalescing).
const ACK_EVERY: u32 = 32;
/// Size of the send WQE header (spec §6.1).
const WQE_HDR: usize = 64;
/// Most response packets (PSNs) one RDMA READ may take (spec §14.3). PSN comparisons are signed
/// over 2^24 (IBTA 9.7.1), so everything outstanding must span less than 2^23 PSNs; a READ is
/// sent only inside the send window (128 PSNs), so a quarter of the space per READ keeps every
/// comparison exact. Reached only at path MTU 256 by a READ of more than 1 GiB.
pub const MAX_READ_PSNS: u32 = 1 << 22;
/// Size of one SGE.
const SGE_SIZE: usize = 16;
/// `retire`'s CQE vector is kept while it holds at most this many (a larger one was a burst).
const CQE_SCRATCH_CAP: usize = 64;

/// Requester-side protocol state of one QP, held in `Qp::req`.
///
/// `qp/` calls [`RequesterState::set_sq_psn`] when MODIFY_QP carries `VRDMA_QP_SQ_PSN`, and
/// [`RequesterState::reset`] on any transition to RESET.
#[derive(Debug, Default)]
pub struct RequesterState {
    /// Next PSN for a new request packet.
    pub psn: u32,
    /// Oldest PSN not yet acknowledged (RC).
    pub una: u32,
    /// One past the highest PSN ever sent (`psn` moves back on a rewind, this does not).
    pub psn_high: u32,
    /// Next SQ ring index to fetch (free-running, §4).
    pub sq_fetch: u32,
    /// WQEs fetched from the SQ and not yet retired, in SQ order.
    pub wqes: VecDeque<SendWqe>,
    /// `wqes[..sent_prefix]` are all Sent or Done, so [`send`] starts after them instead of
    /// skipping a whole window of outstanding WQEs on every call. Only `restart` moves a WQE
    /// back to Pending/Sending (it resets this to 0); `retire` pops Done WQEs off the front.
    pub sent_prefix: usize,
    /// Reused so steady-state traffic allocates nothing per WQE ([datapath] item 3): the slot
    /// buffer of `fetch` (within the QP's `wqe_floor` charge) and the CQEs `retire` collects.
    pub wqe_buf: Vec<u8>,
    pub cqe_scratch: Vec<Cqe>,
    /// Host memory of the fetched WQEs beyond the first one, which the QP's own charge covers
    /// (spec §16: see [`wqe_floor`]); `wqe_bytes` is what all of `wqes` hold.
    pub wqe_charge: Charge,
    pub wqe_bytes: u64,
    /// The last fetch stopped with WQEs left in the ring (cache full or budget exhausted):
    /// fetch again once retiring made room.
    pub fetch_blocked: bool,
    /// Outstanding RDMA READ / atomic requests (bounded by max_rd_atomic); recomputed on restart.
    pub rd_atomic_outstanding: u32,
    /// Remaining transport retries before RETRY_EXC_ERR.
    pub retry_left: u8,
    /// Remaining RNR retries before RNR_RETRY_EXC_ERR (7 = infinite).
    pub rnr_left: u8,
    /// Retry counters were loaded from the QP attributes.
    pub counters_loaded: bool,
    /// Retransmission deadline (RC): armed while packets are outstanding.
    pub retrans_deadline: Option<Instant>,
    /// RNR back-off: no (re)transmission before this instant.
    pub rnr_deadline: Option<Instant>,
    /// Restored by a migration with packets in flight (spec §17.4): resend them from this
    /// instant on. Not a timeout: what the source sent was lost with its port, so no retry is
    /// spent on it (the source may have spent them all on a bad path just before it stopped).
    pub moved_resend: Option<Instant>,
    /// Set while an ODP fault on a local SGE blocks the QP (spec §10).
    pub odp_wait: Option<OdpWait>,
    /// An error WQE is queued: send nothing more, the QP goes to ERROR when it retires.
    pub stopped: bool,
    /// Deferred QP-level error to apply once the state is back in the QP (see `with_req`).
    pub fatal: Option<Fatal>,
    /// Go-back-N rewinds (`restart`) since the QP was created or reset (tests, stats).
    pub restarts: u64,
    /// Placeholder left in the QP while a transport function holds the real state.
    pub taken: bool,
    /// Congestion window in packets (0 = not initialised): additive increase per acknowledgement,
    /// halved on every loss signal (NAK sequence error, timeout, implied NAK), bounded by
    /// [`MIN_CWND`]..=[`WINDOW`]. IBTA leaves flow control beyond credits to the implementation;
    /// this keeps go-back-N from resending a whole window per lost packet on lossy links.
    pub cwnd: u32,
    /// Restart point of the last loss-triggered go-back-N; further loss signals for the same
    /// point are ignored until progress is made (a burst of out-of-order READ responses, or
    /// duplicated NAKs, must not trigger a retransmission each).
    pub retry_psn: Option<u32>,
}

/// A suspended requester waits for this ODP chunk to become resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OdpWait {
    pub key: u32,
    pub iova: u64,
}

impl RequesterState {
    /// Back to the state of a freshly created QP (MODIFY_QP to RESET).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// MODIFY_QP with `VRDMA_QP_SQ_PSN`.
    pub fn set_sq_psn(&mut self, psn: u32) {
        self.psn = psn & PSN_MASK;
        self.una = self.psn;
        self.psn_high = self.psn;
    }

    /// Are RC packets outstanding (sent and not acknowledged / answered)?
    pub fn outstanding(&self) -> bool {
        self.wqes
            .iter()
            .any(|w| matches!(w.state, WqeState::Sending | WqeState::Sent))
    }

    /// The effective window (packets).
    pub fn window(&self) -> u32 {
        if self.cwnd == 0 {
            INIT_CWND
        } else {
            self.cwnd
        }
    }

    /// An acknowledgement made progress.
    pub fn cwnd_grow(&mut self) {
        self.cwnd = (self.window() + 1).min(WINDOW);
    }

    /// A loss signal.
    pub fn cwnd_shrink(&mut self) {
        self.cwnd = (self.window() / 2).max(MIN_CWND);
    }

    pub(crate) fn recount_rd_atomic(&mut self) {
        self.rd_atomic_outstanding = self
            .wqes
            .iter()
            .filter(|w| w.is_rd_atomic() && matches!(w.state, WqeState::Sending | WqeState::Sent))
            .count() as u32;
    }
}

/// Entry point: the SQ doorbell, an ODP resume, a timer or a response opened the window.
pub fn run(dev: &Device, qpn: u32, now: Instant) {
    super::with_req(dev, qpn, |dev, ctx, st| process(dev, ctx, st, now));
}

pub(crate) fn process(dev: &Device, ctx: &QpCtx, st: &mut RequesterState, now: Instant) {
    // An XRC_TGT has no send queue (spec §13.7): its SQ doorbells (the guest's, or the
    // doorbell-overflow sweep's) have nothing to start or flush.
    if ctx.qp_type == QpType::XrcTgt {
        return;
    }
    if ctx.state == QpState::Err {
        flush(dev, ctx, st);
        return;
    }
    if !ctx.can_send() {
        return;
    }
    if !st.counters_loaded {
        st.retry_left = ctx.retry_cnt;
        st.rnr_left = ctx.rnr_retry;
        st.counters_loaded = true;
    }
    // Fetching is harmless in SQD: `send` starts nothing new there, and the WQEs are ready when
    // the QP returns to RTS (the engine tick restarts such QPs, see timers.rs).
    if let Err(f) = fetch(dev, ctx, st) {
        st.fatal = Some(f);
        return;
    }
    send(dev, ctx, st, now);
    let mut before = st.wqes.len();
    retire(dev, ctx, st);
    // Retiring made room for WQEs the fetch left in the ring (cache full or budget exhausted,
    // spec §16.1): fetch them now, since no further doorbell or response may come for them
    // (UD sends complete as they are sent). Each round retires at least one WQE; the number
    // of rounds per call is bounded like one fetch is.
    let mut rounds = 0;
    while st.fetch_blocked && st.wqes.len() < before && st.fatal.is_none() && rounds < MAX_FETCHED {
        rounds += 1;
        if let Err(f) = fetch(dev, ctx, st) {
            st.fatal = Some(f);
            return;
        }
        send(dev, ctx, st, now);
        before = st.wqes.len();
        retire(dev, ctx, st);
    }
    arm_timer(ctx, st, now);
    // SQD (IBTA 10.3.1): once nothing is in flight the drain is complete; SQ_DRAINED is
    // reported if the QP asked for it (en_sqd_async_notify).
    if ctx.state == QpState::Sqd && ctx.sq_draining && !st.outstanding() {
        ctx::sq_drained(dev, ctx.qpn);
        if ctx.en_sqd_async_notify {
            ctx::event(dev, EV_SQ_DRAINED, ctx.qpn, 0);
        }
    }
}

/// Host memory a decoded send WQE holds: the struct, its SGE list and inline data.
pub fn wqe_cost(w: &SendWqe) -> u64 {
    (std::mem::size_of::<SendWqe>()
        + w.sges.len() * std::mem::size_of::<Sge>()
        + w.inline.as_ref().map_or(0, |v| v.len())) as u64
}

/// The most one fetched WQE of a QP with `sq_wqe_size`-byte slots can cost: its SGEs and inline
/// data come from the slot, so they are never larger. The QP's own charge includes this much
/// (`Device::qp_fixed_charge`), so every QP can always hold one fetched WQE and make progress
/// whatever the other objects of the device hold (spec §16).
pub fn wqe_floor(sq_wqe_size: u32) -> u64 {
    std::mem::size_of::<SendWqe>() as u64 + u64::from(sq_wqe_size)
}

/// Pull newly posted WQEs from the SQ ring (spec §4: producer read on a doorbell). Stops at
/// [`MAX_FETCHED`] cached WQEs, or when the next one does not fit the host-memory budget
/// (spec §16: the WQE stays in the ring and is fetched once retiring makes room).
fn fetch(dev: &Device, ctx: &QpCtx, st: &mut RequesterState) -> Result<(), Fatal> {
    let producer = ctx::sq_producer(dev, ctx.qpn).map_err(|f| Fatal::QpFatal(f.0))?;
    let floor = wqe_floor(ctx.sq_wqe_size);
    let mut buf = std::mem::take(&mut st.wqe_buf);
    buf.resize(ctx.sq_wqe_size as usize, 0);
    st.fetch_blocked = false;
    while st.sq_fetch != producer {
        if st.wqes.len() >= MAX_FETCHED {
            st.fetch_blocked = true;
            break;
        }
        let idx = st.sq_fetch;
        ctx::sq_read(dev, ctx.qpn, idx, &mut buf).map_err(|f| Fatal::QpFatal(f.0))?;
        let mut w = decode_wqe(ctx, idx, &buf);
        w.cost = wqe_cost(&w);
        let need = (st.wqe_bytes + w.cost).saturating_sub(floor);
        let more = need.saturating_sub(st.wqe_charge.bytes());
        if more > 0 && st.wqe_charge.try_grow(&dev.budget, more).is_err() {
            st.fetch_blocked = true;
            break;
        }
        st.wqe_bytes += w.cost;
        // UD/GSI send errors complete the WQE and leave the QP in RTS (spec §14.3, no SQE).
        if ctx.is_ud() {
            w.fatal = false;
        }
        st.wqes.push_back(w);
        st.sq_fetch = st.sq_fetch.wrapping_add(1);
    }
    st.wqe_buf = buf;
    Ok(())
}

/// Retire completed WQEs from the front of the queue in SQ order: write send CQEs (signaled or
/// error, IBTA 10.7 / spec §7) and advance the SQ consumer (spec §4).
///
/// The consumer moves BEFORE the CQEs are written: a consumer that sees a send completion may
/// post again at once, and the driver checks SQ space against this consumer.
pub(crate) fn retire(dev: &Device, ctx: &QpCtx, st: &mut RequesterState) {
    let mut consumer = None;
    let mut cqes = std::mem::take(&mut st.cqe_scratch);
    cqes.clear();
    while let Some(w) = st.wqes.front() {
        if w.state != WqeState::Done {
            break;
        }
        let Some(w) = st.wqes.pop_front() else { break };
        st.sent_prefix = st.sent_prefix.saturating_sub(1);
        st.wqe_bytes = st.wqe_bytes.saturating_sub(w.cost);
        if w.signaled || w.status != WC_SUCCESS {
            let cqe = Cqe {
                wr_id: w.wr_id,
                qpn: ctx.qpn,
                opcode: w.wc_opcode(),
                status: w.status,
                byte_len: if w.status == WC_SUCCESS {
                    w.length as u32
                } else {
                    0
                },
                ..Default::default()
            };
            cqes.push(cqe);
        }
        consumer = Some(w.index.wrapping_add(1));
        if w.status != WC_SUCCESS && w.fatal {
            st.fatal = Some(Fatal::Silent);
            break;
        }
    }
    let held = st.wqe_charge.bytes();
    st.wqe_charge
        .shrink(held.saturating_sub(st.wqe_bytes.saturating_sub(wqe_floor(ctx.sq_wqe_size))));
    if let Some(c) = consumer {
        ctx::sq_set_consumer(dev, ctx.qpn, c);
    }
    for cqe in &cqes {
        ctx::post_cqe(dev, ctx.send_cqn, cqe, false);
    }
    if cqes.capacity() <= CQE_SCRATCH_CAP {
        st.cqe_scratch = cqes;
    }
}

/// Arm or clear the retransmission timer (RC): armed while anything is outstanding.
fn arm_timer(ctx: &QpCtx, st: &mut RequesterState, now: Instant) {
    if !ctx.is_rc() {
        return;
    }
    if st.outstanding() {
        if st.retrans_deadline.is_none() {
            st.retrans_deadline = super::timers::retrans_timeout(ctx.timeout).map(|d| now + d);
        }
    } else {
        st.retrans_deadline = None;
    }
}

/// Go-back-N (IBTA 9.7.5.1): rewind to the oldest WQE that is not complete and resend from
/// `una` (SEND/WRITE) or from the first missing response (READ). Later WQEs are resent from the
/// start and get the same PSNs again.
pub(crate) fn restart(ctx: &QpCtx, st: &mut RequesterState) {
    st.restarts += 1;
    st.sent_prefix = 0;
    let mtu = ctx.mtu as u64;
    // Everything before `una` was acknowledged: new WQEs must not reuse those PSNs (an ACK that
    // completes the WQE being resent leaves `psn` behind `una`).
    if psn_diff(st.una, st.psn) > 0 {
        st.psn = st.una;
    }
    let mut restart_psn: Option<u32> = None;
    let una = st.una;
    for w in st.wqes.iter_mut() {
        if w.state == WqeState::Done || w.is_local() {
            continue;
        }
        if !w.sent_once {
            // Never sent: nothing to rewind from here on, but PSNs must restart here.
            if restart_psn.is_none() {
                restart_psn = Some(st.psn);
            }
            continue;
        }
        match restart_psn {
            None => {
                if w.is_read() {
                    // Responses arrive in order: `offset` bytes are in; ask for the rest.
                    let psn = psn_add(w.first_psn, (w.offset / mtu) as u32);
                    w.state = if w.offset == 0 {
                        WqeState::Pending
                    } else {
                        WqeState::Sending
                    };
                    restart_psn = Some(psn);
                } else if w.is_atomic() || w.is_empty_read_like() {
                    // One PSN, executed once by the responder: resend it whole (a duplicate is
                    // answered from the responder's resource cache).
                    w.state = WqeState::Pending;
                    w.offset = 0;
                    restart_psn = Some(w.first_psn);
                } else {
                    // SEND/WRITE: everything before `una` was acknowledged.
                    let d = psn_diff(una, w.first_psn);
                    let k = if d > 0 { d as u64 } else { 0 };
                    w.offset = (k * mtu).min(w.length);
                    if w.offset >= w.length && w.length > 0 {
                        // Fully acknowledged but not yet marked: the ack path marks it Done.
                        w.offset = 0;
                        w.state = WqeState::Pending;
                        restart_psn = Some(w.first_psn);
                    } else {
                        w.state = if w.offset == 0 {
                            WqeState::Pending
                        } else {
                            WqeState::Sending
                        };
                        restart_psn = Some(psn_add(w.first_psn, (w.offset / mtu) as u32));
                    }
                }
            }
            Some(_) => {
                w.state = WqeState::Pending;
                w.offset = 0;
            }
        }
    }
    if let Some(p) = restart_psn {
        st.psn = p;
    }
    st.recount_rd_atomic();
}

/// Where a go-back-N restart would resume (see [`restart`]); `None` if nothing was sent.
fn restart_point(ctx: &QpCtx, st: &RequesterState) -> Option<u32> {
    let mtu = ctx.mtu as u64;
    let w = st
        .wqes
        .iter()
        .find(|w| w.state != WqeState::Done && !w.is_local())?;
    if !w.sent_once {
        return None;
    }
    Some(if w.is_read() {
        psn_add(w.first_psn, (w.offset / mtu) as u32)
    } else if w.is_atomic() || w.is_empty_read_like() {
        w.first_psn
    } else if psn_diff(st.una, w.first_psn) > 0 && psn_diff(st.una, w.last_psn) <= 0 {
        st.una
    } else {
        w.first_psn
    })
}

/// A loss signal (NAK sequence error, implied NAK): go back once per restart point and shrink the
/// congestion window.
/// Returns whether a restart happened.
pub(crate) fn restart_on_loss(ctx: &QpCtx, st: &mut RequesterState) -> bool {
    let p = restart_point(ctx, st);
    if p.is_none() || p == st.retry_psn {
        return false;
    }
    st.retry_psn = p;
    st.cwnd_shrink();
    restart(ctx, st);
    true
}

/// QP in ERROR (IBTA 10.3.1 / spec §13): complete every outstanding and posted send WQE with
/// WR_FLUSH_ERR (the WQE that caused the error has its own status), in SQ order.
pub(crate) fn flush(dev: &Device, ctx: &QpCtx, st: &mut RequesterState) {
    for w in st.wqes.iter_mut() {
        if w.state != WqeState::Done {
            w.state = WqeState::Done;
            w.status = WC_WR_FLUSH_ERR;
        }
        w.fatal = false;
        // Flushed WQEs always produce a CQE (IBTA 10.8: error completions are always
        // generated).
        if w.status != WC_SUCCESS {
            w.signaled = true;
        }
    }
    retire(dev, ctx, st);
    st.fatal = None;
    // WQEs still in the ring: at most its depth. A fetch index ahead of the producer (state a
    // migration stream restored) names none, not the ~2^32 slots around the index space.
    let depth = dev.qps.get(ctx.qpn).map_or(0, |qp| qp.sq.depth());
    if let Ok(producer) = ctx::sq_producer(dev, ctx.qpn) {
        let mut buf = vec![0u8; 16];
        while st.sq_fetch != producer && producer.wrapping_sub(st.sq_fetch) <= depth {
            let idx = st.sq_fetch;
            let wr_id = if ctx::sq_read(dev, ctx.qpn, idx, &mut buf).is_ok() {
                let mut a = [0u8; 8];
                a.copy_from_slice(&buf[0..8]);
                u64::from_le_bytes(a)
            } else {
                0
            };
            let cqe = Cqe {
                wr_id,
                qpn: ctx.qpn,
                opcode: if buf.len() > 8 {
                    decode_opcode(buf[8])
                } else {
                    WC_SEND
                },
                status: WC_WR_FLUSH_ERR,
                ..Default::default()
            };
            st.sq_fetch = st.sq_fetch.wrapping_add(1);
            ctx::sq_set_consumer(dev, ctx.qpn, st.sq_fetch);
            ctx::post_cqe(dev, ctx.send_cqn, &cqe, false);
        }
    }
    st.retrans_deadline = None;
    st.rnr_deadline = None;
    st.moved_resend = None;
    st.odp_wait = None;
    st.rd_atomic_outstanding = 0;
}

fn decode_opcode(op: u8) -> u8 {
    SendWqe {
        opcode: op,
        ..Default::default()
    }
    .wc_opcode()
}
