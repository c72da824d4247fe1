//! Responder (IBTA 9.7 responder side): request packets -> guest memory; ACK/NAK, READ responses
//! and atomic acknowledgements (spec §14). The IBTA 1.5 ATOMIC WRITE and FLUSH are answered like
//! a zero-length READ.
//!
//! Every packet walks an explicit state machine ([`RespStep`]), like IBTA's responder description
//! and rxe's `enum resp_states`: checks first (PSN, opcode sequence, opcode validity, resources,
//! length, R_Key), then execution, completion and acknowledgement. Errors are states too, so each
//! IBTA rule (e.g. C9-222.1.1 for R_Key violations) is one arm of `Responder::step`.

use std::collections::VecDeque;

use super::ctx::{self, abi::*, Cqe, QpCtx, GSI_QKEY, QPS_RTR, QPT_GSI, QPT_XRC_TGT};
use super::packet::{opcode_for, RxPkt, TxHdrs};
use super::requester::{sge_copy, Sge, SgeError, SgeIo};
use super::{psn_add, psn_diff, Fatal, PSN_MASK};
use crate::device::Device;
use crate::memory::mr::{GuestRange, MrError};
use crate::wire::feth::{PLACEMENT_GLOBAL, PLACEMENT_PERSISTENT, SELECT_MR};
use crate::wire::{Aeth, AtomicAckEth, NakCode, Operation, Position, Syndrome, Transport};

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
pub(crate) fn on_request(dev: &mut Device, ctx: &QpCtx, st: &mut ResponderState, pkt: &RxPkt<'_>) {
    if ctx.state == QPS_RTR && !st.comm_est {
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
    let ctx = if ctx.qp_type == QPT_XRC_TGT {
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
        ranges: std::mem::take(&mut dev.resp_range_scratch),
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
    dev.resp_range_scratch = r.ranges;
}

impl Responder<'_, '_> {
    fn step(&mut self, dev: &mut Device, st: &mut ResponderState, step: RespStep) -> RespStep {
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

    // ---- checks -------------------------------------------------------------------------------

    fn check_psn(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let d = psn_diff(self.pkt.psn(), st.epsn);
        if self.ctx.is_uc() {
            // UC (IBTA 9.8): no retransmission; a gap aborts the message in progress and the
            // receiver resynchronises on the packet's PSN; old packets are dropped. Spec §14.6:
            // only a gap of less than UC_PSN_WINDOW counts as loss; further ahead is dropped
            // with the receive state untouched. A MIDDLE/LAST in the window moves the expected
            // PSN too (so a long message whose FIRST was lost does not push the next message
            // out of the window) and is then dropped by the opcode sequence check; only a
            // FIRST/ONLY starts a message.
            if d < 0 {
                return RespStep::Drop;
            }
            if d as u32 >= UC_PSN_WINDOW {
                crate::stats::bump(&dev.port_stats.drop_uc_out_of_window);
                return RespStep::Drop;
            }
            if d > 0 {
                self.uc_abort(st);
                st.epsn = self.pkt.psn();
            }
            return RespStep::CheckOpSeq;
        }
        if d > 0 {
            return RespStep::ErrPsnOutOfSeq;
        }
        if d < 0 {
            return RespStep::Duplicate;
        }
        st.seq_nak_sent = false;
        RespStep::CheckOpSeq
    }

    fn check_op_seq(&mut self, st: &mut ResponderState) -> RespStep {
        let info = self.pkt.info;
        let want = match info.operation {
            Operation::Send => Some(MsgOp::Send),
            Operation::Write => Some(MsgOp::Write),
            _ => None,
        };
        let first = matches!(info.position, Position::First | Position::Only);
        if self.ctx.is_uc() {
            if first {
                if st.cur.is_some() {
                    // A new message starts while one is incomplete: the old one is lost.
                    self.uc_abort(st);
                }
                st.uc_drop = false;
            } else if st.uc_drop || st.cur != want {
                st.uc_drop = true;
                return RespStep::Drop;
            }
            return RespStep::CheckOpValid;
        }
        // RC (IBTA 9.7.5.2): MIDDLE/LAST must continue the same kind of message;
        // FIRST/ONLY/READ/atomic must not interrupt one.
        let ok = if first {
            st.cur.is_none()
        } else {
            st.cur.is_some() && st.cur == want
        };
        if ok {
            RespStep::CheckOpValid
        } else {
            RespStep::ErrInvalidRequest
        }
    }

    fn check_op_valid(&mut self) -> RespStep {
        let need = match self.pkt.op() {
            Operation::Write => ACCESS_REMOTE_WRITE,
            Operation::ReadRequest => ACCESS_REMOTE_READ,
            Operation::CompareSwap | Operation::FetchAdd => ACCESS_REMOTE_ATOMIC,
            Operation::AtomicWrite => ACCESS_REMOTE_WRITE,
            Operation::Flush => match self.pkt.feth.and_then(|f| flush_access(f.placement)) {
                Some(a) => a,
                None => return RespStep::ErrInvalidRequest,
            },
            Operation::Send => 0,
            _ => return RespStep::Drop,
        };
        if self.ctx.access & need != need {
            // The QP is not enabled for this operation: Invalid Request (IBTA 9.7.5.2, as rxe).
            return RespStep::ErrInvalidRequest;
        }
        RespStep::CheckResource
    }

    fn check_resource(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let info = self.pkt.info;
        let needs_recv = match info.operation {
            Operation::Send => matches!(info.position, Position::First | Position::Only),
            Operation::Write => info.has_imm(),
            _ => false,
        };
        // Spec §14.6: more READ/atomic/ATOMIC WRITE/FLUSH requests outstanding than
        // max_dest_rd_atomic (READ replies still queued) is an Invalid Request.
        if info.uses_responder_resource()
            && st.replies_holding_resources() >= self.ctx.max_dest_rd_atomic.max(1) as usize
        {
            return RespStep::ErrInvalidRequest;
        }
        if needs_recv && st.recv.is_none() {
            match take_recv(dev, self.ctx) {
                Ok(Some(w)) if w.malformed => {
                    st.recv = Some(w);
                    self.recv_status = WC_LOC_QP_OP_ERR;
                    return RespStep::ErrRemoteOp;
                }
                Ok(Some(w)) => st.recv = Some(w),
                Ok(None) => return RespStep::ErrRnr,
                Err(code) => {
                    st.fatal = Some(Fatal::QpFatal(code));
                    return RespStep::Drop;
                }
            }
        }
        RespStep::CheckLength
    }

    fn check_length(&mut self, st: &mut ResponderState) -> RespStep {
        let info = self.pkt.info;
        let n = self.pkt.payload.len() as u64;
        let mtu = self.ctx.mtu as u64;
        // IBTA 9.7.5.2: FIRST/MIDDLE carry exactly one MTU, LAST/ONLY at most one.
        let ok = match info.operation {
            Operation::Send | Operation::Write => match info.position {
                Position::First | Position::Middle => n == mtu,
                Position::Last | Position::Only => n <= mtu,
            },
            _ => true,
        };
        if !ok {
            return RespStep::ErrInvalidRequest;
        }
        match info.operation {
            Operation::Write => {
                if let Some(reth) = self.pkt.reth {
                    let total = reth.dma_len as u64;
                    // RETH length beyond max_msg_sz (2^31, spec §14.6).
                    if total > 1 << 31 {
                        return RespStep::ErrInvalidRequest;
                    }
                    let bad = match info.position {
                        Position::Only => n != total,
                        _ => n >= total,
                    };
                    if bad {
                        return RespStep::ErrInvalidRequest;
                    }
                } else {
                    let Some(w) = st.write else {
                        return RespStep::ErrInvalidRequest;
                    };
                    let bad = match info.position {
                        Position::Last => n != w.remaining,
                        _ => n >= w.remaining,
                    };
                    if bad {
                        return RespStep::ErrInvalidRequest;
                    }
                }
            }
            // Atomics need an 8-byte aligned VA (IBTA 9.7.5.2): Invalid Request otherwise.
            Operation::CompareSwap | Operation::FetchAdd
                if self.pkt.atomic.is_none_or(|a| !a.va.is_multiple_of(8)) =>
            {
                return RespStep::ErrInvalidRequest;
            }
            Operation::ReadRequest if self.pkt.reth.is_none_or(|r| r.dma_len > 1 << 31) => {
                return RespStep::ErrInvalidRequest;
            }
            // ATOMIC WRITE: exactly 8 bytes, to an 8-byte aligned VA (Invalid Request otherwise,
            // as for the other atomics).
            Operation::AtomicWrite
                if n != 8
                    || self
                        .pkt
                        .reth
                        .is_none_or(|r| r.dma_len != 8 || !r.va.is_multiple_of(8)) =>
            {
                return RespStep::ErrInvalidRequest;
            }
            Operation::Flush
                if self.pkt.reth.is_none_or(|r| r.dma_len > 1 << 31)
                    || self.pkt.feth.is_none_or(|f| f.selectivity > SELECT_MR) =>
            {
                return RespStep::ErrInvalidRequest;
            }
            _ => {}
        }
        if info.operation == Operation::Send {
            if let Some(w) = &st.recv {
                if w.offset + n > w.capacity {
                    return RespStep::ErrLength;
                }
            }
        }
        RespStep::CheckRkey
    }

    fn check_rkey(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let pkt = self.pkt;
        let (va, rkey, len, access) = match pkt.op() {
            Operation::Write => {
                let n = pkt.payload.len() as u64;
                if let Some(reth) = pkt.reth {
                    // A zero-length RDMA WRITE needs no R_Key check (IBTA 9.7.4.1).
                    if reth.dma_len == 0 {
                        return RespStep::Execute;
                    }
                    // Validate the whole transfer at its first packet, without faulting it
                    // in: each packet resolves (and faults) only its own bytes, so a WRITE
                    // larger than the resident budget makes progress (spec §12.6).
                    if let Err(s) = self.check_whole(
                        dev,
                        reth.rkey,
                        reth.va,
                        reth.dma_len as u64,
                        ACCESS_REMOTE_WRITE,
                    ) {
                        return s;
                    }
                    (reth.va, reth.rkey, n, ACCESS_REMOTE_WRITE)
                } else {
                    let Some(w) = st.write else {
                        return RespStep::ErrInvalidRequest;
                    };
                    (w.va, w.rkey, n, ACCESS_REMOTE_WRITE)
                }
            }
            Operation::ReadRequest => {
                let Some(reth) = pkt.reth else {
                    return RespStep::ErrInvalidRequest;
                };
                if reth.dma_len == 0 {
                    return RespStep::Execute;
                }
                // The whole range is checked, only the first response packet is resolved (an
                // ODP fault there is the RNR NAK of §12.4); `pump_replies` resolves the others
                // one at a time, so a READ larger than the resident budget makes progress.
                if let Err(s) = self.check_whole(
                    dev,
                    reth.rkey,
                    reth.va,
                    reth.dma_len as u64,
                    ACCESS_REMOTE_READ,
                ) {
                    return s;
                }
                let first = (reth.dma_len as u64).min(self.ctx.mtu as u64);
                (reth.va, reth.rkey, first, ACCESS_REMOTE_READ)
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let Some(a) = pkt.atomic else {
                    return RespStep::ErrInvalidRequest;
                };
                (a.va, a.rkey, 8, ACCESS_REMOTE_ATOMIC)
            }
            Operation::AtomicWrite => {
                let Some(reth) = pkt.reth else {
                    return RespStep::ErrInvalidRequest;
                };
                (reth.va, reth.rkey, 8, ACCESS_REMOTE_WRITE)
            }
            Operation::Flush => return self.check_flush_rkey(dev),
            _ => return RespStep::Execute,
        };
        if len == 0 {
            return RespStep::Execute;
        }
        match self.resolve(dev, rkey, va, len, access) {
            Ok(()) => RespStep::Execute,
            Err(s) => s,
        }
    }

    /// FLUSH: the R_Key is always checked (also for a zero length) for the placement's access
    /// right; a range FLUSH is bounds-checked and faults ODP pages in like a READ, a whole-MR FLUSH
    /// is not (spec §14.6).
    fn check_flush_rkey(&mut self, dev: &mut Device) -> RespStep {
        let (Some(reth), Some(feth)) = (self.pkt.reth, self.pkt.feth) else {
            return RespStep::ErrInvalidRequest;
        };
        let Some(access) = flush_access(feth.placement) else {
            return RespStep::ErrInvalidRequest;
        };
        let len = if feth.selectivity == SELECT_MR {
            0
        } else {
            reth.dma_len as u64
        };
        match self.resolve(dev, reth.rkey, reth.va, len, access) {
            Ok(()) => RespStep::Execute,
            Err(s) => s,
        }
    }

    /// Check a whole RETH range (key, PD, access, bounds) without translating or faulting it.
    fn check_whole(
        &self,
        dev: &Device,
        rkey: u32,
        va: u64,
        len: u64,
        access: u32,
    ) -> Result<(), RespStep> {
        dev.mrs
            .check_remote(rkey, self.ctx.pdn, self.ctx.qpn, va, len, access)
            .map_err(|_| RespStep::ErrRkeyViolation)?;
        self.check_odp_caps(dev, rkey, access)
    }

    /// Spec §2.2 / §14.6: an R_Key of an ODP MR for an operation the QP's transport does not list
    /// in its ODP caps is an R_Key violation (RC: NAK Remote Access Error; UC: dropped).
    fn check_odp_caps(&self, dev: &Device, rkey: u32, access: u32) -> Result<(), RespStep> {
        let op = if access & ACCESS_REMOTE_ATOMIC != 0 {
            vrdma_spec::VRDMA_ODP_ATOMIC
        } else if access & ACCESS_REMOTE_READ != 0 {
            vrdma_spec::VRDMA_ODP_READ
        } else if access & ACCESS_REMOTE_WRITE != 0 {
            vrdma_spec::VRDMA_ODP_WRITE
        } else {
            0
        };
        if ctx::odp_denied(dev, self.ctx, rkey, op) {
            return Err(RespStep::ErrRkeyViolation);
        }
        Ok(())
    }

    /// Resolve an R_Key range; map failures to the responder error states (spec §10, §14).
    fn resolve(
        &mut self,
        dev: &mut Device,
        rkey: u32,
        va: u64,
        len: u64,
        access: u32,
    ) -> Result<(), RespStep> {
        self.check_odp_caps(dev, rkey, access)?;
        let (pdn, qpn) = (self.ctx.pdn, self.ctx.qpn);
        match dev
            .mrs
            .resolve_remote_into(None, rkey, pdn, qpn, va, len, access, &mut self.ranges)
        {
            Ok(()) => Ok(()),
            // ODP at the responder: RNR NAK now, the page request is already on its way.
            Err(MrError::Fault { .. }) => {
                self.odp = true;
                Err(RespStep::ErrRnr)
            }
            Err(_) => Err(RespStep::ErrRkeyViolation),
        }
    }

    // ---- execution ----------------------------------------------------------------------------

    fn execute(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let pkt = self.pkt;
        match pkt.op() {
            Operation::Send => {
                let Some(w) = st.recv.as_mut() else {
                    return RespStep::ErrInvalidRequest;
                };
                // Spec §2.2: receive SGEs of an ODP MR only if the transport lists RECV
                // (SRQ_RECV for an SRQ WQE) in its ODP caps; else the WQE completes LOC_PROT_ERR.
                let op = ctx::odp_recv_op(w);
                if w.sges
                    .iter()
                    .any(|s| ctx::odp_denied(dev, self.ctx, s.lkey, op))
                {
                    self.recv_status = WC_LOC_PROT_ERR;
                    return RespStep::ErrRemoteOp;
                }
                let buf = pkt.payload;
                if !buf.is_empty() {
                    let off = w.offset;
                    let sges = std::mem::take(&mut w.sges);
                    let r = sge_copy(dev, None, self.ctx.pdn, &sges, off, SgeIo::Scatter(buf));
                    if let Some(w) = st.recv.as_mut() {
                        w.sges = sges;
                    }
                    match r {
                        Ok(()) => {}
                        Err(SgeError::Fault { .. }) => {
                            self.odp = true;
                            return RespStep::ErrRnr;
                        }
                        Err(SgeError::Len) => return RespStep::ErrLength,
                        Err(SgeError::Prot) => {
                            self.recv_status = WC_LOC_PROT_ERR;
                            return RespStep::ErrRemoteOp;
                        }
                    }
                }
                if let Some(w) = st.recv.as_mut() {
                    w.offset += buf.len() as u64;
                }
                st.cur = Some(MsgOp::Send);
                RespStep::Complete
            }
            Operation::Write => {
                if let Some(reth) = pkt.reth {
                    st.write = Some(WriteCtx {
                        va: reth.va,
                        rkey: reth.rkey,
                        remaining: reth.dma_len as u64,
                        total: reth.dma_len as u64,
                    });
                }
                let n = pkt.payload.len();
                if n > 0 {
                    let mut p = 0usize;
                    for r in &self.ranges {
                        let Some(chunk) = p
                            .checked_add(r.len as usize)
                            .and_then(|e| pkt.payload.get(p..e))
                        else {
                            return RespStep::ErrRemoteOp;
                        };
                        if dev.mem.write(r.gpa, chunk).is_err() {
                            self.mem_fault = true;
                            return RespStep::ErrRemoteOp;
                        }
                        p += chunk.len();
                    }
                }
                if let Some(w) = st.write.as_mut() {
                    w.va = w.va.wrapping_add(n as u64);
                    w.remaining -= n as u64;
                }
                st.cur = Some(MsgOp::Write);
                RespStep::Complete
            }
            Operation::ReadRequest => RespStep::ReadReply,
            Operation::CompareSwap | Operation::FetchAdd => RespStep::AtomicReply,
            Operation::AtomicWrite => RespStep::AtomicWriteReply,
            Operation::Flush => RespStep::FlushReply,
            _ => RespStep::Drop,
        }
    }

    /// Generate READ responses (IBTA 9.7.4.1.4): one per MTU, PSNs from the request's PSN.
    fn read_reply(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let Some(reth) = self.pkt.reth else {
            return RespStep::ErrInvalidRequest;
        };
        let psn = self.pkt.psn();
        let n = (reth.dma_len as u64).div_ceil(self.ctx.mtu as u64).max(1) as u32;
        push_resource(
            st,
            self.ctx,
            RdAtomicRes {
                first_psn: psn,
                last_psn: psn_add(psn, n - 1),
                kind: ResKind::Read {
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                },
            },
        );
        st.msn = psn_add(st.msn, 1);
        st.epsn = psn_add(psn, n);
        st.unacked = 0;
        st.replies.push_back(ReadReply {
            kind: ReplyKind::Read,
            psn,
            va: reth.va,
            rkey: reth.rkey,
            remaining: reth.dma_len as u64,
            first: true,
            msn: st.msn,
            pdn: self.ctx.pdn,
        });
        pump_replies(dev, self.ctx, st, READ_BURST);
        RespStep::Done
    }

    /// Execute an atomic with the guest's CPU atomics and reply with an AtomicAckETH (IBTA 9.4.5).
    fn atomic_reply(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let Some(a) = self.pkt.atomic else {
            return RespStep::ErrInvalidRequest;
        };
        let Some(r) = self.ranges.first().copied() else {
            return RespStep::ErrRemoteOp;
        };
        if r.len != 8 {
            return RespStep::ErrRemoteOp;
        }
        let res = if self.pkt.op() == Operation::CompareSwap {
            dev.mem.compare_swap_u64(r.gpa, a.compare, a.swap_add)
        } else {
            dev.mem.fetch_add_u64(r.gpa, a.swap_add)
        };
        let Ok(orig) = res else {
            self.mem_fault = true;
            return RespStep::ErrRemoteOp;
        };
        let psn = self.pkt.psn();
        push_resource(
            st,
            self.ctx,
            RdAtomicRes {
                first_psn: psn,
                last_psn: psn,
                kind: ResKind::Atomic { orig },
            },
        );
        st.msn = psn_add(st.msn, 1);
        st.epsn = psn_add(psn, 1);
        st.unacked = 0;
        atomic_ack_in_order(dev, self.ctx, st, psn, orig);
        RespStep::Done
    }

    /// ATOMIC WRITE (IBTA 1.5): one atomic 64-bit store of the payload, after every earlier
    /// request of the QP (they were executed in PSN order before this one).
    fn atomic_write_reply(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let Ok(data) = <[u8; 8]>::try_from(self.pkt.payload) else {
            return RespStep::ErrInvalidRequest;
        };
        let Some(r) = self.ranges.first().copied().filter(|r| r.len == 8) else {
            return RespStep::ErrRemoteOp;
        };
        if dev.mem.store_bytes8_atomic(r.gpa, data).is_err() {
            self.mem_fault = true;
            return RespStep::ErrRemoteOp;
        }
        self.empty_read_response(dev, st)
    }

    /// FLUSH (IBTA 1.5): earlier requests are already applied; global visibility in host RAM is
    /// a full fence. Persistence never gets here (no MR grants FLUSH_PERSISTENT).
    fn flush_reply(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        dev.mem.fence();
        self.empty_read_response(dev, st)
    }

    /// Answer ATOMIC WRITE / FLUSH with RDMA READ RESPONSE ONLY, AETH and no payload, queued
    /// behind any READ responses still being paced so responses stay in PSN order.
    fn empty_read_response(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let psn = self.pkt.psn();
        push_resource(
            st,
            self.ctx,
            RdAtomicRes {
                first_psn: psn,
                last_psn: psn,
                kind: ResKind::EmptyReadResponse,
            },
        );
        st.msn = psn_add(st.msn, 1);
        st.epsn = psn_add(psn, 1);
        st.unacked = 0;
        queue_empty_read_response(dev, self.ctx, st, psn);
        RespStep::Done
    }

    /// End of a message: receive completion for SEND / WRITE_WITH_IMM (spec §7).
    fn complete(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let info = self.pkt.info;
        if !matches!(info.position, Position::Last | Position::Only) {
            return RespStep::Acknowledge;
        }
        let mut cqe = Cqe {
            qpn: self.ctx.qpn,
            ..Default::default()
        };
        match info.operation {
            Operation::Send => {
                let Some(w) = st.recv.take() else {
                    return RespStep::ErrInvalidRequest;
                };
                cqe.wr_id = w.wr_id;
                cqe.opcode = WC_RECV;
                cqe.byte_len = w.offset as u32;
                if let Some(ieth) = self.pkt.ieth {
                    // SEND_WITH_INV (IBTA 9.4.4 / 10.6): invalidate the named R_Key in our PD.
                    let (pdn, qpn) = (self.ctx.pdn, self.ctx.qpn);
                    if dev.mrs.remote_invalidate(ieth.rkey, pdn, qpn).is_err() {
                        // Spec §14.6: NAK Invalid Request, the receive WQE completes
                        // REM_INV_REQ_ERR, QP to ERROR.
                        cqe.status = WC_REM_INV_REQ_ERR;
                        st.cur = None;
                        ctx::post_cqe(dev, self.ctx.recv_cqn, &cqe, true);
                        self.nak(dev, st, NakCode::InvalidRequest, self.pkt.psn());
                        st.fatal = Some(Fatal::Silent);
                        return RespStep::Done;
                    }
                    cqe.flags |= WC_F_INV;
                    cqe.ex = ieth.rkey;
                }
            }
            Operation::Write => {
                if info.has_imm() {
                    let Some(w) = st.recv.take() else {
                        return RespStep::ErrInvalidRequest;
                    };
                    cqe.wr_id = w.wr_id;
                    cqe.opcode = WC_RECV_RDMA_WITH_IMM;
                    cqe.byte_len = st.write.map_or(0, |w| w.total as u32);
                }
                st.write = None;
            }
            _ => {}
        }
        if let Some(imm) = self.pkt.imm {
            cqe.flags |= WC_F_IMM;
            cqe.ex = u32::from_le_bytes(imm.wire_bytes());
        }
        st.cur = None;
        if self.ctx.is_rc() {
            st.msn = psn_add(st.msn, 1);
        }
        if cqe.opcode != 0 || info.operation == Operation::Send {
            ctx::post_cqe(dev, self.ctx.recv_cqn, &cqe, self.pkt.bth.solicited);
        }
        RespStep::Acknowledge
    }

    /// Advance the expected PSN and coalesce ACKs (IBTA 9.7.5.1: AckReq, message end).
    fn acknowledge(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        st.epsn = psn_add(self.pkt.psn(), 1);
        if !self.ctx.is_rc() {
            return RespStep::Done;
        }
        st.unacked += 1;
        if self.pkt.bth.ack_req || st.unacked >= ACK_COALESCE {
            ack_in_order(dev, self.ctx, st, Aeth::ack(st.msn), self.pkt.psn());
            st.unacked = 0;
        }
        RespStep::Done
    }

    // ---- duplicates and errors ----------------------------------------------------------------

    /// Duplicate request (IBTA 9.7.5.1): SEND/WRITE are re-acknowledged, READ responses are
    /// regenerated for the requested range and atomics are answered from the resource cache
    /// without re-execution.
    fn duplicate(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        let psn = self.pkt.psn();
        match self.pkt.op() {
            Operation::Send | Operation::Write if self.pkt.bth.ack_req => {
                let aeth = Aeth::ack(st.msn);
                ack_in_order(dev, self.ctx, st, aeth, psn_add(st.epsn, PSN_MASK));
            }
            Operation::ReadRequest => {
                let Some(reth) = self.pkt.reth else {
                    return RespStep::Drop;
                };
                let Some(res) = st.resources.iter().find(|r| {
                    matches!(r.kind, ResKind::Read { .. })
                        && psn_diff(psn, r.first_psn) >= 0
                        && psn_diff(psn, r.last_psn) <= 0
                }) else {
                    return RespStep::Drop;
                };
                let ResKind::Read { va, rkey, len } = res.kind else {
                    return RespStep::Drop;
                };
                // The re-request must stay inside the original one.
                let skip = psn_diff(psn, res.first_psn) as u64 * self.ctx.mtu as u64;
                if reth.rkey != rkey
                    || reth.va != va.wrapping_add(skip)
                    || reth.dma_len as u64 + skip != len as u64
                {
                    return RespStep::Drop;
                }
                // The requester discards everything after the gap it re-requests from, so any
                // reply still queued is obsolete: answer the re-request instead.
                st.replies.clear();
                st.replies.push_back(ReadReply {
                    kind: ReplyKind::Read,
                    psn,
                    va: reth.va,
                    rkey,
                    remaining: reth.dma_len as u64,
                    first: true,
                    msn: st.msn,
                    pdn: self.ctx.pdn,
                });
                pump_replies(dev, self.ctx, st, READ_BURST);
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                if let Some(ResKind::Atomic { orig }) = st
                    .resources
                    .iter()
                    .find(|r| r.first_psn == psn)
                    .map(|r| r.kind)
                {
                    atomic_ack_in_order(dev, self.ctx, st, psn, orig);
                }
            }
            // Replayed from the resource cache, never executed twice (a later WRITE may have
            // changed the ATOMIC WRITE's target since). As for a re-requested READ, whatever is
            // still queued is obsolete: the requester resends everything after this PSN, and a
            // reply left behind a stale READ tail would be cleared by that READ's duplicate.
            Operation::AtomicWrite | Operation::Flush
                if st
                    .resources
                    .iter()
                    .any(|r| r.first_psn == psn && r.kind == ResKind::EmptyReadResponse) =>
            {
                st.replies.clear();
                queue_empty_read_response(dev, self.ctx, st, psn);
            }
            _ => {}
        }
        RespStep::Done
    }

    fn err_psn(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        // IBTA 9.7.5.2: one PSN sequence error NAK per gap, carrying the expected PSN.
        if !st.seq_nak_sent {
            st.seq_nak_sent = true;
            if let Some(s) = ctx::qp_stats(dev, self.ctx.qpn) {
                s.seq_naks_tx += 1;
            }
            let aeth = Aeth {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: st.msn,
            };
            ack_in_order(dev, self.ctx, st, aeth, st.epsn);
        }
        RespStep::Done
    }

    fn err_rnr(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        if self.ctx.is_rc() {
            if let Some(s) = ctx::qp_stats(dev, self.ctx.qpn) {
                s.rnr_naks_tx += 1;
            }
            // IBTA 9.7.5.2.8: RNR NAK with our min_rnr_timer; the requester resends this PSN.
            let aeth = Aeth {
                syndrome: Syndrome::RnrNak {
                    timer: self.ctx.min_rnr_timer,
                },
                msn: st.msn,
            };
            ack_in_order(dev, self.ctx, st, aeth, self.pkt.psn());
        } else {
            self.uc_abort(st);
        }
        if self.odp {
            log::trace!(
                "qp {}: ODP fault at the responder, RNR NAK for psn {}",
                self.ctx.qpn,
                self.pkt.psn()
            );
        }
        RespStep::Done
    }

    /// IBTA C9-222.1.1 (spec §14).
    fn err_rkey(&mut self, dev: &mut Device, st: &mut ResponderState) -> RespStep {
        if !self.ctx.is_rc() {
            // UC: no NAKs; the damaged message is dropped silently.
            self.uc_abort(st);
            return RespStep::Done;
        }
        self.nak(dev, st, NakCode::RemoteAccessError, self.pkt.psn());
        let info = self.pkt.info;
        if info.operation == Operation::Write && info.has_imm() {
            // WRITE_WITH_IMM: the violation is tied to the consumed receive WQE, which completes
            // with LOC_ACCESS_ERR; QP to ERROR, no async event. (A multi-packet WRITE_WITH_IMM's
            // FIRST packet cannot be tied to a receive WQE yet: it is handled as a plain WRITE.)
            self.recv_status = WC_LOC_ACCESS_ERR;
            self.complete_recv_error(dev, st);
            st.fatal = Some(Fatal::Silent);
        } else {
            // WRITE without immediate, READ, atomic: QP to ERROR + VRDMA_EV_QP_ACCESS_ERR.
            st.fatal = Some(Fatal::AccessErr);
        }
        RespStep::Done
    }

    fn nak(&self, dev: &mut Device, st: &ResponderState, code: NakCode, psn: u32) {
        let aeth = Aeth {
            syndrome: Syndrome::Nak(code),
            msn: st.msn,
        };
        send_ack(dev, self.ctx, aeth, psn);
    }

    /// Complete the consumed receive WQE (if any) with `self.recv_status`.
    fn complete_recv_error(&mut self, dev: &mut Device, st: &mut ResponderState) {
        if let Some(w) = st.recv.take() {
            let cqe = Cqe {
                wr_id: w.wr_id,
                qpn: self.ctx.qpn,
                opcode: WC_RECV,
                status: self.recv_status,
                ..Default::default()
            };
            ctx::post_cqe(dev, self.ctx.recv_cqn, &cqe, true);
        }
        st.cur = None;
        st.write = None;
    }

    /// UC: drop the rest of the current message; a consumed receive WQE is kept for the next
    /// message (IBTA 9.8: the damaged message is silently discarded).
    fn uc_abort(&self, st: &mut ResponderState) {
        if let Some(w) = st.recv.as_mut() {
            w.offset = 0;
        }
        st.cur = None;
        st.write = None;
        st.uc_drop = true;
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
fn queue_empty_read_response(dev: &mut Device, ctx: &QpCtx, st: &mut ResponderState, psn: u32) {
    st.replies.push_back(ReadReply {
        kind: ReplyKind::Read,
        psn,
        va: 0,
        rkey: 0,
        remaining: 0,
        first: true,
        msn: st.msn,
        pdn: ctx.pdn,
    });
    pump_replies(dev, ctx, st, READ_BURST);
}

/// Take a receive WQE from the RQ or the SRQ.
fn take_recv(dev: &mut Device, ctx: &QpCtx) -> Result<Option<RecvWqe>, u32> {
    ctx::recv_take(dev, ctx).map_err(|f| f.0)
}

/// Send a non-fatal ACK / RNR NAK / PSN sequence error NAK in PSN order: at once if nothing is
/// queued, else behind the queued READ responses (IBTA 9.7.5.1.1), where `pump_replies` sends
/// it when the queue drains past it. Any such response covers every earlier PSN, so a newer one
/// replaces an ACK still waiting at the tail (the queue stays bounded by the responder
/// resources). Fatal NAKs are sent at once: the QP goes to ERROR and drops the queue.
fn ack_in_order(dev: &mut Device, ctx: &QpCtx, st: &mut ResponderState, aeth: Aeth, psn: u32) {
    if st.replies.is_empty() {
        send_ack(dev, ctx, aeth, psn);
        return;
    }
    let r = ReadReply {
        kind: ReplyKind::Ack(aeth),
        psn,
        va: 0,
        rkey: 0,
        remaining: 0,
        first: true,
        msn: aeth.msn,
        pdn: ctx.pdn,
    };
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
fn atomic_ack_in_order(
    dev: &mut Device,
    ctx: &QpCtx,
    st: &mut ResponderState,
    psn: u32,
    orig: u64,
) {
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
    st.replies.push_back(ReadReply {
        kind: ReplyKind::AtomicAck { orig },
        psn,
        va: 0,
        rkey: 0,
        remaining: 0,
        first: true,
        msn: st.msn,
        pdn: ctx.pdn,
    });
}

/// Send an ACK / NAK / RNR NAK with `aeth` for `psn`.
pub(crate) fn send_ack(dev: &mut Device, ctx: &QpCtx, aeth: Aeth, psn: u32) {
    let Some(path) = ctx.path else { return };
    let Some(op) = opcode_for(
        ctx.transport(),
        Operation::Ack,
        Position::Only,
        false,
        false,
    ) else {
        return;
    };
    let hdrs = TxHdrs {
        aeth: Some(aeth),
        ..Default::default()
    };
    if let Some(f) = super::build_frame(
        &path,
        ctx.qpn,
        ctx.dest_qpn,
        op,
        psn,
        false,
        false,
        &hdrs,
        &[],
    ) {
        ctx::send_frame(dev, ctx.qpn, f, false);
    }
}

fn send_atomic_ack(dev: &mut Device, ctx: &QpCtx, msn: u32, psn: u32, orig: u64) {
    let Some(path) = ctx.path else { return };
    let Some(op) = opcode_for(
        ctx.transport(),
        Operation::AtomicAck,
        Position::Only,
        false,
        false,
    ) else {
        return;
    };
    let hdrs = TxHdrs {
        aeth: Some(Aeth::ack(msn)),
        atomic_ack: Some(AtomicAckEth { orig }),
        ..Default::default()
    };
    if let Some(f) = super::build_frame(
        &path,
        ctx.qpn,
        ctx.dest_qpn,
        op,
        psn,
        false,
        false,
        &hdrs,
        &[],
    ) {
        ctx::send_frame(dev, ctx.qpn, f, false);
    }
}

/// Send up to `budget` READ response packets (IBTA 9.7.4.1.4: one per MTU, FIRST/MIDDLE/LAST or
/// ONLY, AETH on FIRST/LAST/ONLY). Returns true when the budget ran out with replies still
/// queued (call again soon); false when the queue is empty or waits for an ODP fault, whose end
/// resumes the QP (`transport::resume_odp`), so a waiting READ costs no timer spin.
pub(crate) fn pump_replies(
    dev: &mut Device,
    ctx: &QpCtx,
    st: &mut ResponderState,
    mut budget: u32,
) -> bool {
    let Some(path) = ctx.path else {
        st.replies.clear();
        return false;
    };
    let mtu = ctx.mtu as u64;
    while budget > 0 {
        let Some(r) = st.replies.front_mut() else {
            break;
        };
        // An ACK queued behind READ responses: they are all sent, so it may go now.
        match r.kind {
            ReplyKind::Read => {}
            ReplyKind::Ack(aeth) => {
                let psn = r.psn;
                st.replies.pop_front();
                send_ack(dev, ctx, aeth, psn);
                budget -= 1;
                continue;
            }
            ReplyKind::AtomicAck { orig } => {
                let (psn, msn) = (r.psn, r.msn);
                st.replies.pop_front();
                send_atomic_ack(dev, ctx, msn, psn, orig);
                budget -= 1;
                continue;
            }
        }
        let n = r.remaining.min(mtu);
        let last = r.remaining <= mtu;
        let pos = match (r.first, last) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, false) => Position::Middle,
            (false, true) => Position::Last,
        };
        // `vec!` of zeroes is a zeroed allocation; `resize` is a per-byte loop in debug builds.
        let mut buf = vec![0u8; n as usize];
        if n > 0 {
            // Re-translate per packet: the MR may have been invalidated or deregistered since the
            // request was checked, and ODP chunks may have been reclaimed.
            let mut ranges = Vec::new();
            let ok = match dev.mrs.resolve_remote_into(
                Some(ctx.qpn),
                r.rkey,
                r.pdn,
                ctx.qpn,
                r.va,
                n,
                ACCESS_REMOTE_READ,
                &mut ranges,
            ) {
                Ok(()) => {
                    let mut p = 0usize;
                    let mut ok = true;
                    for g in ranges {
                        let Some(chunk) = p
                            .checked_add(g.len as usize)
                            .and_then(|e| buf.get_mut(p..e))
                        else {
                            ok = false;
                            break;
                        };
                        if dev.mem.read(g.gpa, chunk).is_err() {
                            ok = false;
                            break;
                        }
                        p += g.len as usize;
                    }
                    ok
                }
                // Not resident (yet, or any more): the fault is in flight and its end resumes
                // this QP; the responses continue from here, in PSN order (spec §12.4).
                Err(MrError::Fault { .. }) => return false,
                Err(_) => false,
            };
            if !ok {
                // The requester times out and retries; a retry fails the R_Key check and gets
                // the remote access NAK.
                st.replies.pop_front();
                continue;
            }
        }
        let hdrs = TxHdrs {
            aeth: matches!(pos, Position::First | Position::Last | Position::Only)
                .then(|| Aeth::ack(r.msn)),
            ..Default::default()
        };
        let psn = r.psn;
        r.psn = psn_add(r.psn, 1);
        r.va = r.va.wrapping_add(n);
        r.remaining -= n;
        r.first = false;
        if last {
            st.replies.pop_front();
        }
        budget -= 1;
        let Some(op) = opcode_for(ctx.transport(), Operation::ReadResponse, pos, false, false)
        else {
            continue;
        };
        if let Some(f) = super::build_frame(
            &path,
            ctx.qpn,
            ctx.dest_qpn,
            op,
            psn,
            false,
            false,
            &hdrs,
            &buf,
        ) {
            ctx::send_frame(dev, ctx.qpn, f, false);
        }
    }
    budget == 0 && !st.replies.is_empty()
}

/// UD / GSI receive (IBTA 9.8, 10.2; spec §6.2): Q_Key check, GRH area, one-packet message.
fn ud_receive(dev: &mut Device, ctx: &QpCtx, st: &mut ResponderState, pkt: &RxPkt<'_>) {
    if pkt.info.transport != Transport::Ud {
        return;
    }
    let Some(deth) = pkt.deth else { return };
    // Q_Key check (IBTA 10.2.5): mismatch → silently dropped. QP1 uses 0x80010000.
    let qkey = if ctx.qp_type == QPT_GSI {
        GSI_QKEY
    } else {
        ctx.qkey
    };
    if deth.qkey != qkey {
        return;
    }
    // A WQE kept from a dropped oversized datagram is used first (it is still the head).
    let w = match st
        .recv
        .take()
        .map_or_else(|| take_recv(dev, ctx), |w| Ok(Some(w)))
    {
        Ok(Some(w)) => w,
        // UD has no RNR: without a receive WQE the datagram is dropped (IBTA 9.8).
        Ok(None) => return,
        Err(code) => {
            st.fatal = Some(Fatal::QpFatal(code));
            return;
        }
    };
    let total = GRH_LEN as u64 + pkt.payload.len() as u64;
    let mut cqe = Cqe {
        wr_id: w.wr_id,
        qpn: ctx.qpn,
        opcode: WC_RECV,
        src_qp: deth.src_qp,
        pkey_index: 0,
        smac: pkt.smac,
        vlan_id: pkt.vlan.unwrap_or(ctx::NO_VLAN),
        network_hdr_type: if pkt.ipv4 { NETWORK_IPV4 } else { NETWORK_IPV6 },
        flags: WC_F_GRH,
        ..Default::default()
    };
    if let Some(imm) = pkt.imm {
        cqe.flags |= WC_F_IMM;
        cqe.ex = u32::from_le_bytes(imm.wire_bytes());
    }
    if w.malformed {
        // Spec §14.4: the WQE completes LOC_QP_OP_ERR and the QP goes to ERROR.
        cqe.status = WC_LOC_QP_OP_ERR;
        st.fatal = Some(Fatal::Silent);
    } else if w
        .sges
        .iter()
        .any(|s| ctx::odp_denied(dev, ctx, s.lkey, ctx::odp_recv_op(&w)))
    {
        // Spec §2.2: receive SGEs of an ODP MR the UD caps do not allow (the device advertises
        // RECV and SRQ_RECV for UD, so this only guards the rule).
        cqe.status = WC_LOC_PROT_ERR;
    } else if total > w.capacity {
        // Spec §14.6: a datagram longer than the receive buffers is dropped and the WQE is not
        // consumed (it stays the head receive for the next datagram).
        st.recv = Some(w);
        return;
    } else {
        let mut buf = Vec::with_capacity(total as usize);
        buf.extend_from_slice(&pkt.grh);
        buf.extend_from_slice(pkt.payload);
        match sge_copy(dev, None, ctx.pdn, &w.sges, 0, SgeIo::Scatter(&buf)) {
            Ok(()) => cqe.byte_len = total as u32,
            // Spec §14.6: an ODP chunk that is not resident drops the datagram (UD has no RNR);
            // the chunk is being faulted in and the WQE stays the head for the next datagram.
            Err(SgeError::Fault { .. }) => {
                st.recv = Some(w);
                return;
            }
            Err(SgeError::Len) => cqe.status = WC_LOC_LEN_ERR,
            Err(_) => cqe.status = WC_LOC_PROT_ERR,
        }
    }
    ctx::post_cqe(dev, ctx.recv_cqn, &cqe, pkt.bth.solicited);
}

/// QP in ERROR (spec §13): RQ WQEs (and a receive in progress) complete with WR_FLUSH_ERR; an
/// SRQ-attached QP reports LAST_WQE_REACHED instead (IBTA 11.6.2).
pub(crate) fn flush(dev: &mut Device, ctx: &QpCtx, st: &mut ResponderState) {
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
