//! A QP in the state stream (spec §17.3): its attributes and rings, and the transport state in
//! flight (the requester's fetched send WQEs with their progress, the responder's message in
//! progress). The reader checks every reference and range like the rest of `snapshot.rs`.

use super::*;

pub(super) fn put_qp(w: &mut Writer, qp: &Qp) {
    w.u32(qp.qpn);
    w.u32(qp.qp_type.as_u32());
    w.u32(qp.pd);
    w.u32(qp.send_cqn);
    w.u32(qp.recv_cqn);
    w.opt_u32(qp.srqn);
    w.ring(&qp.sq);
    w.bool(qp.rq.is_some());
    if let Some(rq) = &qp.rq {
        w.ring(rq);
    }
    w.bool(qp.sq_sig_all);
    let c = &qp.caps;
    for v in [
        c.max_send_wr,
        c.max_recv_wr,
        c.max_send_sge,
        c.max_recv_sge,
        c.max_inline_data,
    ] {
        w.u32(v);
    }
    w.u32(qp.state.as_u32());
    w.bool(qp.sq_draining);
    let a = &qp.attrs;
    for v in [
        a.path_mtu,
        a.qkey,
        a.rq_psn,
        a.sq_psn,
        a.dest_qpn,
        a.access_flags,
    ] {
        w.u32(v);
    }
    w.u16(a.pkey_index);
    w.bool(a.en_sqd_async_notify);
    for v in [
        a.max_rd_atomic,
        a.max_dest_rd_atomic,
        a.min_rnr_timer,
        a.timeout,
        a.retry_cnt,
        a.rnr_retry,
        a.port_num,
    ] {
        w.u8(v);
    }
    w.bytes(a.av.as_bytes());
    w.bool(a.av_valid);
    w.bytes(&a.sgid);
    // Requester (IBTA 9.7): sequence numbers and retry counters. Nothing is in flight (see
    // `busy_reason`), so the SQ resumes at `sq_fetch` with the next PSN.
    let q = &qp.req;
    for v in [q.psn, q.una, q.psn_high, q.sq_fetch, q.cwnd] {
        w.u32(v);
    }
    w.u8(q.retry_left);
    w.u8(q.rnr_left);
    w.bool(q.counters_loaded);
    w.bool(q.stopped);
    w.bool(q.fetch_blocked);
    w.u64(q.restarts);
    w.opt_u32(q.retry_psn);
    w.u32(q.rd_atomic_outstanding);
    // A restored QP whose resend has not run yet still has its packets in flight.
    w.bool(q.retrans_deadline.is_some() || q.moved_resend.is_some());
    w.bool(q.rnr_deadline.is_some());
    w.u32(q.wqes.len() as u32);
    for wqe in &q.wqes {
        put_wqe(w, wqe);
    }
    // Responder: expected PSN and MSN (IBTA 9.7.5.1).
    let s = &qp.resp;
    w.u32(s.epsn);
    w.u32(s.msn);
    w.u32(s.unacked);
    w.bool(s.seq_nak_sent);
    w.bool(s.uc_drop);
    w.bool(s.comm_est);
    w.bool(s.last_wqe_reported);
    w.u8(match s.cur {
        None => 0,
        Some(MsgOp::Send) => 1,
        Some(MsgOp::Write) => 2,
    });
    w.bool(s.recv.is_some());
    if let Some(r) = &s.recv {
        w.u64(r.wr_id);
        w.u64(r.capacity);
        w.u64(r.offset);
        w.opt_u32(r.srqn);
        w.bool(r.malformed);
        put_sges(w, &r.sges);
    }
    w.bool(s.write.is_some());
    if let Some(x) = &s.write {
        w.u64(x.va);
        w.u32(x.rkey);
        w.u64(x.remaining);
        w.u64(x.total);
    }
}

fn put_sges(w: &mut Writer, sges: &[Sge]) {
    w.u32(sges.len() as u32);
    for g in sges {
        w.u64(g.addr);
        w.u32(g.len);
        w.u32(g.lkey);
    }
}

fn put_wqe(w: &mut Writer, q: &SendWqe) {
    w.u32(q.index);
    w.u64(q.wr_id);
    w.u8(q.opcode);
    w.u8(q.flags);
    w.bool(q.signaled);
    w.u32(q.ex);
    w.u64(q.remote_addr);
    w.u32(q.rkey);
    w.u64(q.compare_add);
    w.u64(q.swap);
    w.bytes(&q.atomic_write_data);
    w.u8(q.flush.placement);
    w.u8(q.flush.selectivity);
    w.u64(q.flush.length);
    w.u32(q.ah_index);
    w.u32(q.remote_qpn);
    w.u32(q.remote_qkey);
    let r = &q.reg;
    w.u64(r.iova);
    w.u64(r.length);
    for v in [r.key, r.access, r.page_list_len, r.page_shift] {
        w.u32(v);
    }
    w.u64(r.page_list_addr);
    put_sges(w, &q.sges);
    w.bool(q.inline.is_some());
    if let Some(d) = &q.inline {
        w.u32(d.len() as u32);
        w.bytes(d);
    }
    w.u64(q.length);
    w.u8(match q.state {
        WqeState::Pending => 0,
        WqeState::Sending => 1,
        WqeState::Sent => 2,
        WqeState::Done => 3,
    });
    w.bool(q.validated);
    w.bool(q.sent_once);
    w.u32(q.first_psn);
    w.u32(q.last_psn);
    w.u64(q.offset);
    w.u64(q.read_base);
    w.u8(q.status);
    w.bool(q.fatal);
}

pub(super) fn get_qp(r: &mut Reader, dev: &Device) -> Result<Qp, SnapshotError> {
    let qpn = r.u32()?;
    let qp_type = QpType::from_u32(r.u32()?).ok_or(invalid("QP type", qpn))?;
    let valid_qpn = match qp_type {
        QpType::Gsi => qpn == VRDMA_GSI_QPN,
        _ => (VRDMA_FIRST_QPN..=crate::qp::MAX_QPN).contains(&qpn),
    };
    if !valid_qpn || dev.qps.get(qpn).is_some() {
        return Err(invalid("QPN", qpn));
    }
    if qp_type != QpType::Gsi && dev.qps.len() >= dev.config.max_qp {
        return Err(invalid("QP count", dev.qps.len()));
    }
    let pd = r.u32()?;
    let send_cqn = r.u32()?;
    let recv_cqn = r.u32()?;
    let srqn = r.opt_u32()?;
    if !dev.pds.contains(pd) {
        return Err(invalid("QP's PD", pd));
    }
    if !dev.cqs.contains(send_cqn) || !dev.cqs.contains(recv_cqn) {
        return Err(invalid("QP's CQ", qpn));
    }
    if srqn.is_some_and(|s| !dev.srqs.contains(s)) {
        return Err(invalid("QP's SRQ", qpn));
    }
    let max_wr = dev.config.max_qp_wr;
    let sq = r.ring(6, max_wr)?;
    let rq = if r.bool()? {
        Some(r.ring(5, max_wr)?)
    } else {
        None
    };
    if rq.is_some() == srqn.is_some() {
        return Err(invalid("QP receive queue", qpn));
    }
    let sq_sig_all = r.bool()?;
    let caps = QpCaps {
        max_send_wr: r.u32()?,
        max_recv_wr: r.u32()?,
        max_send_sge: r.u32()?,
        max_recv_sge: r.u32()?,
        max_inline_data: r.u32()?,
    };
    let cfg = &dev.config;
    if caps.max_send_wr != sq.depth()
        || caps.max_recv_wr != rq.as_ref().map_or(0, |q| q.depth())
        || caps.max_send_sge > cfg.max_send_sge
        || caps.max_recv_sge > cfg.max_recv_sge
        || caps.max_inline_data > cfg.max_inline_data
    {
        return Err(invalid("QP capacities", qpn));
    }
    let state = QpState::from_u32(r.u32()?).ok_or(invalid("QP state", qpn))?;
    let sq_draining = r.bool()?;
    let mut attrs = QpAttrs {
        path_mtu: r.u32()?,
        qkey: r.u32()?,
        rq_psn: r.u32()?,
        sq_psn: r.u32()?,
        dest_qpn: r.u32()?,
        access_flags: r.u32()?,
        pkey_index: r.u16()?,
        en_sqd_async_notify: r.bool()?,
        ..Default::default()
    };
    attrs.max_rd_atomic = r.u8()?;
    attrs.max_dest_rd_atomic = r.u8()?;
    attrs.min_rnr_timer = r.u8()?;
    attrs.timeout = r.u8()?;
    attrs.retry_cnt = r.u8()?;
    attrs.rnr_retry = r.u8()?;
    attrs.port_num = r.u8()?;
    attrs.av = r.abi::<VrdmaAv>()?;
    attrs.av_valid = r.bool()?;
    attrs.sgid = r.array::<16>()?;
    if attrs.path_mtu > 5
        || u32::from(attrs.max_rd_atomic) > cfg.max_qp_rd_atom
        || u32::from(attrs.max_dest_rd_atomic) > cfg.max_qp_init_rd_atom
        || attrs.retry_cnt > 7
        || attrs.rnr_retry > 7
        || attrs.min_rnr_timer > 31
        || attrs.timeout > 31
        || attrs.rq_psn > 0xff_ffff
        || attrs.sq_psn > 0xff_ffff
        || attrs.dest_qpn > 0xff_ffff
    {
        return Err(invalid("QP attributes", qpn));
    }
    let charge = dev
        .budget
        .try_charge(dev.qp_fixed_charge(
            (sq.pages().len() + rq.as_ref().map_or(0, |q| q.pages().len())) as u64,
            sq.entry_size(),
        ))
        .map_err(|_| SnapshotError::NoResources)?;
    let mut qp = Qp {
        qpn,
        qp_type,
        pd,
        send_cqn,
        recv_cqn,
        srqn,
        sq,
        rq,
        sq_sig_all,
        caps,
        state,
        attrs,
        sq_draining,
        req: Default::default(),
        resp: Default::default(),
        tick: Default::default(),
        stats: Default::default(),
        charge,
        xrcdn: None,
    };
    let (mtu, caps, max_rd, sq_entry) = (
        qp.mtu_bytes(),
        qp.caps,
        qp.attrs.max_rd_atomic,
        qp.sq.entry_size(),
    );
    let q = &mut qp.req;
    q.psn = psn(r, "requester PSN")?;
    q.una = psn(r, "requester unacknowledged PSN")?;
    q.psn_high = psn(r, "requester highest PSN")?;
    q.sq_fetch = r.u32()?;
    q.cwnd = r.u32()?;
    if q.cwnd > crate::transport::requester::WINDOW {
        return Err(invalid("congestion window", q.cwnd));
    }
    q.retry_left = r.u8()?;
    q.rnr_left = r.u8()?;
    if q.retry_left > 7 || q.rnr_left > 7 {
        return Err(invalid("retry counter", qpn));
    }
    q.counters_loaded = r.bool()?;
    q.stopped = r.bool()?;
    q.fetch_blocked = r.bool()?;
    q.restarts = r.u64()?;
    q.retry_psn = r.opt_u32()?;
    if q.retry_psn.is_some_and(|p| p > 0xff_ffff) {
        return Err(invalid("retry PSN", qpn));
    }
    q.rd_atomic_outstanding = r.u32()?;
    let (retrans, rnr) = (r.bool()?, r.bool()?);
    let nwqes = r.count(WQE_MIN_BYTES)?;
    if nwqes as u64 > u64::from(caps.max_send_wr) {
        return Err(invalid("fetched WQE count", nwqes as u64));
    }
    if q.rd_atomic_outstanding > u32::from(max_rd).max(1) {
        return Err(invalid(
            "outstanding READ/atomic count",
            q.rd_atomic_outstanding,
        ));
    }
    for _ in 0..nwqes {
        let wqe = get_wqe(r, &caps, dev.config.max_msg_sz, mtu)?;
        q.wqe_bytes += wqe.cost;
        q.wqes.push_back(wqe);
    }
    let floor = crate::transport::requester::wqe_floor(sq_entry);
    let beyond = q.wqe_bytes.saturating_sub(floor);
    if beyond > 0 && q.wqe_charge.try_grow(&dev.budget, beyond).is_err() {
        return Err(SnapshotError::NoResources);
    }
    // Whatever was in flight was lost with the source's port: resend it at once, as a
    // go-back-N that spends no retry (`completer::resend_after_move`: the source may have
    // spent every retry on a path that failed while it was being stopped), or end the RNR
    // wait now.
    let now = std::time::Instant::now();
    q.retrans_deadline = None;
    q.moved_resend = retrans.then_some(now);
    q.rnr_deadline = rnr.then_some(now);
    let s = &mut qp.resp;
    s.epsn = psn(r, "responder PSN")?;
    s.msn = r.u32()? & 0xff_ffff;
    s.unacked = r.u32()?;
    s.seq_nak_sent = r.bool()?;
    s.uc_drop = r.bool()?;
    s.comm_est = r.bool()?;
    s.last_wqe_reported = r.bool()?;
    s.cur = match r.u8()? {
        0 => None,
        1 => Some(MsgOp::Send),
        2 => Some(MsgOp::Write),
        v => return Err(invalid("message in progress", v)),
    };
    if r.bool()? {
        let wr_id = r.u64()?;
        let capacity = r.u64()?;
        let offset = r.u64()?;
        let srqn = r.opt_u32()?;
        let malformed = r.bool()?;
        let sges = get_sges(r, MAX_SAVED_SGES)?;
        let total: u64 = sges.iter().map(|g| u64::from(g.len)).sum();
        if offset > capacity || capacity > total || srqn != qp.srqn {
            return Err(invalid("receive WQE in progress", qpn));
        }
        s.recv = Some(RecvWqe {
            wr_id,
            sges,
            capacity,
            offset,
            srqn,
            malformed,
        });
    }
    if r.bool()? {
        let va = r.u64()?;
        let rkey = r.u32()?;
        let remaining = r.u64()?;
        let total = r.u64()?;
        if remaining > total || va.checked_add(remaining).is_none() {
            return Err(invalid("RDMA WRITE in progress", qpn));
        }
        s.write = Some(WriteCtx {
            va,
            rkey,
            remaining,
            total,
        });
    }
    Ok(qp)
}

/// Fewest bytes a saved WQE takes (bounds the count before anything is allocated).
const WQE_MIN_BYTES: usize = 159;
/// SGEs of a receive WQE in progress: a receive slot holds at most 4 KiB of 16-byte SGEs.
const MAX_SAVED_SGES: usize = 256;

fn get_sges(r: &mut Reader, max: usize) -> Result<SgeList, SnapshotError> {
    let n = r.count(16)?;
    if n > max {
        return Err(invalid("SGE count", n as u64));
    }
    let mut l = SgeList::default();
    for _ in 0..n {
        l.push(Sge {
            addr: r.u64()?,
            len: r.u32()?,
            lkey: r.u32()?,
        });
    }
    Ok(l)
}

fn get_wqe(
    r: &mut Reader,
    caps: &QpCaps,
    max_msg: u32,
    mtu: u32,
) -> Result<SendWqe, SnapshotError> {
    let mut q = SendWqe {
        index: r.u32()?,
        wr_id: r.u64()?,
        opcode: r.u8()?,
        flags: r.u8()?,
        signaled: r.bool()?,
        ex: r.u32()?,
        remote_addr: r.u64()?,
        rkey: r.u32()?,
        compare_add: r.u64()?,
        swap: r.u64()?,
        atomic_write_data: r.array::<8>()?,
        ..Default::default()
    };
    if q.opcode > VRDMA_WR_FLUSH {
        return Err(invalid("WQE opcode", q.opcode));
    }
    q.flush.placement = r.u8()?;
    q.flush.selectivity = r.u8()?;
    q.flush.length = r.u64()?;
    q.ah_index = r.u32()?;
    q.remote_qpn = r.u32()?;
    q.remote_qkey = r.u32()?;
    q.reg.iova = r.u64()?;
    q.reg.length = r.u64()?;
    q.reg.key = r.u32()?;
    q.reg.access = r.u32()?;
    q.reg.page_list_len = r.u32()?;
    q.reg.page_shift = r.u32()?;
    q.reg.page_list_addr = r.u64()?;
    q.sges = get_sges(r, caps.max_send_sge as usize)?;
    if r.bool()? {
        let n = r.count(1)?;
        if n > caps.max_inline_data as usize {
            return Err(invalid("inline data length", n as u64));
        }
        q.inline = Some(r.take(n)?.to_vec());
    }
    q.length = r.u64()?;
    q.state = match r.u8()? {
        0 => WqeState::Pending,
        1 => WqeState::Sending,
        2 => WqeState::Sent,
        3 => WqeState::Done,
        v => return Err(invalid("WQE state", v)),
    };
    q.validated = r.bool()?;
    q.sent_once = r.bool()?;
    q.first_psn = psn(r, "WQE first PSN")?;
    q.last_psn = psn(r, "WQE last PSN")?;
    q.offset = r.u64()?;
    q.read_base = r.u64()?;
    q.status = r.u8()?;
    q.fatal = r.bool()?;
    if q.length > u64::from(max_msg) || q.offset > q.length || q.read_base > q.length {
        return Err(invalid("WQE length", q.length));
    }
    // The PSN span of a sent WQE is what its length gives (the completer relies on it).
    if q.sent_once
        && !q.is_local()
        && psn_span(q.first_psn, q.last_psn) != q.npkts(mtu).saturating_sub(1)
    {
        return Err(invalid("WQE PSN span", q.first_psn));
    }
    q.cost = crate::transport::requester::wqe_cost(&q);
    Ok(q)
}

fn psn_span(first: u32, last: u32) -> u32 {
    last.wrapping_sub(first) & 0xff_ffff
}

fn psn(r: &mut Reader, what: &'static str) -> Result<u32, SnapshotError> {
    let v = r.u32()?;
    if v > 0xff_ffff {
        return Err(invalid(what, v));
    }
    Ok(v)
}
