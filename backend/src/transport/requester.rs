//! Requester (IBTA 9.7 requester side): takes WQEs from the SQ ring (spec §6.1), validates them,
//! segments them by path MTU and builds request packets.

use std::collections::VecDeque;
use std::time::Instant;

/// Requester-side protocol state of one QP, held in `Qp::req`.
///
/// `qp/` calls [`RequesterState::set_sq_psn`] when MODIFY_QP carries `VRDMA_QP_SQ_PSN`, and
/// [`RequesterState::reset`] on any transition to RESET.
#[derive(Debug, Default)]
pub struct RequesterState {
    /// Next PSN for a new request packet.
    pub psn: u32,
    /// Oldest PSN not yet acknowledged (RC).
    pub una: u32,
    /// Next SQ ring index to fetch (free-running, §4).
    pub sq_fetch: u32,
    /// WQEs fetched from the SQ and not yet retired, in SQ order.
    pub wqes: VecDeque<SendWqe>,
    /// Outstanding RDMA READ / atomic requests (bounded by max_rd_atomic).
    pub rd_atomic_outstanding: u32,
    /// Remaining transport retries before RETRY_EXC_ERR.
    pub retry_left: u8,
    /// Remaining RNR retries before RNR_RETRY_EXC_ERR (7 = infinite).
    pub rnr_left: u8,
    /// Retransmission deadline (RC): armed while packets are outstanding.
    pub retrans_deadline: Option<Instant>,
    /// RNR back-off: no (re)transmission before this instant.
    pub rnr_deadline: Option<Instant>,
    /// Set while an ODP fault on a local SGE blocks the QP (spec §10).
    pub odp_wait: Option<OdpWait>,
    /// Set when the next request must restart from `una` (go-back-N).
    pub restart: bool,
    /// The SQ stopped after an error completion; waiting for the QP to leave RTS.
    pub error: bool,
    /// Bumped every time anything is acknowledged; used for ghost-ack detection.
    pub progress: u64,
}

/// A suspended requester waits for this ODP chunk to become resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OdpWait {
    pub key: u32,
    pub iova: u64,
}

/// One local scatter/gather element after validation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// Where a WQE's progress is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WqeState {
    /// Not a single packet sent yet.
    #[default]
    Pending,
    /// Some packets sent.
    Sending,
    /// Every request packet sent; waiting for ACK / response.
    Sent,
    /// Completed (CQE written or suppressed); waiting to be retired in SQ order.
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
    /// UD: AH index, remote QPN, Q_Key.
    pub ah_index: u32,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    pub sges: Vec<Sge>,
    pub inline: Option<Vec<u8>>,
    pub length: u64,
    pub state: WqeState,
    /// PSN of the first packet and of the last packet of this WQE.
    pub first_psn: u32,
    pub last_psn: u32,
    /// Bytes already sent (requests) or received (READ responses).
    pub offset: u64,
    /// Completion status once `state == Done`.
    pub status: u8,
}

impl RequesterState {
    /// Back to the state of a freshly created QP (MODIFY_QP to RESET).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// MODIFY_QP with `VRDMA_QP_SQ_PSN`.
    pub fn set_sq_psn(&mut self, psn: u32) {
        self.psn = psn & super::PSN_MASK;
        self.una = self.psn;
    }
}
