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

/// Bytes of the paced READ.
const RLEN: u64 = 256 << 10;

/// An RC pair on 9000-byte Ethernet with an MR of `RLEN` + 4096 bytes on each side.
fn read_pair() -> RcPair {
    let len = RLEN + 4096;
    RcPair::new().eth_mtu(9000).mrs(len, len).build()
}

/// A 256-packet READ (paced in bursts), then SENDs, WRITEs and an atomic, all signaled: every
/// frame B sends has a PSN not below the previous one, and A never rewinds.
#[test]
fn acks_wait_behind_paced_read_responses() {
    // MTU 1024: the READ is 256 response packets, four READ_BURSTs.
    let mut rc = read_pair();
    let (la, ka, lb, kb) = (rc.src, rc.ka, rc.dst, rc.kb);
    let data = pattern(5, RLEN as usize);
    rc.b.write(lb, &data);
    let mut rq = rc.qb.rq.clone().expect("RQ");
    for i in 0..4u64 {
        rc.b.post_recv(&mut rq, 100 + i, &[(lb + RLEN, 64, kb)]);
    }
    rc.qb.rq = Some(rq);
    let read = rdma(1, VRDMA_WR_RDMA_READ, (la, RLEN as u32, ka), lb, kb);
    rc.a.post_send_nodb(&mut rc.qa, &read);
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
        rc.a.post_send_nodb(&mut rc.qa, &w);
    }
    let fadd = fetch_add(20, (la + RLEN + 2048, 8, ka), lb + RLEN + 2048, kb, 1);
    rc.a.post_send(&mut rc.qa, &fadd);
    let seen: Rc<RefCell<Vec<(u8, u32)>>> = Rc::default();
    let mut link = Link::clean();
    let s = seen.clone();
    link.filter_ba = Some(Box::new(move |f: &[u8]| {
        let p = RocePacket::parse(f).expect("responder frame parses");
        s.borrow_mut().push((p.bth.opcode.value(), p.bth.psn));
        true
    }));
    let mut ga = Vec::new();
    pump_until(&mut rc.a, &mut rc.b, &mut link, T, |a, _| {
        ga.extend(a.poll_cq(&mut rc.cqa));
        ga.len() >= 6
    });
    assert!(ga.iter().all(|c| c.status == VRDMA_WC_SUCCESS), "{ga:?}");
    assert!(rc.a.read(la, RLEN as usize) == data, "READ data");
    assert_eq!(rc.b.poll_cq(&mut rc.cqb).len(), 2, "two receives");
    let restarts = rc.a.dev.qps.get(rc.qa.qpn).map(|q| q.req.restarts);
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
    let mut p = read_pair();
    let (la, ka, lb, kb) = (p.src, p.ka, p.dst, p.kb);
    let read = rdma(1, VRDMA_WR_RDMA_READ, (la, RLEN as u32, ka), lb, kb);
    let fadd = fetch_add(2, (la + RLEN, 8, ka), lb + RLEN, kb, 1);
    // The atomic first, answered at once (nothing queued yet); keep its request frame.
    p.a.post_send(&mut p.qa, &fadd);
    let atomic = p.a.dev.outbox(0).frames[0].clone();
    let mut link = Link::clean();
    pump_idle(&mut p.a, &mut p.b, &mut link);
    // Then the READ: B paces its responses and they stay queued (B's outbox is not drained).
    p.a.post_send(&mut p.qa, &read);
    for f in std::mem::take(&mut p.a.dev.outbox(0).frames) {
        vrdma_backend::transport::on_frame(&p.b.dev, &f);
    }
    let queued = |b: &Node| b.dev.qps.get(p.qb.qpn).expect("qp").resp.replies.len();
    let before = queued(&p.b);
    assert!(before >= 1, "the READ is paced: its responses are queued");
    // The duplicate atomic, again and again, while B's responses are not drained.
    for _ in 0..10_000 {
        vrdma_backend::transport::on_frame(&p.b.dev, &atomic);
    }
    let after = queued(&p.b);
    assert!(
        after <= before + 1,
        "reply queue grew from {before} to {after} entries on duplicates"
    );
    // The atomic ran once.
    assert_eq!(p.b.read(lb + RLEN, 8), 1u64.to_le_bytes());
}
