//! The transport's narrow interface to the rest of the device: a snapshot of the QP attributes the
//! protocol needs ([`QpCtx`]), taking/putting the per-QP protocol state, rings, CQ posting, AHs and
//! GIDs. Keeping every `Device` access here means the state machines never hold a borrow of the QP
//! table while they touch guest memory, MRs or CQs.

use super::packet::Path;
use super::{RequesterState, ResponderState};
use crate::device::Device;

/// QP types (spec §13, `VRDMA_QPT_*`).
pub const QPT_GSI: u32 = 1;
pub const QPT_RC: u32 = 2;
pub const QPT_UC: u32 = 3;
pub const QPT_UD: u32 = 4;

/// QP states (`VRDMA_QPS_*`).
pub const QPS_RESET: u32 = 0;
pub const QPS_INIT: u32 = 1;
pub const QPS_RTR: u32 = 2;
pub const QPS_RTS: u32 = 3;
pub const QPS_SQD: u32 = 4;
pub const QPS_SQE: u32 = 5;
pub const QPS_ERR: u32 = 6;

/// The well-known Q_Key of QP1 (IBTA 13.4.6.x / spec §13).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Snapshot of the QP attributes the transport reads, taken at the start of each operation.
#[derive(Debug, Clone)]
pub struct QpCtx {
    pub qpn: u32,
    pub qp_type: u32,
    pub state: u32,
    pub pdn: u32,
    pub send_cqn: u32,
    pub recv_cqn: u32,
    pub srqn: Option<u32>,
    /// Path MTU in bytes (256..4096).
    pub mtu: u32,
    pub dest_qpn: u32,
    pub qkey: u32,
    pub access: u32,
    pub max_rd_atomic: u32,
    pub max_dest_rd_atomic: u32,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub sq_sig_all: bool,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
    /// SQ slot size in bytes.
    pub sq_wqe_size: u32,
    /// RQ slot size in bytes (0 with an SRQ).
    pub rq_wqe_size: u32,
    /// RC/UC primary path; `None` when the address vector is unusable.
    pub path: Option<Path>,
}

impl QpCtx {
    pub fn is_rc(&self) -> bool {
        self.qp_type == QPT_RC
    }
    pub fn is_uc(&self) -> bool {
        self.qp_type == QPT_UC
    }
    pub fn is_ud(&self) -> bool {
        self.qp_type == QPT_UD || self.qp_type == QPT_GSI
    }
    /// States in which the requester may transmit (IBTA 10.3.1: RTS; SQD finishes what is in flight).
    pub fn can_send(&self) -> bool {
        self.state == QPS_RTS || self.state == QPS_SQD
    }
    /// States in which the responder accepts requests (RTR and later, not ERR).
    pub fn can_receive(&self) -> bool {
        matches!(self.state, QPS_RTR | QPS_RTS | QPS_SQD | QPS_SQE)
    }
}

/// IB MTU enum (1..5) to bytes; anything else is treated as 1024 (the core validates attributes).
pub fn mtu_bytes(e: u32) -> u32 {
    match e {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        5 => 4096,
        _ => 1024,
    }
}

/// Why a ring access failed: the QP must go to ERROR with QP_FATAL (spec §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFault;

/// A completion queue entry (spec §7, 64 bytes) as the transport builds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cqe {
    pub wr_id: u64,
    pub qpn: u32,
    pub opcode: u8,
    pub status: u8,
    pub flags: u8,
    pub network_hdr_type: u8,
    pub byte_len: u32,
    /// imm_data in wire byte order (the 4 bytes as on the wire), or the invalidated rkey.
    pub ex: u32,
    pub src_qp: u32,
    pub pkey_index: u16,
    pub sl: u8,
    pub vendor_err: u32,
    pub smac: [u8; 6],
    pub vlan_id: u16,
}

impl Cqe {
    /// The 64-byte little-endian layout of `struct vrdma_cqe`.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&self.wr_id.to_le_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12] = self.opcode;
        b[13] = self.status;
        b[14] = self.flags;
        b[15] = self.network_hdr_type;
        b[16..20].copy_from_slice(&self.byte_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.ex.to_le_bytes());
        b[24..28].copy_from_slice(&self.src_qp.to_le_bytes());
        b[28..30].copy_from_slice(&self.pkey_index.to_le_bytes());
        b[30] = self.sl;
        b[32..36].copy_from_slice(&self.vendor_err.to_le_bytes());
        b[36..42].copy_from_slice(&self.smac);
        b[42..44].copy_from_slice(&self.vlan_id.to_le_bytes());
        b
    }

    /// Parse the 64-byte layout (tests and tools).
    pub fn from_bytes(b: &[u8; 64]) -> Cqe {
        let u32at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut wr = [0u8; 8];
        wr.copy_from_slice(&b[0..8]);
        let mut smac = [0u8; 6];
        smac.copy_from_slice(&b[36..42]);
        Cqe {
            wr_id: u64::from_le_bytes(wr),
            qpn: u32at(8),
            opcode: b[12],
            status: b[13],
            flags: b[14],
            network_hdr_type: b[15],
            byte_len: u32at(16),
            ex: u32at(20),
            src_qp: u32at(24),
            pkey_index: u16::from_le_bytes([b[28], b[29]]),
            sl: b[30],
            vendor_err: u32at(32),
            smac,
            vlan_id: u16::from_le_bytes([b[42], b[43]]),
        }
    }
}

/// ABI constants the transport uses (values from `include/vrdma_abi.h`, spec §6, §7, §9).
pub mod abi {
    // Send opcodes (§6.1).
    pub const WR_RDMA_WRITE: u8 = 0;
    pub const WR_RDMA_WRITE_WITH_IMM: u8 = 1;
    pub const WR_SEND: u8 = 2;
    pub const WR_SEND_WITH_IMM: u8 = 3;
    pub const WR_RDMA_READ: u8 = 4;
    pub const WR_ATOMIC_CMP_AND_SWP: u8 = 5;
    pub const WR_ATOMIC_FETCH_AND_ADD: u8 = 6;
    pub const WR_LOCAL_INV: u8 = 7;
    pub const WR_REG_MR: u8 = 8;
    pub const WR_SEND_WITH_INV: u8 = 9;
    // Send flags.
    pub const SEND_SIGNALED: u8 = 1 << 0;
    pub const SEND_SOLICITED: u8 = 1 << 1;
    pub const SEND_INLINE: u8 = 1 << 2;
    pub const SEND_FENCE: u8 = 1 << 3;
    // CQE opcodes (§7).
    pub const WC_SEND: u8 = 0;
    pub const WC_RDMA_WRITE: u8 = 1;
    pub const WC_RDMA_READ: u8 = 2;
    pub const WC_COMP_SWAP: u8 = 3;
    pub const WC_FETCH_ADD: u8 = 4;
    pub const WC_LOCAL_INV: u8 = 6;
    pub const WC_REG_MR: u8 = 8;
    pub const WC_RECV: u8 = 128;
    pub const WC_RECV_RDMA_WITH_IMM: u8 = 129;
    // CQE status (= enum ib_wc_status).
    pub const WC_SUCCESS: u8 = 0;
    pub const WC_LOC_LEN_ERR: u8 = 1;
    pub const WC_LOC_QP_OP_ERR: u8 = 2;
    pub const WC_LOC_PROT_ERR: u8 = 4;
    pub const WC_WR_FLUSH_ERR: u8 = 5;
    pub const WC_BAD_RESP_ERR: u8 = 7;
    pub const WC_LOC_ACCESS_ERR: u8 = 8;
    pub const WC_REM_INV_REQ_ERR: u8 = 9;
    pub const WC_REM_ACCESS_ERR: u8 = 10;
    pub const WC_REM_OP_ERR: u8 = 11;
    pub const WC_RETRY_EXC_ERR: u8 = 12;
    pub const WC_RNR_RETRY_EXC_ERR: u8 = 13;
    pub const WC_REM_INV_RD_REQ_ERR: u8 = 15;
    pub const WC_GENERAL_ERR: u8 = 21;
    // CQE flags.
    pub const WC_F_GRH: u8 = 1 << 0;
    pub const WC_F_IMM: u8 = 1 << 1;
    pub const WC_F_INV: u8 = 1 << 2;
    pub const NETWORK_IPV4: u8 = 2;
    pub const NETWORK_IPV6: u8 = 3;
    // Events (§9).
    pub const EV_QP_FATAL: u32 = 3;
    pub const EV_QP_REQ_ERR: u32 = 4;
    pub const EV_QP_ACCESS_ERR: u32 = 5;
    pub const EV_COMM_EST: u32 = 6;
    pub const EV_SQ_DRAINED: u32 = 7;
    pub const EV_QP_LAST_WQE_REACHED: u32 = 8;
    // Doorbells (§8).
    pub const DB_SQ: u32 = 1;
    pub const DB_RQ: u32 = 2;
    pub const DB_SRQ: u32 = 3;
    pub const DB_CQ_ARM: u32 = 4;
    // Access flags.
    pub const ACCESS_LOCAL_WRITE: u32 = 1 << 0;
    pub const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
    pub const ACCESS_REMOTE_READ: u32 = 1 << 2;
    pub const ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
}
