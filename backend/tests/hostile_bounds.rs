//! A guest cannot make the device recurse without bound or queue unbounded work (spec §5.2,
//! §8, §14.4): CQ-overflow chains are flushed iteratively, doorbell records are merged and
//! bounded.

mod common;

use common::*;
use vrdma_spec::*;

/// QPs in the overflow chain of [`overflow_chain_is_flushed_iteratively`].
const CHAIN: usize = 5000;

/// QP `i` sends to CQ `i + 1` and receives on CQ `i`; every CQ has depth 1 and every SQ two
/// posted WQEs. Moving QP 0 to ERR flushes its two WQEs into CQ 1, which overflows (§5.2) and
/// moves QP 1 to ERR, whose flush overflows CQ 2, and so on down the chain. Before the flush
/// worklist each link nested one more flush inside the previous one and a 256 KiB stack
/// overflowed after a few hundred links.
#[test]
fn overflow_chain_is_flushed_iteratively() {
    let worker = std::thread::Builder::new()
        .name("small-stack".into())
        .stack_size(256 << 10)
        .spawn(|| {
            // Per link: one CQ (2 pages), SQ (2 pages) and RQ (2 pages).
            let mut n = Node::new(1, ((CHAIN as u64 * 6 * 4096) >> 20) + 16, 1500);
            let pd = n.create_pd();
            let cqs: Vec<u32> = (0..=CHAIN).map(|_| n.create_cq(1).0).collect();
            let mut qps = Vec::with_capacity(CHAIN);
            for i in 0..CHAIN {
                let mut s = QpSpec::rc(pd, cqs[i + 1]);
                s.rcq = cqs[i];
                s.sq_depth = 2;
                s.sq_shift = 7;
                s.rq_depth = 1;
                s.rq_shift = 5;
                s.max_sge = 1;
                s.max_inline = 0;
                let mut q = n.create_qp(s);
                let init = VrdmaQpAttr {
                    qp_state: VRDMA_QPS_INIT,
                    port_num: 1,
                    ..Default::default()
                };
                n.modify_qp(
                    q.qpn,
                    VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_ACCESS_FLAGS,
                    init,
                )
                .expect("INIT");
                // Posted in INIT: nothing is sent, the flush completes them (§13.3).
                for w in 0..2 {
                    let wqe = Wqe {
                        wr_id: (i * 2 + w) as u64,
                        opcode: VRDMA_WR_SEND,
                        ..Default::default()
                    };
                    n.post_send_nodb(&mut q, &wqe);
                }
                qps.push(q);
            }
            n.qp_to_err(qps[0].qpn);
            let states: Vec<u32> = qps.iter().map(|q| n.qp_state(q.qpn)).collect();
            let cq_errors = n
                .events()
                .iter()
                .filter(|e| e.type_ == VRDMA_EV_CQ_ERR)
                .count();
            (states, cq_errors)
        })
        .expect("spawn");
    let (states, cq_errors) = worker.join().expect("the flush chain overflowed the stack");
    let not_err: Vec<usize> = (0..CHAIN).filter(|&i| states[i] != VRDMA_QPS_ERR).collect();
    assert!(not_err.is_empty(), "QPs not in ERR: {not_err:?}");
    // Every CQ but CQ 0 (receive-only, nothing posted) overflowed exactly once.
    assert_eq!(cq_errors, CHAIN);
}
