//! The IBTA QP state machine (IBTA Vol. 1 §10.3.1, table "QP state transition properties"), with
//! the required / optional attribute masks of every transition per QP type (spec §13).
//!
//! `check_transition(cur, next, qp_type, mask)`:
//! - transition not allowed → `StateError::IllegalTransition` (STATUS_BAD_STATE);
//! - a required attribute missing or an attribute that is neither required nor optional present
//!   → `StateError::BadMask` (STATUS_INVALID).
//!
//! `VRDMA_QP_STATE` itself is always allowed (it selects `next`); without it `next == cur`.

use thiserror::Error;
use vrdma_spec::*;

/// QP states (values of VRDMA_QPS_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl QpState {
    pub fn from_u32(v: u32) -> Option<QpState> {
        Some(match v {
            VRDMA_QPS_RESET => QpState::Reset,
            VRDMA_QPS_INIT => QpState::Init,
            VRDMA_QPS_RTR => QpState::Rtr,
            VRDMA_QPS_RTS => QpState::Rts,
            VRDMA_QPS_SQD => QpState::Sqd,
            VRDMA_QPS_SQE => QpState::Sqe,
            VRDMA_QPS_ERR => QpState::Err,
            _ => return None,
        })
    }

    pub fn as_u32(self) -> u32 {
        match self {
            QpState::Reset => VRDMA_QPS_RESET,
            QpState::Init => VRDMA_QPS_INIT,
            QpState::Rtr => VRDMA_QPS_RTR,
            QpState::Rts => VRDMA_QPS_RTS,
            QpState::Sqd => VRDMA_QPS_SQD,
            QpState::Sqe => VRDMA_QPS_SQE,
            QpState::Err => VRDMA_QPS_ERR,
        }
    }

    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

/// QP types the table knows (VRDMA_QPT_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    Gsi,
    Rc,
    Uc,
    Ud,
    /// XRC initiator (spec §13.7): a send queue only.
    XrcIni,
    /// XRC target (spec §13.7): no rings, receives through XRC SRQs.
    XrcTgt,
}

impl QpType {
    pub fn from_u32(v: u32) -> Option<QpType> {
        Some(match v {
            VRDMA_QPT_GSI => QpType::Gsi,
            VRDMA_QPT_RC => QpType::Rc,
            VRDMA_QPT_UC => QpType::Uc,
            VRDMA_QPT_UD => QpType::Ud,
            VRDMA_QPT_XRC_INI => QpType::XrcIni,
            VRDMA_QPT_XRC_TGT => QpType::XrcTgt,
            _ => return None,
        })
    }
    pub fn as_u32(self) -> u32 {
        match self {
            QpType::Gsi => VRDMA_QPT_GSI,
            QpType::Rc => VRDMA_QPT_RC,
            QpType::Uc => VRDMA_QPT_UC,
            QpType::Ud => VRDMA_QPT_UD,
            QpType::XrcIni => VRDMA_QPT_XRC_INI,
            QpType::XrcTgt => VRDMA_QPT_XRC_TGT,
        }
    }
    /// XRC_INI or XRC_TGT.
    pub fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcIni | QpType::XrcTgt)
    }
    /// Connected service types, which have a primary path (RC, UC, XRC).
    pub fn is_connected(self) -> bool {
        matches!(
            self,
            QpType::Rc | QpType::Uc | QpType::XrcIni | QpType::XrcTgt
        )
    }
    /// Datagram semantics (UD and GSI).
    pub fn is_datagram(self) -> bool {
        matches!(self, QpType::Ud | QpType::Gsi)
    }
}

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum StateError {
    #[error("illegal QP transition {0:?} -> {1:?}")]
    IllegalTransition(QpState, QpState),
    #[error("attribute mask {mask:#x} invalid for {cur:?} -> {next:?} (required {required:#x}, optional {optional:#x})")]
    BadMask {
        cur: QpState,
        next: QpState,
        mask: u32,
        required: u32,
        optional: u32,
    },
}

/// Every attribute-mask bit the device knows.
pub const QP_ATTR_ALL: u32 = (1 << 21) - 1;

/// (required, optional) masks per type for one transition; `None` = transition not allowed.
#[derive(Clone, Copy)]
struct Masks {
    ud: (u32, u32),
    uc: (u32, u32),
    rc: (u32, u32),
    gsi: (u32, u32),
}

impl Masks {
    const NONE: Masks = Masks {
        ud: (0, 0),
        uc: (0, 0),
        rc: (0, 0),
        gsi: (0, 0),
    };
    fn for_type(&self, t: QpType) -> (u32, u32) {
        match t {
            QpType::Ud => self.ud,
            QpType::Uc => self.uc,
            QpType::Rc | QpType::XrcIni | QpType::XrcTgt => self.rc,
            QpType::Gsi => self.gsi,
        }
    }
}

/// Whether a transition exists for a type: SQE is only reachable by UD/UC/GSI (an RC QP never
/// enters SQE: send errors take it to ERR), so SQE → RTS is not valid for RC.
fn transition(cur: QpState, next: QpState, t: QpType) -> Option<(u32, u32)> {
    use QpState::*;
    const PKEY: u32 = VRDMA_QP_PKEY_INDEX;
    const PORT: u32 = VRDMA_QP_PORT;
    const QKEY: u32 = VRDMA_QP_QKEY;
    const ACC: u32 = VRDMA_QP_ACCESS_FLAGS;
    const CUR: u32 = VRDMA_QP_CUR_STATE;
    const ALT: u32 = VRDMA_QP_ALT_PATH;
    const MIG: u32 = VRDMA_QP_PATH_MIG_STATE;
    const RNR_T: u32 = VRDMA_QP_MIN_RNR_TIMER;
    let m: Masks = match (cur, next) {
        // Any state → RESET, and any state but RESET → ERR: no attributes (IBTA 10.3.1: a QP in
        // RESET cannot be moved to ERR).
        (Reset, Err) => return None,
        (_, Reset) | (_, Err) => Masks::NONE,
        (Reset, Init) => Masks {
            ud: (PKEY | PORT | QKEY, 0),
            uc: (PKEY | PORT | ACC, 0),
            rc: (PKEY | PORT | ACC, 0),
            gsi: (PKEY | QKEY, 0),
        },
        (Init, Init) => Masks {
            ud: (0, PKEY | PORT | QKEY),
            uc: (0, PKEY | PORT | ACC),
            rc: (0, PKEY | PORT | ACC),
            gsi: (0, PKEY | QKEY),
        },
        (Init, Rtr) => Masks {
            ud: (0, PKEY | QKEY),
            uc: (
                VRDMA_QP_AV | VRDMA_QP_PATH_MTU | VRDMA_QP_DEST_QPN | VRDMA_QP_RQ_PSN,
                ALT | ACC | PKEY,
            ),
            rc: (
                VRDMA_QP_AV
                    | VRDMA_QP_PATH_MTU
                    | VRDMA_QP_DEST_QPN
                    | VRDMA_QP_RQ_PSN
                    | VRDMA_QP_MAX_DEST_RD_ATOMIC
                    | RNR_T,
                ALT | ACC | PKEY,
            ),
            gsi: (0, PKEY | QKEY),
        },
        (Rtr, Rts) => Masks {
            ud: (VRDMA_QP_SQ_PSN, CUR | QKEY),
            uc: (VRDMA_QP_SQ_PSN, CUR | ALT | ACC | MIG),
            rc: (
                VRDMA_QP_TIMEOUT
                    | VRDMA_QP_RETRY_CNT
                    | VRDMA_QP_RNR_RETRY
                    | VRDMA_QP_SQ_PSN
                    | VRDMA_QP_MAX_QP_RD_ATOMIC,
                CUR | ALT | ACC | RNR_T | MIG,
            ),
            gsi: (VRDMA_QP_SQ_PSN, CUR | QKEY),
        },
        (Rts, Rts) | (Sqd, Rts) => Masks {
            ud: (0, CUR | QKEY),
            uc: (0, CUR | ACC | ALT | MIG),
            rc: (0, CUR | ACC | ALT | MIG | RNR_T),
            gsi: (0, CUR | QKEY),
        },
        (Rts, Sqd) => Masks {
            ud: (0, VRDMA_QP_EN_SQD_ASYNC_NOTIFY),
            uc: (0, VRDMA_QP_EN_SQD_ASYNC_NOTIFY),
            rc: (0, VRDMA_QP_EN_SQD_ASYNC_NOTIFY),
            gsi: (0, VRDMA_QP_EN_SQD_ASYNC_NOTIFY),
        },
        (Sqd, Sqd) => Masks {
            ud: (0, PKEY | QKEY),
            uc: (0, VRDMA_QP_AV | ALT | ACC | PKEY | MIG),
            rc: (
                0,
                PORT | VRDMA_QP_AV
                    | VRDMA_QP_TIMEOUT
                    | VRDMA_QP_RETRY_CNT
                    | VRDMA_QP_RNR_RETRY
                    | VRDMA_QP_MAX_QP_RD_ATOMIC
                    | VRDMA_QP_MAX_DEST_RD_ATOMIC
                    | ALT
                    | ACC
                    | PKEY
                    | RNR_T
                    | MIG,
            ),
            gsi: (0, PKEY | QKEY),
        },
        (Sqe, Rts) => {
            if matches!(t, QpType::Rc | QpType::XrcIni | QpType::XrcTgt) {
                return None;
            }
            Masks {
                ud: (0, CUR | QKEY),
                uc: (0, CUR | ACC),
                rc: (0, 0),
                gsi: (0, CUR | QKEY),
            }
        }
        _ => return None,
    };
    let (req, opt) = m.for_type(t);
    // The XRC types use RC's table except where Linux's `qp_state_table` (the masks ib_core
    // lets through for them) differs (spec §13.7): an XRC_INI has no receive side, an XRC_TGT
    // no send side.
    Some(match (t, cur, next) {
        (QpType::XrcIni, Init, Rtr) => (req & !(VRDMA_QP_MAX_DEST_RD_ATOMIC | RNR_T), opt),
        (QpType::XrcIni, Rtr, Rts) => (req, opt & !RNR_T),
        (QpType::XrcTgt, Rtr, Rts) => (VRDMA_QP_TIMEOUT | VRDMA_QP_SQ_PSN, opt),
        _ => (req, opt),
    })
}

/// Check a MODIFY_QP transition. `mask` is the full attribute mask (VRDMA_QP_STATE included or
/// not); `next` is the target state (== `cur` when VRDMA_QP_STATE is absent).
pub fn check_transition(
    cur: QpState,
    next: QpState,
    t: QpType,
    mask: u32,
) -> Result<(), StateError> {
    let (required, optional) =
        transition(cur, next, t).ok_or(StateError::IllegalTransition(cur, next))?;
    let attrs = mask & !VRDMA_QP_STATE;
    let bad = BadMaskHelper {
        cur,
        next,
        mask,
        required,
        optional,
    };
    if attrs & required != required {
        return Err(bad.err());
    }
    if attrs & !(required | optional) != 0 {
        return Err(bad.err());
    }
    Ok(())
}

struct BadMaskHelper {
    cur: QpState,
    next: QpState,
    mask: u32,
    required: u32,
    optional: u32,
}

impl BadMaskHelper {
    fn err(&self) -> StateError {
        StateError::BadMask {
            cur: self.cur,
            next: self.next,
            mask: self.mask,
            required: self.required,
            optional: self.optional,
        }
    }
}

/// Is `cur → next` a legal transition for type `t` (ignoring masks)? For tests and tools.
pub fn is_legal(cur: QpState, next: QpState, t: QpType) -> bool {
    transition(cur, next, t).is_some()
}

/// The (required, optional) masks of a legal transition (tests and tools).
pub fn masks(cur: QpState, next: QpState, t: QpType) -> Option<(u32, u32)> {
    transition(cur, next, t)
}
