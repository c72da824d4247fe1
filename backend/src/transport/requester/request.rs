//! What a WQE's next request packet is (IBTA 9.7 requester; rxe's `init_req_packet` and
//! `next_opcode`): where it goes, its operation and position, its extension headers, its payload
//! and how many PSNs it takes. These are functions of the WQE, its offset and the path MTU only,
//! so a go-back-N restart regenerates exactly the packets sent before.

use super::*;
use crate::transport::packet::Path;
use crate::wire::{ExtHeaders, Opcode, Transport};

/// Where every request packet of a WQE goes, and the headers they all carry.
pub(super) struct Destination {
    pub path: Path,
    pub dst_qpn: u32,
    /// DETH (UD/GSI) and XRCETH (XRC): the same in every packet of the WQE.
    pub ext: ExtHeaders,
}

/// The destination of `w`'s packets: the QP's primary path and destination QP (RC/UC/XRC), or
/// the WQE's AH and remote QP (UD/GSI, [`ud_destination`]). XRC requests name the target's XRC
/// SRQ in every packet (XRCETH, spec §13.7, §15.2). `None`: `w` was completed in error (an RC/UC
/// QP without a path is LOC_QP_OP_ERR and moves to ERROR).
pub(super) fn destination(dev: &Device, ctx: &QpCtx, w: &mut SendWqe) -> Option<Destination> {
    let (path, dst_qpn, deth) = if ctx.is_ud() {
        ud_destination(dev, ctx, w)?
    } else {
        let Some(path) = ctx.path else {
            w.finish(WC_LOC_QP_OP_ERR, true);
            return None;
        };
        (path, ctx.dest_qpn, None)
    };
    let xrceth = ctx.is_xrc().then_some(Xrceth { srqn: w.xrc_srqn });
    Some(Destination {
        path,
        dst_qpn,
        ext: ExtHeaders {
            deth,
            xrceth,
            ..Default::default()
        },
    })
}

/// UD/GSI (IBTA 9.8): the path of the WQE's AH, its remote QP and the DETH (IBTA 9.3.2). An
/// unknown AH or one of another PD is LOC_QP_OP_ERR (spec §6.1), a message longer than the path
/// MTU LOC_LEN_ERR (a UD message is one packet); both leave the QP in RTS (spec §14.3).
fn ud_destination(dev: &Device, ctx: &QpCtx, w: &mut SendWqe) -> Option<(Path, u32, Option<Deth>)> {
    let Some(path) = ctx::ah_path(dev, w.ah_index, ctx.pdn) else {
        w.finish(WC_LOC_QP_OP_ERR, false);
        return None;
    };
    if w.length > ctx.mtu as u64 {
        w.finish(WC_LOC_LEN_ERR, false);
        return None;
    }
    let deth = Deth {
        qkey: ud_qkey(ctx, w),
        src_qp: ctx.qpn,
    };
    Some((path, w.remote_qpn, Some(deth)))
}

/// The Q_Key a UD request carries: GSI always sends with Q_Key 0x80010000 (and source QP 1,
/// IBTA 13.4.6); otherwise a WR Q_Key with the high bit set means "use the QP's Q_Key"
/// (IBTA 10.2.5).
fn ud_qkey(ctx: &QpCtx, w: &SendWqe) -> u32 {
    if ctx.qp_type == QpType::Gsi {
        ctx::GSI_QKEY
    } else if w.remote_qkey & 0x8000_0000 != 0 {
        ctx.qkey
    } else {
        w.remote_qkey
    }
}

/// Where a request packet's payload comes from.
#[derive(Clone, Copy)]
pub(super) enum Source {
    Empty,
    /// ATOMIC WRITE's 8 bytes.
    Atomic([u8; 8]),
    /// The message at the WQE's offset: its inline data or its SGEs.
    Message,
}

/// A WQE's next request packet, as [`next_packet`] lays it out.
pub(super) struct NextPacket {
    pub op: Operation,
    pub pos: Position,
    /// The destination's headers plus this packet's own.
    pub ext: ExtHeaders,
    pub source: Source,
    /// Payload bytes.
    pub len: usize,
    /// PSNs the packet takes: one, or a READ request's one per response packet (IBTA 9.7.1).
    pub psns: u32,
    /// The message's last packet (solicited event, AckReq and completion go with it).
    pub last: bool,
}

impl NextPacket {
    /// A one-PSN ONLY request without payload.
    fn only(op: Operation, ext: ExtHeaders) -> Self {
        NextPacket {
            op,
            pos: Position::Only,
            ext,
            source: Source::Empty,
            len: 0,
            psns: 1,
            last: true,
        }
    }
}

/// The packet of `w` at its current offset, `ext` holding the destination's headers (rxe
/// `init_req_packet`). Only a READ request changes `w` (its `read_base`).
pub(super) fn next_packet(w: &mut SendWqe, mtu: u32, ext: ExtHeaders) -> NextPacket {
    match w.opcode {
        WR_RDMA_READ => read_request(w, mtu, ext),
        WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD => atomic_request(w, ext),
        WR_ATOMIC_WRITE => atomic_write_request(w, ext),
        WR_FLUSH => flush_request(w, ext),
        _ => message_packet(w, mtu, ext),
    }
}

/// RDMA READ request: one packet with a RETH (IBTA 9.3.3) taking a PSN per response packet. A
/// restarted READ asks only for what has not arrived (IBTA 9.7.5.1); its first response lands
/// at `read_base`.
fn read_request(w: &mut SendWqe, mtu: u32, mut ext: ExtHeaders) -> NextPacket {
    let remaining = w.length - w.offset;
    w.read_base = w.offset;
    ext.reth = Some(Reth {
        va: w.remote_addr.wrapping_add(w.offset),
        rkey: w.rkey,
        dma_len: remaining as u32,
    });
    NextPacket {
        psns: (remaining.div_ceil(mtu as u64)).max(1) as u32,
        ..NextPacket::only(Operation::ReadRequest, ext)
    }
}

/// COMPARE & SWAP or FETCH & ADD (IBTA 9.4.5): one packet with an AtomicETH (IBTA 9.3.4).
fn atomic_request(w: &SendWqe, mut ext: ExtHeaders) -> NextPacket {
    let cmp = w.opcode == WR_ATOMIC_CMP_AND_SWP;
    ext.atomic_eth = Some(AtomicEth {
        va: w.remote_addr,
        rkey: w.rkey,
        swap_add: if cmp { w.swap } else { w.compare_add },
        compare: if cmp { w.compare_add } else { 0 },
    });
    let op = if cmp {
        Operation::CompareSwap
    } else {
        Operation::FetchAdd
    };
    NextPacket::only(op, ext)
}

/// ATOMIC WRITE (IBTA 1.5): one packet with a RETH for 8 bytes and those 8 bytes as payload.
fn atomic_write_request(w: &SendWqe, mut ext: ExtHeaders) -> NextPacket {
    ext.reth = Some(Reth {
        va: w.remote_addr,
        rkey: w.rkey,
        dma_len: 8,
    });
    NextPacket {
        source: Source::Atomic(w.atomic_write_data),
        len: 8,
        ..NextPacket::only(Operation::AtomicWrite, ext)
    }
}

/// FLUSH (IBTA 1.5): one packet with a FETH (placement, selectivity) and a RETH for the range.
fn flush_request(w: &SendWqe, mut ext: ExtHeaders) -> NextPacket {
    ext.feth = Some(Feth {
        placement: w.flush.placement,
        selectivity: w.flush.selectivity,
    });
    ext.reth = Some(Reth {
        va: w.remote_addr,
        rkey: w.rkey,
        dma_len: w.flush.length as u32,
    });
    NextPacket::only(Operation::Flush, ext)
}

/// SEND or RDMA WRITE: the message cut into packets of one path MTU, FIRST/MIDDLE/LAST or ONLY
/// (IBTA 9.7.5.2: FIRST and MIDDLE carry exactly one MTU). A WRITE's first packet carries the
/// RETH for the whole message (IBTA 9.3.3); the last one the immediate data (IBTA 9.3.5) or the
/// R_Key to invalidate (IETH, IBTA 9.3.6).
fn message_packet(w: &SendWqe, mtu: u32, mut ext: ExtHeaders) -> NextPacket {
    let remaining = w.length - w.offset;
    let first = w.offset == 0;
    let last = remaining <= mtu as u64;
    let write = matches!(w.opcode, WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM);
    if write && first {
        ext.reth = Some(Reth {
            va: w.remote_addr,
            rkey: w.rkey,
            dma_len: w.length as u32,
        });
    }
    if last {
        match w.opcode {
            WR_SEND_WITH_IMM | WR_RDMA_WRITE_WITH_IMM => {
                ext.immdt = Some(ImmDt(u32::from_be_bytes(w.ex.to_le_bytes())))
            }
            WR_SEND_WITH_INV => ext.ieth = Some(Ieth { rkey: w.ex }),
            _ => {}
        }
    }
    let pos = match (first, last) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, false) => Position::Middle,
        (false, true) => Position::Last,
    };
    NextPacket {
        op: if write {
            Operation::Write
        } else {
            Operation::Send
        },
        pos,
        ext,
        source: Source::Message,
        len: remaining.min(mtu as u64) as usize,
        psns: 1,
        last,
    }
}

/// The BTH opcode of `p` on transport `t` (IBTA 9.2; rxe `next_opcode`): looked up in the opcode
/// table by operation, position and whether it carries immediate data or an IETH. `None`: the
/// transport has no such opcode (e.g. a READ on UC).
pub(super) fn next_opcode(t: Transport, p: &NextPacket) -> Option<Opcode> {
    opcode_for(t, p.op, p.pos, p.ext.immdt.is_some(), p.ext.ieth.is_some())
}

/// Whether the packet at `psn` (the next one at `next`) asks for an ACK (AckReq, IBTA 9.2.3):
/// RC only, on the last packet of a message, every [`ACK_EVERY`] packets, and when the window is
/// about to fill, so ACKs are coalesced but the window keeps moving.
pub(super) fn ack_req(ctx: &QpCtx, st: &RequesterState, psn: u32, next: u32, last: bool) -> bool {
    ctx.is_rc()
        && (last || psn.is_multiple_of(ACK_EVERY) || psn_diff(next, st.una) >= st.window() as i32)
}
