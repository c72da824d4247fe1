//! Small IBTA / spec edge cases of the transport: a UD datagram that hits an ODP fault is
//! dropped (spec §14.6), a READ never spans enough PSNs to break PSN comparisons.

mod common;

use common::*;
use vrdma_backend::transport;
use vrdma_spec::*;

fn ud_qp(n: &mut Node, pd: u32, cq: u32) -> QpH {
    let q = n.create_qp(QpSpec::of_type(VRDMA_QPT_UD, pd, cq));
    ud_rts(n, &q, 0x77);
    q
}

/// Deliver A's frames to B once.
fn deliver(a: &mut Node, b: &mut Node) -> usize {
    let f = std::mem::take(&mut a.dev.outbox(0).frames);
    let n = f.len();
    for x in f {
        transport::on_frame(&b.dev, &x);
    }
    n
}

/// A UD datagram whose receive buffer is an ODP chunk that is not resident is dropped like any
/// UD datagram that cannot be placed (IBTA 9.8, spec §14.6): no completion, the receive WQE stays
/// the head, the chunk is faulted in; the next datagram lands in that WQE.
#[test]
fn ud_receive_on_odp_fault_is_dropped() {
    let mut a = Node::new(1, 16, 1500);
    let mut b = Node::new_odp(2, 16);
    let pda = a.create_pd();
    let pdb = b.create_pd();
    let (ca, mut cqa) = a.create_cq(64);
    let (cb, mut cqb) = b.create_cq(64);
    let mut qa = ud_qp(&mut a, pda, ca);
    let qb = ud_qp(&mut b, pdb, cb);
    let av = a.av_to(&b);
    let ah = a.create_ah(pda, av);
    let src = a.alloc(4096);
    let ka = a.reg_mr(pda, src, 4096, ACC_ALL);
    let dst = b.alloc(4 << 20);
    let kb = b.reg_odp_mr(pdb, dst, 4 << 20, ACC_ALL);
    let mut rq = qb.rq.clone().expect("RQ");
    b.post_recv(&mut rq, 5, &[(dst, 4096, kb)]);
    let send = |a: &mut Node, qa: &mut QpH, wr_id: u64, data: &[u8]| {
        a.write(src, data);
        let w = Wqe {
            ah,
            remote_qpn: qb.qpn,
            remote_qkey: 0x77,
            ..send(wr_id, (src, data.len() as u32, ka))
        };
        a.post_send(qa, &w);
    };
    let first = pattern(1, 200);
    send(&mut a, &mut qa, 1, &first);
    assert_eq!(deliver(&mut a, &mut b), 1);
    assert!(
        b.poll_cq(&mut cqb).is_empty(),
        "a faulting datagram completed"
    );
    assert_eq!(b.answer_page_requests(), 1, "the chunk is faulted in");
    let second = pattern(2, 300);
    send(&mut a, &mut qa, 2, &second);
    assert_eq!(deliver(&mut a, &mut b), 1);
    let c = b.poll_cq(&mut cqb);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wr_id, c[0].status), (5, VRDMA_WC_SUCCESS));
    assert_eq!(c[0].byte_len, 40 + 300);
    assert!(b.read(dst + 40, 300) == second, "second datagram data");
    assert_eq!(b.qp_state(qb.qpn), VRDMA_QPS_RTS);
    assert_eq!(a.poll_cq(&mut cqa).len(), 2);
}

/// An RDMA READ of more than 2^22 response packets (path MTU 256, > 1 GiB) would span enough of
/// the 24-bit PSN space to break signed PSN comparisons: it completes with LOC_LEN_ERR before
/// anything is sent (spec §14.3). One of exactly 2^22 packets is accepted (it fails later, on its
/// SGE, which is smaller than the READ).
#[test]
fn read_spanning_too_many_psns_is_a_length_error() {
    // Path MTU 256 (code 1).
    let mut p = RcPair::new().cq_depth(64).mtu(1).no_mrs().build();
    let la = p.a.alloc(4096);
    let ka = p.a.reg_mr(p.pda, la, 4096, ACC_ALL);
    for (wr_id, len) in [(1u64, (1u32 << 30) + 256), (2, 1 << 30)] {
        p.a.post_send(
            &mut p.qa,
            &rdma(wr_id, VRDMA_WR_RDMA_READ, (la, len, ka), 0x10000, 0x100),
        );
        let c = p.a.poll_cq(&mut p.cqa);
        assert_eq!(c.len(), 1, "READ {wr_id} completes at once");
        let want = if wr_id == 1 {
            VRDMA_WC_LOC_LEN_ERR
        } else {
            VRDMA_WC_LOC_PROT_ERR
        };
        assert_eq!((c[0].wr_id, c[0].status), (wr_id, want));
        assert!(p.a.dev.outbox(0).frames.is_empty(), "nothing sent");
        if wr_id == 1 {
            // The QP went to ERROR; start again for the boundary case.
            p.qa = p.a.create_qp(QpSpec::rc(p.pda, p.cqna));
            let qb2 = p.b.create_qp(QpSpec::rc(p.pdb, p.cqnb));
            connect(&mut p.a, &p.qa, &mut p.b, &qb2, RtsAttrs::mtu(1));
        }
    }
}
