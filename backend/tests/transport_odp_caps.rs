//! Per-transport ODP caps (spec §2.2): the device advertises `odp_rc_caps`, `odp_uc_caps` and
//! `odp_ud_caps`, and an operation a transport does not list fails on an ODP MR: LOC_PROT_ERR for
//! local SGEs (send side and receive WQEs), a remote access error (UC: dropped) for an R_Key.

mod common;

use std::time::Instant;

use common::*;
use vrdma_backend::transport;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

const MIB: u64 = 1 << 20;

/// A UC connection between two ODP-capable nodes (64-deep CQs, no MRs).
fn uc() -> RcPair {
    RcPair::new()
        .nodes(Node::new_odp(1, 16), Node::new_odp(2, 16))
        .qp_type(VRDMA_QPT_UC)
        .cq_depth(64)
        .timeout(0)
        .retry(0)
        .rnr_retry(0)
        .no_mrs()
        .build()
}

/// A's 64 KiB pinned MR (`src`, `ka`) and B's 4 MiB ODP MR (`dst`, `kb`, with `b_access`).
fn pinned_to_odp(t: &mut RcPair, b_access: u32) -> (u64, u32, u64, u32) {
    let src = t.a.alloc(65536);
    let ka = t.a.reg_mr(t.pda, src, 65536, ACC_ALL);
    let dst = t.b.alloc(4 * MIB);
    let kb = t.b.reg_odp_mr(t.pdb, dst, 4 * MIB, b_access);
    (src, ka, dst, kb)
}

/// Move frames both ways, answering page requests, until nothing moves.
fn settle(a: &mut Node, b: &mut Node) {
    for _ in 0..16 {
        let mut moved = a.answer_page_requests() + b.answer_page_requests();
        transport::resume_odp(&a.dev, Instant::now());
        transport::resume_odp(&b.dev, Instant::now());
        for f in std::mem::take(&mut a.dev.outbox(0).frames) {
            transport::on_frame(&b.dev, &f);
            moved += 1;
        }
        for f in std::mem::take(&mut b.dev.outbox(0).frames) {
            transport::on_frame(&a.dev, &f);
            moved += 1;
        }
        if moved == 0 {
            return;
        }
    }
}

fn poll(n: &mut Node, cq: &mut RingH) -> Vec<(u64, u8)> {
    let c: Vec<Cqe> = n.poll_cq(cq);
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}

#[test]
fn odp_caps_are_advertised_per_transport() {
    let n = Node::new_odp(1, 16);
    let c = n.dev.config.to_vrdma_config();
    let all = VRDMA_ODP_SEND
        | VRDMA_ODP_RECV
        | VRDMA_ODP_WRITE
        | VRDMA_ODP_READ
        | VRDMA_ODP_ATOMIC
        | VRDMA_ODP_SRQ_RECV;
    assert_eq!(c.odp_rc_caps, all);
    assert_eq!(c.odp_uc_caps, VRDMA_ODP_SEND);
    assert_eq!(
        c.odp_ud_caps,
        VRDMA_ODP_SEND | VRDMA_ODP_RECV | VRDMA_ODP_SRQ_RECV
    );
    // Without ODP no transport lists anything.
    let mut off = Node::new(2, 16, 1500);
    off.dev.config.odp.enabled = false;
    let plain = off.dev.config.to_vrdma_config();
    assert_eq!(
        (plain.odp_rc_caps, plain.odp_uc_caps, plain.odp_ud_caps),
        (0, 0, 0)
    );
}

/// UC requester: an RDMA WRITE whose local SGE is in an ODP MR (WRITE not in `odp_uc_caps`)
/// completes LOC_PROT_ERR without a packet or a page request; a SEND from the same MR (SEND is
/// listed) is sent and lands.
#[test]
fn uc_write_from_an_odp_mr_is_a_local_protection_error() {
    let mut t = uc();
    let src = t.a.alloc(4 * MIB);
    let ka = t.a.reg_odp_mr(t.pda, src, 4 * MIB, ACC_ALL);
    let dst = t.b.alloc(65536);
    let kb = t.b.reg_mr(t.pdb, dst, 65536, ACC_ALL);
    let data = pattern(3, 512);
    t.a.write(src, &data);
    t.a.post_send(
        &mut t.qa,
        &rdma(1, VRDMA_WR_RDMA_WRITE, (src, 512, ka), dst, kb),
    );
    assert!(t.a.dev.outbox(0).frames.is_empty(), "nothing sent");
    assert_eq!(t.a.answer_page_requests(), 0, "no page request");
    assert_eq!(poll(&mut t.a, &mut t.cqa), vec![(1, VRDMA_WC_LOC_PROT_ERR)]);
    assert_eq!(t.a.qp_state(t.qa.qpn), VRDMA_QPS_ERR);

    // SEND is in odp_uc_caps: a fresh pair sends from an ODP MR.
    let mut t = uc();
    let src = t.a.alloc(4 * MIB);
    let ka = t.a.reg_odp_mr(t.pda, src, 4 * MIB, ACC_ALL);
    let dst = t.b.alloc(65536);
    let kb = t.b.reg_mr(t.pdb, dst, 65536, ACC_ALL);
    t.a.write(src, &data);
    let mut rq = t.qb.rq.clone().expect("RQ");
    t.b.post_recv(&mut rq, 7, &[(dst, 4096, kb)]);
    t.a.post_send(&mut t.qa, &send(2, (src, 512, ka)));
    settle(&mut t.a, &mut t.b);
    assert_eq!(poll(&mut t.a, &mut t.cqa), vec![(2, VRDMA_WC_SUCCESS)]);
    assert_eq!(poll(&mut t.b, &mut t.cqb), vec![(7, VRDMA_WC_SUCCESS)]);
    assert!(t.b.read(dst, 512) == data, "SEND data");
}

/// UC responder: an RDMA WRITE whose R_Key names an ODP MR (WRITE not in `odp_uc_caps`) is an
/// R_Key violation, which UC drops: no page request, nothing placed, also after a retry; the
/// responder QP stays RTS.
#[test]
fn uc_write_into_an_odp_mr_is_dropped() {
    let mut t = uc();
    let (src, ka, dst, kb) = pinned_to_odp(&mut t, ACC_ALL);
    let data = pattern(4, 512);
    t.a.write(src, &data);
    for wr_id in [1, 2] {
        t.a.post_send(
            &mut t.qa,
            &rdma(wr_id, VRDMA_WR_RDMA_WRITE, (src, 512, ka), dst, kb),
        );
        settle(&mut t.a, &mut t.b);
        assert_eq!(t.b.answered, 0, "WRITE {wr_id}: no page request at B");
    }
    assert!(t.b.read(dst, 512) != data, "nothing placed");
    assert_eq!(t.b.qp_state(t.qb.qpn), VRDMA_QPS_RTS);
    assert_eq!(
        poll(&mut t.a, &mut t.cqa),
        vec![(1, VRDMA_WC_SUCCESS), (2, VRDMA_WC_SUCCESS)],
        "UC completes when sent"
    );
}

/// The same through a memory window bound to the ODP MR (spec §12.8): the caps apply to the
/// memory behind the window, so the WRITE is dropped without a page request.
#[test]
fn uc_write_through_a_window_into_an_odp_mr_is_dropped() {
    let mut t = uc();
    let (src, ka, dst, kb) = pinned_to_odp(&mut t, ACC_ALL | VRDMA_ACCESS_MW_BIND);
    let r =
        t.b.cmd(
            VRDMA_CMD_ALLOC_MW,
            VrdmaCmdAllocMw {
                pdn: t.pdb,
                type_: VRDMA_MW_TYPE_2,
            }
            .as_bytes(),
        )
        .expect("alloc mw");
    let mw = VrdmaHandle::read_from(&r).unwrap().handle;
    let rkey = (mw & !0xff) | ((mw + 1) & 0xff);
    t.b.post_send(
        &mut t.qb,
        &Wqe {
            wr_id: 9,
            opcode: VRDMA_WR_BIND_MW,
            flags: VRDMA_SEND_SIGNALED,
            bind: Some(VrdmaWqeBindMw {
                addr: dst,
                length: 4096,
                mw_key: mw,
                new_key: rkey,
                mr_key: kb,
                access: VRDMA_ACCESS_REMOTE_WRITE,
                reserved: [0; 2],
            }),
            ..Default::default()
        },
    );
    settle(&mut t.a, &mut t.b);
    assert_eq!(
        poll(&mut t.b, &mut t.cqb),
        vec![(9, VRDMA_WC_SUCCESS)],
        "bound"
    );
    let data = pattern(5, 512);
    t.a.write(src, &data);
    t.a.post_send(
        &mut t.qa,
        &rdma(1, VRDMA_WR_RDMA_WRITE, (src, 512, ka), dst, rkey),
    );
    settle(&mut t.a, &mut t.b);
    assert_eq!(t.b.answered, 0, "no page request at B");
    assert!(t.b.read(dst, 512) != data, "nothing placed");
    assert_eq!(t.b.qp_state(t.qb.qpn), VRDMA_QPS_RTS);
}

/// UC responder: a SEND into a receive WQE whose SGE is in an ODP MR (RECV not in
/// `odp_uc_caps`) completes that WQE LOC_PROT_ERR; no page request.
#[test]
fn uc_receive_into_an_odp_mr_is_a_local_protection_error() {
    let mut t = uc();
    let (src, ka, dst, kb) = pinned_to_odp(&mut t, ACC_ALL);
    let mut rq = t.qb.rq.clone().expect("RQ");
    t.b.post_recv(&mut rq, 9, &[(dst, 4096, kb)]);
    t.a.post_send(&mut t.qa, &send(1, (src, 100, ka)));
    settle(&mut t.a, &mut t.b);
    assert_eq!(t.b.answered, 0, "no page request at B");
    assert_eq!(poll(&mut t.b, &mut t.cqb), vec![(9, VRDMA_WC_LOC_PROT_ERR)]);
}

/// UD: SEND from an ODP MR and a receive into an ODP MR are both in `odp_ud_caps` and work
/// (the receive after its chunk was faulted in, spec §14.6).
#[test]
fn ud_send_from_and_receive_into_odp_mrs() {
    let (mut a, mut b, pda, pdb) = Sides::of(Node::new_odp(1, 16), Node::new_odp(2, 16)).parts();
    let spec = QpPairSpec::datagram(VRDMA_QPT_UD, 64, 0x11);
    let QpPair {
        mut qa,
        qb,
        mut cqa,
        mut cqb,
        ..
    } = QpPair::open(&mut a, &mut b, pda, pdb, spec);
    let av = a.av_to(&b);
    let ah = a.create_ah(pda, av);
    let src = a.alloc(4 * MIB);
    let ka = a.reg_odp_mr(pda, src, 4 * MIB, ACC_ALL);
    let dst = b.alloc(4 * MIB);
    let kb = b.reg_odp_mr(pdb, dst, 4 * MIB, ACC_ALL);
    let data = pattern(5, 256);
    a.write(src, &data);
    let mut rq = qb.rq.clone().expect("RQ");
    b.post_recv(&mut rq, 3, &[(dst, 4096, kb)]);
    // Fault B's receive chunk in first (a faulting datagram is dropped, spec §14.6).
    for wr_id in [1, 2] {
        a.post_send(
            &mut qa,
            &Wqe {
                ah,
                remote_qpn: qb.qpn,
                remote_qkey: 0x11,
                ..send(wr_id, (src, 256, ka))
            },
        );
        settle(&mut a, &mut b);
    }
    assert_eq!(
        poll(&mut a, &mut cqa),
        vec![(1, VRDMA_WC_SUCCESS), (2, VRDMA_WC_SUCCESS)]
    );
    assert_eq!(poll(&mut b, &mut cqb), vec![(3, VRDMA_WC_SUCCESS)]);
    assert!(b.read(dst + 40, 256) == data, "datagram data");
}
