//! QP state machine through MODIFY_QP: every legal transition accepted with its required mask,
//! illegal transitions → BAD_STATE, missing / extra attributes → INVALID, attribute ranges.

mod common;

use common::*;
use vrdma_backend::qp::state::{is_legal, masks, QpState, QpType};
use vrdma_spec::*;

fn full_attr(cur: QpState, next: QpState) -> VrdmaQpAttr {
    VrdmaQpAttr {
        qp_state: next.as_u32(),
        cur_qp_state: cur.as_u32(),
        path_mtu: 3,
        qkey: 0x1234,
        rq_psn: 100,
        sq_psn: 200,
        dest_qp_num: 17,
        qp_access_flags: VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_WRITE,
        pkey_index: 0,
        en_sqd_async_notify: 1,
        sq_draining: 0,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        port_num: 1,
        reserved0: 0,
        max_send_wr: 0,
        max_recv_wr: 0,
        max_send_sge: 0,
        max_recv_sge: 0,
        max_inline_data: 0,
        reserved1: 0,
        av: av_to_host(2),
    }
}

type AttrFn = Box<dyn Fn(&mut VrdmaQpAttr)>;

const TYPES: [(u32, QpType); 4] = [
    (VRDMA_QPT_RC, QpType::Rc),
    (VRDMA_QPT_UC, QpType::Uc),
    (VRDMA_QPT_UD, QpType::Ud),
    (VRDMA_QPT_GSI, QpType::Gsi),
];

struct Fixture {
    env: Node,
    pd: u32,
    cq: u32,
}

fn fixture() -> Fixture {
    let mut env = Node::bare();
    env.add_gid_v4(0, 1);
    let pd = env.create_pd();
    let (cq, _) = env.create_cq(64);
    Fixture { env, pd, cq }
}

impl Fixture {
    fn qp_in(&mut self, t: u32, st: QpState) -> u32 {
        let qpn = self.env.small_qp(self.pd, t, self.cq, None);
        self.env.dev.qps.get_mut(qpn).unwrap().state = st;
        qpn
    }
    fn destroy(&mut self, qpn: u32) {
        let (s, _) = self.env.cmd_status(VRDMA_CMD_DESTROY_QP, &h(qpn));
        assert_eq!(s, VRDMA_STATUS_OK);
    }
}

#[test]
fn every_legal_transition_accepted_with_required_mask() {
    let mut f = fixture();
    let mut legal = 0;
    for (t, qt) in TYPES {
        for cur in QpState::ALL {
            for next in QpState::ALL {
                let qpn = f.qp_in(t, cur);
                let st = match masks(cur, next, qt) {
                    Some((req, _)) => {
                        legal += 1;
                        let s =
                            f.env
                                .modify_status(qpn, VRDMA_QP_STATE | req, full_attr(cur, next));
                        assert_eq!(s, VRDMA_STATUS_OK, "{qt:?} {cur:?}->{next:?}");
                        assert_eq!(f.env.query_qp_state(qpn), next.as_u32());
                        s
                    }
                    None => {
                        let s = f
                            .env
                            .modify_status(qpn, VRDMA_QP_STATE, full_attr(cur, next));
                        assert_eq!(s, VRDMA_STATUS_BAD_STATE, "{qt:?} {cur:?}->{next:?}");
                        assert_eq!(f.env.query_qp_state(qpn), cur.as_u32(), "state unchanged");
                        s
                    }
                };
                let _ = st;
                f.destroy(qpn);
            }
        }
    }
    assert!(legal > 60, "table has {legal} legal transitions");
}

#[test]
fn optional_attributes_accepted_missing_and_extra_rejected() {
    let mut f = fixture();
    for (t, qt) in TYPES {
        for cur in QpState::ALL {
            for next in QpState::ALL {
                let Some((req, opt)) = masks(cur, next, qt) else {
                    continue;
                };
                // Required + all optional.
                let qpn = f.qp_in(t, cur);
                let s = f
                    .env
                    .modify_status(qpn, VRDMA_QP_STATE | req | opt, full_attr(cur, next));
                assert_eq!(s, VRDMA_STATUS_OK, "{qt:?} {cur:?}->{next:?} with optional");
                f.destroy(qpn);
                // Each required bit missing.
                for bit in 0..21 {
                    let b = 1u32 << bit;
                    if req & b == 0 {
                        continue;
                    }
                    let qpn = f.qp_in(t, cur);
                    let s =
                        f.env
                            .modify_status(qpn, VRDMA_QP_STATE | (req & !b), full_attr(cur, next));
                    assert_eq!(
                        s, VRDMA_STATUS_INVALID,
                        "{qt:?} {cur:?}->{next:?} missing {b:#x}"
                    );
                    assert_eq!(f.env.query_qp_state(qpn), cur.as_u32());
                    f.destroy(qpn);
                }
                // Each bit that is neither required nor optional.
                for bit in 1..21 {
                    let b = 1u32 << bit;
                    if (req | opt) & b != 0 {
                        continue;
                    }
                    let qpn = f.qp_in(t, cur);
                    let s =
                        f.env
                            .modify_status(qpn, VRDMA_QP_STATE | req | b, full_attr(cur, next));
                    assert_eq!(
                        s, VRDMA_STATUS_INVALID,
                        "{qt:?} {cur:?}->{next:?} extra {b:#x}"
                    );
                    f.destroy(qpn);
                }
            }
        }
    }
}

#[test]
fn table_matches_ibta_facts() {
    // A few anchors of the IBTA table.
    assert!(!is_legal(QpState::Reset, QpState::Rtr, QpType::Rc));
    assert!(!is_legal(QpState::Reset, QpState::Err, QpType::Rc));
    assert!(!is_legal(QpState::Init, QpState::Rts, QpType::Rc));
    assert!(!is_legal(QpState::Sqe, QpState::Rts, QpType::Rc));
    assert!(is_legal(QpState::Sqe, QpState::Rts, QpType::Ud));
    assert!(!is_legal(QpState::Rtr, QpState::Rtr, QpType::Rc));
    assert!(is_legal(QpState::Err, QpState::Reset, QpType::Uc));
    let (req, _) = masks(QpState::Init, QpState::Rtr, QpType::Rc).unwrap();
    assert_eq!(
        req,
        VRDMA_QP_AV
            | VRDMA_QP_PATH_MTU
            | VRDMA_QP_DEST_QPN
            | VRDMA_QP_RQ_PSN
            | VRDMA_QP_MAX_DEST_RD_ATOMIC
            | VRDMA_QP_MIN_RNR_TIMER
    );
    let (req, _) = masks(QpState::Reset, QpState::Init, QpType::Ud).unwrap();
    assert_eq!(req, VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_QKEY);
    let (req, _) = masks(QpState::Rtr, QpState::Rts, QpType::Rc).unwrap();
    assert_eq!(
        req,
        VRDMA_QP_TIMEOUT
            | VRDMA_QP_RETRY_CNT
            | VRDMA_QP_RNR_RETRY
            | VRDMA_QP_SQ_PSN
            | VRDMA_QP_MAX_QP_RD_ATOMIC
    );
}

/// Bring an RC QP to RTS through the ordinary path and check queried attributes.
#[test]
fn rc_to_rts_and_query() {
    let mut f = fixture();
    let qpn = f.qp_in(VRDMA_QPT_RC, QpState::Reset);
    let steps = [
        (QpState::Reset, QpState::Init),
        (QpState::Init, QpState::Rtr),
        (QpState::Rtr, QpState::Rts),
    ];
    for (cur, next) in steps {
        let (req, _) = masks(cur, next, QpType::Rc).unwrap();
        assert_eq!(
            f.env
                .modify_status(qpn, VRDMA_QP_STATE | req, full_attr(cur, next)),
            VRDMA_STATUS_OK
        );
    }
    let (s, r) = f.env.cmd_status(VRDMA_CMD_QUERY_QP, &h(qpn));
    assert_eq!(s, VRDMA_STATUS_OK);
    let a = VrdmaQpAttr::read_from(&r).unwrap();
    assert_eq!(a.qp_state, VRDMA_QPS_RTS);
    assert_eq!(a.sq_psn, 200);
    assert_eq!(a.rq_psn, 100);
    assert_eq!(a.dest_qp_num, 17);
    assert_eq!(a.path_mtu, 3);
    assert_eq!(a.av.dgid, gid_v4([10, 0, 0, 2]));
    assert_eq!(a.max_send_wr, 16);
    let qp = f.env.dev.qps.get(qpn).unwrap();
    assert_eq!(qp.attrs.sgid, gid_v4([10, 0, 0, 1]), "source GID resolved");
    assert_eq!(qp.req.psn, 200, "transport's requester PSN set");
    drop(qp);
    // RTS -> SQD -> RTS, then to ERR and RESET.
    assert_eq!(
        f.env
            .modify_status(qpn, VRDMA_QP_STATE, full_attr(QpState::Rts, QpState::Sqd)),
        VRDMA_STATUS_OK
    );
    assert!(f.env.dev.qps.get(qpn).unwrap().sq_draining);
    assert_eq!(
        f.env
            .modify_status(qpn, VRDMA_QP_STATE, full_attr(QpState::Sqd, QpState::Rts)),
        VRDMA_STATUS_OK
    );
    assert_eq!(
        f.env
            .modify_status(qpn, VRDMA_QP_STATE, full_attr(QpState::Rts, QpState::Err)),
        VRDMA_STATUS_OK
    );
    assert_eq!(
        f.env
            .modify_status(qpn, VRDMA_QP_STATE, full_attr(QpState::Err, QpState::Reset)),
        VRDMA_STATUS_OK
    );
    let qp = f.env.dev.qps.get(qpn).unwrap();
    assert_eq!(qp.attrs.path_mtu, 0, "RESET clears attributes");
    assert_eq!(qp.req.psn, 0, "RESET resets transport state");
}

#[test]
fn attribute_range_checks() {
    let mut f = fixture();
    let (req, _) = masks(QpState::Init, QpState::Rtr, QpType::Rc).unwrap();
    let bad: Vec<(&str, AttrFn)> = vec![
        ("mtu 0", Box::new(|a| a.path_mtu = 0)),
        ("mtu 6", Box::new(|a| a.path_mtu = 6)),
        (
            "mtu above port (1500 -> 1024)",
            Box::new(|a| a.path_mtu = 4),
        ),
        ("rq_psn > 24 bits", Box::new(|a| a.rq_psn = 1 << 24)),
        ("dest qpn > 24 bits", Box::new(|a| a.dest_qp_num = 1 << 24)),
        (
            "max_dest_rd_atomic",
            Box::new(|a| a.max_dest_rd_atomic = 17),
        ),
        ("min_rnr_timer", Box::new(|a| a.min_rnr_timer = 32)),
        ("sgid index empty", Box::new(|a| a.av.sgid_index = 5)),
        (
            "sgid index out of table",
            Box::new(|a| a.av.sgid_index = 200),
        ),
        (
            "dgid family",
            Box::new(|a| a.av.dgid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        ),
        ("dgid zero", Box::new(|a| a.av.dgid = [0; 16])),
        ("flow label", Box::new(|a| a.av.flow_label = 1 << 20)),
        ("vlan", Box::new(|a| a.av.vlan_id = 4096)),
    ];
    for (what, m) in bad {
        let qpn = f.qp_in(VRDMA_QPT_RC, QpState::Init);
        let mut a = full_attr(QpState::Init, QpState::Rtr);
        m(&mut a);
        assert_eq!(
            f.env.modify_status(qpn, VRDMA_QP_STATE | req, a),
            VRDMA_STATUS_INVALID,
            "{what}"
        );
        assert_eq!(
            f.env.query_qp_state(qpn),
            VRDMA_QPS_INIT,
            "{what}: unchanged"
        );
        f.destroy(qpn);
    }
    // RTR -> RTS ranges.
    let (req, _) = masks(QpState::Rtr, QpState::Rts, QpType::Rc).unwrap();
    let bad2: Vec<AttrFn> = vec![
        Box::new(|a| a.timeout = 32),
        Box::new(|a| a.retry_cnt = 8),
        Box::new(|a| a.rnr_retry = 8),
        Box::new(|a| a.max_rd_atomic = 17),
        Box::new(|a| a.sq_psn = 1 << 24),
        Box::new(|a| a.cur_qp_state = VRDMA_QPS_INIT),
        Box::new(|a| a.cur_qp_state = 99),
    ];
    for m in bad2 {
        let qpn = f.qp_in(VRDMA_QPT_RC, QpState::Rtr);
        let mut a = full_attr(QpState::Rtr, QpState::Rts);
        m(&mut a);
        assert_eq!(
            f.env
                .modify_status(qpn, VRDMA_QP_STATE | VRDMA_QP_CUR_STATE | req, a),
            VRDMA_STATUS_INVALID
        );
        f.destroy(qpn);
    }
    // RESET -> INIT: port and pkey index, access flags, unknown mask bits, unknown state.
    let (req, _) = masks(QpState::Reset, QpState::Init, QpType::Rc).unwrap();
    let bad3: Vec<(u32, AttrFn)> = vec![
        (0, Box::new(|a| a.port_num = 2)),
        (0, Box::new(|a| a.pkey_index = 1)),
        (0, Box::new(|a| a.qp_access_flags = 1 << 7)),
        // MR-only bits are not QP access flags (spec §13.4 rule 4).
        (0, Box::new(|a| a.qp_access_flags = VRDMA_ACCESS_MW_BIND)),
        (0, Box::new(|a| a.qp_access_flags = VRDMA_ACCESS_ZERO_BASED)),
        (0, Box::new(|a| a.qp_access_flags |= VRDMA_ACCESS_ON_DEMAND)),
        (1 << 25, Box::new(|_| {})),
        (0, Box::new(|a| a.qp_state = 7)),
    ];
    for (extra, m) in bad3 {
        let qpn = f.qp_in(VRDMA_QPT_RC, QpState::Reset);
        let mut a = full_attr(QpState::Reset, QpState::Init);
        m(&mut a);
        assert_eq!(
            f.env.modify_status(qpn, VRDMA_QP_STATE | req | extra, a),
            VRDMA_STATUS_INVALID
        );
        f.destroy(qpn);
    }
    // Unknown QP.
    assert_eq!(
        f.env.modify_status(
            12345,
            VRDMA_QP_STATE,
            full_attr(QpState::Reset, QpState::Reset)
        ),
        VRDMA_STATUS_NOT_FOUND
    );
    // Non-RoCEv2 source GID.
    let c = VrdmaCmdGid {
        index: 3,
        type_: VRDMA_GID_TYPE_ROCE_V1,
        gid: gid_v4([10, 0, 0, 9]),
    };
    assert_eq!(
        f.env.cmd_status(VRDMA_CMD_ADD_GID, c.as_bytes()).0,
        VRDMA_STATUS_OK
    );
    let qpn = f.qp_in(VRDMA_QPT_RC, QpState::Init);
    let mut a = full_attr(QpState::Init, QpState::Rtr);
    a.av.sgid_index = 3;
    let (req, _) = masks(QpState::Init, QpState::Rtr, QpType::Rc).unwrap();
    assert_eq!(
        f.env.modify_status(qpn, VRDMA_QP_STATE | req, a),
        VRDMA_STATUS_INVALID
    );
}

#[test]
fn to_error_calls_flush_hook() {
    use std::sync::atomic::{AtomicU32, Ordering};
    static FLUSHED: AtomicU32 = AtomicU32::new(0);
    fn hook(_d: &vrdma_backend::device::Device, qpn: u32) {
        FLUSHED.store(qpn, Ordering::SeqCst);
    }
    let mut f = fixture();
    f.env.dev.flush_hook = Some(hook);
    let qpn = f.qp_in(VRDMA_QPT_UD, QpState::Rts);
    assert_eq!(
        f.env
            .modify_status(qpn, VRDMA_QP_STATE, full_attr(QpState::Rts, QpState::Err)),
        VRDMA_STATUS_OK
    );
    assert_eq!(FLUSHED.load(Ordering::SeqCst), qpn);
}
