//! Responder checks of a request packet (IBTA 9.7.5.1, spec §14): PSN, opcode sequence and
//! validity, resources, length, R_Key. Each is a step of `Responder::step`.

use super::*;

impl Responder<'_, '_> {
    pub(super) fn check_psn(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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

    pub(super) fn check_op_seq(&mut self, st: &mut ResponderState) -> RespStep {
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

    pub(super) fn check_op_valid(&mut self) -> RespStep {
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

    pub(super) fn check_resource(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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

    pub(super) fn check_length(&mut self, st: &mut ResponderState) -> RespStep {
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

    pub(super) fn check_rkey(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
        let pkt = self.pkt;
        let (va, rkey, len, access) = match pkt.op() {
            Operation::Write => {
                let n = pkt.payload.len() as u64;
                if let Some(reth) = pkt.reth {
                    // Validate the whole transfer at its first packet, without faulting it
                    // in: each packet resolves (and faults) only its own bytes, so a WRITE
                    // larger than the resident budget makes progress (spec §12.6).
                    if let Some(s) = self.check_whole_reth(dev, reth, ACCESS_REMOTE_WRITE) {
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
                // The whole range is checked, only the first response packet is resolved (an
                // ODP fault there is the RNR NAK of §12.4); `pump_replies` resolves the others
                // one at a time, so a READ larger than the resident budget makes progress.
                if let Some(s) = self.check_whole_reth(dev, reth, ACCESS_REMOTE_READ) {
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
        match self.resolve(dev, self.remote_access(rkey, va, len, access)) {
            Ok(()) => RespStep::Execute,
            Err(s) => s,
        }
    }

    /// FLUSH: the R_Key is always checked (also for a zero length) for the placement's access
    /// right; a range FLUSH is bounds-checked and faults ODP pages in like a READ, a whole-MR FLUSH
    /// is not (spec §14.6).
    pub(super) fn check_flush_rkey(&mut self, dev: &Device) -> RespStep {
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
        match self.resolve(dev, self.remote_access(reth.rkey, reth.va, len, access)) {
            Ok(()) => RespStep::Execute,
            Err(s) => s,
        }
    }

    /// The step a WRITE's or READ's RETH decides before any translation: `Execute` at once for
    /// a zero-length transfer (it needs no R_Key check, IBTA 9.7.4.1), the error of a range
    /// [`Self::check_whole`] refuses; `None`: go on.
    fn check_whole_reth(
        &self,
        dev: &Device,
        reth: crate::wire::Reth,
        access: u32,
    ) -> Option<RespStep> {
        if reth.dma_len == 0 {
            return Some(RespStep::Execute);
        }
        let a = self.remote_access(reth.rkey, reth.va, u64::from(reth.dma_len), access);
        self.check_whole(dev, a).err()
    }

    /// The request's R_Key range in the PD it is checked against.
    fn remote_access(&self, rkey: u32, va: u64, len: u64, access: u32) -> Access {
        Access {
            key: rkey,
            pd: self.ctx.pdn,
            iova: va,
            len,
            rights: access,
        }
    }

    /// Check a whole RETH range (key, PD, access, bounds) without translating or faulting it.
    pub(super) fn check_whole(&self, dev: &Device, a: Access) -> Result<(), RespStep> {
        dev.mrs
            .read()
            .check_remote(a, self.ctx.qpn)
            .map_err(|_| RespStep::ErrRkeyViolation)?;
        self.check_odp_caps(dev, a.key, a.rights)
    }

    /// Spec §2.2 / §14.6: an R_Key of an ODP MR for an operation the QP's transport does not list
    /// in its ODP caps is an R_Key violation (RC: NAK Remote Access Error; UC: dropped).
    pub(super) fn check_odp_caps(
        &self,
        dev: &Device,
        rkey: u32,
        access: u32,
    ) -> Result<(), RespStep> {
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
    pub(super) fn resolve(&mut self, dev: &Device, a: Access) -> Result<(), RespStep> {
        self.check_odp_caps(dev, a.key, a.rights)?;
        let resolved = ctx::resolve_remote(dev, None, a, self.ctx.qpn, &mut self.ranges);
        match resolved {
            Ok(()) => Ok(()),
            // ODP at the responder: RNR NAK now, the page request is already on its way.
            Err(MrError::Fault { .. }) => {
                self.odp = true;
                Err(RespStep::ErrRnr)
            }
            Err(_) => Err(RespStep::ErrRkeyViolation),
        }
    }
}
