//! Responder (IBTA 9.7 responder side): request packets -> guest memory; ACK/NAK, READ responses
//! and atomic acknowledgements (spec §14). The IBTA 1.5 ATOMIC WRITE and FLUSH are answered like
//! a zero-length READ.
//!
//! Every packet walks an explicit state machine ([`RespStep`]), like IBTA's responder description
//! and rxe's `enum resp_states`: checks first (PSN, opcode sequence, opcode validity, resources,
//! length, R_Key), then execution, completion and acknowledgement. Errors are states too, so each
//! IBTA rule (e.g. C9-222.1.1 for R_Key violations) is one arm of `Responder::step`.
//!
//! Files: this one holds the state, the step machine's driver (`Responder::step`), the ACK,
//! READ-response and UD paths and the flush; `checks.rs` the checks of a request, `execute.rs`
//! its execution and completion, `duplicates.rs` duplicates and errors (NAKs), `ud.rs` UD/GSI
//! receives.

use std::collections::VecDeque;

use super::ctx::{self, abi::*, Cqe, QpCtx, GSI_QKEY};
use super::packet::{self, opcode_for, Path, RxPkt, TxMeta};
use super::requester::{sge_copy, Sge, SgeError, SgeIo};
use super::{psn_add, psn_diff, Fatal, PSN_MASK};
use crate::memory::mr::{GuestRange, MrError};
use crate::memory::Access;
use crate::qp::{QpState, QpType};
use crate::transport::Device;
use crate::wire::feth::{PLACEMENT_GLOBAL, PLACEMENT_PERSISTENT, SELECT_MR};
use crate::wire::segment::SegmentWriter;
use crate::wire::{
    Aeth, AtomicAckEth, ExtHeaders, NakCode, Opcode, Operation, Position, Syndrome, Transport,
};

mod checks;
mod duplicates;
mod execute;
mod replies;
mod ud;

pub(crate) use replies::pump_replies;
use ud::ud_receive;

/// Send an ACK at least every this many unacknowledged packets even without AckReq.
const ACK_COALESCE: u32 = 64;
/// UC: how far ahead of the expected PSN a packet may be and still be taken as the peer's
/// (spec §14.6). UC has no retransmission, so a gap is a loss burst; a packet further ahead is
/// dropped without touching the receive state, which bounds what a blind injector can hit to
/// 2^16 of the 2^24 PSNs. Losing more than this many packets in a row leaves the QP unable to
/// receive until it is reconnected (RESET → RTR with a new `rq_psn`).
pub const UC_PSN_WINDOW: u32 = 1 << 16;
/// Size of the receive WQE header (spec §6.2).
const RWQE_HDR: usize = 16;
/// The GRH area of a UD/GSI receive (spec §6.2).
pub const GRH_LEN: usize = 40;

/// Responder-side protocol state of one QP, held in `Qp::resp`.
///
/// `qp/` calls [`ResponderState::set_rq_psn`] when MODIFY_QP carries `VRDMA_QP_RQ_PSN`, and
/// [`ResponderState::reset`] on any transition to RESET.
#[derive(Debug, Default)]
pub struct ResponderState {
    /// Expected PSN of the next request.
    pub epsn: u32,
    /// Message sequence number (IBTA 9.7.5.1.2), carried in the AETH.
    pub msn: u32,
    /// A NAK for a PSN sequence error has been sent and not yet cleared (IBTA 9.7.5.2.2: once).
    pub seq_nak_sent: bool,
    /// The message in progress (between FIRST and LAST).
    pub cur: Option<MsgOp>,
    /// Receive WQE consumed by a SEND (or WRITE_WITH_IMM) in progress.
    pub recv: Option<RecvWqe>,
    /// RDMA WRITE in progress (from the RETH of its first packet).
    pub write: Option<WriteCtx>,
    /// Responder resources: recent READ / atomic requests replayed on duplicates.
    pub resources: VecDeque<RdAtomicRes>,
    /// Responses still to send, in PSN order: READ responses being paced (see `pump_replies`)
    /// and the ACKs / atomic ACKs of later requests that must not overtake them.
    pub replies: VecDeque<ReadReply>,
    /// Packets received since the last ACK (ACK coalescing).
    pub unacked: u32,
    /// UC: the current message is damaged; drop packets until the next FIRST/ONLY (IBTA 9.8).
    pub uc_drop: bool,
    /// COMM_EST was reported (first packet in RTR, IBTA 11.6.3).
    pub comm_est: bool,
    /// LAST_WQE_REACHED was reported for the current ERROR period (SRQ-attached QPs).
    pub last_wqe_reported: bool,
    /// Deferred QP-level error (see `with_resp`).
    pub fatal: Option<Fatal>,
    /// Placeholder left in the QP while a transport function holds the real state.
    pub taken: bool,
}

/// The kind of multi-packet message in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgOp {
    Send,
    Write,
}

/// A receive WQE taken from the RQ or SRQ.
#[derive(Debug, Clone, Default)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub sges: super::sgelist::SgeList,
    /// Total capacity of the SGEs.
    pub capacity: u64,
    /// Bytes already scattered.
    pub offset: u64,
    /// The WQE came from this SRQ (None: the QP's RQ).
    pub srqn: Option<u32>,
    /// `num_sge` above the maximum or beyond the slot (spec §14.4): the WQE is consumed and
    /// completes with LOC_QP_OP_ERR; only `wr_id` is meaningful.
    pub malformed: bool,
}

impl RecvWqe {
    /// A consumed receive WQE that failed to decode: keep its `wr_id` for the error completion.
    pub(crate) fn malformed(b: &[u8], srqn: Option<u32>) -> RecvWqe {
        let mut id = [0u8; 8];
        if let Some(src) = b.get(0..8) {
            id.copy_from_slice(src);
        }
        RecvWqe {
            wr_id: u64::from_le_bytes(id),
            srqn,
            malformed: true,
            ..Default::default()
        }
    }
}

/// An RDMA WRITE being received.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteCtx {
    pub va: u64,
    pub rkey: u32,
    pub remaining: u64,
    pub total: u64,
}

/// What a queued response is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// READ response packets (an empty one for ATOMIC WRITE / FLUSH).
    Read,
    /// An ACK, RNR NAK or PSN sequence error NAK for `psn`, held behind earlier READ responses
    /// (IBTA 9.7.5.1.1: responses in PSN order).
    Ack(Aeth),
    /// The atomic ACK for `psn`, held likewise.
    AtomicAck { orig: u64 },
}

/// A response waiting in `ResponderState::replies`: a READ being answered, or an ACK queued
/// behind one.
#[derive(Debug, Clone, Copy)]
pub struct ReadReply {
    pub kind: ReplyKind,
    /// PSN of the next response packet.
    pub psn: u32,
    pub va: u64,
    pub rkey: u32,
    pub remaining: u64,
    /// The next packet is the first of this response (FIRST / ONLY).
    pub first: bool,
    /// MSN carried in the AETHs.
    pub msn: u32,
    /// The PD the request was checked against: the QP's, or for an XRC_TGT the PD of the XRC
    /// SRQ its XRCETH named (spec §13.7). Each packet is translated again in this PD.
    pub pdn: u32,
}

impl ReadReply {
    /// A response without payload to send (an ACK, an atomic ACK, an empty READ RESPONSE): one
    /// packet, `psn`, carrying `msn`.
    fn bare(kind: ReplyKind, psn: u32, msn: u32, pdn: u32) -> ReadReply {
        ReadReply {
            kind,
            psn,
            va: 0,
            rkey: 0,
            remaining: 0,
            first: true,
            msn,
            pdn,
        }
    }
}

/// READ response packets sent per request arrival or engine tick. A READ of many MTUs is answered
/// in bursts of this size rather than all at once: on a lossy link the requester discards
/// everything after a gap and asks again for the remainder (IBTA 9.7.5.1), so an unpaced
/// multi-megabyte burst would be resent almost entirely for every lost packet.
pub const READ_BURST: u32 = 64;

/// Kind of a cached READ / atomic request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResKind {
    Read {
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        orig: u64,
    },
    /// ATOMIC WRITE / FLUSH: executed once; a duplicate only gets its empty READ response again.
    EmptyReadResponse,
}

/// One responder resource (IBTA 9.7.5.1.5: sized by max_dest_rd_atomic).
#[derive(Debug, Clone, Copy)]
pub struct RdAtomicRes {
    pub first_psn: u32,
    pub last_psn: u32,
    pub kind: ResKind,
}

impl RdAtomicRes {
    /// The resource of a one-packet request (atomic, ATOMIC WRITE, FLUSH) at `psn`.
    pub fn single(psn: u32, kind: ResKind) -> RdAtomicRes {
        RdAtomicRes {
            first_psn: psn,
            last_psn: psn,
            kind,
        }
    }
}

impl ResponderState {
    /// Back to the state of a freshly created QP (MODIFY_QP to RESET).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// MODIFY_QP with `VRDMA_QP_RQ_PSN`.
    /// Queued responses of READ / atomic / ATOMIC WRITE / FLUSH requests (plain ACKs queued
    /// behind them hold no responder resource).
    pub fn replies_holding_resources(&self) -> usize {
        self.replies
            .iter()
            .filter(|r| !matches!(r.kind, ReplyKind::Ack(_)))
            .count()
    }

    pub fn set_rq_psn(&mut self, psn: u32) {
        self.epsn = psn & PSN_MASK;
    }
}

/// Decode a receive WQE (spec §6.2). `None` when malformed (num_sge too large for the slot or the
/// QP's max_recv_sge): the caller treats it as a QP error.
pub(crate) fn decode_recv(b: &[u8], max_sge: u32, srqn: Option<u32>) -> Option<RecvWqe> {
    let le32 = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let le64 = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    if b.len() < RWQE_HDR {
        return None;
    }
    let n = le32(8) as usize;
    if n > max_sge as usize || RWQE_HDR + n * 16 > b.len() {
        return None;
    }
    let mut w = RecvWqe {
        wr_id: le64(0),
        srqn,
        ..Default::default()
    };
    for i in 0..n {
        let o = RWQE_HDR + i * 16;
        let s = Sge {
            addr: le64(o),
            len: le32(o + 8),
            lkey: le32(o + 12),
        };
        w.capacity += s.len as u64;
        if s.len > 0 {
            w.sges.push(s);
        }
    }
    Some(w)
}

/// The responder's per-packet states (IBTA 9.7.5 responder; names follow its checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespStep {
    CheckPsn,
    CheckOpSeq,
    CheckOpValid,
    CheckResource,
    CheckLength,
    CheckRkey,
    Execute,
    ReadReply,
    AtomicReply,
    AtomicWriteReply,
    FlushReply,
    Complete,
    Acknowledge,
    Duplicate,
    Done,
    /// PSN ahead of the expected one: NAK sequence error once (RC), resync/drop (UC).
    ErrPsnOutOfSeq,
    /// No receive WQE, or an ODP fault: RNR NAK (RC), drop (UC/UD).
    ErrRnr,
    /// Malformed request / opcode not allowed / bad length: NAK invalid request, QP to ERROR.
    ErrInvalidRequest,
    /// The message does not fit the receive WQE: LOC_LEN_ERR completion (+ NAK invalid request).
    ErrLength,
    /// R_Key violation (IBTA C9-222.1.1, spec §14).
    ErrRkeyViolation,
    /// Local failure executing a valid request (e.g. bad receive SGE): NAK remote operational.
    ErrRemoteOp,
    /// Silently drop the packet.
    Drop,
}

/// One packet's walk through the responder.
struct Responder<'p, 'a> {
    ctx: &'p QpCtx,
    pkt: &'p RxPkt<'a>,
    /// Guest ranges of the RETH / AtomicETH target validated by CheckRkey.
    ranges: Vec<GuestRange>,
    /// Status for the receive completion on an error path.
    recv_status: u8,
    /// An ODP fault caused the RNR (vs. no receive WQE).
    odp: bool,
    /// A guest memory access failed under a valid translation (→ QP_FATAL).
    mem_fault: bool,
}

/// A request packet for `ctx`'s QP arrived.
pub(crate) fn on_request(dev: &Device, ctx: &QpCtx, st: &mut ResponderState, pkt: &RxPkt<'_>) {
    if ctx.state == QpState::Rtr && !st.comm_est {
        // IBTA 11.6.3: first packet received in RTR → Communication Established.
        st.comm_est = true;
        ctx::event(dev, EV_COMM_EST, ctx.qpn, 0);
    }
    if ctx.is_ud() {
        ud_receive(dev, ctx, st, pkt);
        return;
    }
    let mut step = RespStep::CheckPsn;
    let xctx;
    let ctx = if ctx.qp_type == QpType::XrcTgt {
        match ctx::xrc_target_ctx(dev, ctx, pkt.xrceth.map(|x| x.srqn)) {
            Some(c) => {
                xctx = c;
                &xctx
            }
            // Spec §14.6: a new request naming no XRC SRQ of the target's domain is an
            // Invalid Request. Duplicates and early packets take the PSN checks as usual (they
            // need no SRQ: a duplicate is re-ACKed, an early one NAKed for its sequence).
            None => {
                if psn_diff(pkt.psn(), st.epsn) == 0 {
                    step = RespStep::ErrInvalidRequest;
                }
                ctx
            }
        }
    } else {
        ctx
    };
    let mut r = Responder {
        ctx,
        pkt,
        // Reused across packets (no allocation per packet for pinned MRs).
        ranges: super::scratch::take(super::scratch::Side::Responder),
        recv_status: WC_SUCCESS,
        odp: false,
        mem_fault: false,
    };
    // Each state moves strictly forward or to a terminal state; the bound is a belt-and-braces
    // guarantee that a bug cannot spin the engine thread.
    for _ in 0..32 {
        if step == RespStep::Done {
            break;
        }
        step = r.step(dev, st, step);
    }
    super::scratch::give_back(super::scratch::Side::Responder, r.ranges);
}

impl Responder<'_, '_> {
    fn step(&mut self, dev: &Device, st: &mut ResponderState, step: RespStep) -> RespStep {
        use RespStep::*;
        match step {
            CheckPsn => self.check_psn(dev, st),
            CheckOpSeq => self.check_op_seq(st),
            CheckOpValid => self.check_op_valid(),
            CheckResource => self.check_resource(dev, st),
            CheckLength => self.check_length(st),
            CheckRkey => self.check_rkey(dev, st),
            Execute => self.execute(dev, st),
            ReadReply => self.read_reply(dev, st),
            AtomicReply => self.atomic_reply(dev, st),
            AtomicWriteReply => self.atomic_write_reply(dev, st),
            FlushReply => self.flush_reply(dev, st),
            Complete => self.complete(dev, st),
            Acknowledge => self.acknowledge(dev, st),
            Duplicate => self.duplicate(dev, st),
            Done => Done,
            ErrPsnOutOfSeq => self.err_psn(dev, st),
            ErrRnr => self.err_rnr(dev, st),
            ErrInvalidRequest => {
                if self.ctx.is_rc() {
                    self.nak(dev, st, NakCode::InvalidRequest, self.pkt.psn());
                    // IBTA 9.7.5.2 / 11.6.2: Invalid Request Local Work Queue Error.
                    st.fatal = Some(Fatal::ReqErr);
                } else {
                    self.uc_abort(st);
                }
                Done
            }
            ErrLength => {
                if self.ctx.is_rc() {
                    // Spec §14.6: the receive WQE completes LOC_LEN_ERR, NAK Invalid Request.
                    self.recv_status = WC_LOC_LEN_ERR;
                    self.complete_recv_error(dev, st);
                    self.nak(dev, st, NakCode::InvalidRequest, self.pkt.psn());
                    st.fatal = Some(Fatal::Silent);
                } else {
                    // UC: the message is dropped, the WQE is not consumed (kept for the next).
                    self.uc_abort(st);
                }
                Done
            }
            ErrRkeyViolation => self.err_rkey(dev, st),
            ErrRemoteOp => {
                if self.recv_status == WC_SUCCESS {
                    self.recv_status = WC_LOC_PROT_ERR;
                }
                self.complete_recv_error(dev, st);
                if self.ctx.is_rc() {
                    self.nak(dev, st, NakCode::RemoteOperationalError, self.pkt.psn());
                } else {
                    self.uc_abort(st);
                }
                // Spec §14.4/§14.6: the QP goes to ERROR (RC and UC); a failed guest memory
                // access is QP_FATAL, a bad receive WQE was reported through its completion.
                st.fatal = Some(if self.mem_fault {
                    Fatal::QpFatal(0)
                } else {
                    Fatal::Silent
                });
                Done
            }
            Drop => Done,
        }
    }
}

/// Remember a READ/atomic (IBTA 9.7.5.1.5): at most max_dest_rd_atomic entries, oldest evicted.
fn push_resource(st: &mut ResponderState, ctx: &QpCtx, r: RdAtomicRes) {
    let cap = ctx.max_dest_rd_atomic.max(1) as usize;
    while st.resources.len() >= cap {
        st.resources.pop_front();
    }
    st.resources.push_back(r);
}

/// The access right a FLUSH placement type needs (spec §12.3); `None` for placement 0 or unknown
/// bits.
fn flush_access(placement: u8) -> Option<u32> {
    if placement == 0 || placement & !(PLACEMENT_GLOBAL | PLACEMENT_PERSISTENT) != 0 {
        return None;
    }
    let mut a = 0;
    if placement & PLACEMENT_GLOBAL != 0 {
        a |= ACCESS_FLUSH_GLOBAL;
    }
    if placement & PLACEMENT_PERSISTENT != 0 {
        a |= ACCESS_FLUSH_PERSISTENT;
    }
    Some(a)
}

/// Queue the zero-length RDMA READ RESPONSE ONLY for `psn` and send what the pacing allows.
fn queue_empty_read_response(dev: &Device, ctx: &QpCtx, st: &mut ResponderState, psn: u32) {
    let reply = ReadReply::bare(ReplyKind::Read, psn, st.msn, ctx.pdn);
    st.replies.push_back(reply);
    pump_replies(dev, ctx, st, READ_BURST);
}

/// Take a receive WQE from the RQ or the SRQ.
fn take_recv(dev: &Device, ctx: &QpCtx) -> Result<Option<RecvWqe>, u32> {
    ctx::recv_take(dev, ctx).map_err(|f| f.0)
}

/// Send a non-fatal ACK / RNR NAK / PSN sequence error NAK in PSN order: at once if nothing is
/// queued, else behind the queued READ responses (IBTA 9.7.5.1.1), where `pump_replies` sends
/// it when the queue drains past it. Any such response covers every earlier PSN, so a newer one
/// replaces an ACK still waiting at the tail (the queue stays bounded by the responder
/// resources). Fatal NAKs are sent at once: the QP goes to ERROR and drops the queue.
fn ack_in_order(dev: &Device, ctx: &QpCtx, st: &mut ResponderState, aeth: Aeth, psn: u32) {
    if st.replies.is_empty() {
        send_ack(dev, ctx, aeth, psn);
        return;
    }
    let r = ReadReply::bare(ReplyKind::Ack(aeth), psn, aeth.msn, ctx.pdn);
    // A newer ACK supersedes a queued plain ACK (it acknowledges more); a queued NAK is kept
    // unless the new response is a NAK too, so a sequence error or RNR NAK is never lost.
    let new_is_ack = matches!(aeth.syndrome, Syndrome::Ack { .. });
    let replace = st.replies.back().is_some_and(|b| {
        matches!(b.kind, ReplyKind::Ack(a)
            if !new_is_ack || matches!(a.syndrome, Syndrome::Ack { .. }))
    });
    if replace {
        if let Some(b) = st.replies.back_mut() {
            *b = r;
        }
    } else if st.replies.len() < reply_queue_bound(ctx) {
        st.replies.push_back(r);
    }
}

/// Entries the reply queue may hold: the READ/ATOMIC WRITE/FLUSH replies of every responder
/// resource, an atomic ACK per resource, and the ACKs between them. Responses for duplicates
/// beyond it are not queued (the requester retries), so a peer resending duplicates while a READ
/// is paced cannot grow daemon memory (spec §16).
fn reply_queue_bound(ctx: &QpCtx) -> usize {
    3 * ctx.max_dest_rd_atomic.max(1) as usize + 2
}

/// The atomic ACK for `psn`, in PSN order like [`ack_in_order`] (never merged: it carries the
/// original value). The atomic has already been executed.
fn atomic_ack_in_order(dev: &Device, ctx: &QpCtx, st: &mut ResponderState, psn: u32, orig: u64) {
    if st.replies.is_empty() {
        send_atomic_ack(dev, ctx, st.msn, psn, orig);
        return;
    }
    // A duplicate atomic already answered in the queue needs no second answer there.
    let queued = st
        .replies
        .iter()
        .any(|r| r.psn == psn && matches!(r.kind, ReplyKind::AtomicAck { .. }));
    if queued || st.replies.len() >= reply_queue_bound(ctx) {
        return;
    }
    let reply = ReadReply::bare(ReplyKind::AtomicAck { orig }, psn, st.msn, ctx.pdn);
    st.replies.push_back(reply);
}

/// Send an ACK / NAK / RNR NAK with `aeth` for `psn`.
pub(crate) fn send_ack(dev: &Device, ctx: &QpCtx, aeth: Aeth, psn: u32) {
    let ext = ExtHeaders {
        aeth: Some(aeth),
        ..Default::default()
    };
    send_payloadless(dev, ctx, Operation::Ack, psn, ext);
}

fn send_atomic_ack(dev: &Device, ctx: &QpCtx, msn: u32, psn: u32, orig: u64) {
    let ext = ExtHeaders {
        aeth: Some(Aeth::ack(msn)),
        atomic_ack_eth: Some(AtomicAckEth { orig }),
        ..Default::default()
    };
    send_payloadless(dev, ctx, Operation::AtomicAck, psn, ext);
}

/// One ONLY packet of `operation` without payload (an ACK or atomic ACK) for `psn`, sent as a
/// single frame.
fn send_payloadless(dev: &Device, ctx: &QpCtx, operation: Operation, psn: u32, ext: ExtHeaders) {
    let Some(path) = ctx.path else { return };
    let Some(op) = opcode_for(ctx.transport(), operation, Position::Only, false, false) else {
        return;
    };
    if let Some(f) = packet::build(&response_meta(ctx, &path, op, psn, ext), &[]) {
        ctx::send_frame(dev, ctx.qpn, f, false);
    }
}

/// A response packet to the QP's peer (ACK, atomic ACK, READ response) besides its payload:
/// from this QP to its destination QP, with neither a solicited event nor AckReq (both belong
/// to requests).
fn response_meta<'a>(
    ctx: &QpCtx,
    path: &'a Path,
    opcode: Opcode,
    psn: u32,
    ext: ExtHeaders,
) -> TxMeta<'a> {
    TxMeta {
        path,
        src_qpn: ctx.qpn,
        dst_qpn: ctx.dest_qpn,
        opcode,
        psn,
        solicited: false,
        ack_req: false,
        ext,
    }
}

/// QP in ERROR (spec §13): RQ WQEs (and a receive in progress) complete with WR_FLUSH_ERR; an
/// SRQ-attached QP reports LAST_WQE_REACHED instead (IBTA 11.6.2).
pub(crate) fn flush(dev: &Device, ctx: &QpCtx, st: &mut ResponderState) {
    let mut wr_ids = Vec::new();
    if let Some(w) = st.recv.take() {
        wr_ids.push(w.wr_id);
    }
    if ctx.srqn.is_none() {
        wr_ids.extend(ctx::rq_drain(dev, ctx));
    }
    for wr_id in wr_ids {
        let cqe = Cqe {
            wr_id,
            qpn: ctx.qpn,
            opcode: WC_RECV,
            status: WC_WR_FLUSH_ERR,
            ..Default::default()
        };
        ctx::post_cqe(dev, ctx.recv_cqn, &cqe, false);
    }
    if ctx.srqn.is_some() && !st.last_wqe_reported {
        st.last_wqe_reported = true;
        ctx::event(dev, EV_QP_LAST_WQE_REACHED, ctx.qpn, 0);
    }
    st.cur = None;
    st.write = None;
    st.resources.clear();
    st.replies.clear();
}
