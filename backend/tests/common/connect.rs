//! QP state transitions as a driver's connection setup makes them: INIT, RTR, RTS.

use vrdma_spec::*;

use super::{Node, QpH};

/// The attributes `connect` and `rts` set on the way to RTS besides the peer: path MTU (IBTA
/// enum), local ACK timeout, retry and RNR retry counts.
#[derive(Debug, Clone, Copy)]
pub struct RtsAttrs {
    pub mtu: u32,
    pub timeout: u8,
    pub retry: u8,
    pub rnr_retry: u8,
}

impl RtsAttrs {
    /// Path MTU enum `mtu`, timeout 14 (67 ms: robust against a loaded host starving an engine
    /// thread), retry and RNR retry 7 (infinite RNR retry).
    pub fn mtu(mtu: u32) -> RtsAttrs {
        RtsAttrs {
            mtu,
            timeout: 14,
            retry: 7,
            rnr_retry: 7,
        }
    }

    setters! {
        /// Local ACK timeout (IBTA 4.096 µs · 2^timeout; default 14).
        timeout: u8;
    }
}

/// Bring an RC/UC pair to RTS (IBTA 10.3.1 transitions with the usual attribute masks); A's
/// send PSN is 1000, B's 5000.
pub fn connect(a: &mut Node, qa: &QpH, b: &mut Node, qb: &QpH, attrs: RtsAttrs) {
    let (ava, avb) = (a.av_to(b), b.av_to(a));
    rts(a, qa, qb.qpn, ava, attrs, (1000, 5000));
    rts(b, qb, qa.qpn, avb, attrs, (5000, 1000));
}

/// Take QP `q` of `n` through INIT and RTR to RTS towards QP `dest` at `av`, with `attrs` and
/// `(sq_psn, rq_psn)`.
pub fn rts(
    n: &mut Node,
    q: &QpH,
    dest: u32,
    av: VrdmaAv,
    attrs: RtsAttrs,
    (sq_psn, rq_psn): (u32, u32),
) {
    let RtsAttrs {
        mtu,
        timeout,
        retry,
        rnr_retry,
    } = attrs;
    let rc = q.qp_type == VRDMA_QPT_RC;
    let mut a = VrdmaQpAttr {
        qp_state: VRDMA_QPS_INIT,
        // Every remote right, the flush ones included (as rdma-core's pyverbs tests do).
        qp_access_flags: VRDMA_ACCESS_REMOTE_WRITE
            | VRDMA_ACCESS_REMOTE_READ
            | VRDMA_ACCESS_REMOTE_ATOMIC
            | VRDMA_ACCESS_FLUSH_GLOBAL
            | VRDMA_ACCESS_FLUSH_PERSISTENT,
        port_num: 1,
        ..Default::default()
    };
    let acc = if rc {
        VRDMA_QP_ACCESS_FLAGS
    } else {
        a.qp_access_flags = VRDMA_ACCESS_REMOTE_WRITE;
        VRDMA_QP_ACCESS_FLAGS
    };
    n.modify_qp(
        q.qpn,
        VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | acc,
        a,
    )
    .expect("INIT");
    a.qp_state = VRDMA_QPS_RTR;
    a.av = av;
    a.path_mtu = mtu;
    a.dest_qp_num = dest;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    let mut m =
        VRDMA_QP_STATE | VRDMA_QP_AV | VRDMA_QP_PATH_MTU | VRDMA_QP_DEST_QPN | VRDMA_QP_RQ_PSN;
    if rc {
        m |= VRDMA_QP_MAX_DEST_RD_ATOMIC | VRDMA_QP_MIN_RNR_TIMER;
    }
    n.modify_qp(q.qpn, m, a).expect("RTR");
    a.qp_state = VRDMA_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = timeout;
    a.retry_cnt = retry;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = 16;
    let mut m = VRDMA_QP_STATE | VRDMA_QP_SQ_PSN;
    if rc {
        m |= VRDMA_QP_TIMEOUT | VRDMA_QP_RETRY_CNT | VRDMA_QP_RNR_RETRY | VRDMA_QP_MAX_QP_RD_ATOMIC;
    }
    n.modify_qp(q.qpn, m, a).expect("RTS");
}

/// UD/GSI QP to RTS.
pub fn ud_rts(n: &mut Node, q: &QpH, qkey: u32) {
    let mut a = VrdmaQpAttr {
        qp_state: VRDMA_QPS_INIT,
        qkey,
        port_num: 1,
        ..Default::default()
    };
    // GSI: PKEY_INDEX + QKEY; UD additionally PORT (ib_modify_qp_is_ok's table).
    let port = if q.qp_type == VRDMA_QPT_GSI {
        0
    } else {
        VRDMA_QP_PORT
    };
    n.modify_qp(
        q.qpn,
        VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | port | VRDMA_QP_QKEY,
        a,
    )
    .expect("UD INIT");
    a.qp_state = VRDMA_QPS_RTR;
    n.modify_qp(q.qpn, VRDMA_QP_STATE, a).expect("UD RTR");
    a.qp_state = VRDMA_QPS_RTS;
    a.sq_psn = 7;
    n.modify_qp(q.qpn, VRDMA_QP_STATE | VRDMA_QP_SQ_PSN, a)
        .expect("UD RTS");
}

/// Connect QPs `q1` and `q2` of one node to each other (send PSNs 100 and 200).
pub fn connect_loopback(n: &mut Node, q1: &QpH, q2: &QpH, attrs: RtsAttrs) {
    let av = n.av_to(n);
    rts(n, q1, q2.qpn, av, attrs, (100, 200));
    rts(n, q2, q1.qpn, av, attrs, (200, 100));
}
