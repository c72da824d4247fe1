//! Drain and flush (IBTA 10.3.1 / 11.2.1.2, spec §13.3): what Linux's `ib_drain_qp()`,
//! `ib_drain_sq()` and `ib_drain_rq()` rely on. They move the QP to ERROR, post one more WR and
//! wait for its WR_FLUSH_ERR completion, so every WQE posted in ERROR must be flushed once the
//! device hears of it, and in order behind the WQEs flushed on entry to ERROR.

mod common;

use std::time::Duration;

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

const T: Duration = Duration::from_secs(30);

/// An RC pair at RTS with a 4 ms ACK timeout.
fn pair() -> RcPair {
    RcPair::new().timeout(10).build()
}

fn write(p: &RcPair, wr_id: u64) -> Wqe {
    rdma(wr_id, VRDMA_WR_RDMA_WRITE, (p.src, 100, p.ka), p.dst, p.kb)
}

/// Post [`write`]s with the ids `wr_ids` on A.
fn post_writes(p: &mut RcPair, wr_ids: std::ops::RangeInclusive<u64>) {
    for id in wr_ids {
        let w = write(p, id);
        p.post(&w);
    }
}

fn ids(c: &[Cqe]) -> Vec<(u64, u8, u8)> {
    c.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect()
}

#[test]
fn receive_posted_in_error_is_flushed_on_the_rq_doorbell() {
    let mut p = pair();
    p.recv_b(10, 0, 64);
    let qb = p.qb.qpn;
    p.b.qp_to_err(qb);
    let first = p.b.poll_cq(&mut p.cqb);
    assert_eq!(
        ids(&first),
        vec![(10, VRDMA_WC_WR_FLUSH_ERR, VRDMA_WC_RECV)]
    );
    // ib_drain_rq(): one more receive, then the RQ doorbell.
    p.recv_b(11, 0, 64);
    assert!(
        p.b.poll_cq(&mut p.cqb).is_empty(),
        "nothing before the doorbell"
    );
    p.b.ring_doorbell(VRDMA_DB_RQ, qb);
    let drained = p.b.poll_cq(&mut p.cqb);
    assert_eq!(
        ids(&drained),
        vec![(11, VRDMA_WC_WR_FLUSH_ERR, VRDMA_WC_RECV)]
    );
    // A second doorbell with nothing new posted writes nothing.
    p.b.ring_doorbell(VRDMA_DB_RQ, qb);
    assert!(p.b.poll_cq(&mut p.cqb).is_empty());
}

#[test]
fn rq_doorbell_outside_error_consumes_nothing() {
    let mut p = pair();
    p.recv_b(20, 0, 64);
    let qb = p.qb.qpn;
    p.b.ring_doorbell(VRDMA_DB_RQ, qb);
    assert!(p.b.poll_cq(&mut p.cqb).is_empty());
    // The receive is still there for a SEND.
    let w = send(1, (p.src, 32, p.ka));
    p.post(&w);
    let mut got = Vec::new();
    let cqb = &mut p.cqb;
    pump_until(&mut p.a, &mut p.b, &mut p.link, T, |_, b| {
        got.extend(b.poll_cq(cqb));
        !got.is_empty()
    });
    assert_eq!(ids(&got), vec![(20, VRDMA_WC_SUCCESS, VRDMA_WC_RECV)]);
}

#[test]
fn send_posted_in_error_is_flushed_on_the_sq_doorbell() {
    let mut p = pair();
    let qa = p.qa.qpn;
    p.a.qp_to_err(qa);
    // ib_drain_sq(): an unsignaled-looking marker still completes (error CQEs are always written).
    let mut w = write(&p, 30);
    w.flags = 0;
    p.post(&w);
    let c = p.a.poll_cq(&mut p.cqa);
    assert_eq!(
        ids(&c),
        vec![(30, VRDMA_WC_WR_FLUSH_ERR, VRDMA_WC_RDMA_WRITE)]
    );
}

#[test]
fn drain_qp_with_work_in_flight_flushes_everything_in_order() {
    let mut p = pair();
    // Sends in flight (never acknowledged: the link is not pumped) and receives posted on A.
    post_writes(&mut p, 1..=4);
    p.recv_a(100, 0, 64);
    p.recv_a(101, 0, 64);
    assert!(!p.a.dev.outbox(0).frames.is_empty(), "the writes went out");
    let qa = p.qa.qpn;
    // ib_drain_qp(): to ERROR, then a marker send and a marker receive, each with its doorbell.
    p.a.qp_to_err(qa);
    let w = write(&p, 5);
    p.post(&w);
    p.recv_a(102, 0, 64);
    p.a.ring_doorbell(VRDMA_DB_RQ, qa);
    let c = p.a.poll_cq(&mut p.cqa);
    let sends: Vec<_> = c.iter().filter(|c| c.opcode != VRDMA_WC_RECV).collect();
    let recvs: Vec<_> = c.iter().filter(|c| c.opcode == VRDMA_WC_RECV).collect();
    assert_eq!(
        sends
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        (1..=5)
            .map(|i| (i, VRDMA_WC_WR_FLUSH_ERR))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        recvs
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        vec![
            (100, VRDMA_WC_WR_FLUSH_ERR),
            (101, VRDMA_WC_WR_FLUSH_ERR),
            (102, VRDMA_WC_WR_FLUSH_ERR)
        ]
    );
    // The late ACKs of the flushed writes complete nothing more.
    pump_idle(&mut p.a, &mut p.b, &mut p.link);
    assert!(p.a.poll_cq(&mut p.cqa).is_empty());
}

#[test]
fn srq_qp_drain_leaves_srq_wqes_and_reports_last_wqe_once() {
    let mut p = RcPair::new().timeout(10).srq_b().build();
    let (srqn, mut ring) = p.srq_b.take().expect("srq");
    let (dst, kb) = (p.dst, p.kb);
    p.b.post_recv(&mut ring, 40, &[(dst, 64, kb)]);
    p.b.post_recv(&mut ring, 41, &[(dst, 64, kb)]);
    let qb = p.qb.qpn;
    p.b.events();
    p.b.qp_to_err(qb);
    // RQ doorbells of an SRQ QP in ERROR (a driver may ring them) change nothing.
    p.b.ring_doorbell(VRDMA_DB_RQ, qb);
    p.b.ring_doorbell(VRDMA_DB_RQ, qb);
    assert!(
        p.b.poll_cq(&mut p.cqb).is_empty(),
        "SRQ WQEs belong to the SRQ, not to the QP"
    );
    let last: Vec<_> =
        p.b.events()
            .into_iter()
            .filter(|e| e.type_ == VRDMA_EV_QP_LAST_WQE_REACHED)
            .collect();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].id, qb);
    // The device consumed neither SRQ WQE (spec §4: the consumer index is the device's).
    let consumer = p.b.mem.load_u32_acquire(ring.ctrl() + 64).unwrap();
    assert_eq!(consumer, 0, "SRQ {srqn}: no WQE taken");
}

#[test]
fn destroy_with_outstanding_work_returns_at_once() {
    let mut p = pair();
    post_writes(&mut p, 1..=8);
    p.recv_a(200, 0, 64);
    let qa = p.qa.qpn;
    let h = VrdmaHandle {
        handle: qa,
        reserved: 0,
    };
    assert!(p.a.cmd(VRDMA_CMD_DESTROY_QP, h.as_bytes()).is_ok());
    // The peer's ACKs for a destroyed QP are dropped; nothing is written to A's CQ.
    pump_idle(&mut p.a, &mut p.b, &mut p.link);
    assert!(p.a.poll_cq(&mut p.cqa).is_empty());
    // A doorbell for the destroyed QP is ignored.
    p.a.ring_doorbell(VRDMA_DB_SQ, qa);
    p.a.ring_doorbell(VRDMA_DB_RQ, qa);
    assert!(p.a.poll_cq(&mut p.cqa).is_empty());
}

/// MODIFY_QP of `qpn` to `state` (with `mask`'s other attributes from `attr`) as the control
/// queue runs it: on the device held shared, beside the engine workers.
fn modify_beside(n: &Node, qpn: u32, mask: u32, attr: VrdmaQpAttr) -> Option<u32> {
    let c = VrdmaCmdModifyQp {
        qpn,
        attr_mask: mask,
        attr,
    };
    n.dev
        .handle_shared(VRDMA_CMD_MODIFY_QP, c.as_bytes(), &mut Vec::new())
}

#[test]
fn a_flush_queued_beside_the_workers_runs_once_and_spares_a_qp_reset_since() {
    // MODIFY_QP to ERR beside the workers only queues the QP's flush for its worker. If the
    // guest resets and reuses the QP before the worker gets to it, the late flush must not
    // complete the new WQEs; an exclusive command in between runs the queued flush first.
    let mut n = Node::new(1, 16, 1500);
    let pd = n.create_pd();
    let (cq, mut cqr) = n.create_cq(64);
    let q = n.create_qp(QpSpec::rc(pd, cq));
    n.qp_to_init(q.qpn);
    let buf = n.alloc(4096);
    let k = n.reg_mr(pd, buf, 4096, ACC_ALL);
    let mut rq = q.rq.clone().unwrap();
    n.post_recv(&mut rq, 1, &[(buf, 64, k)]);
    let to = |state| VrdmaQpAttr {
        qp_state: state,
        port_num: 1,
        ..Default::default()
    };
    let init_mask = VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_ACCESS_FLAGS;
    let ok = Some(VRDMA_STATUS_OK);

    // ERR, then RESET and INIT again with a new receive, all beside the workers.
    assert_eq!(
        modify_beside(&n, q.qpn, VRDMA_QP_STATE, to(VRDMA_QPS_ERR)),
        ok
    );
    assert!(
        n.poll_cq(&mut cqr).is_empty(),
        "queued for the worker, not run here"
    );
    assert_eq!(
        modify_beside(&n, q.qpn, VRDMA_QP_STATE, to(VRDMA_QPS_RESET)),
        ok
    );
    assert_eq!(modify_beside(&n, q.qpn, init_mask, to(VRDMA_QPS_INIT)), ok);
    let mut rq = q.rq.clone().unwrap();
    rq.idx = 0;
    n.post_recv(&mut rq, 2, &[(buf, 64, k)]);
    // The worker's turn comes late: the QP it was queued for is gone through RESET.
    n.dev.run_flushes();
    assert!(
        n.poll_cq(&mut cqr).is_empty(),
        "the late flush completed a WQE of the reused QP"
    );

    // ERR beside the workers again; an exclusive command flushes it before it runs.
    assert_eq!(
        modify_beside(&n, q.qpn, VRDMA_QP_STATE, to(VRDMA_QPS_ERR)),
        ok
    );
    // DESTROY_QP while the QP's flush is queued takes the exclusive device, which runs the
    // queued flush first: the WQE completes before the QP goes.
    let destroy = VrdmaHandle {
        handle: q.qpn,
        ..Default::default()
    };
    assert_eq!(
        n.dev
            .handle_shared(VRDMA_CMD_DESTROY_QP, destroy.as_bytes(), &mut Vec::new()),
        None,
        "a destroy while the QP's flush is queued needs the exclusive device"
    );
    assert_eq!(
        n.cmd(VRDMA_CMD_DESTROY_QP, destroy.as_bytes()),
        Ok(Vec::new())
    );
    let got = n.poll_cq(&mut cqr);
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(2, VRDMA_WC_WR_FLUSH_ERR)]
    );
}
