//! Responses in PSN order (IBTA 9.7.5.1.1 / 9.7.5.1.2): while READ responses are paced, the
//! ACKs (plain, coalesced, atomic) and empty READ responses of later requests wait behind them,
//! so the requester never sees an ACK covering a READ it has no answer for.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use common::*;
use vrdma_backend::transport::psn_diff;
use vrdma_backend::wire::RocePacket;
use vrdma_spec::*;

const T: Duration = Duration::from_secs(60);

/// A 256-packet READ (paced in bursts), then SENDs, WRITEs and an atomic, all signaled: every
/// frame B sends has a PSN not below the previous one, and A never rewinds.
#[test]
fn acks_wait_behind_paced_read_responses() {
    // MTU 1024: the READ is 256 response packets, four READ_BURSTs.
    let RcPair {
        mut a,
        mut b,
        mut qa,
        mut qb,
        mut cqa,
        mut cqb,
        pda,
        pdb,
        ..
    } = RcPair::new().eth_mtu(9000).no_mrs().build();
    const RLEN: u64 = 256 << 10;
    let la = a.alloc(RLEN + 4096);
    let ka = a.reg_mr(pda, la, RLEN + 4096, ACC_ALL);
    let lb = b.alloc(RLEN + 4096);
    let kb = b.reg_mr(pdb, lb, RLEN + 4096, ACC_ALL);
    let data = pattern(5, RLEN as usize);
    b.write(lb, &data);
    let mut rq = qb.rq.clone().expect("RQ");
    for i in 0..4u64 {
        b.post_recv(&mut rq, 100 + i, &[(lb + RLEN, 64, kb)]);
    }
    qb.rq = Some(rq);
    let read = Wqe {
        wr_id: 1,
        opcode: VRDMA_WR_RDMA_READ,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(la, RLEN as u32, ka)],
        remote_addr: lb,
        rkey: kb,
        ..Default::default()
    };
    a.post_send_nodb(&mut qa, &read);
    for i in 0..4u64 {
        let w = Wqe {
            wr_id: 10 + i,
            opcode: if i % 2 == 0 {
                VRDMA_WR_SEND
            } else {
                VRDMA_WR_RDMA_WRITE
            },
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(la + RLEN, 64, ka)],
            remote_addr: lb + RLEN + 1024,
            rkey: kb,
            ..Default::default()
        };
        a.post_send_nodb(&mut qa, &w);
    }
    let fadd = Wqe {
        wr_id: 20,
        opcode: VRDMA_WR_ATOMIC_FETCH_AND_ADD,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(la + RLEN + 2048, 8, ka)],
        remote_addr: lb + RLEN + 2048,
        rkey: kb,
        compare_add: 1,
        ..Default::default()
    };
    a.post_send(&mut qa, &fadd);
    let seen: Rc<RefCell<Vec<(u8, u32)>>> = Rc::default();
    let mut link = Link::clean();
    let s = seen.clone();
    link.filter_ba = Some(Box::new(move |f: &[u8]| {
        let p = RocePacket::parse(f).expect("responder frame parses");
        s.borrow_mut().push((p.bth.opcode.value(), p.bth.psn));
        true
    }));
    let mut ga = Vec::new();
    pump_until(&mut a, &mut b, &mut link, T, |a, _| {
        ga.extend(a.poll_cq(&mut cqa));
        ga.len() >= 6
    });
    assert!(ga.iter().all(|c| c.status == VRDMA_WC_SUCCESS), "{ga:?}");
    assert!(a.read(la, RLEN as usize) == data, "READ data");
    assert_eq!(b.poll_cq(&mut cqb).len(), 2, "two receives");
    let restarts = a.dev.qps.get(qa.qpn).map(|q| q.req.restarts);
    assert_eq!(restarts, Some(0), "the requester rewound");
    let seen = seen.borrow();
    for w in seen.windows(2) {
        assert!(
            psn_diff(w[1].1, w[0].1) >= 0,
            "responder frames out of PSN order: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
}

/// A peer that resends a duplicate atomic while a READ is being paced gets at most one queued
/// answer for it: the reply queue stays bounded however often the duplicate arrives (spec §16).
#[test]
fn duplicate_atomics_behind_a_paced_read_do_not_grow_the_reply_queue() {
    let RcPair {
        mut a,
        mut b,
        mut qa,
        qb,
        pda,
        pdb,
        ..
    } = RcPair::new().eth_mtu(9000).no_mrs().build();
    const RLEN: u64 = 256 << 10;
    let la = a.alloc(RLEN + 4096);
    let ka = a.reg_mr(pda, la, RLEN + 4096, ACC_ALL);
    let lb = b.alloc(RLEN + 4096);
    let kb = b.reg_mr(pdb, lb, RLEN + 4096, ACC_ALL);
    let read = Wqe {
        wr_id: 1,
        opcode: VRDMA_WR_RDMA_READ,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(la, RLEN as u32, ka)],
        remote_addr: lb,
        rkey: kb,
        ..Default::default()
    };
    let fadd = Wqe {
        wr_id: 2,
        opcode: VRDMA_WR_ATOMIC_FETCH_AND_ADD,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(la + RLEN, 8, ka)],
        remote_addr: lb + RLEN,
        rkey: kb,
        compare_add: 1,
        ..Default::default()
    };
    // The atomic first, answered at once (nothing queued yet); keep its request frame.
    a.post_send(&mut qa, &fadd);
    let atomic = a.dev.outbox[0].clone();
    let mut link = Link::clean();
    pump_idle(&mut a, &mut b, &mut link);
    // Then the READ: B paces its responses and they stay queued (B's outbox is not drained).
    a.post_send(&mut qa, &read);
    for f in std::mem::take(&mut a.dev.outbox) {
        vrdma_backend::transport::on_frame(&mut b.dev, &f);
    }
    let queued = |b: &Node| b.dev.qps.get(qb.qpn).expect("qp").resp.replies.len();
    let before = queued(&b);
    assert!(before >= 1, "the READ is paced: its responses are queued");
    // The duplicate atomic, again and again, while B's responses are not drained.
    for _ in 0..10_000 {
        vrdma_backend::transport::on_frame(&mut b.dev, &atomic);
    }
    let after = queued(&b);
    assert!(
        after <= before + 1,
        "reply queue grew from {before} to {after} entries on duplicates"
    );
    // The atomic ran once.
    assert_eq!(b.read(lb + RLEN, 8), 1u64.to_le_bytes());
}
