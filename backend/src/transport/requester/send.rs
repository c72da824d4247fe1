//! WQEs to request packets: the send loop (window, fences, max_rd_atomic, RNR back-off), local
//! operations, SGE gathers and segmentation by path MTU (spec §6.1, IBTA 9.7).

use super::*;

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
        let state = st.wqes[i].state;
        if matches!(state, WqeState::Sent | WqeState::Done) {
            if i == st.sent_prefix {
                st.sent_prefix += 1;
            }
            i += 1;
            continue;
        }
        // SQD: finish what was started, start nothing new (IBTA 10.3.1).
        if ctx.state == QpState::Sqd && !st.wqes[i].sent_once {
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

/// Send the next packets of WQE `i`. Returns false when the QP must stop for now (window full,
/// ODP suspension); true when the WQE has nothing more to send right now.
fn send_wqe(
    dev: &Device,
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
        let qkey = if ctx.qp_type == QpType::Gsi {
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
        // Only messages of several packets go into segments: a one-packet message (64 B
        // WRITEs, READ requests, atomics) gains nothing there and costs a segment buffer, so
        // it leaves as a plain frame, after the segment so far (PSN order on the wire).
        let multi = w.length > u64::from(mtu) && !w.is_rd_atomic();
        if let Some(w) = seg.as_mut() {
            if !w.is_empty() && (!multi || !w.fits(plen)) {
                ctx::flush_segment(dev, ctx.qpn, w);
                *w = SegmentWriter::new(crate::transport::packet::segment_buf());
            }
        }
        let again = psn_diff(psn, st.psn_high) < 0;
        let hdr = crate::transport::packet::TxMeta {
            path: &path,
            src_qpn: ctx.qpn,
            dst_qpn: dqpn,
            opcode,
            psn,
            solicited: solicited && last,
            ack_req,
            hdrs: &hdrs,
        };
        // One copy (spec §16.2 rule 6, `onecopy`): an RC WRITE packet of a segment leaves its
        // payload in guest memory, the receiving engine copies it from there. `None`: copied.
        let mut by_ref = None;
        let is_write = matches!(op, Operation::Write);
        if let Some(w) = seg.as_mut().filter(|_| multi) {
            use crate::transport::onecopy::{
                build_by_reference, by_reference, Built, PayloadSource,
            };
            if matches!(src, Src::Message)
                && by_reference(dev, ctx.is_rc(), is_write, inline.is_some(), plen)
            {
                let payload = PayloadSource {
                    qpn: ctx.qpn,
                    pdn: ctx.pdn,
                    sges: &sges,
                    off,
                    len: plen,
                };
                by_ref = match build_by_reference(dev, &hdr, payload, w) {
                    Ok(Built::Added(len)) => {
                        ctx::count_tx(dev, ctx.qpn, len, again);
                        Some(Ok(()))
                    }
                    Ok(Built::Lost) => Some(Ok(())),
                    Ok(Built::Copy) => None,
                    Err(e) => Some(Err(e)),
                };
            }
        }
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
        // Behind the highest PSN ever sent (`again`): go-back-N is sending this packet again.
        let sent = match (by_ref, seg.as_mut().filter(|_| multi)) {
            (Some(r), _) => r,
            (None, Some(w)) => crate::transport::packet::build_into_segment(&hdr, plen, w, fill)
                .map(|len| {
                    if let Some(len) = len {
                        ctx::count_tx(dev, ctx.qpn, len, again);
                    }
                }),
            (None, None) => crate::transport::packet::build_with(
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
