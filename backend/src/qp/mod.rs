//! Queue pairs (spec §13): the `Qp` object and its attributes. The IBTA state machine and
//! attribute-mask table are in `state.rs`, the QP table in `table.rs` (its QPN → slot map in
//! `index.rs`). Protocol state (`req`, `resp`, `tick`) is owned by `transport/`, which sits
//! above this module: `Qp` holds it through the [`Protocol`] types the device names
//! (`transport::Rocev2`), and only resets it and seeds its PSNs.

pub mod index;
pub mod state;
mod table;

use thiserror::Error;
use vrdma_spec::*;

use crate::guest::{GuestMem, Ring};
use crate::objects::gid::{gid_is_ipv4, GidTable};
pub use state::{QpState, QpType, StateError};
pub use table::QpTable;

/// An IB MTU enum in bytes (`vrdma_spec::ib_mtu_to_bytes`, §13.4); anything outside 1..=5 — only
/// an unset `path_mtu` (0) can be, since MODIFY_QP refuses the rest — counts as 256, the smallest
/// MTU. A connected QP cannot send unset (INIT → RTR requires PATH_MTU) and datagram QPs use the
/// port's MTU (§15.6), so the fallback only keeps the value defined. The one definition: the
/// transport's `ctx::mtu_bytes` is this function.
pub fn path_mtu_bytes(mtu: u32) -> u32 {
    ib_mtu_to_bytes(mtu).unwrap_or(256)
}

/// 24-bit PSN / QPN mask.
pub const MASK24: u32 = 0x00ff_ffff;

/// Errors of MODIFY_QP attribute checks.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum QpError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("invalid QP attribute: {0}")]
    Invalid(&'static str),
}

impl QpError {
    /// VRDMA_STATUS_* for the command.
    pub fn status(&self) -> u32 {
        match self {
            QpError::State(StateError::IllegalTransition(..)) => VRDMA_STATUS_BAD_STATE,
            _ => VRDMA_STATUS_INVALID,
        }
    }
}

/// Capacities fixed at creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// Attributes set by MODIFY_QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrs {
    /// IB MTU enum 1..=5 (0 until set).
    pub path_mtu: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qpn: u32,
    /// VRDMA_ACCESS_REMOTE_* (+ LOCAL_WRITE) the QP allows incoming requests to use.
    pub access_flags: u32,
    pub pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub port_num: u8,
    /// Primary path (RC/UC); `av_valid` once set.
    pub av: VrdmaAv,
    pub av_valid: bool,
    /// Source GID resolved from `av.sgid_index` when the AV was set.
    pub sgid: [u8; 16],
}

impl Default for QpAttrs {
    fn default() -> Self {
        QpAttrs {
            path_mtu: 0,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qpn: 0,
            access_flags: 0,
            pkey_index: 0,
            en_sqd_async_notify: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            port_num: 1,
            av: VrdmaAv::ZERO,
            av_valid: false,
            sgid: [0; 16],
        }
    }
}

/// Device limits and port facts MODIFY_QP checks against.
#[derive(Debug, Clone, Copy)]
pub struct ModifyLimits {
    /// Largest IB MTU enum of the port (from the Ethernet MTU).
    pub port_mtu: u32,
    /// max_qp_rd_atom (limit of max_rd_atomic, header §2.2).
    pub max_rd_atomic: u32,
    /// max_qp_init_rd_atom (limit of max_dest_rd_atomic, header §2.2).
    pub max_dest_rd_atomic: u32,
}

/// The protocol engine's per-QP state as `qp/` sees it: storage it resets on a transition to RESET
/// and whose PSNs MODIFY_QP sets (spec §13.4); everything else about it belongs to the engine.
/// `device/` implements it for `transport/`'s types, so this layer does not depend on that one.
pub trait Protocol {
    /// Requester state (`Qp::req`).
    type Req: SendState;
    /// Responder state (`Qp::resp`).
    type Resp: RecvState;
    /// The device timer queue's marks for the QP (`Qp::tick`).
    type Tick: Default;
}

/// The requester half of [`Protocol`].
pub trait SendState: Default {
    /// MODIFY_QP's `sq_psn`: the next PSN to send.
    fn set_sq_psn(&mut self, psn: u32);
    /// Back to the state of a new QP (transition to RESET).
    fn reset(&mut self);
}

/// The responder half of [`Protocol`].
pub trait RecvState: Default {
    /// MODIFY_QP's `rq_psn`: the next PSN expected.
    fn set_rq_psn(&mut self, psn: u32);
    /// Back to the state of a new QP (transition to RESET).
    fn reset(&mut self);
}

/// A queue pair.
pub struct Qp<P: Protocol> {
    pub qpn: u32,
    pub qp_type: QpType,
    pub pd: u32,
    pub send_cqn: u32,
    pub recv_cqn: u32,
    /// SRQ attached at creation (then `rq` is `None`).
    pub srqn: Option<u32>,
    /// XRC_TGT: its XRC domain (spec §13.7).
    pub xrcdn: Option<u32>,
    pub sq: Ring,
    pub rq: Option<Ring>,
    pub sq_sig_all: bool,
    pub caps: QpCaps,
    pub state: QpState,
    pub attrs: QpAttrs,
    /// Set on RTS → SQD; the transport clears it (and sends SQ_DRAINED when
    /// `attrs.en_sqd_async_notify`) once no request is outstanding.
    pub sq_draining: bool,
    /// Requester protocol state (owned by transport/).
    pub req: P::Req,
    /// Responder protocol state (owned by transport/).
    pub resp: P::Resp,
    /// The device timer queue's marks for this QP (owned by transport/timers.rs).
    pub tick: P::Tick,
    /// Transport counters (`stats.rs`), written by transport/.
    pub stats: crate::stats::QpStats,
    /// Host memory the QP holds for its whole life (spec §16, see
    /// `Device::qp_fixed_charge`); fetched WQEs beyond the first are charged by the requester.
    pub charge: crate::budget::Charge,
}

impl<P: Protocol> std::fmt::Debug for Qp<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("type", &self.qp_type)
            .field("state", &self.state)
            .field("pd", &self.pd)
            .finish_non_exhaustive()
    }
}

/// What a successful MODIFY_QP did (the device performs the side effects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: QpState,
    pub to: QpState,
}

impl<P: Protocol> Qp<P> {
    /// A new QP in RESET with no PD, CQs, rings or capabilities yet (CREATE_QP fills in what
    /// its type has) and fresh protocol state, holding `charge` for its life.
    pub fn in_reset(qpn: u32, qp_type: QpType, charge: crate::budget::Charge) -> Self {
        Qp {
            qpn,
            qp_type,
            pd: 0,
            send_cqn: 0,
            recv_cqn: 0,
            srqn: None,
            xrcdn: None,
            sq: Ring::absent(),
            rq: None,
            sq_sig_all: false,
            caps: QpCaps::default(),
            state: QpState::Reset,
            attrs: Default::default(),
            sq_draining: false,
            req: Default::default(),
            resp: Default::default(),
            tick: Default::default(),
            stats: Default::default(),
            charge,
        }
    }

    /// Q_Key to use for this QP's datagrams.
    pub fn qkey(&self) -> u32 {
        if self.qp_type == QpType::Gsi {
            VRDMA_GSI_QKEY
        } else {
            self.attrs.qkey
        }
    }

    /// Path MTU in bytes (256..4096; see [`path_mtu_bytes`] if unset).
    pub fn mtu_bytes(&self) -> u32 {
        path_mtu_bytes(self.attrs.path_mtu)
    }

    /// Validate and apply a MODIFY_QP. Nothing changes unless the whole request is valid.
    pub fn modify(
        &mut self,
        mem: &GuestMem,
        gids: &GidTable,
        limits: &ModifyLimits,
        mask: u32,
        a: &VrdmaQpAttr,
    ) -> Result<Transition, QpError> {
        if mask & !state::QP_ATTR_ALL != 0 {
            return Err(QpError::Invalid("unknown attribute mask bits"));
        }
        let cur = self.state;
        if mask & VRDMA_QP_CUR_STATE != 0 {
            let cs = QpState::from_u32(a.cur_qp_state).ok_or(QpError::Invalid("cur_qp_state"))?;
            if cs != cur {
                return Err(QpError::Invalid("cur_qp_state differs from the QP state"));
            }
        }
        let next = if mask & VRDMA_QP_STATE != 0 {
            QpState::from_u32(a.qp_state).ok_or(QpError::Invalid("qp_state"))?
        } else {
            cur
        };
        state::check_transition(cur, next, self.qp_type, mask)?;

        // Range checks on everything present.
        let mut new = self.attrs;
        if mask & VRDMA_QP_PKEY_INDEX != 0 {
            if a.pkey_index != 0 {
                return Err(QpError::Invalid("pkey_index (only index 0 exists)"));
            }
            new.pkey_index = 0;
        }
        if mask & VRDMA_QP_PORT != 0 {
            if a.port_num != 1 {
                return Err(QpError::Invalid("port_num"));
            }
            new.port_num = 1;
        }
        if mask & VRDMA_QP_QKEY != 0 {
            new.qkey = a.qkey;
        }
        if mask & VRDMA_QP_ACCESS_FLAGS != 0 {
            // Every known access bit is accepted (applications often pass their MR flags);
            // only the REMOTE_* bits mean something for a QP.
            if a.qp_access_flags & !VRDMA_QP_ACCESS_ALLOWED != 0 {
                return Err(QpError::Invalid("qp_access_flags"));
            }
            new.access_flags = a.qp_access_flags;
        }
        if mask & VRDMA_QP_PATH_MTU != 0 {
            if !(1..=5).contains(&a.path_mtu) || a.path_mtu > limits.port_mtu {
                return Err(QpError::Invalid("path_mtu"));
            }
            new.path_mtu = a.path_mtu;
        }
        if mask & VRDMA_QP_TIMEOUT != 0 {
            if a.timeout > 31 {
                return Err(QpError::Invalid("timeout"));
            }
            new.timeout = a.timeout;
        }
        if mask & VRDMA_QP_RETRY_CNT != 0 {
            if a.retry_cnt > 7 {
                return Err(QpError::Invalid("retry_cnt"));
            }
            new.retry_cnt = a.retry_cnt;
        }
        if mask & VRDMA_QP_RNR_RETRY != 0 {
            if a.rnr_retry > 7 {
                return Err(QpError::Invalid("rnr_retry"));
            }
            new.rnr_retry = a.rnr_retry;
        }
        if mask & VRDMA_QP_MIN_RNR_TIMER != 0 {
            if a.min_rnr_timer > 31 {
                return Err(QpError::Invalid("min_rnr_timer"));
            }
            new.min_rnr_timer = a.min_rnr_timer;
        }
        if mask & VRDMA_QP_RQ_PSN != 0 {
            if a.rq_psn > MASK24 {
                return Err(QpError::Invalid("rq_psn"));
            }
            new.rq_psn = a.rq_psn;
        }
        if mask & VRDMA_QP_SQ_PSN != 0 {
            if a.sq_psn > MASK24 {
                return Err(QpError::Invalid("sq_psn"));
            }
            new.sq_psn = a.sq_psn;
        }
        if mask & VRDMA_QP_DEST_QPN != 0 {
            if a.dest_qp_num > MASK24 {
                return Err(QpError::Invalid("dest_qp_num"));
            }
            new.dest_qpn = a.dest_qp_num;
        }
        if mask & VRDMA_QP_MAX_QP_RD_ATOMIC != 0 {
            if a.max_rd_atomic as u32 > limits.max_rd_atomic {
                return Err(QpError::Invalid("max_rd_atomic"));
            }
            new.max_rd_atomic = a.max_rd_atomic;
        }
        if mask & VRDMA_QP_MAX_DEST_RD_ATOMIC != 0 {
            if a.max_dest_rd_atomic as u32 > limits.max_dest_rd_atomic {
                return Err(QpError::Invalid("max_dest_rd_atomic"));
            }
            new.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        if mask & VRDMA_QP_EN_SQD_ASYNC_NOTIFY != 0 {
            new.en_sqd_async_notify = a.en_sqd_async_notify != 0;
        }
        if mask & VRDMA_QP_AV != 0 {
            new.sgid = check_av(gids, &a.av)?;
            new.av = a.av;
            new.av_valid = true;
        }
        // ALT_PATH / PATH_MIG_STATE: accepted where the table allows them, ignored (no APM).

        // Apply.
        self.attrs = new;
        if mask & VRDMA_QP_SQ_PSN != 0 {
            self.req.set_sq_psn(new.sq_psn);
        }
        if mask & VRDMA_QP_RQ_PSN != 0 {
            self.resp.set_rq_psn(new.rq_psn);
        }
        if next != cur {
            self.enter(mem, next);
        }
        Ok(Transition {
            from: cur,
            to: next,
        })
    }

    /// Enter `next` (effects that need no other object; the device does flush hooks / events).
    pub fn enter(&mut self, mem: &GuestMem, next: QpState) {
        match next {
            QpState::Reset => {
                self.req.reset();
                self.resp.reset();
                self.sq.reset_indices(mem);
                if let Some(rq) = self.rq.as_mut() {
                    rq.reset_indices(mem);
                }
                self.attrs = QpAttrs::default();
                self.sq_draining = false;
            }
            QpState::Sqd => self.sq_draining = true,
            QpState::Rts => self.sq_draining = false,
            _ => {}
        }
        self.state = next;
    }

    /// QUERY_QP response.
    pub fn query(&self) -> VrdmaQpAttr {
        let a = &self.attrs;
        VrdmaQpAttr {
            qp_state: self.state.as_u32(),
            cur_qp_state: self.state.as_u32(),
            path_mtu: a.path_mtu,
            qkey: self.qkey(),
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qpn,
            qp_access_flags: a.access_flags,
            pkey_index: a.pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify as u8,
            sq_draining: self.sq_draining as u8,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            port_num: a.port_num,
            reserved0: 0,
            max_send_wr: self.caps.max_send_wr,
            max_recv_wr: self.caps.max_recv_wr,
            max_send_sge: self.caps.max_send_sge,
            max_recv_sge: self.caps.max_recv_sge,
            max_inline_data: self.caps.max_inline_data,
            reserved1: 0,
            av: a.av,
        }
    }
}

/// Validate an address vector against the GID table; returns the source GID.
/// sgid_index must name a RoCEv2 entry; the destination GID must be of the same IP family as the
/// source (IPv4-mapped vs IPv6); flow label ≤ 20 bits; VLAN id < 4096 or `VRDMA_VLAN_NONE` (untagged).
pub fn check_av(gids: &GidTable, av: &VrdmaAv) -> Result<[u8; 16], QpError> {
    let e = gids
        .get(av.sgid_index as u32)
        .ok_or(QpError::Invalid("sgid_index not in the GID table"))?;
    if e.gid_type != VRDMA_GID_TYPE_ROCE_V2 {
        return Err(QpError::Invalid("source GID is not RoCEv2"));
    }
    if gid_is_ipv4(&e.gid) != gid_is_ipv4(&av.dgid) {
        return Err(QpError::Invalid(
            "destination GID family differs from the source GID",
        ));
    }
    if av.dgid == [0; 16] {
        return Err(QpError::Invalid("destination GID is zero"));
    }
    if av.flow_label > 0xf_ffff {
        return Err(QpError::Invalid("flow_label"));
    }
    if av.vlan_id != VRDMA_VLAN_NONE && av.vlan_id >= 4096 {
        return Err(QpError::Invalid("vlan_id"));
    }
    Ok(e.gid)
}

/// Highest QPN handed out: 0xffffff is the multicast QPN (IBTA 10.5), never a QP's.
pub(crate) const MAX_QPN: u32 = MASK24 - 1;

/// The engine worker a QP belongs to (`--engine-threads`, ARCHITECTURE.md "Engine workers"):
/// its QPN modulo the number of workers. A pure function of the QPN, so the vhost-user thread
/// routes a doorbell and worker 0 routes a received frame without a table or a lock;
/// [`QpTable::alloc_qpn`] spreads new QPs over the workers by choosing the residue.
pub fn worker_of(qpn: u32, workers: usize) -> usize {
    match u32::try_from(workers) {
        Ok(n) if n > 1 => (qpn % n) as usize,
        _ => 0,
    }
}
