//! ODP state stays bounded whatever a peer or a local WQE does (spec §12.4, §12.6): transfers
//! larger than the resident budget make progress chunk by chunk, outstanding page requests are
//! capped per device, failed chunks expire, and the bookkeeping never grows with the number of
//! chunks touched.

mod common;

use std::time::{Duration, Instant};

use common::odp::*;
use common::*;
use vrdma_backend::memory::odp::{OdpConfig, FAIL_HOLD};
use vrdma_backend::memory::MrError;
use vrdma_backend::transport;
use vrdma_spec::*;

const CH: u64 = 2 << 20;
/// Guest memory (MiB) of each node in the 64 MiB transfer tests: source, target and slack.
const MEM: u64 = 2 * 64 + 16;

/// One 64 MiB RDMA `op` (READ or WRITE) with the ODP MR at `va` on `odp` (B: the target, A: the
/// local SGE), whose device keeps at most 4 chunks resident: it completes with the right data and
/// without thrashing (fewer than two faults per chunk).
fn transfer_64m_with_4_chunk_budget(op: u8, odp: Side, va: u64, seed: u64) {
    const LEN: u64 = 64 << 20;
    const NB: usize = 4;
    let what = if op == VRDMA_WR_RDMA_READ {
        "READ"
    } else {
        "WRITE"
    };
    let mut p = match odp {
        Side::A => Pair::with(MEM).odp_a(budget(NB)).build(),
        Side::B => Pair::with(MEM).odp_b(budget(NB)).build(),
    };
    if odp == Side::B {
        p.budget_b = Some(NB);
    }
    let other = if odp == Side::A { Side::B } else { Side::A };
    let (kodp, back) = p.odp_mr(odp, va, LEN);
    let (pinned, kpin) = p.mr(other, LEN);
    // The WQE's local SGE is on A, its remote range on B.
    let (local, lkey, remote, rkey) = match odp {
        Side::A => ((va, back), kodp, (pinned, pinned), kpin),
        Side::B => ((pinned, pinned), kpin, (va, back), kodp),
    };
    let data = pattern(seed, LEN as usize);
    // (address the WQE names, GPA that backs it) of the side the data comes from and goes to.
    let (from, to) = if op == VRDMA_WR_RDMA_READ {
        (remote, local)
    } else {
        (local, remote)
    };
    let from_node = if op == VRDMA_WR_RDMA_READ { &p.b } else { &p.a };
    from_node.write(from.1, &data);
    p.post(0, &rdma(1, op, (local.0, LEN as u32, lkey), remote.0, rkey));
    let c = p.run_until(0, 1);
    assert_eq!(c[0].status, VRDMA_WC_SUCCESS, "{:?}", c[0]);
    if odp == Side::A {
        assert!(p.a.dev.mrs.write().odp_resident_total() <= NB);
    }
    let to_node = if op == VRDMA_WR_RDMA_READ { &p.a } else { &p.b };
    assert!(
        to_node.read(to.1, LEN as usize) == data,
        "{what} data differs"
    );
    let nch = (LEN / CH) as usize;
    let faults = if odp == Side::A { &p.pa } else { &p.pb }.faults.len();
    assert!(
        faults < 2 * nch,
        "{faults} faults for {nch} chunks: the {what} thrashed"
    );
}

/// A 64 MiB RDMA READ from an ODP MR whose device keeps at most 4 chunks resident completes with
/// the right data: the responder resolves one packet at a time instead of the whole range.
#[test]
fn read_64m_with_4_chunk_budget_completes() {
    transfer_64m_with_4_chunk_budget(VRDMA_WR_RDMA_READ, Side::B, 0x7100_0000_0000, 64);
}

/// A 64 MiB RDMA WRITE into an ODP MR with a 4-chunk budget completes: the first packet checks the
/// whole RETH range without faulting it in.
#[test]
fn write_64m_with_4_chunk_budget_completes() {
    transfer_64m_with_4_chunk_budget(VRDMA_WR_RDMA_WRITE, Side::B, 0x7200_0000_0000, 65);
}

/// A 64 MiB RDMA WRITE whose local SGE is an ODP MR on a device with a 4-chunk budget completes:
/// the requester checks the SGE without faulting it in and resolves each packet's bytes.
#[test]
fn write_64m_from_odp_lkey_with_4_chunk_budget_completes() {
    transfer_64m_with_4_chunk_budget(VRDMA_WR_RDMA_WRITE, Side::A, 0x7300_0000_0000, 66);
}

/// Accesses to thousands of fresh chunks (what a peer holding the rkey of an implicit ODP MR
/// can send, one READ per chunk) keep the device's ODP state bounded: at most `max_requests`
/// FAULT requests are outstanding and no chunk entry exists beyond them; the refused access
/// faults (RNR at the responder) and its QP is resumed when a request ends.
#[test]
fn fresh_chunks_keep_odp_state_bounded() {
    let cfg = OdpConfig::default();
    let cap = cfg.max_requests;
    let mut n = Node::new(1, 16, 9000);
    enable_odp(&mut n, cfg);
    let pd = n.create_pd();
    let k = reg_odp(&mut n, pd, 0, 0, true);
    let base = 0x1000_0000_0000u64;
    let touched = 5 * cap as u64;
    for i in 0..touched {
        let r = n.dev.mrs.write().resolve_for(
            Some(9),
            k,
            pd,
            base + i * CH,
            64,
            VRDMA_ACCESS_REMOTE_READ,
        );
        assert!(matches!(r, Err(MrError::Fault { .. })), "{r:?}");
    }
    n.dev.mrs.write().odp_check_invariants().expect("ODP state");
    assert_eq!(n.dev.mrs.write().odp_pending_requests(), cap);
    assert_eq!(
        n.dev.mrs.write().odp_chunk_count(),
        cap,
        "chunk entries beyond the requests"
    );
    let reqs = n.out.take_page_requests();
    assert_eq!(reqs.len(), cap, "FAULT requests sent");
    assert!(n.dev.mrs.write().take_resumed().is_empty());
    // One request ends (answered with an error): the refused QP may try again.
    let c = VrdmaCmdOdpPageResp {
        req_id: reqs[0].req_id,
        mr_key: k,
        status: VRDMA_STATUS_ACCESS,
        flags: 0,
        iova: reqs[0].iova,
        npages: 0,
        reserved: 0,
    };
    n.cmd(VRDMA_CMD_ODP_PAGE_RESP, c.as_bytes())
        .expect("page resp");
    assert_eq!(n.dev.mrs.write().take_resumed(), vec![9]);
    n.dev.mrs.write().odp_check_invariants().expect("ODP state");
}

/// Failed chunks do not stay forever: `FAIL_HOLD` after the failure they are gone.
#[test]
fn failed_chunks_expire() {
    let mut n = Node::new(1, 16, 9000);
    enable_odp(&mut n, OdpConfig::default());
    let pd = n.create_pd();
    let k = reg_odp(&mut n, pd, 0, 0, true);
    let mut pager = Pager::default();
    pager.status.insert(k, VRDMA_STATUS_BAD_ADDRESS);
    let base = 0x2000_0000_0000u64;
    const N: u64 = 300;
    for i in 0..N {
        let r = n.resolve(k, pd, base + i * CH, 64, VRDMA_ACCESS_REMOTE_READ);
        assert!(matches!(r, Err(MrError::Fault { .. })), "{r:?}");
    }
    let t0 = Instant::now();
    assert_eq!(pager.serve(&mut n), N as usize);
    assert_eq!(
        n.dev.mrs.write().odp_chunk_count(),
        N as usize,
        "failed chunks"
    );
    let r = n.resolve(k, pd, base, 64, VRDMA_ACCESS_REMOTE_READ);
    assert!(matches!(r, Err(MrError::OdpFailed { .. })), "{r:?}");
    // The next ODP deadline is the expiry; after it nothing is left.
    let next = n.dev.odp_tick(t0).expect("an expiry is due");
    assert!(next <= Instant::now() + FAIL_HOLD);
    n.dev
        .odp_tick(Instant::now() + FAIL_HOLD + Duration::from_millis(1));
    assert_eq!(
        n.dev.mrs.write().odp_chunk_count(),
        0,
        "failed chunks left after FAIL_HOLD"
    );
    n.dev.mrs.write().odp_check_invariants().expect("ODP state");
}

/// A READ whose responses reach a chunk that is not resident holds them back without keeping
/// the engine busy: the responder's timers report nothing due while it waits, and the answer to
/// the page request resumes the responses where they stopped.
#[test]
fn read_waiting_for_a_fault_does_not_spin() {
    const LEN: u64 = 2 * CH;
    let mut p = Pair::with(32).build();
    let (dst, ka) = p.mr(Side::A, LEN);
    let va = 0x7400_0000_0000u64;
    let (kb, back) = p.odp_mr(Side::B, va, LEN);
    let data = pattern(67, LEN as usize);
    p.b.write(back, &data);
    p.post(
        0,
        &rdma(1, VRDMA_WR_RDMA_READ, (dst, LEN as u32, ka), va, kb),
    );
    // The first chunk is answered (RNR, retry); the second one's FAULT is left unanswered.
    let mut steps = 0;
    while p.pb.faults.is_empty() {
        p.step();
        steps += 1;
        assert!(steps < 1000, "no first fault");
    }
    p.pb.silent.push(kb);
    while p.pb.faults.len() < 2 {
        p.step();
        steps += 1;
        assert!(steps < 2000, "the READ never reached the second chunk");
    }
    for _ in 0..5 {
        p.step();
    }
    let now = p.vt;
    let next = transport::on_tick(&p.b.dev, now);
    assert!(
        next.is_none_or(|d| d > now),
        "the responder wants a tick right away while it waits for a fault"
    );
    // Answer the second chunk's FAULT: the READ completes.
    let r = p.pb.faults[1];
    p.pb.reply(&mut p.b, &r);
    let c = p.run_until(0, 1);
    assert_eq!(c[0].status, VRDMA_WC_SUCCESS, "{:?}", c[0]);
    assert!(p.a.read(dst, LEN as usize) == data, "READ data differs");
}

/// The same through the wire: a peer sends thousands of READ requests (valid ICRC, the expected
/// PSN: an RNR NAK keeps it) for fresh chunks of an implicit ODP MR. Every one is RNR-NAKed, and
/// the responder's ODP state stays at the request cap.
#[test]
fn peer_reads_of_fresh_chunks_keep_odp_state_bounded() {
    use vrdma_backend::wire::{Bth, ExtHeaders, Opcode, PacketBuilder, Reth, RocePacket, Syndrome};
    let cap = OdpConfig::default().max_requests;
    let mut p = Pair::with(32).build();
    let (dst, ka) = p.mr(Side::A, 4096);
    let kb = p.implicit_mr(Side::B);
    let base = 0x3000_0000_0000u64;
    p.post(0, &rdma(1, VRDMA_WR_RDMA_READ, (dst, 64, ka), base, kb));
    let good = p.a.dev.outbox(0).frames.remove(0);
    let parsed = RocePacket::parse(&good).expect("READ request parses");
    assert_eq!(parsed.bth.opcode, Opcode::RcReadRequest);
    let (qpn, psn) = (parsed.bth.dest_qp, parsed.bth.psn);
    let n = 5 * cap as u64;
    for i in 0..n {
        let mut b = PacketBuilder::new(parsed.addr, Bth::new(Opcode::RcReadRequest, qpn, psn));
        b.ext = ExtHeaders {
            reth: Some(Reth {
                va: base + i * CH,
                rkey: kb,
                dma_len: 64,
            }),
            ..Default::default()
        };
        let mut f = Vec::new();
        b.build(&[], &mut f).expect("build");
        transport::on_frame(&p.b.dev, &f);
    }
    let replies = std::mem::take(&mut p.b.dev.outbox(0).frames);
    assert_eq!(replies.len(), n as usize, "one reply per request");
    for f in &replies {
        let r = RocePacket::parse(f).expect("reply parses");
        let rnr = r
            .ext
            .aeth
            .is_some_and(|a| matches!(a.syndrome, Syndrome::RnrNak { .. }));
        assert!(
            rnr && r.bth.psn == psn,
            "not an RNR NAK for the PSN: {:?}",
            r.bth
        );
    }
    p.b.dev
        .mrs
        .write()
        .odp_check_invariants()
        .expect("ODP state");
    assert_eq!(p.b.dev.mrs.write().odp_pending_requests(), cap);
    assert_eq!(p.b.dev.mrs.write().odp_chunk_count(), cap);
    assert_eq!(p.b.out.take_page_requests().len(), cap);
    assert_eq!(p.b.qp_state(p.conns[0].qp.qb.qpn), VRDMA_QPS_RTS);
}
