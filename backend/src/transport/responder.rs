//! Responder (IBTA 9.7 responder side): request packets -> guest memory; ACK/NAK, READ responses
//! and atomic acknowledgements (spec §14).

use std::collections::VecDeque;

/// Responder-side protocol state of one QP, held in `Qp::resp`.
///
/// `qp/` calls [`ResponderState::set_rq_psn`] when MODIFY_QP carries `VRDMA_QP_RQ_PSN`, and
/// [`ResponderState::reset`] on any transition to RESET.
#[derive(Debug, Default)]
pub struct ResponderState {
    /// Expected PSN of the next request.
    pub epsn: u32,
    /// Message sequence number (IBTA 9.7.5.1.2), carried in the AETH.
    pub msn: u32,
    /// A NAK for a PSN sequence error has been sent and not yet cleared (C9-xx: NAK once).
    pub seq_nak_sent: bool,
    /// Receive WQE consumed by a multi-packet SEND or WRITE_WITH_IMM in progress.
    pub recv: Option<RecvWqe>,
    /// RDMA WRITE in progress (from the RETH of its first packet).
    pub write: Option<WriteCtx>,
    /// Responder resources: recent READ / atomic requests replayed on duplicates.
    pub resources: VecDeque<RdAtomicRes>,
    /// Packets received since the last ACK (ACK coalescing).
    pub unacked: u32,
    /// An ODP fault RNR-NAKed this PSN; the packet is expected again.
    pub rnr_psn: Option<u32>,
    /// UC: the current message is damaged; drop packets until the next FIRST/ONLY.
    pub uc_drop: bool,
}

/// A receive WQE taken from the RQ or SRQ.
#[derive(Debug, Clone, Default)]
pub struct RecvWqe {
    pub wr_id: u64,
    /// SGEs as (addr, length, lkey).
    pub sges: Vec<(u64, u32, u32)>,
    /// Bytes already scattered.
    pub offset: u64,
    /// The WQE came from this SRQ (None: the QP's RQ).
    pub srqn: Option<u32>,
    /// Sticky error status (e.g. LOC_LEN_ERR) to report at message end.
    pub status: u8,
}

/// An RDMA WRITE being received.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteCtx {
    pub va: u64,
    pub rkey: u32,
    pub remaining: u64,
}

/// Kind of a cached READ / atomic request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResKind {
    Read { va: u64, rkey: u32, len: u32 },
    Atomic { orig: u64 },
}

/// One responder resource (IBTA 9.7.5.1.5 / o9-xx: sized by max_dest_rd_atomic).
#[derive(Debug, Clone, Copy)]
pub struct RdAtomicRes {
    pub first_psn: u32,
    pub last_psn: u32,
    pub kind: ResKind,
}

impl ResponderState {
    /// Back to the state of a freshly created QP (MODIFY_QP to RESET).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// MODIFY_QP with `VRDMA_QP_RQ_PSN`.
    pub fn set_rq_psn(&mut self, psn: u32) {
        self.epsn = psn & super::PSN_MASK;
    }
}
