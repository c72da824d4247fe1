//! The send WQE as the requester holds it, and its decoding from an SQ slot (spec §6.1).

use super::*;

/// One local scatter/gather element.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// Where a WQE's progress is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WqeState {
    /// Not a single packet sent yet (or rewound by a restart).
    #[default]
    Pending,
    /// Some packets sent.
    Sending,
    /// Every request packet sent; waiting for ACK / response (RC).
    Sent,
    /// Completed with `status`; waiting to be retired in SQ order.
    Done,
}

/// A WQE the requester has fetched from the SQ ring (decoded copy; guest memory is not re-read).
#[derive(Debug, Clone, Default)]
pub struct SendWqe {
    /// SQ ring index of the WQE.
    pub index: u32,
    pub wr_id: u64,
    pub opcode: u8,
    pub flags: u8,
    pub signaled: bool,
    /// imm_data (wire order) or rkey to invalidate.
    pub ex: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
    /// ATOMIC_WRITE: the 8 bytes to store, in memory order.
    pub atomic_write_data: [u8; 8],
    /// FLUSH: the FETH fields and the RETH length (`length` stays 0: no payload, one PSN).
    pub flush: FlushWqe,
    /// UD: AH index, remote QPN, Q_Key.
    pub ah_index: u32,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    /// XRC_INI: the XRC SRQ at the target (`xrc_srqn`, sent in every request's XRCETH, §13.7).
    pub xrc_srqn: u32,
    /// REG_MR: the raw registration fields.
    pub reg: FastReg,
    /// BIND_MW: `wr.bind_mw` (the QP's PD and QPN are filled in when it executes).
    pub bind: BindMw,
    pub sges: crate::transport::sgelist::SgeList,
    pub inline: Option<Vec<u8>>,
    pub length: u64,
    pub state: WqeState,
    /// SGEs were validated (keys, bounds) on first transmission.
    pub validated: bool,
    /// PSNs were assigned (first transmission happened); survives go-back-N rewinds, so
    /// acknowledgements for a rewound WQE are still recognised.
    pub sent_once: bool,
    /// PSN of the first packet and of the last packet of this WQE (valid once sent).
    pub first_psn: u32,
    pub last_psn: u32,
    /// Bytes already sent (requests) or received (READ responses).
    pub offset: u64,
    /// READ: `offset` when the current READ request was (re)sent; its first response (FIRST or
    /// ONLY) lands there (IBTA 9.7.5.1: a resent READ asks for the remainder only).
    pub read_base: u64,
    /// Host memory this decoded copy holds (see [`wqe_cost`]), fixed at fetch.
    pub cost: u64,
    /// Completion status once `state == Done`.
    pub status: u8,
    /// The error in `status` moves the QP to ERROR when this WQE retires.
    pub fatal: bool,
}

/// Fields of a FLUSH WQE (`struct vrdma_wqe_flush`).
#[derive(Debug, Clone, Copy, Default)]
pub struct FlushWqe {
    pub placement: u8,
    pub selectivity: u8,
    pub length: u64,
}

impl SendWqe {
    pub fn is_read(&self) -> bool {
        self.opcode == WR_RDMA_READ
    }
    pub fn is_atomic(&self) -> bool {
        matches!(self.opcode, WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD)
    }
    /// IBTA 1.5 ATOMIC WRITE or FLUSH: one request answered by an empty READ response.
    pub fn is_empty_read_like(&self) -> bool {
        matches!(self.opcode, WR_ATOMIC_WRITE | WR_FLUSH)
    }
    /// Ordered like READ: counts against max_rd_atomic and is waited for by fences.
    pub fn is_rd_atomic(&self) -> bool {
        self.is_read() || self.is_atomic() || self.is_empty_read_like()
    }
    pub fn is_local(&self) -> bool {
        matches!(self.opcode, WR_LOCAL_INV | WR_REG_MR | WR_BIND_MW)
    }
    /// Number of PSNs this WQE consumes for a given MTU (READ: one per response packet).
    pub fn npkts(&self, mtu: u32) -> u32 {
        if self.is_atomic() || self.is_empty_read_like() {
            1
        } else {
            (self.length.div_ceil(mtu as u64)).max(1) as u32
        }
    }
    /// CQE opcode (spec §7).
    pub fn wc_opcode(&self) -> u8 {
        match self.opcode {
            WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM => WC_RDMA_WRITE,
            WR_RDMA_READ => WC_RDMA_READ,
            WR_ATOMIC_CMP_AND_SWP => WC_COMP_SWAP,
            WR_ATOMIC_FETCH_AND_ADD => WC_FETCH_ADD,
            WR_ATOMIC_WRITE => WC_ATOMIC_WRITE,
            WR_FLUSH => WC_FLUSH,
            WR_LOCAL_INV => WC_LOCAL_INV,
            WR_REG_MR => WC_REG_MR,
            WR_BIND_MW => WC_BIND_MW,
            _ => WC_SEND,
        }
    }
    pub(super) fn finish(&mut self, status: u8, fatal: bool) {
        self.state = WqeState::Done;
        self.status = status;
        self.fatal = fatal;
    }
}

/// Decode a send WQE slot (spec §6.1). Errors are the completion status for the WQE and whether it
/// is QP-fatal: the header and the opcode's fields ([`decode_op_fields`]), the opcode and flags
/// allowed for the QP ([`opcode_allowed`]), then the payload (inline data or SGEs) and the
/// message length checks.
pub(crate) fn decode_wqe(ctx: &QpCtx, index: u32, b: &[u8]) -> SendWqe {
    if b.len() < WQE_HDR {
        // Slots are at least 64 bytes (sq_wqe_shift >= 6); anything else is a broken QP.
        let mut w = SendWqe {
            index,
            ..Default::default()
        };
        w.finish(WC_LOC_QP_OP_ERR, true);
        return w;
    }
    let s = Slot(b);
    let mut w = SendWqe {
        index,
        wr_id: s.le64(0),
        opcode: b[8],
        flags: b[9],
        ex: s.le32(12),
        xrc_srqn: if ctx.is_xrc() {
            s.le32(20) & 0x00ff_ffff
        } else {
            0
        },
        ..Default::default()
    };
    w.signaled = w.flags & SEND_SIGNALED != 0 || ctx.sq_sig_all;
    let num_sge = b[10] as usize;
    decode_op_fields(ctx, s, &mut w);
    // Unknown flag bits are invalid too (spec §6.1 "Other bits MUST be 0", §14.3).
    const KNOWN_FLAGS: u8 = SEND_SIGNALED | SEND_SOLICITED | SEND_INLINE | SEND_FENCE;
    if !opcode_allowed(ctx, w.opcode, num_sge) || w.flags & !KNOWN_FLAGS != 0 {
        w.finish(WC_LOC_QP_OP_ERR, true);
        return w;
    }
    if w.is_local() {
        return w;
    }
    if w.is_empty_read_like() {
        return decode_empty_read_like(w, num_sge);
    }
    let payload = if w.flags & SEND_INLINE != 0 && !w.is_rd_atomic() {
        decode_inline(ctx, s, &mut w)
    } else {
        decode_sges(ctx, s, &mut w, num_sge)
    };
    if let Err(status) = payload.and_then(|()| check_length(&mut w)) {
        w.finish(status, true);
    }
    w
}

/// A send WQE slot's bytes, little-endian fields at the offsets of spec §6.1.
#[derive(Clone, Copy)]
struct Slot<'a>(&'a [u8]);

impl Slot<'_> {
    fn le32(self, o: usize) -> u32 {
        let b = self.0;
        u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
    }
    fn le64(self, o: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.0[o..o + 8]);
        u64::from_le_bytes(a)
    }
}

/// The fields of bytes 24..63 that `w`'s opcode uses (spec §6.1): the remote address and R_Key,
/// atomic operands, FLUSH fields, a UD SEND's address, REG_MR's or BIND_MW's fields.
fn decode_op_fields(ctx: &QpCtx, s: Slot<'_>, w: &mut SendWqe) {
    match w.opcode {
        WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM | WR_RDMA_READ => {
            w.remote_addr = s.le64(24);
            w.rkey = s.le32(32);
        }
        WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD => {
            w.remote_addr = s.le64(24);
            w.rkey = s.le32(32);
            w.compare_add = s.le64(40);
            w.swap = s.le64(48);
        }
        WR_ATOMIC_WRITE => {
            w.remote_addr = s.le64(24);
            w.rkey = s.le32(32);
            w.atomic_write_data.copy_from_slice(&s.0[40..48]);
        }
        WR_FLUSH => {
            w.remote_addr = s.le64(24);
            w.rkey = s.le32(32);
            w.flush = FlushWqe {
                placement: s.0[36],
                selectivity: s.0[37],
                length: s.le64(40),
            };
        }
        WR_SEND | WR_SEND_WITH_IMM if ctx.is_ud() => {
            w.ah_index = s.le32(24);
            w.remote_qpn = s.le32(28) & 0x00ff_ffff;
            w.remote_qkey = s.le32(32);
        }
        WR_REG_MR => {
            w.reg = FastReg {
                iova: s.le64(24),
                length: s.le64(32),
                key: s.le32(40),
                access: s.le32(44),
                page_list_len: s.le32(48),
                page_shift: s.le32(52),
                page_list_addr: s.le64(56),
            };
        }
        WR_BIND_MW => {
            w.bind = BindMw {
                addr: s.le64(24),
                length: s.le64(32),
                mw_key: s.le32(40),
                new_key: s.le32(44),
                mr_key: s.le32(48),
                access: s.le32(52),
                ..Default::default()
            };
        }
        _ => {}
    }
}

/// Whether `opcode` is allowed for the QP type (IBTA 9.7 / spec §6.1): an invalid one completes
/// with LOC_QP_OP_ERR and moves the QP to ERROR.
fn opcode_allowed(ctx: &QpCtx, opcode: u8, num_sge: usize) -> bool {
    match opcode {
        WR_SEND | WR_SEND_WITH_IMM | WR_LOCAL_INV | WR_REG_MR => true,
        WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM => ctx.is_rc() || ctx.is_uc(),
        WR_RDMA_READ | WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD | WR_SEND_WITH_INV => {
            ctx.is_rc()
        }
        // Not over XRC (spec §13.7: no XRC FLUSH / ATOMIC WRITE opcodes, no windows).
        WR_ATOMIC_WRITE | WR_FLUSH => ctx.qp_type == QpType::Rc,
        // Spec §6.1: windows are bound through RC and UC QPs; no SGEs.
        WR_BIND_MW => (ctx.qp_type == QpType::Rc || ctx.is_uc()) && num_sge == 0,
        _ => false,
    }
}

/// Inline data: it must respect max_inline_data and fit the slot (§6.1), else LOC_LEN_ERR.
fn decode_inline(ctx: &QpCtx, s: Slot<'_>, w: &mut SendWqe) -> Result<(), u8> {
    let inline_len = s.le32(16) as usize;
    if inline_len > ctx.max_inline as usize || WQE_HDR + inline_len > s.0.len() {
        return Err(WC_LOC_LEN_ERR);
    }
    w.inline = Some(s.0[WQE_HDR..WQE_HDR + inline_len].to_vec());
    w.length = inline_len as u64;
    Ok(())
}

/// The SGE list after the header: at most max_send_sge within the slot (else LOC_QP_OP_ERR);
/// empty SGEs count for nothing and are not kept.
fn decode_sges(ctx: &QpCtx, s: Slot<'_>, w: &mut SendWqe, num_sge: usize) -> Result<(), u8> {
    if num_sge > ctx.max_send_sge as usize || WQE_HDR + num_sge * SGE_SIZE > s.0.len() {
        return Err(WC_LOC_QP_OP_ERR);
    }
    let mut total: u64 = 0;
    for i in 0..num_sge {
        let o = WQE_HDR + i * SGE_SIZE;
        let sge = Sge {
            addr: s.le64(o),
            len: s.le32(o + 8),
            lkey: s.le32(o + 12),
        };
        total += sge.len as u64;
        if sge.len > 0 {
            w.sges.push(sge);
        }
    }
    w.length = total;
    Ok(())
}

/// The message length: an atomic's SGEs describe exactly 8 bytes (LOC_LEN_ERR, spec §6.1,
/// §14.3) at an 8-byte aligned remote address (IBTA 9.4.5, LOC_QP_OP_ERR); no message is longer
/// than max_msg_sz, 2^31 (spec §2.2, LOC_LEN_ERR).
fn check_length(w: &mut SendWqe) -> Result<(), u8> {
    if w.is_atomic() {
        if w.length != 8 {
            return Err(WC_LOC_LEN_ERR);
        }
        if !w.remote_addr.is_multiple_of(8) {
            return Err(WC_LOC_QP_OP_ERR);
        }
        w.length = 8;
    }
    if w.length > (1u64 << 31) {
        return Err(WC_LOC_LEN_ERR);
    }
    Ok(())
}

/// The checks of an ATOMIC_WRITE / FLUSH WQE (spec §6.1, §14.3): no SGEs, a valid FLUSH type and
/// level, a FLUSH length within max_msg_sz. The responder checks the ATOMIC_WRITE alignment.
fn decode_empty_read_like(mut w: SendWqe, num_sge: usize) -> SendWqe {
    const PLACEMENTS: u8 = FLUSH_GLOBAL | FLUSH_PERSISTENT;
    let bad_flush = w.opcode == WR_FLUSH
        && (w.flush.placement == 0
            || w.flush.placement & !PLACEMENTS != 0
            || w.flush.selectivity > FLUSH_MR);
    if num_sge != 0 || bad_flush {
        w.finish(WC_LOC_QP_OP_ERR, true);
        return w;
    }
    if w.opcode == WR_FLUSH && w.flush.length > (1u64 << 31) {
        w.finish(WC_LOC_LEN_ERR, true);
        return w;
    }
    w.length = if w.opcode == WR_ATOMIC_WRITE { 8 } else { 0 };
    w
}
