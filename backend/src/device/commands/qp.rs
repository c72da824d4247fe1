//! QP commands (spec §11.6, §13): CREATE_QP (XRC_TGT included), MODIFY_QP, QUERY_QP,
//! DESTROY_QP, and multicast ATTACH/DETACH (§15.8).

use super::*;

/// How often a MODIFY_QP on the shared device finds the QP's protocol state out (its worker in
/// a unit of work for it) and yields before it falls back to the exclusive device.
const MODIFY_QP_TRIES: u32 = 1000;

impl Device {
    /// CREATE_QP beside the engine workers (`handle_shared`): the QP table inserts through a
    /// shared borrow (`qp/table.rs`), and nothing refers to the new QP before the guest has
    /// its QPN (a packet that names it by chance finds a QP in RESET and is dropped). `None`
    /// when the table's QPN index must grow first, which needs the exclusive device.
    pub(super) fn cmd_create_qp_shared(&self, req: &[u8], resp: &mut Vec<u8>) -> Option<CmdResult> {
        self.qps.has_room().then(|| self.cmd_create_qp(req, resp))
    }

    /// CREATE_QP on the exclusive device: the table grows if it must.
    pub(super) fn cmd_create_qp_exclusive(&mut self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        self.qps.make_room();
        self.cmd_create_qp(req, resp)
    }

    fn cmd_create_qp(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, rest) = parse::<VrdmaCmdCreateQp>(req)?;
        let t = QpType::from_u32(c.qp_type).ok_or(VRDMA_STATUS_INVALID)?;
        if t == QpType::XrcTgt {
            return self.create_xrc_tgt(&c, resp);
        }
        if c.xrcdn != 0 {
            return Err(VRDMA_STATUS_INVALID);
        }
        let total = c
            .sq_npages
            .checked_add(c.rq_npages)
            .ok_or(VRDMA_STATUS_INVALID)?;
        let pages = page_list(rest, total)?;
        self.pd_exists(c.pdn)?;
        // An XRC_INI has no receive side (spec §13.7): no recv CQ, SRQ or RQ.
        let ini = t == QpType::XrcIni;
        if !self.cqs.contains(c.send_cqn) || (!ini && !self.cqs.contains(c.recv_cqn)) {
            return Err(VRDMA_STATUS_NOT_FOUND);
        }
        if ini && (c.srqn != VRDMA_NO_SRQ || c.rq_depth != 0 || c.rq_npages != 0) {
            return Err(VRDMA_STATUS_INVALID);
        }
        let srqn = if c.srqn == VRDMA_NO_SRQ {
            None
        } else {
            let srq = self.srqs.get(c.srqn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
            // An XRC SRQ is reached through an XRC_TGT's XRCETH, never attached (§11.7).
            if srq.xrc.is_some() {
                return Err(VRDMA_STATUS_INVALID);
            }
            Some(c.srqn)
        };
        let cfg = &self.config;
        // Capacities against the device limits and the slot sizes.
        let sq_shift = c.sq_wqe_shift as u32;
        let rq_shift = c.rq_wqe_shift as u32;
        if !(6..=12).contains(&sq_shift) {
            return Err(VRDMA_STATUS_INVALID);
        }
        if c.max_send_sge > cfg.max_send_sge
            || c.max_send_sge > sq_max_sge(c.sq_wqe_shift)
            || c.max_inline_data > cfg.max_inline_data
            || c.max_inline_data > sq_max_inline(c.sq_wqe_shift)
        {
            return Err(VRDMA_STATUS_INVALID);
        }
        if srqn.is_some() || ini {
            if c.rq_depth != 0 || c.rq_npages != 0 {
                return Err(VRDMA_STATUS_INVALID);
            }
        } else {
            if !(5..=12).contains(&rq_shift) {
                return Err(VRDMA_STATUS_INVALID);
            }
            if c.max_recv_sge > cfg.max_recv_sge || c.max_recv_sge > rq_max_sge(c.rq_wqe_shift) {
                return Err(VRDMA_STATUS_INVALID);
            }
        }
        let max_wr = cfg.max_qp_wr;
        let charge = self.charge(self.qp_fixed_charge(pages.len() as u64, 1 << sq_shift))?;
        let (sq_pages, rq_pages) = pages.split_at(c.sq_npages as usize);
        let sq = self.make_ring(sq_pages, c.sq_depth, sq_shift, 6, max_wr)?;
        let rq = match srqn {
            _ if ini => None,
            Some(_) => None,
            None => Some(self.make_ring(rq_pages, c.rq_depth, rq_shift, 5, max_wr)?),
        };
        let no_rq = srqn.is_some() || ini;
        let qpn = self.qps.alloc_qpn(t).ok_or(if t == QpType::Gsi {
            VRDMA_STATUS_BUSY
        } else {
            VRDMA_STATUS_NO_RESOURCES
        })?;
        let qp = Qp {
            pd: c.pdn,
            send_cqn: c.send_cqn,
            recv_cqn: if ini { 0 } else { c.recv_cqn },
            srqn,
            sq,
            rq,
            sq_sig_all: c.sq_sig_all != 0,
            caps: QpCaps {
                max_send_wr: c.sq_depth,
                max_recv_wr: if no_rq { 0 } else { c.rq_depth },
                max_send_sge: c.max_send_sge,
                max_recv_sge: if no_rq { 0 } else { c.max_recv_sge },
                max_inline_data: c.max_inline_data,
            },
            ..Qp::in_reset(qpn, t, charge)
        };
        // Room was made (`cmd_create_qp_shared` / `_exclusive`) and the QPN is free.
        if !self.qps.insert_shared(qp) {
            return Err(VRDMA_STATUS_NO_RESOURCES);
        }
        if let Some(mut s) = srqn.and_then(|s| self.srqs.get(s)) {
            s.qp_refs += 1;
        }
        put(resp, &VrdmaRespCreateQp { qpn, reserved: 0 });
        Ok(())
    }

    /// CREATE_QP of an XRC_TGT (spec §11.7, §13.7): no rings, no CQs, no PD; only its domain.
    fn create_xrc_tgt(&self, c: &VrdmaCmdCreateQp, resp: &mut Vec<u8>) -> CmdResult {
        if !self.xrcds.contains(c.xrcdn) {
            return Err(VRDMA_STATUS_NOT_FOUND);
        }
        if c.srqn != VRDMA_NO_SRQ
            || c.sq_depth != 0
            || c.rq_depth != 0
            || c.sq_npages != 0
            || c.rq_npages != 0
        {
            return Err(VRDMA_STATUS_INVALID);
        }
        let charge = self.charge(self.qp_fixed_charge(0, 0))?;
        let qpn = self
            .qps
            .alloc_qpn(QpType::XrcTgt)
            .ok_or(VRDMA_STATUS_NO_RESOURCES)?;
        let qp = Qp {
            xrcdn: Some(c.xrcdn),
            ..Qp::in_reset(qpn, QpType::XrcTgt, charge)
        };
        if !self.qps.insert_shared(qp) {
            return Err(VRDMA_STATUS_NO_RESOURCES);
        }
        put(resp, &VrdmaRespCreateQp { qpn, reserved: 0 });
        Ok(())
    }

    pub(super) fn modify_limits(&self) -> ModifyLimits {
        ModifyLimits {
            port_mtu: self.config.port_mtu(),
            max_rd_atomic: self.config.max_qp_rd_atom,
            max_dest_rd_atomic: self.config.max_qp_init_rd_atom,
        }
    }

    /// MODIFY_QP on the exclusive device (the fallback of [`Device::cmd_modify_qp_shared`]).
    pub(super) fn cmd_modify_qp(&mut self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdModifyQp>(req)?;
        let limits = self.modify_limits();
        let qp = self.qps.get_mut(c.qpn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
        let tr = qp
            .modify(&self.mem, &self.gids, &limits, c.attr_mask, &c.attr)
            .map_err(|e| e.status())?;
        self.modified_qp(c.qpn, tr);
        Ok(())
    }

    /// MODIFY_QP under the QP's own lock, on the device held shared (beside the engine
    /// workers) or exclusively. The attributes and the protocol state change together, so it
    /// waits while the QP's worker has that state out for a unit of work (only this QP's own
    /// data path); `None` if it stays out for [`MODIFY_QP_TRIES`] yields (a long unit, or a
    /// worker that died inside one): the caller then runs [`Device::cmd_modify_qp`] on the
    /// exclusive device, which waits for every worker's hand-off as any other command.
    pub(super) fn cmd_modify_qp_shared(&self, req: &[u8]) -> Option<CmdResult> {
        let c = match parse::<VrdmaCmdModifyQp>(req) {
            Ok((c, _)) => c,
            Err(s) => return Some(Err(s)),
        };
        let limits = self.modify_limits();
        for _ in 0..MODIFY_QP_TRIES {
            let Some(mut qp) = self.qps.get(c.qpn) else {
                return Some(Err(VRDMA_STATUS_NOT_FOUND));
            };
            if crate::transport::ctx::state_out(&qp) {
                drop(qp);
                std::thread::yield_now();
                continue;
            }
            let tr = qp.modify(&self.mem, &self.gids, &limits, c.attr_mask, &c.attr);
            // The QP is unlocked before the flush is scheduled (it locks the QP again).
            drop(qp);
            return Some(match tr {
                Ok(tr) => {
                    self.modified_qp(c.qpn, tr);
                    Ok(())
                }
                Err(e) => Err(e.status()),
            });
        }
        None
    }

    /// After a MODIFY_QP: a QP that entered ERR is flushed (by its own worker when the
    /// command ran beside the workers, `tables/flush.rs`).
    fn modified_qp(&self, qpn: u32, tr: crate::qp::Transition) {
        if tr.to == QpState::Err && tr.from != QpState::Err {
            self.schedule_flush(qpn);
        }
    }

    pub(super) fn cmd_query_qp(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        let qp = self.qps.get(c.handle).ok_or(VRDMA_STATUS_NOT_FOUND)?;
        put(resp, &qp.query());
        Ok(())
    }

    /// DESTROY_QP beside the engine workers (`handle_shared`). `None`, for the exclusive
    /// device, while the QP's flush is queued: an exclusive command runs the queued flushes
    /// first, so a DESTROY_QP right after a MODIFY_QP to ERR still gets the flush
    /// completions, as on the exclusive device.
    pub(super) fn cmd_destroy_qp_shared(&self, req: &[u8]) -> Option<CmdResult> {
        let c = match parse::<VrdmaHandle>(req) {
            Ok((c, _)) => c,
            Err(s) => return Some(Err(s)),
        };
        if self.flush_queued(c.handle) {
            return None;
        }
        Some(self.destroy_qp(c.handle))
    }

    /// DESTROY_QP on the exclusive device.
    pub(super) fn cmd_destroy_qp(&mut self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        self.destroy_qp(c.handle)
    }

    /// Spec §11.6: no completions, packets dropped from now on, the ring pages free when the
    /// command completes. The QP leaves the table first (no unit of work that starts later
    /// finds it) and its multicast groups (§15.8), then the command waits for the units in
    /// flight (one of them may have the QP's protocol state out, reading its rings or
    /// completing its WQEs, or a datagram for one of its groups) before it answers.
    fn destroy_qp(&self, qpn: u32) -> CmdResult {
        let qp = self.qps.remove(qpn).ok_or(VRDMA_STATUS_NOT_FOUND)?;
        if qp.qp_type == QpType::Ud {
            self.mcast.write().detach_qp(qpn);
        }
        if let Some(mut s) = qp.srqn.and_then(|s| self.srqs.get(s)) {
            s.qp_refs = s.qp_refs.saturating_sub(1);
        }
        // Spec §12.8: type 2B windows bound through the QP are unbound with it.
        self.mrs.write().unbind_qp(qpn);
        self.fence_local_copies();
        drop(qp);
        Ok(())
    }

    /// ATTACH_MCAST / DETACH_MCAST (spec §15.8): UD QPs only. Beside the workers
    /// (`handle_shared`), under the groups' write lock; a detach then waits for the units in
    /// flight, which may be delivering a datagram of the group to the QP, before it answers.
    pub(super) fn cmd_mcast(&self, req: &[u8], attach: bool) -> CmdResult {
        use crate::objects::McastError;
        let (c, _) = parse::<VrdmaCmdMcast>(req)?;
        let qp_type = self.qps.get(c.qpn).ok_or(VRDMA_STATUS_NOT_FOUND)?.qp_type;
        if attach && qp_type != QpType::Ud {
            return Err(VRDMA_STATUS_INVALID);
        }
        let r = if attach {
            self.mcast.write().attach(c.gid, c.qpn)
        } else {
            self.mcast.write().detach(&c.gid, c.qpn)
        };
        r.map_err(|e| match e {
            McastError::NotMulticast => VRDMA_STATUS_INVALID,
            McastError::Full => VRDMA_STATUS_NO_RESOURCES,
            McastError::NotAttached => VRDMA_STATUS_NOT_FOUND,
        })?;
        if !attach {
            self.fence_local_copies();
        }
        Ok(())
    }
}
