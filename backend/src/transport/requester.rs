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

use std::collections::VecDeque;
use std::time::Instant;

use super::ctx::{self, abi::*, Cqe, QpCtx, QPS_ERR, QPS_SQD, QPT_RC, QPT_XRC_TGT};
use super::packet::{opcode_for, TxHdrs};
use super::{psn_add, psn_diff, Fatal, PSN_MASK};
use crate::budget::Charge;
use crate::device::Device;
use crate::fabric::segment::SegmentWriter;
use crate::memory::mr::MrError;
use crate::memory::BindMw;
use crate::wire::{AtomicEth, Deth, Feth, Ieth, ImmDt, Operation, Position, Reth, Xrceth};

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

/// One local scatter/gather element.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// Where a WQE's progress is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WqeState {
    /// Not a single packet sent yet (or rewound by a restart).
    #[default]
    Pending,
    /// Some packets sent.
    Sending,
    /// Every request packet sent; waiting for ACK / response (RC).
    Sent,
    /// Completed with `status`; waiting to be retired in SQ order.
    Done,
}

/// A WQE the requester has fetched from the SQ ring (decoded copy; guest memory is not re-read).
#[derive(Debug, Clone, Default)]
pub struct SendWqe {
    /// SQ ring index of the WQE.
    pub index: u32,
    pub wr_id: u64,
    pub opcode: u8,
    pub flags: u8,
    pub signaled: bool,
    /// imm_data (wire order) or rkey to invalidate.
    pub ex: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
    /// ATOMIC_WRITE: the 8 bytes to store, in memory order.
    pub atomic_write_data: [u8; 8],
    /// FLUSH: the FETH fields and the RETH length (`length` stays 0: no payload, one PSN).
    pub flush: FlushWqe,
    /// UD: AH index, remote QPN, Q_Key.
    pub ah_index: u32,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    /// XRC_INI: the XRC SRQ at the target (`xrc_srqn`, sent in every request's XRCETH, §13.7).
    pub xrc_srqn: u32,
    /// REG_MR: the raw registration fields.
    pub reg: RegWqe,
    /// BIND_MW: `wr.bind_mw` (the QP's PD and QPN are filled in when it executes).
    pub bind: BindMw,
    pub sges: super::sgelist::SgeList,
    pub inline: Option<Vec<u8>>,
    pub length: u64,
    pub state: WqeState,
    /// SGEs were validated (keys, bounds) on first transmission.
    pub validated: bool,
    /// PSNs were assigned (first transmission happened); survives go-back-N rewinds, so
    /// acknowledgements for a rewound WQE are still recognised.
    pub sent_once: bool,
    /// PSN of the first packet and of the last packet of this WQE (valid once sent).
    pub first_psn: u32,
    pub last_psn: u32,
    /// Bytes already sent (requests) or received (READ responses).
    pub offset: u64,
    /// READ: `offset` when the current READ request was (re)sent; its first response (FIRST or
    /// ONLY) lands there (IBTA 9.7.5.1: a resent READ asks for the remainder only).
    pub read_base: u64,
    /// Host memory this decoded copy holds (see [`wqe_cost`]), fixed at fetch.
    pub cost: u64,
    /// Completion status once `state == Done`.
    pub status: u8,
    /// The error in `status` moves the QP to ERROR when this WQE retires.
    pub fatal: bool,
}

/// Fields of a FLUSH WQE (`struct vrdma_wqe_flush`).
#[derive(Debug, Clone, Copy, Default)]
pub struct FlushWqe {
    pub placement: u8,
    pub selectivity: u8,
    pub length: u64,
}

/// Fields of a REG_MR WQE (`struct vrdma_wqe_reg`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RegWqe {
    pub iova: u64,
    pub length: u64,
    pub key: u32,
    pub access: u32,
    pub page_list_len: u32,
    pub page_shift: u32,
    pub page_list_addr: u64,
}

impl SendWqe {
    pub fn is_read(&self) -> bool {
        self.opcode == WR_RDMA_READ
    }
    pub fn is_atomic(&self) -> bool {
        matches!(self.opcode, WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD)
    }
    /// IBTA 1.5 ATOMIC WRITE or FLUSH: one request answered by an empty READ response.
    pub fn is_empty_read_like(&self) -> bool {
        matches!(self.opcode, WR_ATOMIC_WRITE | WR_FLUSH)
    }
    /// Ordered like READ: counts against max_rd_atomic and is waited for by fences.
    pub fn is_rd_atomic(&self) -> bool {
        self.is_read() || self.is_atomic() || self.is_empty_read_like()
    }
    pub fn is_local(&self) -> bool {
        matches!(self.opcode, WR_LOCAL_INV | WR_REG_MR | WR_BIND_MW)
    }
    /// Number of PSNs this WQE consumes for a given MTU (READ: one per response packet).
    pub fn npkts(&self, mtu: u32) -> u32 {
        if self.is_atomic() || self.is_empty_read_like() {
            1
        } else {
            (self.length.div_ceil(mtu as u64)).max(1) as u32
        }
    }
    /// CQE opcode (spec §7).
    pub fn wc_opcode(&self) -> u8 {
        match self.opcode {
            WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM => WC_RDMA_WRITE,
            WR_RDMA_READ => WC_RDMA_READ,
            WR_ATOMIC_CMP_AND_SWP => WC_COMP_SWAP,
            WR_ATOMIC_FETCH_AND_ADD => WC_FETCH_ADD,
            WR_ATOMIC_WRITE => WC_ATOMIC_WRITE,
            WR_FLUSH => WC_FLUSH,
            WR_LOCAL_INV => WC_LOCAL_INV,
            WR_REG_MR => WC_REG_MR,
            WR_BIND_MW => WC_BIND_MW,
            _ => WC_SEND,
        }
    }
    fn finish(&mut self, status: u8, fatal: bool) {
        self.state = WqeState::Done;
        self.status = status;
        self.fatal = fatal;
    }
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

/// Decode a send WQE slot (spec §6.1). Errors are the completion status for the WQE and whether it
/// is QP-fatal.
pub(crate) fn decode_wqe(ctx: &QpCtx, index: u32, b: &[u8]) -> SendWqe {
    if b.len() < WQE_HDR {
        // Slots are at least 64 bytes (sq_wqe_shift >= 6); anything else is a broken QP.
        let mut w = SendWqe {
            index,
            ..Default::default()
        };
        w.finish(WC_LOC_QP_OP_ERR, true);
        return w;
    }
    let le32 = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let le64 = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let mut w = SendWqe {
        index,
        wr_id: le64(0),
        opcode: b[8],
        flags: b[9],
        ex: le32(12),
        xrc_srqn: if ctx.is_xrc() {
            le32(20) & 0x00ff_ffff
        } else {
            0
        },
        ..Default::default()
    };
    w.signaled = w.flags & SEND_SIGNALED != 0 || ctx.sq_sig_all;
    let num_sge = b[10] as usize;
    let inline_len = le32(16) as usize;
    match w.opcode {
        WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM | WR_RDMA_READ => {
            w.remote_addr = le64(24);
            w.rkey = le32(32);
        }
        WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD => {
            w.remote_addr = le64(24);
            w.rkey = le32(32);
            w.compare_add = le64(40);
            w.swap = le64(48);
        }
        WR_ATOMIC_WRITE => {
            w.remote_addr = le64(24);
            w.rkey = le32(32);
            w.atomic_write_data.copy_from_slice(&b[40..48]);
        }
        WR_FLUSH => {
            w.remote_addr = le64(24);
            w.rkey = le32(32);
            w.flush = FlushWqe {
                placement: b[36],
                selectivity: b[37],
                length: le64(40),
            };
        }
        WR_SEND | WR_SEND_WITH_IMM if ctx.is_ud() => {
            w.ah_index = le32(24);
            w.remote_qpn = le32(28) & 0x00ff_ffff;
            w.remote_qkey = le32(32);
        }
        WR_REG_MR => {
            w.reg = RegWqe {
                iova: le64(24),
                length: le64(32),
                key: le32(40),
                access: le32(44),
                page_list_len: le32(48),
                page_shift: le32(52),
                page_list_addr: le64(56),
            };
        }
        WR_BIND_MW => {
            w.bind = BindMw {
                addr: le64(24),
                length: le64(32),
                mw_key: le32(40),
                new_key: le32(44),
                mr_key: le32(48),
                access: le32(52),
                ..Default::default()
            };
        }
        _ => {}
    }
    // Opcode allowed for the QP type (IBTA 9.7 / spec §6.1): an invalid one completes with
    // LOC_QP_OP_ERR and moves the QP to ERROR.
    let allowed = match w.opcode {
        WR_SEND | WR_SEND_WITH_IMM | WR_LOCAL_INV | WR_REG_MR => true,
        WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM => ctx.is_rc() || ctx.is_uc(),
        WR_RDMA_READ | WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD | WR_SEND_WITH_INV => {
            ctx.is_rc()
        }
        // Not over XRC (spec §13.7: no XRC FLUSH / ATOMIC WRITE opcodes, no windows).
        WR_ATOMIC_WRITE | WR_FLUSH => ctx.qp_type == QPT_RC,
        // Spec §6.1: windows are bound through RC and UC QPs; no SGEs.
        WR_BIND_MW => (ctx.qp_type == QPT_RC || ctx.is_uc()) && num_sge == 0,
        _ => false,
    };
    // Unknown flag bits are invalid too (spec §6.1 "Other bits MUST be 0", §14.3).
    const KNOWN_FLAGS: u8 = SEND_SIGNALED | SEND_SOLICITED | SEND_INLINE | SEND_FENCE;
    if !allowed || w.flags & !KNOWN_FLAGS != 0 {
        w.finish(WC_LOC_QP_OP_ERR, true);
        return w;
    }
    if w.is_local() {
        return w;
    }
    if w.is_empty_read_like() {
        return decode_empty_read_like(w, num_sge);
    }
    if w.flags & SEND_INLINE != 0 && !w.is_rd_atomic() {
        // Inline data must respect max_inline_data and fit the slot (§6.1) → LOC_LEN_ERR.
        if inline_len > ctx.max_inline as usize || WQE_HDR + inline_len > b.len() {
            w.finish(WC_LOC_LEN_ERR, true);
            return w;
        }
        w.inline = Some(b[WQE_HDR..WQE_HDR + inline_len].to_vec());
        w.length = inline_len as u64;
    } else {
        if num_sge > ctx.max_send_sge as usize || WQE_HDR + num_sge * SGE_SIZE > b.len() {
            w.finish(WC_LOC_QP_OP_ERR, true);
            return w;
        }
        let mut total: u64 = 0;
        for i in 0..num_sge {
            let o = WQE_HDR + i * SGE_SIZE;
            let sge = Sge {
                addr: le64(o),
                len: le32(o + 8),
                lkey: le32(o + 12),
            };
            total += sge.len as u64;
            if sge.len > 0 {
                w.sges.push(sge);
            }
        }
        w.length = total;
    }
    if w.is_atomic() {
        // Atomics operate on 8 bytes at an 8-byte aligned address (IBTA 9.4.5); SGEs
        // that do not describe exactly 8 bytes are LOC_LEN_ERR (spec §6.1, §14.3).
        if w.length != 8 {
            w.finish(WC_LOC_LEN_ERR, true);
            return w;
        }
        if !w.remote_addr.is_multiple_of(8) {
            w.finish(WC_LOC_QP_OP_ERR, true);
            return w;
        }
        w.length = 8;
    }
    // max_msg_sz is 2^31 (spec §2.2).
    if w.length > (1u64 << 31) {
        w.finish(WC_LOC_LEN_ERR, true);
        return w;
    }
    w
}

/// The checks of an ATOMIC_WRITE / FLUSH WQE (spec §6.1, §14.3): no SGEs, a valid FLUSH type and
/// level, a FLUSH length within max_msg_sz. The responder checks the ATOMIC_WRITE alignment.
fn decode_empty_read_like(mut w: SendWqe, num_sge: usize) -> SendWqe {
    const PLACEMENTS: u8 = FLUSH_GLOBAL | FLUSH_PERSISTENT;
    let bad_flush = w.opcode == WR_FLUSH
        && (w.flush.placement == 0
            || w.flush.placement & !PLACEMENTS != 0
            || w.flush.selectivity > FLUSH_MR);
    if num_sge != 0 || bad_flush {
        w.finish(WC_LOC_QP_OP_ERR, true);
        return w;
    }
    if w.opcode == WR_FLUSH && w.flush.length > (1u64 << 31) {
        w.finish(WC_LOC_LEN_ERR, true);
        return w;
    }
    w.length = if w.opcode == WR_ATOMIC_WRITE { 8 } else { 0 };
    w
}

/// Entry point: the SQ doorbell, an ODP resume, a timer or a response opened the window.
pub fn run(dev: &mut Device, qpn: u32, now: Instant) {
    super::with_req(dev, qpn, |dev, ctx, st| process(dev, ctx, st, now));
}

pub(crate) fn process(dev: &mut Device, ctx: &QpCtx, st: &mut RequesterState, now: Instant) {
    // An XRC_TGT has no send queue (spec §13.7): its SQ doorbells (the guest's, or the
    // doorbell-overflow sweep's) have nothing to start or flush.
    if ctx.qp_type == QPT_XRC_TGT {
        return;
    }
    if ctx.state == QPS_ERR {
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
    if ctx.state == QPS_SQD && ctx.sq_draining && !st.outstanding() {
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
fn fetch(dev: &mut Device, ctx: &QpCtx, st: &mut RequesterState) -> Result<(), Fatal> {
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

/// Transmit as much as the window, max_rd_atomic, fences and RNR back-off allow.
///
/// On a fabric port that takes segments (spec §16.2 rule 6) the RC/UC/XRC packets of this call
/// are written back to back into fabric segments (`fabric::segment`) instead of one buffer
/// each; every packet is still a complete standard frame with its own PSN and AckReq, so
/// nothing else here changes. UD/GSI packets (an address per WQE) stay single frames.
fn send(dev: &mut Device, ctx: &QpCtx, st: &mut RequesterState, now: Instant) {
    if st.odp_wait.is_some() || st.stopped {
        return;
    }
    let mut seg = (dev.icrc_offload.segments && !ctx.is_ud())
        .then(|| SegmentWriter::new(super::packet::segment_buf()));
    send_packets(dev, ctx, st, now, &mut seg);
    if let Some(mut w) = seg {
        flush_segment(dev, &mut w);
        super::packet::recycle_frame(w.into_buf());
    }
}

/// Queue the packets written into `w` (if any) as one segment (a single packet as a plain
/// frame); `w` is empty afterwards.
fn flush_segment(dev: &mut Device, w: &mut SegmentWriter) {
    if let Some(b) = w.finish() {
        dev.outbox.push(b);
    }
}

fn send_packets(
    dev: &mut Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    now: Instant,
    seg: &mut Option<SegmentWriter>,
) {
    if st.odp_wait.is_some() || st.stopped {
        return;
    }
    if let Some(d) = st.rnr_deadline {
        if now < d {
            return;
        }
        st.rnr_deadline = None;
    }
    let max_rd = ctx.max_rd_atomic.max(1);
    let mut i = st.sent_prefix.min(st.wqes.len());
    while i < st.wqes.len() {
        let state = st.wqes[i].state;
        if matches!(state, WqeState::Sent | WqeState::Done) {
            if i == st.sent_prefix {
                st.sent_prefix += 1;
            }
            i += 1;
            continue;
        }
        // SQD: finish what was started, start nothing new (IBTA 10.3.1).
        if ctx.state == QPS_SQD && !st.wqes[i].sent_once {
            return;
        }
        // Fence (IBTA 10.8.3.3): wait until every earlier READ / atomic has completed.
        if st.wqes[i].flags & SEND_FENCE != 0
            && st
                .wqes
                .iter()
                .take(i)
                .any(|w| w.is_rd_atomic() && w.state != WqeState::Done)
        {
            return;
        }
        if st.wqes[i].is_local() {
            // Local operations (LOCAL_INV, REG_MR) execute in SQ order against the MR table.
            // IBTA 10.6: they must not overtake earlier operations that use the MR; we
            // conservatively wait until everything before them has completed.
            if st.wqes.iter().take(i).any(|w| w.state != WqeState::Done) {
                return;
            }
            exec_local(dev, ctx, &mut st.wqes[i]);
            if st.wqes[i].fatal {
                st.stopped = true;
                return;
            }
            i += 1;
            continue;
        }
        if st.wqes[i].is_rd_atomic()
            && state == WqeState::Pending
            && st.rd_atomic_outstanding >= max_rd
        {
            return;
        }
        if ctx.is_rc() && psn_diff(st.psn, st.una) >= st.window() as i32 {
            return;
        }
        if !send_wqe(dev, ctx, st, i, max_rd, seg) {
            return;
        }
        if ctx.is_ud() {
            // UD/GSI: local errors (SGE keys, AH, length) keep the QP in RTS (spec §14.3).
            st.wqes[i].fatal = false;
        }
        if st.wqes[i].fatal {
            st.stopped = true;
            return;
        }
        i += 1;
    }
}

/// Execute LOCAL_INV / REG_MR / BIND_MW (spec §6.1, §12).
fn exec_local(dev: &mut Device, ctx: &QpCtx, w: &mut SendWqe) {
    if w.opcode == WR_BIND_MW {
        // Spec §14.3: without windows the opcode is not offered (LOC_QP_OP_ERR); a bind that
        // breaks a rule of §12.8 is MW_BIND_ERR. Both move the QP (RC/UC) to ERROR.
        if dev.config.max_mw == 0 {
            return w.finish(WC_LOC_QP_OP_ERR, true);
        }
        let b = BindMw {
            qp_pd: ctx.pdn,
            qpn: ctx.qpn,
            ..w.bind
        };
        return match dev.mrs.bind_mw(&b) {
            Ok(()) => w.finish(WC_SUCCESS, false),
            Err(_) => w.finish(WC_MW_BIND_ERR, true),
        };
    }
    let r = if w.opcode == WR_LOCAL_INV {
        dev.mrs.local_invalidate(w.ex, ctx.pdn)
    } else {
        let g = w.reg;
        dev.mrs.fast_register(
            ctx.pdn,
            g.key,
            g.access,
            g.iova,
            g.length,
            g.page_shift,
            g.page_list_addr,
            g.page_list_len,
        )
    };
    // Spec §14.3: a page list (or page) outside guest memory is LOC_PROT_ERR, every other REG_MR
    // / LOCAL_INV failure LOC_QP_OP_ERR; RC/UC go to ERROR, UD/GSI stay in RTS.
    let fatal = !ctx.is_ud();
    match r {
        Ok(()) => w.finish(WC_SUCCESS, false),
        Err(MrError::BadAddress { .. }) if w.opcode == WR_REG_MR => {
            w.finish(WC_LOC_PROT_ERR, fatal)
        }
        Err(_) => w.finish(WC_LOC_QP_OP_ERR, fatal),
    }
}

/// Validate the SGEs of a WQE against the MR table (IBTA 10.8 local protection checks). ODP
/// chunks are not faulted in here: `sge_copy` resolves each packet's bytes when it moves them,
/// so an SGE larger than the resident budget makes progress (spec §12.6).
fn validate(dev: &mut Device, ctx: &QpCtx, w: &SendWqe) -> Result<(), MrError> {
    let access = if w.is_rd_atomic() {
        ACCESS_LOCAL_WRITE
    } else {
        0
    };
    // Spec §2.2: local SGEs of an ODP MR only for operations in the transport's ODP caps.
    let odp_op = match w.opcode {
        WR_SEND | WR_SEND_WITH_IMM | WR_SEND_WITH_INV => vrdma_spec::VRDMA_ODP_SEND,
        WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM | WR_ATOMIC_WRITE => vrdma_spec::VRDMA_ODP_WRITE,
        WR_RDMA_READ => vrdma_spec::VRDMA_ODP_READ,
        WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD => vrdma_spec::VRDMA_ODP_ATOMIC,
        _ => 0,
    };
    for s in &w.sges {
        dev.mrs
            .check_access(s.lkey, ctx.pdn, s.addr, s.len as u64, access)?;
        if ctx::odp_denied(dev, ctx, s.lkey, odp_op) {
            return Err(MrError::AccessDenied {
                key: s.lkey,
                access,
            });
        }
    }
    Ok(())
}

/// Where a request packet's payload comes from (`send_wqe`).
#[derive(Clone, Copy)]
enum Src {
    Empty,
    /// ATOMIC WRITE's 8 bytes.
    Atomic([u8; 8]),
    /// The message at the WQE's offset: its inline data or its SGEs.
    Message,
}

/// Outcome of copying between local SGEs and a buffer.
pub(crate) enum SgeError {
    Fault { key: u32, iova: u64 },
    Prot,
    Len,
}

/// The buffer side of [`sge_copy`]: filled from the SGEs (gather, a request's payload) or
/// copied into them (scatter, a received payload, straight from the packet: no staging copy).
pub(crate) enum SgeIo<'a> {
    Gather(&'a mut [u8]),
    Scatter(&'a [u8]),
}

impl SgeIo<'_> {
    fn len(&self) -> usize {
        match self {
            SgeIo::Gather(b) => b.len(),
            SgeIo::Scatter(b) => b.len(),
        }
    }
}

/// Copy the buffer's length in bytes at message offset `off` out of (gather) or into
/// (scatter) an SGE list.
pub(crate) fn sge_copy(
    dev: &mut Device,
    waiter: Option<u32>,
    pdn: u32,
    sges: &[Sge],
    off: u64,
    io: SgeIo<'_>,
) -> Result<(), SgeError> {
    // The device's reusable range vector (no allocation per packet for pinned MRs).
    let mut ranges = std::mem::take(&mut dev.range_scratch);
    let r = sge_copy_with(dev, waiter, pdn, sges, off, io, &mut ranges);
    dev.range_scratch = ranges;
    r
}

fn sge_copy_with(
    dev: &mut Device,
    waiter: Option<u32>,
    pdn: u32,
    sges: &[Sge],
    off: u64,
    mut io: SgeIo<'_>,
    ranges: &mut Vec<crate::memory::mr::GuestRange>,
) -> Result<(), SgeError> {
    let total = io.len();
    let access = match io {
        SgeIo::Scatter(_) => ACCESS_LOCAL_WRITE,
        SgeIo::Gather(_) => 0,
    };
    let mut skip = off;
    let mut done = 0usize;
    for s in sges {
        if done == total {
            break;
        }
        let slen = s.len as u64;
        if skip >= slen {
            skip -= slen;
            continue;
        }
        let n = ((slen - skip) as usize).min(total - done);
        dev.mrs
            .resolve_into(
                waiter,
                s.lkey,
                pdn,
                s.addr.wrapping_add(skip),
                n as u64,
                access,
                ranges,
            )
            .map_err(|e| match e {
                MrError::Fault { key, iova } => SgeError::Fault { key, iova },
                _ => SgeError::Prot,
            })?;
        let mut p = done;
        for r in ranges.iter() {
            // The translation must cover exactly the requested bytes; never index past them.
            let end = p.checked_add(r.len as usize).ok_or(SgeError::Prot)?;
            let res = match &mut io {
                SgeIo::Scatter(b) => b.get(p..end).map(|c| dev.mem.write(r.gpa, c)),
                SgeIo::Gather(b) => b.get_mut(p..end).map(|c| dev.mem.read(r.gpa, c)),
            };
            res.ok_or(SgeError::Prot)?.map_err(|_| SgeError::Prot)?;
            p = end;
        }
        done += n;
        skip = 0;
    }
    if done != total {
        return Err(SgeError::Len);
    }
    Ok(())
}

/// Send the next packets of WQE `i`. Returns false when the QP must stop for now (window full,
/// ODP suspension); true when the WQE has nothing more to send right now.
fn send_wqe(
    dev: &mut Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    i: usize,
    max_rd: u32,
    seg: &mut Option<SegmentWriter>,
) -> bool {
    let mtu = ctx.mtu;
    if st.wqes[i].state == WqeState::Pending && st.wqes[i].offset == 0 {
        if st.wqes[i].is_read() && st.wqes[i].npkts(mtu) > MAX_READ_PSNS {
            st.wqes[i].finish(WC_LOC_LEN_ERR, true);
            return true;
        }
        if !st.wqes[i].validated {
            match validate(dev, ctx, &st.wqes[i]) {
                Ok(()) => st.wqes[i].validated = true,
                Err(MrError::Fault { key, iova }) => {
                    st.odp_wait = Some(OdpWait { key, iova });
                    return false;
                }
                Err(_) => {
                    st.wqes[i].finish(WC_LOC_PROT_ERR, true);
                    return true;
                }
            }
        }
        st.wqes[i].first_psn = st.psn;
        st.wqes[i].sent_once = true;
        let n = st.wqes[i].npkts(mtu);
        st.wqes[i].last_psn = psn_add(st.psn, n - 1);
    }
    // Destination.
    let (path, dqpn, deth) = if ctx.is_ud() {
        let w = &st.wqes[i];
        let Some(p) = ctx::ah_path(dev, w.ah_index, ctx.pdn) else {
            // Unknown AH or AH of another PD (spec §6.1): LOC_QP_OP_ERR, the UD QP stays RTS.
            st.wqes[i].finish(WC_LOC_QP_OP_ERR, false);
            return true;
        };
        if w.length > mtu as u64 {
            // A UD message is one packet (IBTA 9.8).
            st.wqes[i].finish(WC_LOC_LEN_ERR, false);
            return true;
        }
        // GSI always sends with Q_Key 0x80010000 and source QP 1 (IBTA 13.4.6). Otherwise a
        // WR Q_Key with the high bit set means "use the QP's Q_Key" (IBTA 10.2.5).
        let qkey = if ctx.qp_type == ctx::QPT_GSI {
            ctx::GSI_QKEY
        } else if w.remote_qkey & 0x8000_0000 != 0 {
            ctx.qkey
        } else {
            w.remote_qkey
        };
        let d = Deth {
            qkey,
            src_qp: ctx.qpn,
        };
        (p, w.remote_qpn, Some(d))
    } else {
        let Some(p) = ctx.path else {
            st.wqes[i].finish(WC_LOC_QP_OP_ERR, true);
            return true;
        };
        (p, ctx.dest_qpn, None)
    };
    let t = ctx.transport();
    // XRC: every request packet names the target's XRC SRQ (spec §13.7, §15.2).
    let xrceth = ctx.is_xrc().then_some(Xrceth {
        srqn: st.wqes[i].xrc_srqn,
    });

    loop {
        let w = &st.wqes[i];
        if ctx.is_rc() && psn_diff(st.psn, st.una) >= st.window() as i32 {
            return false;
        }
        let psn = st.psn;
        let mut hdrs = TxHdrs {
            deth,
            xrceth,
            ..Default::default()
        };
        let solicited = w.flags & SEND_SOLICITED != 0;
        // Where the payload comes from; it is written straight into the frame (one copy).
        let mut src = Src::Empty;
        let mut plen = 0usize;
        let (op, pos, npsn, last) = match w.opcode {
            WR_RDMA_READ => {
                // A restarted READ asks only for what has not arrived (IBTA 9.7.5.1).
                let remaining = w.length - w.offset;
                st.wqes[i].read_base = st.wqes[i].offset;
                let w = &st.wqes[i];
                hdrs.reth = Some(Reth {
                    va: w.remote_addr.wrapping_add(w.offset),
                    rkey: w.rkey,
                    dma_len: remaining as u32,
                });
                let n = (remaining.div_ceil(mtu as u64)).max(1) as u32;
                (Operation::ReadRequest, Position::Only, n, true)
            }
            WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD => {
                let cmp = w.opcode == WR_ATOMIC_CMP_AND_SWP;
                hdrs.atomic = Some(AtomicEth {
                    va: w.remote_addr,
                    rkey: w.rkey,
                    swap_add: if cmp { w.swap } else { w.compare_add },
                    compare: if cmp { w.compare_add } else { 0 },
                });
                let o = if cmp {
                    Operation::CompareSwap
                } else {
                    Operation::FetchAdd
                };
                (o, Position::Only, 1, true)
            }
            WR_ATOMIC_WRITE => {
                hdrs.reth = Some(Reth {
                    va: w.remote_addr,
                    rkey: w.rkey,
                    dma_len: 8,
                });
                src = Src::Atomic(w.atomic_write_data);
                plen = 8;
                (Operation::AtomicWrite, Position::Only, 1, true)
            }
            WR_FLUSH => {
                hdrs.feth = Some(Feth {
                    placement: w.flush.placement,
                    selectivity: w.flush.selectivity,
                });
                hdrs.reth = Some(Reth {
                    va: w.remote_addr,
                    rkey: w.rkey,
                    dma_len: w.flush.length as u32,
                });
                (Operation::Flush, Position::Only, 1, true)
            }
            _ => {
                let remaining = w.length - w.offset;
                let n = remaining.min(mtu as u64) as usize;
                let first = w.offset == 0;
                let last = remaining <= mtu as u64;
                let pos = match (first, last) {
                    (true, true) => Position::Only,
                    (true, false) => Position::First,
                    (false, false) => Position::Middle,
                    (false, true) => Position::Last,
                };
                src = Src::Message;
                plen = n;
                let is_write = matches!(w.opcode, WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM);
                if is_write && first {
                    hdrs.reth = Some(Reth {
                        va: w.remote_addr,
                        rkey: w.rkey,
                        dma_len: w.length as u32,
                    });
                }
                if last {
                    match w.opcode {
                        WR_SEND_WITH_IMM | WR_RDMA_WRITE_WITH_IMM => {
                            hdrs.imm = Some(ImmDt(u32::from_be_bytes(w.ex.to_le_bytes())))
                        }
                        WR_SEND_WITH_INV => hdrs.ieth = Some(Ieth { rkey: w.ex }),
                        _ => {}
                    }
                }
                let o = if is_write {
                    Operation::Write
                } else {
                    Operation::Send
                };
                (o, pos, 1, last)
            }
        };
        let Some(opcode) = opcode_for(t, op, pos, hdrs.imm.is_some(), hdrs.ieth.is_some()) else {
            st.wqes[i].finish(WC_LOC_QP_OP_ERR, true);
            return true;
        };
        let next = psn_add(psn, npsn);
        // AckReq (IBTA 9.2.3): on the last packet of a message, every ACK_EVERY packets, and when
        // the window is about to fill, so ACKs are coalesced but the window keeps moving.
        let ack_req = ctx.is_rc()
            && (last
                || psn.is_multiple_of(ACK_EVERY)
                || psn_diff(next, st.una) >= st.window() as i32);
        // Borrow the SGE list out of the WQE for the gather (no per-packet clone).
        let sges = std::mem::take(&mut st.wqes[i].sges);
        let w = &st.wqes[i];
        let (off, inline) = (w.offset, w.inline.as_deref());
        if let Some(w) = seg.as_mut() {
            if !w.fits(plen) {
                flush_segment(dev, w);
                *w = SegmentWriter::new(super::packet::segment_buf());
            }
        }
        let again = psn_diff(psn, st.psn_high) < 0;
        let fill = |buf: &mut [u8]| match (src, inline) {
            (Src::Empty, _) => Ok(()),
            (Src::Atomic(d), _) => {
                buf.copy_from_slice(&d);
                Ok(())
            }
            (Src::Message, Some(data)) => {
                let o = off as usize;
                let d = o
                    .checked_add(buf.len())
                    .and_then(|e| data.get(o..e))
                    .ok_or(SgeError::Len)?;
                buf.copy_from_slice(d);
                Ok(())
            }
            (Src::Message, None) if buf.is_empty() => Ok(()),
            (Src::Message, None) => {
                sge_copy(dev, Some(ctx.qpn), ctx.pdn, &sges, off, SgeIo::Gather(buf))
            }
        };
        let hdr = super::packet::TxMeta {
            path: &path,
            src_qpn: ctx.qpn,
            dst_qpn: dqpn,
            opcode,
            psn,
            solicited: solicited && last,
            ack_req,
            hdrs: &hdrs,
        };
        // Behind the highest PSN ever sent (`again`): go-back-N is sending this packet again.
        let sent = match seg.as_mut() {
            Some(w) => super::packet::build_into_segment(&hdr, plen, w, fill).map(|len| {
                if let Some(len) = len {
                    ctx::count_tx(dev, ctx.qpn, len, again);
                }
            }),
            None => super::packet::build_with(
                hdr.path,
                hdr.src_qpn,
                hdr.dst_qpn,
                hdr.opcode,
                hdr.psn,
                hdr.solicited,
                hdr.ack_req,
                hdr.hdrs,
                plen,
                fill,
            )
            .map(|f| {
                if let Some(f) = f {
                    ctx::send_frame(dev, ctx.qpn, f, again);
                }
            }),
        };
        st.wqes[i].sges = sges;
        match sent {
            Ok(()) => {}
            Err(SgeError::Fault { key, iova }) => {
                st.odp_wait = Some(OdpWait { key, iova });
                return false;
            }
            Err(_) => {
                st.wqes[i].finish(WC_LOC_PROT_ERR, true);
                return true;
            }
        }
        let plen = plen as u64;
        st.psn = next;
        if psn_diff(next, st.psn_high) > 0 {
            st.psn_high = next;
        }
        let w = &mut st.wqes[i];
        let was_pending = w.state == WqeState::Pending;
        if w.is_rd_atomic() {
            if was_pending {
                st.rd_atomic_outstanding += 1;
            }
            let w = &mut st.wqes[i];
            w.state = WqeState::Sent;
            return st.rd_atomic_outstanding < max_rd;
        }
        w.offset += plen;
        if last {
            if ctx.is_rc() {
                w.state = WqeState::Sent;
            } else {
                // UC / UD: complete once handed to the wire (IBTA 9.8: no acknowledgement).
                w.finish(WC_SUCCESS, false);
            }
            return true;
        }
        w.state = WqeState::Sending;
    }
}

/// Retire completed WQEs from the front of the queue in SQ order: write send CQEs (signaled or
/// error, IBTA 10.7 / spec §7) and advance the SQ consumer (spec §4).
///
/// The consumer moves BEFORE the CQEs are written: a consumer that sees a send completion may
/// post again at once, and the driver checks SQ space against this consumer.
pub(crate) fn retire(dev: &mut Device, ctx: &QpCtx, st: &mut RequesterState) {
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
pub(crate) fn flush(dev: &mut Device, ctx: &QpCtx, st: &mut RequesterState) {
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
    // WQEs still in the ring.
    if let Ok(producer) = ctx::sq_producer(dev, ctx.qpn) {
        let mut buf = vec![0u8; 16];
        while st.sq_fetch != producer {
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
