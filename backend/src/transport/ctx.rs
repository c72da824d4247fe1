//! The transport's narrow interface to the rest of the device: a snapshot of the QP attributes the
//! protocol needs ([`QpCtx`]), taking/putting the per-QP protocol state, rings, CQ posting, AHs and
//! GIDs. Keeping every `Device` access here means the state machines never hold a borrow of the QP
//! table while they touch guest memory, MRs or CQs.

use super::packet::Path;
use super::responder::{decode_recv, RecvWqe};
use super::{RequesterState, ResponderState};
use crate::memory::mr::{GuestRange, MrError};
use crate::memory::Access;
use crate::qp::{QpState, QpType};
use crate::transport::Device;
use vrdma_spec::{VrdmaAv, VrdmaCqe};

/// The well-known Q_Key of QP1 (IBTA 13.4.6 / spec §13).
pub const GSI_QKEY: u32 = vrdma_spec::VRDMA_GSI_QKEY;

/// Snapshot of the QP attributes the transport reads, taken at the start of each operation.
#[derive(Debug, Clone)]
pub struct QpCtx {
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    pub pdn: u32,
    pub send_cqn: u32,
    pub recv_cqn: u32,
    pub srqn: Option<u32>,
    /// XRC_TGT: its XRC domain (spec §13.7).
    pub xrcdn: Option<u32>,
    /// Path MTU in bytes (256..4096).
    pub mtu: u32,
    pub dest_qpn: u32,
    pub qkey: u32,
    /// The P_Key the QP's `pkey_index` names in the port's table (`intake::PKEY_TABLE`); `None`
    /// if the index is outside it (MODIFY_QP prevents that).
    pub pkey: Option<u16>,
    pub access: u32,
    pub max_rd_atomic: u32,
    pub max_dest_rd_atomic: u32,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub sq_sig_all: bool,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
    /// SQ slot size in bytes.
    pub sq_wqe_size: u32,
    /// RQ slot size in bytes (0 with an SRQ).
    pub rq_wqe_size: u32,
    /// RC/UC primary path; `None` when the address vector is unusable.
    pub path: Option<Path>,
    /// SQD: the send queue is still draining (set by `qp/` on RTS → SQD).
    pub sq_draining: bool,
    /// Report SQ_DRAINED when the drain completes.
    pub en_sqd_async_notify: bool,
}

impl QpCtx {
    /// Reliable connected service: RC and the XRC types (spec §13.7: XRC has RC's reliability,
    /// PSN rules, ACKs and responder resources).
    pub fn is_rc(&self) -> bool {
        matches!(self.qp_type, QpType::Rc | QpType::XrcIni | QpType::XrcTgt)
    }
    /// XRC_INI or XRC_TGT: packets use the XRC opcodes (spec §15.2).
    pub fn is_xrc(&self) -> bool {
        self.qp_type.is_xrc()
    }
    /// The transport of this QP's packets.
    pub fn transport(&self) -> crate::wire::Transport {
        use crate::wire::Transport;
        match self.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::XrcIni | QpType::XrcTgt => Transport::Xrc,
            QpType::Ud | QpType::Gsi => Transport::Ud,
        }
    }
    pub fn is_uc(&self) -> bool {
        self.qp_type == QpType::Uc
    }
    pub fn is_ud(&self) -> bool {
        self.qp_type.is_datagram()
    }
    /// States in which the requester may transmit (IBTA 10.3.1: RTS; SQD finishes what is in flight).
    pub fn can_send(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
    }
    /// States in which the responder accepts requests (RTR and later, not ERR).
    pub fn can_receive(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }
}

/// IB MTU enum (1..5) to bytes: `qp::path_mtu_bytes`, the one definition (its fallback for an
/// unset enum is 256; this copy used to say 1024).
pub fn mtu_bytes(e: u32) -> u32 {
    crate::qp::path_mtu_bytes(e)
}

/// Why a ring access failed: the QP must go to ERROR with QP_FATAL (spec §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFault(
    /// The `VRDMA_RING_ERR_*` code (the QP_FATAL event's `info`); 0 when no ring index or
    /// access failed (e.g. a malformed receive WQE).
    pub u32,
);

/// Build a path from an address vector and its resolved source GID (spec §15).
fn av_path(dev: &Device, av: &VrdmaAv, sgid: [u8; 16]) -> Path {
    Path {
        smac: dev.config.mac,
        dmac: av.dmac,
        // VLAN ids 1..=4094 tag the frame; 0xffff (and 0) mean untagged.
        vlan: (1..0xfff).contains(&av.vlan_id).then_some(av.vlan_id),
        sgid,
        dgid: av.dgid,
        traffic_class: av.traffic_class,
        // A hop limit of 0 would be dropped by the first IP hop: use 64 (Linux's default TTL).
        hop_limit: if av.hop_limit == 0 { 64 } else { av.hop_limit },
        flow_label: av.flow_label & 0x000f_ffff,
        icrc: !dev.icrc_offload.seals_tx,
    }
}

/// Snapshot of QP `qpn`, `None` if it does not exist.
pub fn qp_ctx(dev: &Device, qpn: u32) -> Option<QpCtx> {
    let qp = dev.qps.get(qpn)?;
    Some(ctx_of(dev, &qp, qpn))
}

/// The snapshot of a QP already locked.
fn ctx_of(dev: &Device, qp: &crate::qp::Qp<super::Rocev2>, qpn: u32) -> QpCtx {
    let a = &qp.attrs;
    let path = (a.av_valid && qp.qp_type.is_connected()).then(|| av_path(dev, &a.av, a.sgid));
    QpCtx {
        qpn,
        qp_type: qp.qp_type,
        state: qp.state,
        pdn: qp.pd,
        send_cqn: qp.send_cqn,
        recv_cqn: qp.recv_cqn,
        srqn: qp.srqn,
        xrcdn: qp.xrcdn,
        // UD/GSI have no path MTU attribute: datagrams are bounded by the port MTU (IBTA 9.8).
        mtu: if qp.qp_type.is_datagram() {
            mtu_bytes(dev.config.port_mtu())
        } else {
            // Spec §15.6: min(path_mtu, active MTU of the port).
            qp.mtu_bytes().min(mtu_bytes(dev.config.port_mtu()))
        },
        dest_qpn: a.dest_qpn & 0x00ff_ffff,
        qkey: qp.qkey(),
        pkey: super::intake::PKEY_TABLE
            .get(usize::from(a.pkey_index))
            .copied(),
        access: a.access_flags,
        max_rd_atomic: a.max_rd_atomic as u32,
        max_dest_rd_atomic: a.max_dest_rd_atomic as u32,
        min_rnr_timer: a.min_rnr_timer,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        sq_sig_all: qp.sq_sig_all,
        max_send_sge: qp.caps.max_send_sge,
        max_recv_sge: qp.caps.max_recv_sge,
        max_inline: qp.caps.max_inline_data,
        sq_wqe_size: qp.sq.entry_size(),
        rq_wqe_size: qp.rq.as_ref().map_or(0, |r| r.entry_size()),
        path,
        sq_draining: qp.sq_draining,
        en_sqd_async_notify: a.en_sqd_async_notify,
    }
}

/// The view of an XRC_TGT QP for one request packet (spec §13.7): the XRC SRQ its XRCETH names
/// supplies the receive WQEs, the CQ and the PD memory accesses are checked in. `None` when the
/// XRCETH names no XRC SRQ of the QP's domain (the responder NAKs Invalid Request, §14.6).
pub fn xrc_target_ctx(dev: &Device, ctx: &QpCtx, srqn: Option<u32>) -> Option<QpCtx> {
    let srqn = srqn?;
    let srq = dev.srqs.get(srqn)?;
    let x = srq.xrc?;
    if ctx.xrcdn != Some(x.xrcdn) {
        return None;
    }
    Some(QpCtx {
        srqn: Some(srqn),
        pdn: srq.pd,
        recv_cqn: x.cqn,
        ..ctx.clone()
    })
}

/// Whether a worker has the QP's requester or responder state out for a unit of work
/// ([`take_req`], [`take_resp`]): whatever changes that state (MODIFY_QP) waits until it is
/// put back, or it would be overwritten by the put.
pub fn state_out(qp: &crate::qp::Qp<super::Rocev2>) -> bool {
    qp.req.taken || qp.resp.taken
}

/// Take the requester state out of the QP. `None` if the QP does not exist or its state is
/// already taken (a nested call, e.g. a CQ overflow moving this very QP to ERROR: the outer call
/// notices the state change and flushes, see `with_req`). Returned with the QP's snapshot
/// ([`qp_ctx`]), made under the same lock: one lookup per unit of work instead of two.
pub fn take_req(dev: &Device, qpn: u32) -> Option<(QpCtx, RequesterState)> {
    let mut qp = dev.qps.get(qpn)?;
    if qp.req.taken {
        return None;
    }
    let c = ctx_of(dev, &qp, qpn);
    let st = std::mem::take(&mut qp.req);
    qp.req.taken = true;
    Some((c, st))
}

/// Put the requester state back; returns the QP's state as it is then, `None` if the QP is
/// gone.
pub fn put_req(dev: &Device, qpn: u32, st: RequesterState) -> Option<QpState> {
    put_req_counted(dev, qpn, st, 0, 0)
}

/// [`put_req`], adding `packets` and `bytes` to the QP's receive counters under the same lock
/// (a response accepted while the state was out).
pub fn put_req_counted(
    dev: &Device,
    qpn: u32,
    st: RequesterState,
    packets: u64,
    bytes: u64,
) -> Option<QpState> {
    // Under the timer shard's lock, then the QP's: the put and the timer note in one visit.
    super::timers::note_req_with(dev, qpn, |qp| {
        qp.req = st;
        qp.stats.rx_packets += packets;
        qp.stats.rx_bytes += bytes;
        qp.state
    })
}

/// See [`take_req`].
pub fn take_resp(dev: &Device, qpn: u32) -> Option<(QpCtx, ResponderState)> {
    let mut qp = dev.qps.get(qpn)?;
    if qp.resp.taken {
        return None;
    }
    let c = ctx_of(dev, &qp, qpn);
    let st = std::mem::take(&mut qp.resp);
    qp.resp.taken = true;
    Some((c, st))
}

/// See [`put_req`].
pub fn put_resp(dev: &Device, qpn: u32, st: ResponderState) -> Option<QpState> {
    put_resp_counted(dev, qpn, st, 0, 0)
}

/// [`put_resp`], adding `packets` and `bytes` to the QP's receive counters under the same lock
/// (packets accepted while the state was out, also held across a received buffer,
/// `ReceiveRun`).
pub fn put_resp_counted(
    dev: &Device,
    qpn: u32,
    st: ResponderState,
    packets: u64,
    bytes: u64,
) -> Option<QpState> {
    super::timers::note_resp(dev, qpn, |qp| {
        qp.resp = st;
        qp.stats.rx_packets += packets;
        qp.stats.rx_bytes += bytes;
        qp.state
    })
}

/// Translate the local access `a` (`MrTable::resolve_into`): pinned MRs under the MR table's
/// read lock, beside the other workers; an ODP MR, whose translation moves its chunks, under
/// the write lock.
pub fn resolve(
    dev: &Device,
    waiter: Option<u32>,
    a: Access,
    out: &mut Vec<GuestRange>,
) -> Result<(), MrError> {
    let pinned = dev.mrs.read().resolve_pinned_into(a, out);
    pinned.unwrap_or_else(|| dev.mrs.write().resolve_into(waiter, a, out))
}

/// [`resolve`] for an incoming request on QP `qpn` (`MrTable::resolve_remote_into`: `a.key`
/// may be a window's).
pub fn resolve_remote(
    dev: &Device,
    waiter: Option<u32>,
    a: Access,
    qpn: u32,
    out: &mut Vec<GuestRange>,
) -> Result<(), MrError> {
    let pinned = dev.mrs.read().resolve_remote_pinned_into(a, qpn, out);
    pinned.unwrap_or_else(|| dev.mrs.write().resolve_remote_into(waiter, a, qpn, out))
}

/// Current IBTA state of a QP.
pub fn qp_state(dev: &Device, qpn: u32) -> Option<QpState> {
    dev.qps.get(qpn).map(|q| q.state)
}

/// The SQ producer, checked against the ring depth (spec §4: producer − consumer > depth →
/// ring error INDEX; the caller moves the QP to ERROR + QP_FATAL).
pub fn sq_producer(dev: &Device, qpn: u32) -> Result<u32, RingFault> {
    let qp = dev.qps.get(qpn).ok_or(RingFault(0))?;
    match qp.sq.pending(&dev.mem) {
        Ok(n) => Ok(qp.sq.dev_index().wrapping_add(n)),
        Err(e) => {
            let code = e.ring_error_code();
            let _ = qp.sq.set_error(&dev.mem, code);
            Err(RingFault(code))
        }
    }
}

/// Read SQ slot `idx` (its first `buf.len()` bytes).
pub fn sq_read(dev: &Device, qpn: u32, idx: u32, buf: &mut [u8]) -> Result<(), RingFault> {
    let qp = dev.qps.get(qpn).ok_or(RingFault(0))?;
    qp.sq
        .read_entry(&dev.mem, idx, buf)
        .map_err(|e| RingFault(e.ring_error_code()))
}

/// Publish the SQ consumer (spec §4: advanced when WQEs are completed or flushed).
pub fn sq_set_consumer(dev: &Device, qpn: u32, v: u32) {
    if let Some(mut qp) = dev.qps.get(qpn) {
        let _ = qp.sq.set_consumer(&dev.mem, v);
    }
}

/// Take the next receive WQE from the QP's RQ or SRQ (spec §4: the producer is read when a
/// receive is needed). `Ok(None)`: none posted. `Ok(Some(w))` with `w.malformed`: the WQE was
/// consumed but does not decode (completes LOC_QP_OP_ERR). `Err`: ring broken (the SRQ path already
/// reported SRQ_ERR and moved every attached QP to ERROR; the caller moves the QP to ERROR with
/// QP_FATAL).
pub fn recv_take(dev: &Device, ctx: &QpCtx) -> Result<Option<RecvWqe>, RingFault> {
    if let Some(srqn) = ctx.srqn {
        let (size, max_sge) = {
            let srq = dev.srqs.get(srqn).ok_or(RingFault(0))?;
            (srq.ring.entry_size() as usize, srq.max_sge)
        };
        // The thread's reusable slot buffer: no allocation per receive.
        let mut buf = super::scratch::take_wqe(size);
        let r = match dev.srq_pop(srqn, &mut buf) {
            Ok(false) => Ok(None),
            // A malformed SRQ WQE (num_sge beyond the SRQ's max_sge or the slot) is consumed
            // like an RQ one and completes LOC_QP_OP_ERR on the QP that took it (spec §14.4,
            // IBTA 10.8.3.3: never consumed without a completion).
            Ok(true) => Ok(Some(
                decode_recv(&buf, max_sge, Some(srqn))
                    .unwrap_or_else(|| RecvWqe::malformed(&buf, Some(srqn))),
            )),
            Err(e) => Err(RingFault(e.ring_error_code())),
        };
        super::scratch::give_back_wqe(buf);
        return r;
    }
    let mem = &dev.mem;
    let mut qp = dev.qps.get(ctx.qpn).ok_or(RingFault(0))?;
    let max_sge = qp.caps.max_recv_sge;
    let rq = qp.rq.as_mut().ok_or(RingFault(0))?;
    let n = match rq.pending(mem) {
        Ok(n) => n,
        Err(e) => {
            let code = e.ring_error_code();
            let _ = rq.set_error(mem, code);
            return Err(RingFault(code));
        }
    };
    if n == 0 {
        return Ok(None);
    }
    let mut buf = super::scratch::take_wqe(rq.entry_size() as usize);
    let idx = rq.dev_index();
    let r = rq
        .read_entry(mem, idx, &mut buf)
        .and_then(|()| rq.advance_consumer(mem, 1))
        .map_err(|e| RingFault(e.ring_error_code()))
        // A malformed WQE (num_sge beyond max_recv_sge / the slot) is consumed and completes
        // with LOC_QP_OP_ERR (spec §14.4); the responder moves the QP to ERROR.
        .map(|()| {
            Some(decode_recv(&buf, max_sge, None).unwrap_or_else(|| RecvWqe::malformed(&buf, None)))
        });
    super::scratch::give_back_wqe(buf);
    r
}

/// Spec §2.2: an operation (`VRDMA_ODP_*` bit `op`) on an ODP MR is allowed only if the QP's
/// transport lists it in its ODP caps. True when `key` names an ODP MR and `op` is not listed
/// (the caller fails the operation: LOC_PROT_ERR, or a remote access error at the responder).
/// `op` 0 (an operation without an ODP cap bit, e.g. FLUSH) is never denied here.
pub fn odp_denied(dev: &Device, ctx: &QpCtx, key: u32, op: u32) -> bool {
    op != 0 && dev.config.odp_caps(ctx.qp_type.as_u32()) & op == 0 && dev.mrs.read().is_odp_key(key)
}

/// The ODP cap bit a receive WQE's SGEs need (spec §2.2): RECV, or SRQ_RECV for an SRQ WQE.
pub fn odp_recv_op(w: &RecvWqe) -> u32 {
    if w.srqn.is_some() {
        vrdma_spec::VRDMA_ODP_SRQ_RECV
    } else {
        vrdma_spec::VRDMA_ODP_RECV
    }
}

/// Take every posted RQ WQE (flush), returning their wr_ids.
pub fn rq_drain(dev: &Device, ctx: &QpCtx) -> Vec<u64> {
    let mut out = Vec::new();
    let mem = &dev.mem;
    let Some(mut qp) = dev.qps.get(ctx.qpn) else {
        return out;
    };
    let Some(rq) = qp.rq.as_mut() else {
        return out;
    };
    let Ok(n) = rq.pending(mem) else { return out };
    let mut buf = [0u8; 8];
    for _ in 0..n {
        let idx = rq.dev_index();
        let wr_id = if rq.read_entry(mem, idx, &mut buf).is_ok() {
            u64::from_le_bytes(buf)
        } else {
            0
        };
        out.push(wr_id);
        if rq.advance_consumer(mem, 1).is_err() {
            break;
        }
    }
    out
}

/// Post a CQE (the core handles overflow: CQ_ERR + QPs to ERROR).
pub fn post_cqe(dev: &Device, cqn: u32, cqe: &Cqe, solicited: bool) {
    let c = VrdmaCqe {
        wr_id: cqe.wr_id,
        qpn: cqe.qpn,
        opcode: cqe.opcode,
        status: cqe.status,
        flags: cqe.flags,
        network_hdr_type: cqe.network_hdr_type,
        byte_len: cqe.byte_len,
        ex: cqe.ex,
        src_qp: cqe.src_qp,
        pkey_index: cqe.pkey_index,
        sl: cqe.sl,
        reserved0: 0,
        vendor_err: cqe.vendor_err,
        smac: cqe.smac,
        vlan_id: cqe.vlan_id,
        reserved1: [0; 20],
    };
    let _ = dev.post_cqe(cqn, &c, solicited);
}

/// Move a QP to ERROR through the core (which sends `event` and calls the flush hook).
pub fn qp_to_error(dev: &Device, qpn: u32, event: Option<u32>) {
    dev.qp_to_error(qpn, event, 0);
}

/// Send an async event.
pub fn event(dev: &Device, ty: u32, id: u32, info: u32) {
    dev.out.event(crate::guest::output::event(ty, id, info));
}

/// The path of UD AH `index` if it exists in PD `pdn` (spec §6.1).
pub fn ah_path(dev: &Device, index: u32, pdn: u32) -> Option<Path> {
    let (av, sgid) = {
        let ahs = dev.ahs.read();
        let ah = ahs.lookup_in_pd(index, pdn)?;
        (ah.av, ah.sgid)
    };
    Some(av_path(dev, &av, sgid))
}

/// The SQ of a QP in SQD has drained (IBTA 10.3.1): clear the flag.
pub fn sq_drained(dev: &Device, qpn: u32) {
    if let Some(mut qp) = dev.qps.get(qpn) {
        qp.sq_draining = false;
    }
}

/// Queue a frame QP `qpn` sends for the uplink, counting it in the QP's stats (`retransmit`:
/// a request packet sent again).
pub fn send_frame(dev: &Device, qpn: u32, frame: Vec<u8>, retransmit: bool) {
    count_tx(dev, qpn, frame.len(), retransmit);
    dev.outbox_of(qpn).push(frame);
}

/// Queue the packets QP `qpn` wrote into `w` (if any) as one fabric segment (spec §16.2 rule
/// 6; a single packet as a plain frame); `w` is empty afterwards.
pub fn flush_segment(dev: &Device, qpn: u32, w: &mut crate::wire::segment::SegmentWriter) {
    let segment = w.count() > 1;
    // By-reference payloads stay by reference in a segment; a single frame is materialized
    // (spec §16.2 rule 6).
    if let Some((b, refs)) = w.finish_with_refs() {
        let mut out = dev.outbox_of(qpn);
        match (segment, refs) {
            (true, Some(r)) => out.push_segment_refs(b, r),
            (true, None) => out.push_segment(b),
            (false, _) => out.push(b),
        }
    }
}

/// Count one `len`-byte frame QP `qpn` sends (a frame of a fabric segment is counted as it is
/// written into the segment, which is then queued whole).
pub fn count_tx(dev: &Device, qpn: u32, len: usize, retransmit: bool) {
    if let Some(mut s) = qp_stats(dev, qpn) {
        s.tx_packets += 1;
        s.tx_bytes += len as u64;
        s.retransmits += u64::from(retransmit);
    }
}

/// The transport counters of QP `qpn` (host-side stats, `stats.rs`), with the QP locked until
/// the guard drops: count, then let go (never call into the device while holding it).
pub fn qp_stats(dev: &Device, qpn: u32) -> Option<QpStatsGuard<'_>> {
    dev.qps.get(qpn).map(QpStatsGuard)
}

/// See [`qp_stats`].
pub struct QpStatsGuard<'a>(crate::objects::locked::SlotGuard<'a, crate::qp::Qp<super::Rocev2>>);

impl std::ops::Deref for QpStatsGuard<'_> {
    type Target = crate::stats::QpStats;
    fn deref(&self) -> &Self::Target {
        &self.0.stats
    }
}

impl std::ops::DerefMut for QpStatsGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0.stats
    }
}

/// A completion queue entry (spec §7, 64 bytes) as the transport builds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    pub wr_id: u64,
    pub qpn: u32,
    pub opcode: u8,
    pub status: u8,
    pub flags: u8,
    pub network_hdr_type: u8,
    pub byte_len: u32,
    /// imm_data in wire byte order (the 4 bytes as on the wire), or the invalidated rkey.
    pub ex: u32,
    pub src_qp: u32,
    pub pkey_index: u16,
    pub sl: u8,
    pub vendor_err: u32,
    pub smac: [u8; 6],
    /// [`NO_VLAN`] unless a UD/GSI receive came in a VLAN-tagged frame.
    pub vlan_id: u16,
}

/// CQE `vlan_id` of every completion that is not a receive from a tagged frame (spec §7 table).
pub const NO_VLAN: u16 = vrdma_spec::VRDMA_VLAN_NONE;

impl Default for Cqe {
    fn default() -> Self {
        Cqe {
            wr_id: 0,
            qpn: 0,
            opcode: 0,
            status: 0,
            flags: 0,
            network_hdr_type: 0,
            byte_len: 0,
            ex: 0,
            src_qp: 0,
            pkey_index: 0,
            sl: 0,
            vendor_err: 0,
            smac: [0; 6],
            vlan_id: NO_VLAN,
        }
    }
}

impl Cqe {
    /// The 64-byte little-endian layout of `struct vrdma_cqe`.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&self.wr_id.to_le_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12] = self.opcode;
        b[13] = self.status;
        b[14] = self.flags;
        b[15] = self.network_hdr_type;
        b[16..20].copy_from_slice(&self.byte_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.ex.to_le_bytes());
        b[24..28].copy_from_slice(&self.src_qp.to_le_bytes());
        b[28..30].copy_from_slice(&self.pkey_index.to_le_bytes());
        b[30] = self.sl;
        b[32..36].copy_from_slice(&self.vendor_err.to_le_bytes());
        b[36..42].copy_from_slice(&self.smac);
        b[42..44].copy_from_slice(&self.vlan_id.to_le_bytes());
        b
    }

    /// Parse the 64-byte layout (tests and tools).
    pub fn from_bytes(b: &[u8; 64]) -> Cqe {
        let u32at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut wr = [0u8; 8];
        wr.copy_from_slice(&b[0..8]);
        let mut smac = [0u8; 6];
        smac.copy_from_slice(&b[36..42]);
        Cqe {
            wr_id: u64::from_le_bytes(wr),
            qpn: u32at(8),
            opcode: b[12],
            status: b[13],
            flags: b[14],
            network_hdr_type: b[15],
            byte_len: u32at(16),
            ex: u32at(20),
            src_qp: u32at(24),
            pkey_index: u16::from_le_bytes([b[28], b[29]]),
            sl: b[30],
            vendor_err: u32at(32),
            smac,
            vlan_id: u16::from_le_bytes([b[42], b[43]]),
        }
    }
}

/// ABI constants the transport uses, under short names: each is its `vrdma_spec::VRDMA_*` value
/// (spec §6, §7, §9), never a literal.
pub mod abi {
    // Send opcodes (§6.1).
    pub const WR_RDMA_WRITE: u8 = vrdma_spec::VRDMA_WR_RDMA_WRITE;
    pub const WR_RDMA_WRITE_WITH_IMM: u8 = vrdma_spec::VRDMA_WR_RDMA_WRITE_WITH_IMM;
    pub const WR_SEND: u8 = vrdma_spec::VRDMA_WR_SEND;
    pub const WR_SEND_WITH_IMM: u8 = vrdma_spec::VRDMA_WR_SEND_WITH_IMM;
    pub const WR_RDMA_READ: u8 = vrdma_spec::VRDMA_WR_RDMA_READ;
    pub const WR_ATOMIC_CMP_AND_SWP: u8 = vrdma_spec::VRDMA_WR_ATOMIC_CMP_AND_SWP;
    pub const WR_ATOMIC_FETCH_AND_ADD: u8 = vrdma_spec::VRDMA_WR_ATOMIC_FETCH_AND_ADD;
    pub const WR_LOCAL_INV: u8 = vrdma_spec::VRDMA_WR_LOCAL_INV;
    pub const WR_REG_MR: u8 = vrdma_spec::VRDMA_WR_REG_MR;
    pub const WR_SEND_WITH_INV: u8 = vrdma_spec::VRDMA_WR_SEND_WITH_INV;
    pub const WR_ATOMIC_WRITE: u8 = vrdma_spec::VRDMA_WR_ATOMIC_WRITE;
    pub const WR_FLUSH: u8 = vrdma_spec::VRDMA_WR_FLUSH;
    pub const WR_BIND_MW: u8 = vrdma_spec::VRDMA_WR_BIND_MW;
    // FLUSH placement types and selectivity levels (wr.flush).
    pub const FLUSH_GLOBAL: u8 = vrdma_spec::VRDMA_FLUSH_GLOBAL;
    pub const FLUSH_PERSISTENT: u8 = vrdma_spec::VRDMA_FLUSH_PERSISTENT;
    pub const FLUSH_MR: u8 = vrdma_spec::VRDMA_FLUSH_MR;
    // Send flags.
    pub const SEND_SIGNALED: u8 = vrdma_spec::VRDMA_SEND_SIGNALED;
    pub const SEND_SOLICITED: u8 = vrdma_spec::VRDMA_SEND_SOLICITED;
    pub const SEND_INLINE: u8 = vrdma_spec::VRDMA_SEND_INLINE;
    pub const SEND_FENCE: u8 = vrdma_spec::VRDMA_SEND_FENCE;
    // CQE opcodes (§7).
    pub const WC_SEND: u8 = vrdma_spec::VRDMA_WC_SEND;
    pub const WC_RDMA_WRITE: u8 = vrdma_spec::VRDMA_WC_RDMA_WRITE;
    pub const WC_RDMA_READ: u8 = vrdma_spec::VRDMA_WC_RDMA_READ;
    pub const WC_COMP_SWAP: u8 = vrdma_spec::VRDMA_WC_COMP_SWAP;
    pub const WC_FETCH_ADD: u8 = vrdma_spec::VRDMA_WC_FETCH_ADD;
    pub const WC_BIND_MW: u8 = vrdma_spec::VRDMA_WC_BIND_MW;
    pub const WC_LOCAL_INV: u8 = vrdma_spec::VRDMA_WC_LOCAL_INV;
    pub const WC_REG_MR: u8 = vrdma_spec::VRDMA_WC_REG_MR;
    pub const WC_ATOMIC_WRITE: u8 = vrdma_spec::VRDMA_WC_ATOMIC_WRITE;
    pub const WC_FLUSH: u8 = vrdma_spec::VRDMA_WC_FLUSH;
    pub const WC_RECV: u8 = vrdma_spec::VRDMA_WC_RECV;
    pub const WC_RECV_RDMA_WITH_IMM: u8 = vrdma_spec::VRDMA_WC_RECV_RDMA_WITH_IMM;
    // CQE status (= enum ib_wc_status).
    pub const WC_SUCCESS: u8 = vrdma_spec::VRDMA_WC_SUCCESS;
    pub const WC_LOC_LEN_ERR: u8 = vrdma_spec::VRDMA_WC_LOC_LEN_ERR;
    pub const WC_LOC_QP_OP_ERR: u8 = vrdma_spec::VRDMA_WC_LOC_QP_OP_ERR;
    pub const WC_LOC_PROT_ERR: u8 = vrdma_spec::VRDMA_WC_LOC_PROT_ERR;
    pub const WC_WR_FLUSH_ERR: u8 = vrdma_spec::VRDMA_WC_WR_FLUSH_ERR;
    pub const WC_MW_BIND_ERR: u8 = vrdma_spec::VRDMA_WC_MW_BIND_ERR;
    pub const WC_BAD_RESP_ERR: u8 = vrdma_spec::VRDMA_WC_BAD_RESP_ERR;
    pub const WC_LOC_ACCESS_ERR: u8 = vrdma_spec::VRDMA_WC_LOC_ACCESS_ERR;
    pub const WC_REM_INV_REQ_ERR: u8 = vrdma_spec::VRDMA_WC_REM_INV_REQ_ERR;
    pub const WC_REM_ACCESS_ERR: u8 = vrdma_spec::VRDMA_WC_REM_ACCESS_ERR;
    pub const WC_REM_OP_ERR: u8 = vrdma_spec::VRDMA_WC_REM_OP_ERR;
    pub const WC_RETRY_EXC_ERR: u8 = vrdma_spec::VRDMA_WC_RETRY_EXC_ERR;
    pub const WC_RNR_RETRY_EXC_ERR: u8 = vrdma_spec::VRDMA_WC_RNR_RETRY_EXC_ERR;
    pub const WC_REM_INV_RD_REQ_ERR: u8 = vrdma_spec::VRDMA_WC_REM_INV_RD_REQ_ERR;
    pub const WC_GENERAL_ERR: u8 = vrdma_spec::VRDMA_WC_GENERAL_ERR;
    // CQE flags.
    pub const WC_F_GRH: u8 = vrdma_spec::VRDMA_WC_F_GRH;
    pub const WC_F_IMM: u8 = vrdma_spec::VRDMA_WC_F_IMM;
    pub const WC_F_INV: u8 = vrdma_spec::VRDMA_WC_F_INV;
    pub const NETWORK_IPV4: u8 = vrdma_spec::VRDMA_NETWORK_IPV4;
    pub const NETWORK_IPV6: u8 = vrdma_spec::VRDMA_NETWORK_IPV6;
    // Events (§9).
    pub const EV_QP_FATAL: u32 = vrdma_spec::VRDMA_EV_QP_FATAL;
    pub const EV_QP_REQ_ERR: u32 = vrdma_spec::VRDMA_EV_QP_REQ_ERR;
    pub const EV_QP_ACCESS_ERR: u32 = vrdma_spec::VRDMA_EV_QP_ACCESS_ERR;
    pub const EV_COMM_EST: u32 = vrdma_spec::VRDMA_EV_COMM_EST;
    pub const EV_SQ_DRAINED: u32 = vrdma_spec::VRDMA_EV_SQ_DRAINED;
    pub const EV_QP_LAST_WQE_REACHED: u32 = vrdma_spec::VRDMA_EV_QP_LAST_WQE_REACHED;
    // Doorbells (§8).
    pub const DB_SQ: u32 = vrdma_spec::VRDMA_DB_SQ;
    pub const DB_RQ: u32 = vrdma_spec::VRDMA_DB_RQ;
    pub const DB_SRQ: u32 = vrdma_spec::VRDMA_DB_SRQ;
    pub const DB_CQ_ARM: u32 = vrdma_spec::VRDMA_DB_CQ_ARM;
    // Access flags.
    pub const ACCESS_LOCAL_WRITE: u32 = vrdma_spec::VRDMA_ACCESS_LOCAL_WRITE;
    pub const ACCESS_REMOTE_WRITE: u32 = vrdma_spec::VRDMA_ACCESS_REMOTE_WRITE;
    pub const ACCESS_REMOTE_READ: u32 = vrdma_spec::VRDMA_ACCESS_REMOTE_READ;
    pub const ACCESS_REMOTE_ATOMIC: u32 = vrdma_spec::VRDMA_ACCESS_REMOTE_ATOMIC;
    pub const ACCESS_FLUSH_GLOBAL: u32 = vrdma_spec::VRDMA_ACCESS_FLUSH_GLOBAL;
    pub const ACCESS_FLUSH_PERSISTENT: u32 = vrdma_spec::VRDMA_ACCESS_FLUSH_PERSISTENT;
}
