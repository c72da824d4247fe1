//! Responder execution of a checked request (spec §14): SEND/WRITE placement, READ and atomic
//! replies, ATOMIC WRITE, FLUSH, completion and acknowledgement.

use super::*;

impl Responder<'_, '_> {
    /// Execute a checked request (spec §14.6): SEND and RDMA WRITE payloads are placed here;
    /// READ, atomic, ATOMIC WRITE and FLUSH go on to their reply steps.
    pub(super) fn execute(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
        match self.pkt.op() {
            Operation::Send => self.execute_send(dev, st),
            Operation::Write => self.execute_write(dev, st),
            Operation::ReadRequest => RespStep::ReadReply,
            Operation::CompareSwap | Operation::FetchAdd => RespStep::AtomicReply,
            Operation::AtomicWrite => RespStep::AtomicWriteReply,
            Operation::Flush => RespStep::FlushReply,
            _ => RespStep::Drop,
        }
    }

    /// A SEND packet: its payload scattered into the receive WQE's SGEs at the message's
    /// offset so far (spec §14.6: no WQE, a WQE too short, an ODP fault).
    fn execute_send(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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
        let buf = self.pkt.payload;
        if !buf.is_empty() {
            if let Err(step) = self.scatter_send_payload(dev, w, buf) {
                return step;
            }
        }
        w.offset += buf.len() as u64;
        st.cur = Some(MsgOp::Send);
        RespStep::Complete
    }

    /// Scatter `buf` into `w`'s SGEs at its offset. An ODP chunk not resident is an RNR
    /// (spec §12.4); a payload beyond the SGEs a length error; an SGE that fails its lkey check
    /// completes the WQE LOC_PROT_ERR (spec §14.6).
    fn scatter_send_payload(
        &mut self,
        dev: &Device,
        w: &mut RecvWqe,
        buf: &[u8],
    ) -> Result<(), RespStep> {
        let off = w.offset;
        let sges = std::mem::take(&mut w.sges);
        let r = sge_copy(dev, None, self.ctx.pdn, &sges, off, SgeIo::Scatter(buf));
        w.sges = sges;
        match r {
            Ok(()) => Ok(()),
            Err(SgeError::Fault { .. }) => {
                self.odp = true;
                Err(RespStep::ErrRnr)
            }
            Err(SgeError::Len) => Err(RespStep::ErrLength),
            Err(SgeError::Prot) => {
                self.recv_status = WC_LOC_PROT_ERR;
                Err(RespStep::ErrRemoteOp)
            }
        }
    }

    /// An RDMA WRITE packet: its payload placed at the ranges CheckRkey validated (or copied
    /// from the sender's memory when held by reference), and the WRITE's progress advanced.
    fn execute_write(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
        let pkt = self.pkt;
        if let Err(step) = self.write_by_reference(dev) {
            return step;
        }
        if let Some(reth) = pkt.reth {
            st.write = Some(WriteCtx {
                va: reth.va,
                rkey: reth.rkey,
                remaining: reth.dma_len as u64,
                total: reth.dma_len as u64,
            });
        }
        let n = pkt.payload.len();
        if n > 0 && pkt.payload_ref.is_none() {
            if let Err(step) = self.place_write_payload(dev) {
                return step;
            }
        }
        if let Some(w) = st.write.as_mut() {
            w.va = w.va.wrapping_add(n as u64);
            w.remaining -= n as u64;
        }
        st.cur = Some(MsgOp::Write);
        RespStep::Complete
    }

    /// One copy (spec §16.2 rule 6): a payload held by reference is copied from the sender's
    /// guest memory first, before any state changes, so a stale reference (the sender fenced
    /// it) is a lost packet the requester retransmits. Nothing to do for a payload in the frame.
    fn write_by_reference(&mut self, dev: &Device) -> Result<(), RespStep> {
        let Some(src) = super::super::onecopy::payload_ref(self.pkt) else {
            return Ok(());
        };
        use super::super::onecopy::{write_payload, OneCopyError};
        match write_payload(dev, src, &self.ranges, self.pkt.payload.len()) {
            Ok(()) => {
                crate::stats::bump(&dev.port_stats.rx_by_reference);
                Ok(())
            }
            Err(OneCopyError::Stale) => {
                crate::stats::bump(&dev.port_stats.drop_stale_ref);
                Err(RespStep::Drop)
            }
            Err(OneCopyError::Destination) => {
                self.mem_fault = true;
                Err(RespStep::ErrRemoteOp)
            }
        }
    }

    /// Write the packet's payload to the validated guest ranges, which it must cover; a write
    /// that fails under a valid translation is a Remote Operational Error (spec §14.6).
    fn place_write_payload(&mut self, dev: &Device) -> Result<(), RespStep> {
        let payload = self.pkt.payload;
        let mut p = 0usize;
        for r in &self.ranges {
            let Some(chunk) = p
                .checked_add(r.len as usize)
                .and_then(|e| payload.get(p..e))
            else {
                return Err(RespStep::ErrRemoteOp);
            };
            if dev.mem.write(r.gpa, chunk).is_err() {
                self.mem_fault = true;
                return Err(RespStep::ErrRemoteOp);
            }
            p += chunk.len();
        }
        Ok(())
    }

    /// Generate READ responses (IBTA 9.7.4.1.4): one per MTU, PSNs from the request's PSN.
    pub(super) fn read_reply(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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
    pub(super) fn atomic_reply(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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
            RdAtomicRes::single(psn, ResKind::Atomic { orig }),
        );
        st.msn = psn_add(st.msn, 1);
        st.epsn = psn_add(psn, 1);
        st.unacked = 0;
        atomic_ack_in_order(dev, self.ctx, st, psn, orig);
        RespStep::Done
    }

    /// ATOMIC WRITE (IBTA 1.5): one atomic 64-bit store of the payload, after every earlier
    /// request of the QP (they were executed in PSN order before this one).
    pub(super) fn atomic_write_reply(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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
    pub(super) fn flush_reply(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
        dev.mem.fence();
        self.empty_read_response(dev, st)
    }

    /// Answer ATOMIC WRITE / FLUSH with RDMA READ RESPONSE ONLY, AETH and no payload, queued
    /// behind any READ responses still being paced so responses stay in PSN order.
    pub(super) fn empty_read_response(
        &mut self,
        dev: &Device,
        st: &mut ResponderState,
    ) -> RespStep {
        let psn = self.pkt.psn();
        push_resource(
            st,
            self.ctx,
            RdAtomicRes::single(psn, ResKind::EmptyReadResponse),
        );
        st.msn = psn_add(st.msn, 1);
        st.epsn = psn_add(psn, 1);
        st.unacked = 0;
        queue_empty_read_response(dev, self.ctx, st, psn);
        RespStep::Done
    }

    /// End of a message: receive completion for SEND / WRITE_WITH_IMM (spec §7).
    pub(super) fn complete(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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
                    if dev
                        .mrs
                        .write()
                        .remote_invalidate(ieth.rkey, pdn, qpn)
                        .is_err()
                    {
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
    pub(super) fn acknowledge(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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
}
