//! WQEs to request packets: the send loop (window, fences, max_rd_atomic, RNR back-off), local
//! operations, SGE gathers, and a WQE's packets in named steps (spec §6.1, IBTA 9.7): what each
//! packet is comes from `request.rs`, the frame or segment it goes into from `build.rs`.

use super::build::{build_request, Payload, Request};
use super::request;
use super::*;
use crate::transport::packet::TxMeta;

/// Transmit as much as the window, max_rd_atomic, fences and RNR back-off allow.
///
/// On a fabric port that takes segments (spec §16.2 rule 6) the RC/UC/XRC packets of this
/// call's multi-packet messages are written back to back into fabric segments
/// (`wire::segment`) instead of one buffer each; every packet is still a complete standard
/// frame with its own PSN and AckReq, so nothing else here changes. One-packet messages and
/// UD/GSI packets (an address per WQE) stay single frames.
pub(super) fn send(dev: &Device, ctx: &QpCtx, st: &mut RequesterState, now: Instant) {
    if st.odp_wait.is_some() || (st.stopped && sendable(st) == 0) {
        return;
    }
    let mut seg = (dev.icrc_offload.segments && !ctx.is_ud())
        .then(|| SegmentWriter::new(crate::transport::packet::segment_buf()));
    send_packets(dev, ctx, st, now, &mut seg);
    if let Some(mut w) = seg {
        ctx::flush_segment(dev, ctx.qpn, &mut w);
        crate::transport::packet::recycle_frame(w.into_buf());
    }
}

/// Walk the sendable WQEs in SQ order from the first one not yet sent (the loop of rxe's
/// requester): after RNR back-off, each WQE may have to wait ([`must_wait`]), runs as a local
/// operation ([`run_local`]) or, room permitting ([`no_room`]), sends its packets
/// ([`send_wqe`]). A WQE that fails QP-fatally stops the QP (`stopped`).
fn send_packets(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    now: Instant,
    seg: &mut Option<SegmentWriter>,
) {
    if st.odp_wait.is_some() {
        return;
    }
    let end = sendable(st);
    if let Some(d) = st.rnr_deadline {
        if now < d {
            return;
        }
        st.rnr_deadline = None;
    }
    let max_rd = ctx.max_rd_atomic.max(1);
    let mut i = st.sent_prefix.min(end);
    while i < end {
        if matches!(st.wqes[i].state, WqeState::Sent | WqeState::Done) {
            if i == st.sent_prefix {
                st.sent_prefix += 1;
            }
            i += 1;
            continue;
        }
        if must_wait(ctx, st, i) {
            return;
        }
        if st.wqes[i].is_local() {
            if !run_local(dev, ctx, st, i) {
                return;
            }
            i += 1;
            continue;
        }
        if no_room(ctx, st, i, max_rd) || send_wqe(dev, ctx, st, i, max_rd, seg) == Halt::Qp {
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

/// Whether WQE `i` must wait before it starts (rxe `req_next_wqe`): a QP in SQD finishes what
/// it started and starts nothing new (IBTA 10.3.1); a fenced WQE waits until every earlier READ
/// or atomic has completed (IBTA 10.8.3.3).
fn must_wait(ctx: &QpCtx, st: &RequesterState, i: usize) -> bool {
    let w = &st.wqes[i];
    if ctx.state == QpState::Sqd && !w.sent_once {
        return true;
    }
    w.flags & SEND_FENCE != 0
        && st
            .wqes
            .iter()
            .take(i)
            .any(|e| e.is_rd_atomic() && e.state != WqeState::Done)
}

/// Run local operation `i` (LOCAL_INV, REG_MR, BIND_MW) in SQ order against the MR table. It
/// must not overtake earlier operations that use the MR (IBTA 10.6): conservatively, it waits
/// until everything before it has completed. False: the QP stops here (waiting, or the
/// operation failed and the QP goes to ERROR).
fn run_local(dev: &Device, ctx: &QpCtx, st: &mut RequesterState, i: usize) -> bool {
    if st.wqes.iter().take(i).any(|w| w.state != WqeState::Done) {
        return false;
    }
    exec_local(dev, ctx, &mut st.wqes[i]);
    if st.wqes[i].fatal {
        st.stopped = true;
        return false;
    }
    true
}

/// Whether WQE `i` finds no room to send now (rxe `check_init_depth`): a READ or atomic not
/// yet sent while max_rd_atomic of them are outstanding (IBTA 9.5.4), or the RC window
/// ([`WINDOW`], the congestion window) full.
fn no_room(ctx: &QpCtx, st: &RequesterState, i: usize, max_rd: u32) -> bool {
    let w = &st.wqes[i];
    (w.is_rd_atomic() && w.state == WqeState::Pending && st.rd_atomic_outstanding >= max_rd)
        || (ctx.is_rc() && psn_diff(st.psn, st.una) >= st.window() as i32)
}

/// How many of the fetched WQEs may be sent. All of them, unless an error WQE is queued
/// (`stopped`): then only those before it, which were sent already and may have to be sent
/// again (go-back-N after a NAK or a timeout). The QP goes to ERROR when the error WQE
/// retires, after them; a QP that stopped resending them would wait for their ACKs forever.
fn sendable(st: &RequesterState) -> usize {
    if st.stopped {
        st.wqes.iter().position(|w| w.fatal).unwrap_or(0)
    } else {
        st.wqes.len()
    }
}

/// Execute LOCAL_INV / REG_MR / BIND_MW (spec §6.1, §12).
fn exec_local(dev: &Device, ctx: &QpCtx, w: &mut SendWqe) {
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
        let bound = dev.mrs.write().bind_mw(&b);
        return match bound {
            Ok(()) => w.finish(WC_SUCCESS, false),
            Err(_) => w.finish(WC_MW_BIND_ERR, true),
        };
    }
    let r = if w.opcode == WR_LOCAL_INV {
        dev.mrs.write().local_invalidate(w.ex, ctx.pdn)
    } else {
        dev.mrs.write().fast_register(ctx.pdn, &w.reg)
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
fn validate(dev: &Device, ctx: &QpCtx, w: &SendWqe) -> Result<(), MrError> {
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
        dev.mrs.read().check_access(Access {
            key: s.lkey,
            pd: ctx.pdn,
            iova: s.addr,
            len: s.len as u64,
            rights: access,
        })?;
        if ctx::odp_denied(dev, ctx, s.lkey, odp_op) {
            return Err(MrError::AccessDenied {
                key: s.lkey,
                access,
            });
        }
    }
    Ok(())
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
    dev: &Device,
    waiter: Option<u32>,
    pdn: u32,
    sges: &[Sge],
    off: u64,
    io: SgeIo<'_>,
) -> Result<(), SgeError> {
    // The thread's reusable range vector (no allocation per packet for pinned MRs).
    use crate::transport::scratch::{give_back, take, Side};
    let mut ranges = take(Side::Requester);
    let r = sge_copy_with(dev, waiter, pdn, sges, off, io, &mut ranges);
    give_back(Side::Requester, ranges);
    r
}

fn sge_copy_with(
    dev: &Device,
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
        let a = Access {
            key: s.lkey,
            pd: pdn,
            iova: s.addr.wrapping_add(skip),
            len: n as u64,
            rights: access,
        };
        ctx::resolve(dev, waiter, a, ranges).map_err(|e| match e {
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

/// Why [`send_wqe`] stopped sending a WQE's packets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Halt {
    /// The QP sends nothing more for now: the window or max_rd_atomic is full, or an ODP fault
    /// suspends it.
    Qp,
    /// This WQE has nothing more to send now (every packet sent, or it completed in error).
    Wqe,
}

/// Send the next packets of WQE `i` (IBTA 9.7 requester), in the steps of rxe's requester: the
/// WQE's first transmission checks it and assigns its PSNs ([`begin_wqe`]), its destination is
/// resolved once (`request::destination`), then each packet is laid out and built
/// ([`send_packet`]) and the QP's and WQE's progress advanced ([`update_state`]) until the WQE
/// or the QP has to stop.
fn send_wqe(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    i: usize,
    max_rd: u32,
    seg: &mut Option<SegmentWriter>,
) -> Halt {
    if let Err(halt) = begin_wqe(dev, ctx, st, i) {
        return halt;
    }
    let Some(dest) = request::destination(dev, ctx, &mut st.wqes[i]) else {
        return Halt::Wqe;
    };
    loop {
        if ctx.is_rc() && psn_diff(st.psn, st.una) >= st.window() as i32 {
            return Halt::Qp;
        }
        let sent = match send_packet(dev, ctx, st, i, &dest, seg) {
            Ok(sent) => sent,
            Err(halt) => return halt,
        };
        if let Some(halt) = update_state(ctx, st, i, &sent, max_rd) {
            return halt;
        }
    }
}

/// A WQE's first transmission (a Pending WQE at offset 0): the local checks (IBTA 10.8: a READ
/// longer than [`MAX_READ_PSNS`] response packets is LOC_LEN_ERR, spec §14.3; SGE keys and
/// bounds, [`validate`]) and its PSN range, from the QP's next PSN (rxe `update_wqe_psn`).
/// `Err`: the WQE completed in error ([`Halt::Wqe`]) or an ODP fault suspends the QP
/// ([`Halt::Qp`], checked again when the fault ends).
fn begin_wqe(dev: &Device, ctx: &QpCtx, st: &mut RequesterState, i: usize) -> Result<(), Halt> {
    let mtu = ctx.mtu;
    let w = &mut st.wqes[i];
    if w.state != WqeState::Pending || w.offset != 0 {
        return Ok(());
    }
    if w.is_read() && w.npkts(mtu) > MAX_READ_PSNS {
        w.finish(WC_LOC_LEN_ERR, true);
        return Err(Halt::Wqe);
    }
    if !w.validated {
        match validate(dev, ctx, w) {
            Ok(()) => w.validated = true,
            Err(MrError::Fault { key, iova }) => {
                st.odp_wait = Some(OdpWait { key, iova });
                return Err(Halt::Qp);
            }
            Err(_) => {
                w.finish(WC_LOC_PROT_ERR, true);
                return Err(Halt::Wqe);
            }
        }
    }
    w.first_psn = st.psn;
    w.sent_once = true;
    w.last_psn = psn_add(st.psn, w.npkts(mtu) - 1);
    Ok(())
}

/// What [`update_state`] needs of a packet that was sent.
struct SentPacket {
    /// The PSN after the packet's.
    next_psn: u32,
    /// Payload bytes.
    len: u64,
    last: bool,
}

/// Lay out, number and build the WQE's packet at the QP's next PSN (rxe `init_req_packet`,
/// `next_opcode`, `finish_packet`). The QP's PSN and the WQE's offset and state do not move
/// here (a READ's `read_base` is set to its offset, which a resend sets again), so a packet that
/// cannot be built needs no rollback ([`build_failed`]). A transport without the packet's opcode
/// is LOC_QP_OP_ERR.
fn send_packet(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut RequesterState,
    i: usize,
    dest: &request::Destination,
    seg: &mut Option<SegmentWriter>,
) -> Result<SentPacket, Halt> {
    let psn = st.psn;
    let p = request::next_packet(&mut st.wqes[i], ctx.mtu, dest.ext);
    let Some(opcode) = request::next_opcode(ctx.transport(), &p) else {
        st.wqes[i].finish(WC_LOC_QP_OP_ERR, true);
        return Err(Halt::Wqe);
    };
    let next_psn = psn_add(psn, p.psns);
    let meta = TxMeta {
        path: &dest.path,
        src_qpn: ctx.qpn,
        dst_qpn: dest.dst_qpn,
        opcode,
        psn,
        solicited: st.wqes[i].flags & SEND_SOLICITED != 0 && p.last,
        ack_req: request::ack_req(ctx, st, psn, next_psn, p.last),
        ext: p.ext,
    };
    // Borrow the SGE list out of the WQE for the gather (no per-packet clone).
    let sges = std::mem::take(&mut st.wqes[i].sges);
    let w = &st.wqes[i];
    let payload = match (p.source, w.inline.as_deref()) {
        (request::Source::Empty, _) => Payload::Empty,
        (request::Source::Atomic(d), _) => Payload::Atomic(d),
        (request::Source::Message, Some(data)) => Payload::Inline(data),
        (request::Source::Message, None) => Payload::Sges(&sges),
    };
    let r = Request {
        meta,
        payload,
        len: p.len,
        off: w.offset,
        write: matches!(p.op, Operation::Write),
        multi: w.length > u64::from(ctx.mtu) && !w.is_rd_atomic(),
        again: psn_diff(psn, st.psn_high) < 0,
    };
    let built = build_request(dev, ctx, &r, seg);
    st.wqes[i].sges = sges;
    match built {
        Ok(()) => Ok(SentPacket {
            next_psn,
            len: p.len as u64,
            last: p.last,
        }),
        Err(e) => Err(build_failed(st, i, e)),
    }
}

/// A packet whose payload could not be gathered was not sent, and the QP's PSN and the WQE's
/// offset have not moved (rxe saves and rolls them back; here they advance only after a packet
/// is out): an ODP fault suspends the QP and the same packet is built again when the fault
/// ends (spec §12.6); any other failure completes the WQE with LOC_PROT_ERR (IBTA 10.8).
fn build_failed(st: &mut RequesterState, i: usize, e: SgeError) -> Halt {
    match e {
        SgeError::Fault { key, iova } => {
            st.odp_wait = Some(OdpWait { key, iova });
            Halt::Qp
        }
        SgeError::Prot | SgeError::Len => {
            st.wqes[i].finish(WC_LOC_PROT_ERR, true);
            Halt::Wqe
        }
    }
}

/// After a packet went out (rxe `update_wqe_state`, `update_state`): the QP's next PSN and the
/// highest PSN ever sent (IBTA 9.7.1), then the WQE. A READ or atomic is Sent with its one
/// request and counts against max_rd_atomic (IBTA 9.5.4), which stops the QP when full; a
/// message advances by the packet's payload and, with its last packet, is Sent (RC) or
/// completes (UC/UD, IBTA 9.8: no acknowledgement). `None`: the WQE has more packets to send.
fn update_state(
    ctx: &QpCtx,
    st: &mut RequesterState,
    i: usize,
    sent: &SentPacket,
    max_rd: u32,
) -> Option<Halt> {
    st.psn = sent.next_psn;
    if psn_diff(sent.next_psn, st.psn_high) > 0 {
        st.psn_high = sent.next_psn;
    }
    let w = &mut st.wqes[i];
    if w.is_rd_atomic() {
        if w.state == WqeState::Pending {
            st.rd_atomic_outstanding += 1;
        }
        w.state = WqeState::Sent;
        return Some(if st.rd_atomic_outstanding < max_rd {
            Halt::Wqe
        } else {
            Halt::Qp
        });
    }
    w.offset += sent.len;
    if !sent.last {
        w.state = WqeState::Sending;
        return None;
    }
    if ctx.is_rc() {
        w.state = WqeState::Sent;
    } else {
        w.finish(WC_SUCCESS, false);
    }
    Some(Halt::Wqe)
}
