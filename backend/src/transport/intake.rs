//! Packet intake (IBTA Vol. 1 9.6, packet transport header validation; Linux rxe's
//! `rxe_recv.c`): the checks a parsed packet passes before the responder or the completer sees
//! it. Everything here drops silently (spec §14.6) and counts the drop in the port's
//! [`PortStats`] (`vrdma_port_drops_total` on the stats socket).
//!
//! Order (spec §14.6): destination QP exists → transport of the opcode matches the QP's service
//! type → P_Key → (RC/UC) source and destination GID equal the QP's path. The Q_Key of UD/GSI is
//! checked by the responder (it needs the DETH of a request).

use super::ctx::QpCtx;
use super::packet::RxPkt;
use crate::qp::QpType;
use crate::stats::PortStats;
use crate::wire::DEFAULT_PKEY;
use std::sync::atomic::AtomicU64;

/// The port's P_Key table (spec §15.3): one entry, the default partition with full membership.
/// `pkey_index` 0 is the only index MODIFY_QP accepts (spec §13.2).
pub const PKEY_TABLE: [u16; 1] = [DEFAULT_PKEY];

/// Membership bit of a P_Key (IBTA 10.9: set = full member, clear = limited member).
const PKEY_FULL: u16 = 0x8000;

/// Why a packet was dropped at intake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxDrop {
    /// No QP with the BTH's destination QPN.
    UnknownQp,
    /// The opcode belongs to another transport than the QP's service type (IBTA 9.6).
    WrongTransport,
    /// P_Key mismatch (IBTA 9.6, 10.9).
    BadPkey,
    /// RC/UC: source GID ≠ the QP's destination GID, or destination GID ≠ its source GID
    /// (IBTA 9.6, connected service types), or the QP has no path yet.
    BadAddress,
}

impl RxDrop {
    /// The port counter this drop is counted in (spec §14.6: "a counter MAY be incremented").
    pub fn counter(self, p: &PortStats) -> &AtomicU64 {
        match self {
            RxDrop::UnknownQp => &p.drop_unknown_qp,
            RxDrop::WrongTransport => &p.drop_qp_state,
            RxDrop::BadPkey => &p.drop_bad_pkey,
            RxDrop::BadAddress => &p.drop_bad_address,
        }
    }
}

/// IBTA 10.9 P_Key match: the low 15 bits are equal and not 0 (0x0000 / 0x8000 are the invalid
/// P_Key), and at least one of the two is a full member (two limited members may not talk).
pub fn pkey_match(pkt: u16, ours: u16) -> bool {
    let (a, b) = (pkt & !PKEY_FULL, ours & !PKEY_FULL);
    a != 0 && a == b && (pkt | ours) & PKEY_FULL != 0
}

/// The P_Key check of IBTA 9.6 for a packet to `c`'s QP. The GSI QP (QP1) is shared by every
/// partition: a packet matches if its P_Key matches any entry of the port's table (IBTA 9.6, the
/// QP1 exception). Other QPs compare with the entry their `pkey_index` names.
fn pkey_ok(c: &QpCtx, pkey: u16) -> bool {
    if c.qp_type == QpType::Gsi {
        PKEY_TABLE.iter().any(|&k| pkey_match(pkey, k))
    } else {
        c.pkey.is_some_and(|k| pkey_match(pkey, k))
    }
}

/// Connected service types accept only packets of their peer (IBTA 9.6: the source address
/// must be the QP's destination and the destination address its source; Linux rxe's
/// `check_addr`). A QP without a path (no AV yet) accepts nothing.
fn addr_ok(c: &QpCtx, pkt: &RxPkt<'_>) -> bool {
    c.path
        .as_ref()
        .is_some_and(|p| pkt.sgid == p.dgid && pkt.dgid == p.sgid)
}

/// Every intake check for a packet whose destination QP is `c` (see the module doc).
pub fn check(c: &QpCtx, pkt: &RxPkt<'_>) -> Result<(), RxDrop> {
    // `is_rc` also covers the XRC types, so compare the transport itself. An XRC_INI has no
    // receive side and an XRC_TGT no send side (spec §13.7): each takes one direction only.
    let ok = pkt.info.transport == c.transport()
        && match c.qp_type {
            QpType::XrcIni => pkt.info.is_response(),
            QpType::XrcTgt => pkt.info.is_request(),
            _ => true,
        };
    if !ok {
        return Err(RxDrop::WrongTransport);
    }
    if !pkey_ok(c, pkt.bth.pkey) {
        return Err(RxDrop::BadPkey);
    }
    if (c.is_rc() || c.is_uc()) && !addr_ok(c, pkt) {
        return Err(RxDrop::BadAddress);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkey_rules_follow_ibta_10_9() {
        // full/full, limited/full, full/limited: accepted.
        assert!(pkey_match(0xffff, 0xffff));
        assert!(pkey_match(0x7fff, 0xffff));
        assert!(pkey_match(0xffff, 0x7fff));
        assert!(pkey_match(0x9234, 0x1234));
        // limited/limited: dropped.
        assert!(!pkey_match(0x7fff, 0x7fff));
        assert!(!pkey_match(0x1234, 0x1234));
        // Other partition.
        assert!(!pkey_match(0x1234, 0xffff));
        assert!(!pkey_match(0xfffe, 0xffff));
        // The invalid P_Key never matches, not even itself.
        assert!(!pkey_match(0x8000, 0x8000));
        assert!(!pkey_match(0x0000, 0x8000));
    }
}
