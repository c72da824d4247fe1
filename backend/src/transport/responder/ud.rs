//! UD / GSI receives at the responder (IBTA 9.8, 10.2; spec §6.2).

use super::*;

/// UD / GSI receive (IBTA 9.8, 10.2; spec §6.2): Q_Key check, GRH area, one-packet message.
pub(super) fn ud_receive(dev: &Device, ctx: &QpCtx, st: &mut ResponderState, pkt: &RxPkt<'_>) {
    if pkt.info.transport != Transport::Ud {
        return;
    }
    let Some(deth) = pkt.deth else { return };
    // Q_Key check (IBTA 10.2.5): mismatch → silently dropped. QP1 uses 0x80010000.
    let qkey = if ctx.qp_type == QpType::Gsi {
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
