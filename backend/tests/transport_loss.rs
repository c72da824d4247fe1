//! RC under loss: 64 MiB of WRITEs, SENDs and READs through a deterministic impairment (5 % drop,
//! 1 % duplication, reordering) complete with the data intact (IBTA 9.7.5.1 go-back-N,
//! duplicate detection, implied NAKs for READ responses).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_backend::uplink::ImpairConfig;
use vrdma_spec::*;

/// An RC pair over 9000-byte Ethernet at path MTU 4096 with a 1 ms ACK timeout (8), 1024-deep
/// CQs and `mem_mib` MiB of guest memory per node; no MRs.
fn pair(mem_mib: u64) -> RcPair {
    RcPair::new()
        .mem_mib(mem_mib)
        .eth_mtu(9000)
        .cq_depth(1024)
        .mtu(5)
        .timeout(8)
        .no_mrs()
        .build()
}

/// A's next `n` completions, pumping `p` over `link` (not `p.link`) for at most 10 s.
fn wait_a(p: &mut RcPair, link: &mut Link, n: usize) -> Vec<Cqe> {
    let limit = Duration::from_secs(10);
    pump_cqes(&mut p.a, &mut p.b, link, &mut p.cqa, n, limit)
}

#[test]
fn sixty_four_mib_through_loss_dup_reorder() {
    let mut p = pair(160);
    let cfg = match std::env::var("VRDMA_TEST_IMPAIR") {
        Ok(s) => s.parse().expect("VRDMA_TEST_IMPAIR"),
        Err(_) => ImpairConfig {
            drop: 0.05,
            dup: 0.01,
            reorder: 0.02,
            seed: 20261129,
        },
    };
    let mut link = Link::impaired(cfg);
    let chunk: u64 = 16 << 20;
    let src = p.a.alloc(chunk);
    let back = p.a.alloc(chunk);
    let dst = p.b.alloc(chunk);
    let ka = p.a.reg_mr(p.pda, src, chunk, ACC_ALL);
    let kback = p.a.reg_mr(p.pda, back, chunk, ACC_ALL);
    let kb = p.b.reg_mr(p.pdb, dst, chunk, ACC_ALL);
    let mut rq = p.qb.rq.clone().unwrap();
    let start = Instant::now();
    let mut total = 0u64;
    // Round 1, 2: WRITE 16 MiB as 4 × 4 MiB; round 3: SEND 16 MiB as 16 × 1 MiB; round 4: READ.
    for round in 0..4u64 {
        let data = pattern(round + 1, chunk as usize);
        if round < 3 {
            p.a.write(src, &data);
        } else {
            p.b.write(dst, &data);
        }
        let (n, piece) = if round == 2 {
            (16u64, 1u64 << 20)
        } else {
            (4, 4 << 20)
        };
        for i in 0..n {
            let off = i * piece;
            let mut w = Wqe {
                wr_id: round * 100 + i,
                flags: VRDMA_SEND_SIGNALED,
                sges: vec![(src + off, piece as u32, ka)],
                remote_addr: dst + off,
                rkey: kb,
                ..Default::default()
            };
            w.opcode = match round {
                2 => {
                    p.b.post_recv(&mut rq, 1000 + i, &[(dst + off, piece as u32, kb)]);
                    VRDMA_WR_SEND
                }
                3 => {
                    w.sges = vec![(back + off, piece as u32, kback)];
                    VRDMA_WR_RDMA_READ
                }
                _ => VRDMA_WR_RDMA_WRITE,
            };
            p.a.post_send(&mut p.qa, &w);
        }
        let mut got = Vec::new();
        let mut gotb = Vec::new();
        let need_b = if round == 2 { n as usize } else { 0 };
        pump_until(
            &mut p.a,
            &mut p.b,
            &mut link,
            Duration::from_secs(120),
            |a, b| {
                got.extend(a.poll_cq(&mut p.cqa));
                gotb.extend(b.poll_cq(&mut p.cqb));
                got.len() >= n as usize && gotb.len() >= need_b
            },
        );
        for (i, c) in got.iter().enumerate() {
            assert_eq!(
                (c.wr_id, c.status),
                (round * 100 + i as u64, VRDMA_WC_SUCCESS)
            );
        }
        for (i, c) in gotb.iter().enumerate() {
            assert_eq!((c.wr_id, c.status), (1000 + i as u64, VRDMA_WC_SUCCESS));
        }
        let landed = if round < 3 {
            p.b.read(dst, chunk as usize)
        } else {
            p.a.read(back, chunk as usize)
        };
        assert!(landed == data, "round {round}: data differs");
        total += chunk;
    }
    assert_eq!(total, 64 << 20);
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_RTS);
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_RTS);
    eprintln!(
        "64 MiB through 5% drop / 1% dup / reorder in {:?} ({} frames a->b, {} b->a)",
        start.elapsed(),
        link.frames_ab,
        link.frames_ba
    );
}

/// One 1 MiB WRITE or READ with the listed frames (by index per direction) dropped.
fn targeted(drop_ab: Vec<usize>, drop_ba: Vec<usize>, op: u8) {
    let mut p = pair(64);
    let mut link = Link::clean();
    let n1 = Arc::new(AtomicUsize::new(0));
    let n2 = Arc::new(AtomicUsize::new(0));
    let (c1, c2) = (n1.clone(), n2.clone());
    link.filter_ab = Some(Box::new(move |_| {
        let i = c1.fetch_add(1, Ordering::Relaxed);
        !drop_ab.contains(&i)
    }));
    link.filter_ba = Some(Box::new(move |_| {
        let i = c2.fetch_add(1, Ordering::Relaxed);
        !drop_ba.contains(&i)
    }));
    let len = 1u64 << 20;
    let MrPair { src, ka, dst, kb } = MrPair::new(&mut p.a, &mut p.b, p.pda, p.pdb, len);
    let data = pattern(1, len as usize);
    if op == VRDMA_WR_RDMA_READ {
        p.b.write(dst, &data)
    } else {
        p.a.write(src, &data)
    };
    let w = Wqe {
        wr_id: 1,
        opcode: op,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(src, len as u32, ka)],
        remote_addr: dst,
        rkey: kb,
        ..Default::default()
    };
    p.a.post_send(&mut p.qa, &w);
    let got = wait_a(&mut p, &mut link, 1);
    assert_eq!((got[0].wr_id, got[0].status), (1, VRDMA_WC_SUCCESS));
    let landed = if op == VRDMA_WR_RDMA_READ {
        p.a.read(src, len as usize)
    } else {
        p.b.read(dst, len as usize)
    };
    assert!(landed == data, "data differs");
}

#[test]
fn drop_write_middle() {
    targeted(vec![5], vec![], VRDMA_WR_RDMA_WRITE);
}
#[test]
fn drop_write_last() {
    targeted(vec![255], vec![], VRDMA_WR_RDMA_WRITE);
}
#[test]
fn drop_acks() {
    targeted(vec![], vec![0, 1, 2], VRDMA_WR_RDMA_WRITE);
}
#[test]
fn drop_many_both_ways() {
    targeted(
        vec![3, 10, 11, 40, 41, 42, 100],
        vec![1, 5],
        VRDMA_WR_RDMA_WRITE,
    );
}
#[test]
fn drop_read_response_middle() {
    targeted(vec![], vec![5], VRDMA_WR_RDMA_READ);
}
#[test]
fn drop_read_request() {
    targeted(vec![0], vec![], VRDMA_WR_RDMA_READ);
}
#[test]
fn drop_read_response_last() {
    targeted(vec![], vec![255], VRDMA_WR_RDMA_READ);
}

#[test]
fn a_lost_packet_before_an_error_wqe_is_sent_again() {
    // WRITE 1 is sent and lost; WRITE 2 fails locally (bad lkey, LOC_PROT_ERR), which stops
    // the requester: nothing after it may leave, and the QP goes to ERROR when it retires.
    // WRITE 1 retires first and must still be sent again when its ACK timer fires, or the QP
    // waits for that ACK forever (seen as a stalled stream after a DEREG_MR beside by-reference
    // segments: a stale packet dropped, the next WQE failing on the deregistered MR).
    let mut p = pair(64);
    let mut link = Link::clean();
    let sent = Arc::new(AtomicUsize::new(0));
    let count = sent.clone();
    link.filter_ab = Some(Box::new(move |_| {
        count.fetch_add(1, Ordering::Relaxed) != 0
    }));
    let len = 4096u64;
    let MrPair { src, ka, dst, kb } = MrPair::new(&mut p.a, &mut p.b, p.pda, p.pdb, len);
    let data = pattern(7, len as usize);
    p.a.write(src, &data);
    for (wr_id, lkey) in [(1, ka), (2, ka ^ 0x5a00)] {
        let w = rdma(wr_id, VRDMA_WR_RDMA_WRITE, (src, len as u32, lkey), dst, kb);
        p.a.post_send_nodb(&mut p.qa, &w);
    }
    p.a.doorbell(p.qa.qpn);
    let got = wait_a(&mut p, &mut link, 2);
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, VRDMA_WC_SUCCESS), (2, VRDMA_WC_LOC_PROT_ERR)]
    );
    assert!(
        sent.load(Ordering::Relaxed) >= 2,
        "WRITE 1 was not sent again"
    );
    assert!(
        p.b.read(dst, len as usize) == data,
        "WRITE 1's data differs"
    );
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_ERR);
}
