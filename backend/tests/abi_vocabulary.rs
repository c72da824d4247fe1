//! One ABI vocabulary: where the backend keeps a short name or a derived value of an ABI fact,
//! it equals the `vrdma_spec` definition, and two layers that need the same rule share one
//! function instead of two copies that can drift apart (issue #13 item 7: `can_send` and the MTU
//! fallback had drifted).

use std::mem::offset_of;

use vrdma_backend::guest::ring::{CTRL_CONSUMER, CTRL_CQ_ARM, CTRL_ERROR, CTRL_PRODUCER};
use vrdma_backend::objects::cq::CQE_SHIFT;
use vrdma_backend::qp::path_mtu_bytes;
use vrdma_backend::transport::ctx;
use vrdma_spec::*;

/// The transport's enum -> bytes is the QP's, fallback included (it used to answer 1024 for an
/// unset `path_mtu` where the QP answered 256).
#[test]
fn one_mtu_table_with_one_fallback() {
    for e in 0..=8 {
        assert_eq!(ctx::mtu_bytes(e), path_mtu_bytes(e), "MTU enum {e}");
        if let Some(b) = ib_mtu_to_bytes(e) {
            assert_eq!(path_mtu_bytes(e), b);
        }
    }
    assert_eq!(path_mtu_bytes(0), 256);
}

/// Values the backend derives from the spec's layout rather than restating.
#[test]
fn derived_layout_values_match_the_spec() {
    assert_eq!(CTRL_PRODUCER, offset_of!(VrdmaRingCtrl, producer) as u64);
    assert_eq!(CTRL_CONSUMER, offset_of!(VrdmaRingCtrl, consumer) as u64);
    assert_eq!(CTRL_CQ_ARM, offset_of!(VrdmaRingCtrl, cq_arm) as u64);
    assert_eq!(CTRL_ERROR, offset_of!(VrdmaRingCtrl, error) as u64);
    assert_eq!(1u32 << CQE_SHIFT, VRDMA_CQE_SIZE);
    assert_eq!(VRDMA_CQE_SIZE as usize, std::mem::size_of::<VrdmaCqe>());
}

/// The transport's short names are the spec's values (a sample of each family).
#[test]
fn transport_short_names_are_the_spec_values() {
    use ctx::abi::*;
    use vrdma_backend::qp::{QpState, QpType};
    assert_eq!(WR_SEND_WITH_INV, VRDMA_WR_SEND_WITH_INV);
    assert_eq!(WC_RECV_RDMA_WITH_IMM, VRDMA_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(WC_GENERAL_ERR, VRDMA_WC_GENERAL_ERR);
    assert_eq!(EV_QP_LAST_WQE_REACHED, VRDMA_EV_QP_LAST_WQE_REACHED);
    assert_eq!(DB_CQ_ARM, VRDMA_DB_CQ_ARM);
    assert_eq!(ACCESS_REMOTE_ATOMIC, VRDMA_ACCESS_REMOTE_ATOMIC);
    assert_eq!(QpType::Ud.as_u32(), VRDMA_QPT_UD);
    assert_eq!(QpState::Err.as_u32(), VRDMA_QPS_ERR);
    assert_eq!(ctx::GSI_QKEY, VRDMA_GSI_QKEY);
    assert_eq!(ctx::NO_VLAN, VRDMA_VLAN_NONE);
}

/// §13.4 rule 4: QP access flags are the remote rights and LOCAL_WRITE, not the MR-only bits.
#[test]
fn qp_access_flags_are_the_spec_set() {
    assert_eq!(
        VRDMA_QP_ACCESS_ALLOWED,
        VRDMA_ACCESS_LOCAL_WRITE
            | VRDMA_ACCESS_REMOTE_WRITE
            | VRDMA_ACCESS_REMOTE_READ
            | VRDMA_ACCESS_REMOTE_ATOMIC
            | VRDMA_ACCESS_FLUSH_GLOBAL
            | VRDMA_ACCESS_FLUSH_PERSISTENT
    );
    for mr_only in [
        VRDMA_ACCESS_MW_BIND,
        VRDMA_ACCESS_ZERO_BASED,
        VRDMA_ACCESS_ON_DEMAND,
    ] {
        assert_eq!(VRDMA_QP_ACCESS_ALLOWED & mr_only, 0);
    }
}
