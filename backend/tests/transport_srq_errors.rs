//! SRQ error outcomes (spec §14.4, IBTA 10.8.3.3 / 11.6.3): a malformed SRQ receive WQE is
//! consumed with an error completion on the QP that took it, never silently; an SRQ ring error
//! (SRQ_ERR) moves every QP attached to the SRQ to ERROR, each flushed with LAST_WQE_REACHED.

mod common;

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

/// Ring control page: `producer` at 0, `consumer` at 64.
const CTRL_CONSUMER: u64 = 64;

struct Bed {
    a: Node,
    b: Node,
    qa: [QpH; 2],
    qb: [QpH; 2],
    cqa: RingH,
    cqb: RingH,
    srqn: u32,
    srq: RingH,
    src: u64,
    dst: u64,
    ka: u32,
    kb: u32,
}

/// Two RC connections A→B; both B QPs take their receives from one SRQ (max_sge 2).
fn bed() -> Bed {
    let (mut a, mut b, pda, pdb) = Sides::new(16, 1500).parts();
    let (ca, cqa) = a.create_cq(64);
    let (cb, cqb) = b.create_cq(64);
    let (srqn, srq) = b.create_srq(pdb, 16, 2, 0);
    let qa = [
        a.create_qp(QpSpec::rc(pda, ca)),
        a.create_qp(QpSpec::rc(pda, ca)),
    ];
    let on_srq = QpSpec {
        srq: Some(srqn),
        ..QpSpec::rc(pdb, cb)
    };
    let qb = [b.create_qp(on_srq), b.create_qp(on_srq)];
    for i in 0..2 {
        connect(&mut a, &qa[i], &mut b, &qb[i], RtsAttrs::mtu(3).timeout(10));
    }
    let MrPair { src, ka, dst, kb } = MrPair::new(&mut a, &mut b, pda, pdb, 65536);
    let _ = b.events();
    Bed {
        a,
        b,
        qa,
        qb,
        cqa,
        cqb,
        srqn,
        srq,
        src,
        dst,
        ka,
        kb,
    }
}

/// A signaled SEND of 64 bytes on A's QP `i`, delivered until both sides are quiet.
fn send(t: &mut Bed, i: usize, wr_id: u64) {
    let w = common::send(wr_id, (t.src, 64, t.ka));
    let mut q = t.qa[i].clone();
    t.a.post_send(&mut q, &w);
    t.qa[i] = q;
    pump_idle(&mut t.a, &mut t.b, &mut Link::clean());
}

/// Write a raw SRQ slot (wr_id, num_sge, one SGE) and publish it.
fn post_raw(t: &mut Bed, wr_id: u64, num_sge: u32, sge: (u64, u32, u32)) {
    let mut b = vec![0u8; 1 << t.srq.shift];
    b[0..8].copy_from_slice(&wr_id.to_le_bytes());
    b[8..12].copy_from_slice(&num_sge.to_le_bytes());
    b[16..24].copy_from_slice(&sge.0.to_le_bytes());
    b[24..28].copy_from_slice(&sge.1.to_le_bytes());
    b[28..32].copy_from_slice(&sge.2.to_le_bytes());
    let gpa = t.srq.entry_gpa(t.srq.idx);
    t.b.write(gpa, &b);
    t.srq.idx = t.srq.idx.wrapping_add(1);
    t.b.mem.store_u32_release(t.srq.ctrl(), t.srq.idx).unwrap();
}

fn poll_b(t: &mut Bed) -> Vec<Cqe> {
    let mut cq = t.cqb.clone();
    let c = t.b.poll_cq(&mut cq);
    t.cqb = cq;
    c
}

fn poll_a(t: &mut Bed) -> Vec<Cqe> {
    let mut cq = t.cqa.clone();
    let c = t.a.poll_cq(&mut cq);
    t.cqa = cq;
    c
}

fn srq_consumer(t: &Bed) -> u32 {
    t.b.mem
        .load_u32_acquire(t.srq.ctrl() + CTRL_CONSUMER)
        .unwrap()
}

fn recv_errors(c: &[Cqe]) -> Vec<(u64, u32, u8)> {
    c.iter()
        .filter(|c| c.opcode == VRDMA_WC_RECV)
        .map(|c| (c.wr_id, c.qpn, c.status))
        .collect()
}

/// Each malformed SRQ WQE (num_sge above the SRQ's max_sge, num_sge beyond the slot, an SGE with
/// an invalid lkey) is consumed and completes in error on the QP that took it (LOC_QP_OP_ERR for
/// the first two, LOC_PROT_ERR for the key), that QP goes to ERROR and the requester sees a
/// Remote Operational Error. The other QP on the SRQ keeps working with the next WQE.
#[test]
fn malformed_srq_wqe_completes_in_error_on_the_qp_that_took_it() {
    let cases: [(&str, u32, bool, u8); 3] = [
        (
            "num_sge above the SRQ's max_sge",
            3,
            true,
            VRDMA_WC_LOC_QP_OP_ERR,
        ),
        ("num_sge beyond the slot", 255, true, VRDMA_WC_LOC_QP_OP_ERR),
        ("invalid lkey", 1, false, VRDMA_WC_LOC_PROT_ERR),
    ];
    for (name, num_sge, good_key, status) in cases {
        let mut t = bed();
        let key = if good_key { t.kb } else { t.kb ^ 0x0f00 };
        let dst = t.dst;
        post_raw(&mut t, 0xbad, num_sge, (dst, 64, key));
        send(&mut t, 0, 1);
        let c = poll_b(&mut t);
        assert_eq!(
            recv_errors(&c),
            vec![(0xbad, t.qb[0].qpn, status)],
            "{name}: one error CQE for the WQE, on the QP that took it"
        );
        assert_eq!(srq_consumer(&t), 1, "{name}: the WQE is consumed");
        assert_eq!(t.b.qp_state(t.qb[0].qpn), VRDMA_QPS_ERR, "{name}");
        let ca = poll_a(&mut t);
        assert_eq!(ca.len(), 1, "{name}");
        assert_eq!(ca[0].status, VRDMA_WC_REM_OP_ERR, "{name}");
        // The SRQ and the other QP are unaffected.
        assert_eq!(t.b.qp_state(t.qb[1].qpn), VRDMA_QPS_RTS, "{name}");
        let kb = t.kb;
        post_raw(&mut t, 0x900d, 1, (dst, 64, kb));
        send(&mut t, 1, 2);
        let c = poll_b(&mut t);
        let ok: Vec<_> = c
            .iter()
            .filter(|c| c.wr_id == 0x900d)
            .map(|c| (c.qpn, c.status))
            .collect();
        assert_eq!(ok, vec![(t.qb[1].qpn, VRDMA_WC_SUCCESS)], "{name}");
    }
}

/// An SRQ producer beyond the depth breaks the SRQ (ring error INDEX, SRQ_ERR) when a QP needs a
/// receive: every QP attached to the SRQ, not only the one that asked, goes to ERROR with
/// QP_FATAL and reports LAST_WQE_REACHED (IBTA 11.6.3 SRQ catastrophic error, spec §14.4).
#[test]
fn srq_ring_error_moves_every_attached_qp_to_error() {
    let mut t = bed();
    let depth = t.srq.depth;
    t.b.mem.store_u32_release(t.srq.ctrl(), depth + 1).unwrap();
    send(&mut t, 0, 1);
    let ev = t.b.events();
    let has = |ty: u32, id: u32, info: Option<u32>| {
        ev.iter()
            .any(|e| e.type_ == ty && e.id == id && info.is_none_or(|i| e.info == i))
    };
    assert!(
        has(VRDMA_EV_SRQ_ERR, t.srqn, Some(VRDMA_RING_ERR_INDEX)),
        "{ev:?}"
    );
    for q in &t.qb {
        assert_eq!(
            t.b.qp_state(q.qpn),
            VRDMA_QPS_ERR,
            "QP {} of the SRQ",
            q.qpn
        );
        assert!(
            has(VRDMA_EV_QP_FATAL, q.qpn, Some(VRDMA_RING_ERR_INDEX)),
            "QP {}: {ev:?}",
            q.qpn
        );
        assert!(
            has(VRDMA_EV_QP_LAST_WQE_REACHED, q.qpn, None),
            "QP {}: {ev:?}",
            q.qpn
        );
        let n = ev
            .iter()
            .filter(|e| e.id == q.qpn && e.type_ == VRDMA_EV_QP_FATAL)
            .count();
        assert_eq!(n, 1, "one QP_FATAL for QP {}: {ev:?}", q.qpn);
    }
    assert!(
        poll_b(&mut t).iter().all(|c| c.status != VRDMA_WC_SUCCESS),
        "nothing was received"
    );
}
