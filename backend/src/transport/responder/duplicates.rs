//! Responder handling of duplicate requests and errors (IBTA 9.7.5.1, 9.7.5.2): re-ACKs,
//! regenerated READ responses, the atomic resource cache, NAKs and the QP errors they imply.

use super::*;

impl Responder<'_, '_> {
    /// Duplicate request (IBTA 9.7.5.1): SEND/WRITE are re-acknowledged, READ responses are
    /// regenerated for the requested range and atomics are answered from the resource cache
    /// without re-execution.
    pub(super) fn duplicate(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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

    pub(super) fn err_psn(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
        // IBTA 9.7.5.2: one PSN sequence error NAK per gap, carrying the expected PSN.
        if !st.seq_nak_sent {
            st.seq_nak_sent = true;
            if let Some(mut s) = ctx::qp_stats(dev, self.ctx.qpn) {
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

    pub(super) fn err_rnr(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
        if self.ctx.is_rc() {
            if let Some(mut s) = ctx::qp_stats(dev, self.ctx.qpn) {
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
    pub(super) fn err_rkey(&mut self, dev: &Device, st: &mut ResponderState) -> RespStep {
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

    pub(super) fn nak(&self, dev: &Device, st: &ResponderState, code: NakCode, psn: u32) {
        let aeth = Aeth {
            syndrome: Syndrome::Nak(code),
            msn: st.msn,
        };
        send_ack(dev, self.ctx, aeth, psn);
    }

    /// Complete the consumed receive WQE (if any) with `self.recv_status`.
    pub(super) fn complete_recv_error(&mut self, dev: &Device, st: &mut ResponderState) {
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
    pub(super) fn uc_abort(&self, st: &mut ResponderState) {
        if let Some(w) = st.recv.as_mut() {
            w.offset = 0;
        }
        st.cur = None;
        st.write = None;
        st.uc_drop = true;
    }
}
