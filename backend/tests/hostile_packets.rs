//! Hostile packets (spec §14.5, §14.6, §16): random frames and mutated valid RoCEv2 frames
//! (truncated at every length, bit flips with the lengths, IP checksum and ICRC recomputed so they
//! reach the transport, random opcodes, PSNs far out of window, huge/overflowing RETH lengths and
//! addresses, misaligned atomics, AETH garbage, wrong Q_Key, unknown / RESET / ERR QPs) go into
//! `transport::on_frame`. The receiver must not panic, a healthy QP on the same devices keeps
//! moving data intact, and guest memory around the targeted MR (a canary) never changes.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use common::rng::Rng;
use common::*;
use vrdma_backend::transport;
use vrdma_spec::*;

fn set_u32_be(f: &mut [u8], off: usize, v: u32) {
    if off + 4 <= f.len() {
        f[off..off + 4].copy_from_slice(&v.to_be_bytes());
    }
}

fn set_u64_be(f: &mut [u8], off: usize, v: u64) {
    if off + 8 <= f.len() {
        f[off..off + 8].copy_from_slice(&v.to_be_bytes());
    }
}

struct Bed {
    a: Node,
    b: Node,
    link: Link,
    /// Healthy RC pair.
    healthy: HealthyPair,
    /// Target RC pair (hostile traffic goes to tb on b, responses to ta on a).
    ta: QpH,
    tb: QpH,
    tcqa: RingH,
    tcqb: RingH,
    tsrc: u64,
    tka: u32,
    /// b's target MR [tdst, tdst + TLEN), surrounded by canary pages.
    tdst: u64,
    tkb: u32,
    /// UD QPs.
    ua: QpH,
    ub: QpH,
    ucqb: RingH,
    ah: u32,
    ubuf: u64,
    ukb: u32,
    /// QPs on b in RESET and ERR.
    reset_qpn: u32,
    err_qpn: u32,
}

const TLEN: u64 = 16384;
const CANARY: u8 = 0xc5;

fn bed() -> Bed {
    let (mut a, mut b, pda, pdb) = Sides::new(32, 1500).parts();
    let healthy = HealthyPair::new(&mut a, &mut b, pda, pdb);
    let (ca2, tcqa) = a.create_cq(4096);
    let (cb2, tcqb) = b.create_cq(4096);
    let ta = a.create_qp(QpSpec::rc(pda, ca2));
    let tb = b.create_qp(QpSpec::rc(pdb, cb2));
    connect(&mut a, &ta, &mut b, &tb, RtsAttrs::mtu(3));
    let tsrc = a.alloc(65536);
    let tka = a.reg_mr(pda, tsrc, 65536, ACC_ALL);
    let area = b.alloc(TLEN + 8192);
    b.write(area, &vec![CANARY; (TLEN + 8192) as usize]);
    let tdst = area + 4096;
    let tkb = b.reg_mr(pdb, tdst, TLEN, ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
    // UD pair.
    let mut us = QpSpec::rc(pda, ca2);
    us.qp_type = VRDMA_QPT_UD;
    let ua = a.create_qp(us);
    us.pd = pdb;
    us.scq = cb2;
    us.rcq = cb2;
    let (ucb, ucqb) = b.create_cq(4096);
    us.rcq = ucb;
    let ub = b.create_qp(us);
    ud_rts(&mut a, &ua, 0x1111);
    ud_rts(&mut b, &ub, 0x1111);
    let av = a.av_to(&b);
    let ah = a.create_ah(pda, av);
    let ubuf = b.alloc(65536);
    let ukb = b.reg_mr(pdb, ubuf, 65536, ACC_ALL);
    // A RESET QP and an ERR QP on b.
    let r = b.create_qp(QpSpec::rc(pdb, cb2));
    let e = b.create_qp(QpSpec::rc(pdb, cb2));
    let avb = b.av_to(&a);
    rts(&mut b, &e, ta.qpn, avb, RtsAttrs::mtu(3), (5000, 1000));
    b.qp_to_err(e.qpn);
    Bed {
        a,
        b,
        link: Link::clean(),
        healthy,
        ta,
        tb,
        tcqa,
        tcqb,
        tsrc,
        tka,
        tdst,
        tkb,
        ua,
        ub,
        ucqb,
        ah,
        ubuf,
        ukb,
        reset_qpn: r.qpn,
        err_qpn: e.qpn,
    }
}

/// Post a mix of operations on the target QPs of `a` and capture the request frames a sends
/// (not delivered). Then deliver them once to b to capture b's responses (ACKs, read responses,
/// atomic ACKs); those are templates for hostile responses towards a.
fn templates(t: &mut Bed) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut rq = t.tb.rq.clone().unwrap();
    for i in 0..8 {
        t.b.post_recv(&mut rq, 100 + i, &[(t.tdst, 4096, t.tkb)]);
    }
    t.tb.rq = Some(rq);
    let mut urq = t.ub.rq.clone().unwrap();
    for i in 0..8 {
        t.b.post_recv(&mut urq, 200 + i, &[(t.ubuf + i * 4096, 4096, t.ukb)]);
    }
    t.ub.rq = Some(urq);
    let ops: Vec<Wqe> = vec![
        rdma(1, VRDMA_WR_RDMA_WRITE, (t.tsrc, 3000, t.tka), t.tdst, t.tkb),
        send(2, (t.tsrc, 2500, t.tka)),
        rdma(
            3,
            VRDMA_WR_RDMA_READ,
            (t.tsrc + 8192, 3000, t.tka),
            t.tdst,
            t.tkb,
        ),
        fetch_add(4, (t.tsrc + 16384, 8, t.tka), t.tdst + 64, t.tkb, 5),
        cmp_swap(5, (t.tsrc + 16384, 8, t.tka), t.tdst + 64, t.tkb, 5, 9),
        Wqe {
            wr_id: 6,
            opcode: VRDMA_WR_RDMA_WRITE_WITH_IMM,
            flags: VRDMA_SEND_SIGNALED,
            ex: 0x01020304,
            sges: vec![(t.tsrc, 100, t.tka)],
            remote_addr: t.tdst + 4096,
            rkey: t.tkb,
            ..Default::default()
        },
        Wqe {
            wr_id: 7,
            opcode: VRDMA_WR_ATOMIC_WRITE,
            flags: VRDMA_SEND_SIGNALED,
            remote_addr: t.tdst + 128,
            rkey: t.tkb,
            compare_add: 0x0102_0304_0506_0708,
            ..Default::default()
        },
        Wqe {
            wr_id: 8,
            opcode: VRDMA_WR_FLUSH,
            flags: VRDMA_SEND_SIGNALED,
            remote_addr: t.tdst,
            rkey: t.tkb,
            compare_add: 4096,
            flush: Some((VRDMA_FLUSH_GLOBAL, VRDMA_FLUSH_RANGE)),
            ..Default::default()
        },
    ];
    let mut ta = t.ta.clone();
    for w in &ops {
        t.a.post_send(&mut ta, w);
    }
    t.ta = ta;
    let mut ua = t.ua.clone();
    t.a.post_send(
        &mut ua,
        &Wqe {
            wr_id: 9,
            opcode: VRDMA_WR_SEND_WITH_IMM,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(t.tsrc, 500, t.tka)],
            ah: t.ah,
            remote_qpn: t.ub.qpn,
            remote_qkey: 0x1111,
            ..Default::default()
        },
    );
    t.ua = ua;
    let reqs: Vec<Vec<u8>> = std::mem::take(&mut t.a.dev.outbox(0).frames);
    assert!(
        reqs.len() >= 10,
        "expected many request frames, got {}",
        reqs.len()
    );
    for f in &reqs {
        transport::on_frame(&t.b.dev, f);
    }
    let resps: Vec<Vec<u8>> = std::mem::take(&mut t.b.dev.outbox(0).frames);
    assert!(resps.len() >= 3, "expected responses, got {}", resps.len());
    // Let the target pair settle with the real responses so that both sides are in sync.
    for f in &resps {
        transport::on_frame(&t.a.dev, f);
    }
    t.a.dev.outbox(0).frames.clear();
    (reqs, resps)
}

/// Drop what both nodes sent and drain the hostile CQs so they never overflow (overflow is a
/// defined outcome too, but it is not what these tests are about).
fn drop_output(t: &mut Bed) {
    t.a.dev.outbox(0).frames.clear();
    t.b.dev.outbox(0).frames.clear();
    t.a.poll_cq(&mut t.tcqa);
    t.b.poll_cq(&mut t.tcqb);
    t.b.poll_cq(&mut t.ucqb);
}

fn mutate(r: &mut Rng, t: &Bed, tpl: &[u8]) -> Vec<u8> {
    let mut f = tpl.to_vec();
    let qpns = [
        t.tb.qpn,
        t.ub.qpn,
        t.reset_qpn,
        t.err_qpn,
        1,
        0,
        2,
        0xff_ffff,
        t.tb.qpn + 100,
        t.ta.qpn,
        t.ua.qpn,
    ];
    match r.below(12) {
        // Truncate without reseal (ICRC/length checks must drop it).
        0 => {
            let n = r.below(f.len() as u64) as usize;
            f.truncate(n);
        }
        // Truncate, then reseal so it reaches the transport with short headers/payload.
        1 => {
            let n = BTH + 12 + 4 + r.below((f.len() - BTH - 12) as u64) as usize;
            f.truncate(n.min(f.len()));
            reseal(&mut f);
        }
        // Random bit flips in the transport part, resealed.
        2 | 3 => {
            for _ in 0..1 + r.below(4) {
                let o = BTH + r.below((f.len() - BTH - 4) as u64) as usize;
                f[o] ^= 1 << r.below(8);
            }
            reseal(&mut f);
        }
        // Random opcode.
        4 => {
            f[BTH] = r.next() as u8;
            reseal(&mut f);
        }
        // PSN far away / random.
        5 => {
            let psn = (r.next() as u32) & 0xff_ffff;
            f[BTH + 9..BTH + 12].copy_from_slice(&psn.to_be_bytes()[1..]);
            reseal(&mut f);
        }
        // Destination QP from the hostile set.
        6 => {
            let q = r.pick(&qpns);
            f[BTH + 5..BTH + 8].copy_from_slice(&q.to_be_bytes()[1..]);
            reseal(&mut f);
        }
        // RETH / AtomicETH / AETH / DETH words after the BTH: huge lengths, addresses, keys.
        7 | 8 => {
            let o = BTH + 12 + 4 * r.below(8) as usize;
            match r.below(6) {
                0 => set_u32_be(&mut f, o, u32::MAX),
                1 => set_u32_be(&mut f, o, 0x8000_0000),
                2 => set_u64_be(&mut f, o, u64::MAX - r.below(16)),
                3 => set_u64_be(&mut f, o, t.tdst + TLEN - r.below(16)),
                4 => set_u32_be(&mut f, o, t.tkb ^ (1 + r.below(255) as u32)),
                _ => set_u32_be(&mut f, o, r.next() as u32),
            }
            reseal(&mut f);
        }
        // Pad count / solicited / migreq bits.
        9 => {
            f[BTH + 1] = r.next() as u8;
            reseal(&mut f);
        }
        // Extend with garbage payload.
        10 => {
            let n = f.len() - 4;
            let extra: Vec<u8> = (0..r.below(3000)).map(|_| r.next() as u8).collect();
            f.splice(n..n, extra);
            reseal(&mut f);
        }
        // Completely random frame with a valid Ethernet/IP/UDP prefix.
        _ => {
            let n = BTH + r.below(200) as usize;
            let mut g = tpl[..BTH].to_vec();
            g.extend((0..n - BTH).map(|_| r.next() as u8));
            g.extend_from_slice(&[0; 4]);
            reseal(&mut g);
            f = g;
        }
    }
    f
}

/// One healthy RDMA WRITE + SEND round on the healthy pair, with data checks.
fn healthy_round(t: &mut Bed, round: u64) {
    t.healthy
        .round(&mut t.a, &mut t.b, &mut t.link, round, 5000, 3000);
}

fn check_canary(t: &Bed) {
    let before = t.b.read(t.tdst - 4096, 4096);
    let after = t.b.read(t.tdst + TLEN, 4096);
    assert!(
        before.iter().all(|&x| x == CANARY),
        "memory below the target MR was written"
    );
    assert!(
        after.iter().all(|&x| x == CANARY),
        "memory above the target MR was written"
    );
}

/// Bring b's target QP back to RTS (after hostile traffic moved it to ERR) so that later
/// templates are processed again.
fn revive_target(t: &mut Bed) {
    let av = t.b.av_to(&t.a);
    let a = VrdmaQpAttr {
        qp_state: VRDMA_QPS_RESET,
        ..Default::default()
    };
    t.b.modify_qp(t.tb.qpn, VRDMA_QP_STATE, a).unwrap();
    // After RESET the device restarts the indices at 0 in the control page (§4.3); the drivers
    // re-read `producer` from it.
    {
        let q = &mut t.tb;
        q.sq.idx = t.b.mem.load_u32_acquire(q.sq.ctrl()).unwrap();
        let rq = q.rq.as_mut().unwrap();
        rq.idx = t.b.mem.load_u32_acquire(rq.ctrl()).unwrap();
    }
    let tb = t.tb.clone();
    rts(&mut t.b, &tb, t.ta.qpn, av, RtsAttrs::mtu(3), (5000, 1000));
    let mut rq = t.tb.rq.clone().unwrap();
    // Post fresh receives.
    for i in 0..4 {
        t.b.post_recv(&mut rq, 300 + i, &[(t.tdst, 4096, t.tkb)]);
    }
    t.tb.rq = Some(rq);
    let av = t.a.av_to(&t.b);
    let a = VrdmaQpAttr {
        qp_state: VRDMA_QPS_RESET,
        ..Default::default()
    };
    t.a.modify_qp(t.ta.qpn, VRDMA_QP_STATE, a).unwrap();
    t.ta.sq.idx = t.a.mem.load_u32_acquire(t.ta.sq.ctrl()).unwrap();
    let ta = t.ta.clone();
    rts(&mut t.a, &ta, t.tb.qpn, av, RtsAttrs::mtu(3), (1000, 5000));
}

fn run(seed: u64, budget: Duration) {
    let mut t = bed();
    let (reqs, resps) = templates(&mut t);
    healthy_round(&mut t, 1);
    let mut r = Rng::new(seed);
    let start = Instant::now();
    let mut n = 0u64;
    let mut round = 2;
    while start.elapsed() < budget {
        for _ in 0..64 {
            // Requests towards b's responder, responses towards a's completer.
            let to_b = r.below(3) != 0;
            let tpl = if to_b {
                r.pick(&reqs.iter().collect::<Vec<_>>())
            } else {
                r.pick(&resps.iter().collect::<Vec<_>>())
            };
            let f = mutate(&mut r, &t, tpl);
            let dev = if to_b { &mut t.b.dev } else { &mut t.a.dev };
            let res = catch_unwind(AssertUnwindSafe(|| transport::on_frame(dev, &f)));
            assert!(
                res.is_ok(),
                "seed {seed} frame {n}: on_frame panicked on {f:02x?}"
            );
            n += 1;
        }
        // Hostile NAKs/ACKs the devices produced go nowhere; timers must not panic either.
        t.a.dev.outbox(0).frames.clear();
        t.b.dev.outbox(0).frames.clear();
        let now = Instant::now();
        let ra = catch_unwind(AssertUnwindSafe(|| transport::on_tick(&t.a.dev, now)));
        let rb = catch_unwind(AssertUnwindSafe(|| transport::on_tick(&t.b.dev, now)));
        assert!(ra.is_ok() && rb.is_ok(), "seed {seed}: on_tick panicked");
        drop_output(&mut t);
        check_canary(&t);
        if round % 4 == 0 {
            revive_target(&mut t);
        }
        healthy_round(&mut t, round);
        round += 1;
    }
    assert!(n >= 256, "only {n} frames");
    // The UD QP stays in RTS whatever it received (UD never errors on receive).
    assert_eq!(t.b.qp_state(t.ub.qpn), VRDMA_QPS_RTS);
    check_canary(&t);
}

#[test]
fn mutated_frames_never_hurt_other_qps_or_memory() {
    for seed in [1u64, 2, 3] {
        run(seed, Duration::from_millis(1500));
    }
}

/// Every truncation length of every template, with and without resealing.
#[test]
fn truncate_every_length() {
    let mut t = bed();
    let (reqs, resps) = templates(&mut t);
    for (i, tpl) in reqs.iter().chain(resps.iter()).enumerate() {
        for n in 0..tpl.len() {
            let mut f = tpl[..n].to_vec();
            let res = catch_unwind(AssertUnwindSafe(|| {
                transport::on_frame(&t.b.dev, &f);
                transport::on_frame(&t.a.dev, &f);
            }));
            assert!(res.is_ok(), "template {i} truncated at {n}: panic");
            if n >= BTH + 16 {
                reseal(&mut f);
                let res = catch_unwind(AssertUnwindSafe(|| {
                    transport::on_frame(&t.b.dev, &f);
                    transport::on_frame(&t.a.dev, &f);
                }));
                assert!(res.is_ok(), "template {i} resealed at {n}: panic");
            }
        }
        drop_output(&mut t);
    }
    check_canary(&t);
    healthy_round(&mut t, 7);
}

/// Fully random frames (random length, random bytes), and random bytes behind a valid
/// Ethernet/IP/UDP 4791 prefix with a correct ICRC.
#[test]
fn random_frames() {
    let mut t = bed();
    let (reqs, _) = templates(&mut t);
    let mut r = Rng::new(99);
    for i in 0..20000u64 {
        let mut f: Vec<u8> = (0..r.below(1600)).map(|_| r.next() as u8).collect();
        if i % 2 == 0 && f.len() > BTH + 16 {
            f[..BTH].copy_from_slice(&reqs[0][..BTH]);
            reseal(&mut f);
        }
        let res = catch_unwind(AssertUnwindSafe(|| transport::on_frame(&t.b.dev, &f)));
        assert!(res.is_ok(), "frame {i}: panic on {f:02x?}");
        if i % 256 == 0 {
            t.b.dev.outbox(0).frames.clear();
            t.b.poll_cq(&mut t.tcqb);
            t.b.poll_cq(&mut t.ucqb);
        }
    }
    t.b.dev.outbox(0).frames.clear();
    check_canary(&t);
    healthy_round(&mut t, 3);
}

/// The first template frame with BTH opcode `op`.
fn find(reqs: &[Vec<u8>], op: u8) -> Vec<u8> {
    reqs.iter()
        .find(|f| f[BTH] == op)
        .unwrap_or_else(|| panic!("no template with opcode {op:#x}"))
        .clone()
}

/// Fresh bed and templates, but the target QPs were reset and reconnected so that b expects the
/// templates' first PSN again.
fn fresh() -> (Bed, Vec<Vec<u8>>) {
    let mut t = bed();
    let (reqs, _) = templates(&mut t);
    revive_target(&mut t);
    t.b.out.take_events();
    t.b.poll_cq(&mut t.tcqb);
    t.b.poll_cq(&mut t.ucqb);
    (t, reqs)
}

/// Feed `f` to b; return the AETH syndromes of the ACK/NAK frames b answered with.
fn feed_b(t: &mut Bed, f: &[u8]) -> Vec<u8> {
    transport::on_frame(&t.b.dev, f);
    std::mem::take(&mut t.b.dev.outbox(0).frames)
        .iter()
        .filter(|g| g.len() > BTH + 16 && g[BTH] == 0x11)
        .map(|g| g[BTH + 12])
        .collect()
}

/// Set the PSN of a request to b's expected PSN (templates were sent from PSN 1000 on).
fn with_psn(mut f: Vec<u8>, psn: u32) -> Vec<u8> {
    f[BTH + 9..BTH + 12].copy_from_slice(&psn.to_be_bytes()[1..]);
    f
}

const NAK_INV_REQ: u8 = 0x61;
const NAK_REM_ACCESS: u8 = 0x62;

/// §14.6 outcomes of R_Key violations and malformed requests, checked one by one.
#[test]
fn responder_outcomes_for_bad_requests() {
    // (opcode of the template, field offset after BTH, bytes to write, expected NAK, event)
    struct Case {
        name: &'static str,
        op: u8,
        patch: fn(&mut Vec<u8>, &Bed),
        nak: u8,
        event: u32,
    }
    let cases = [
        Case {
            name: "WRITE_FIRST RETH length beyond the MR",
            op: 0x06,
            patch: |f, _| set_u32_be(f, BTH + 12 + 12, (TLEN + 4096) as u32),
            nak: NAK_REM_ACCESS,
            event: VRDMA_EV_QP_ACCESS_ERR,
        },
        Case {
            name: "WRITE_FIRST RETH va+len overflowing u64",
            op: 0x06,
            patch: |f, _| set_u64_be(f, BTH + 12, u64::MAX - 100),
            nak: NAK_REM_ACCESS,
            event: VRDMA_EV_QP_ACCESS_ERR,
        },
        Case {
            name: "WRITE_FIRST wrong rkey variant",
            op: 0x06,
            patch: |f, t| set_u32_be(f, BTH + 12 + 8, t.tkb ^ 0x01),
            nak: NAK_REM_ACCESS,
            event: VRDMA_EV_QP_ACCESS_ERR,
        },
        Case {
            name: "READ request with a 2 GiB - 1 length",
            op: 0x0c,
            patch: |f, _| set_u32_be(f, BTH + 12 + 12, 0x7fff_ffff),
            nak: NAK_REM_ACCESS,
            event: VRDMA_EV_QP_ACCESS_ERR,
        },
        Case {
            name: "READ request va just below the MR",
            op: 0x0c,
            patch: |f, t| set_u64_be(f, BTH + 12, t.tdst - 8),
            nak: NAK_REM_ACCESS,
            event: VRDMA_EV_QP_ACCESS_ERR,
        },
        Case {
            name: "FETCH_ADD misaligned",
            op: 0x14,
            patch: |f, t| set_u64_be(f, BTH + 12, t.tdst + 65),
            nak: NAK_INV_REQ,
            event: VRDMA_EV_QP_REQ_ERR,
        },
        Case {
            name: "FETCH_ADD beyond the MR",
            op: 0x14,
            patch: |f, t| set_u64_be(f, BTH + 12, t.tdst + TLEN),
            nak: NAK_REM_ACCESS,
            event: VRDMA_EV_QP_ACCESS_ERR,
        },
    ];
    for c in &cases {
        let (mut t, reqs) = fresh();
        let mut f = with_psn(find(&reqs, c.op), 1000);
        (c.patch)(&mut f, &t);
        reseal(&mut f);
        let naks = feed_b(&mut t, &f);
        assert_eq!(naks, vec![c.nak], "{}: answer", c.name);
        assert_eq!(t.b.qp_state(t.tb.qpn), VRDMA_QPS_ERR, "{}: state", c.name);
        let ev = t.b.events();
        assert!(
            ev.iter().any(|e| e.type_ == c.event && e.id == t.tb.qpn),
            "{}: events {ev:?}",
            c.name
        );
        check_canary(&t);
        healthy_round(&mut t, 1);
    }
}

/// A PSN far ahead gets one PSN sequence NAK and changes nothing; far behind (outside the
/// duplicate window) is dropped or re-ACKed, never executed.
#[test]
fn psn_far_out_of_window() {
    let (mut t, reqs) = fresh();
    let before = t.b.read(t.tdst, TLEN as usize);
    let f = with_psn(find(&reqs, 0x06), 1000 + 0x40_0000);
    let mut f = f;
    reseal(&mut f);
    let naks = feed_b(&mut t, &f);
    assert_eq!(naks, vec![0x60], "PSN sequence error NAK");
    let naks = feed_b(&mut t, &f);
    assert!(naks.len() <= 1, "at most one NAK per gap: {naks:?}");
    let mut g = with_psn(
        find(&reqs, 0x06),
        1000u32.wrapping_sub(0x40_0000) & 0xff_ffff,
    );
    reseal(&mut g);
    let _ = feed_b(&mut t, &g);
    assert_eq!(
        t.b.read(t.tdst, TLEN as usize),
        before,
        "out-of-window write landed"
    );
    assert_eq!(t.b.qp_state(t.tb.qpn), VRDMA_QPS_RTS);
    check_canary(&t);
}

/// UD datagrams with the wrong Q_Key are dropped: no CQE, no receive consumed (§14.6).
#[test]
fn ud_wrong_qkey_is_dropped() {
    let (mut t, reqs) = fresh();
    let tpl = find(&reqs, 0x65);
    let consumer = |t: &Bed| {
        t.b.mem
            .load_u32_acquire(t.ub.rq.as_ref().unwrap().ctrl() + 64)
            .unwrap()
    };
    let c0 = consumer(&t);
    for qkey in [0u32, 0x1112, 0x8001_0000, u32::MAX] {
        let mut f = tpl.clone();
        set_u32_be(&mut f, BTH + 12, qkey);
        reseal(&mut f);
        transport::on_frame(&t.b.dev, &f);
    }
    assert!(t.b.dev.outbox(0).frames.is_empty(), "UD never answers");
    assert!(t.b.poll_cq(&mut t.ucqb).is_empty(), "wrong Q_Key delivered");
    assert_eq!(consumer(&t), c0, "receive WQE consumed");
    // The right Q_Key is delivered (the template itself).
    transport::on_frame(&t.b.dev, &tpl);
    let c = t.b.poll_cq(&mut t.ucqb);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, VRDMA_WC_SUCCESS);
}

/// Reset b's target QP and bring it back to RTR/RTS with an empty RQ (no receives posted).
fn reset_tb_empty(t: &mut Bed) {
    let a = VrdmaQpAttr {
        qp_state: VRDMA_QPS_RESET,
        ..Default::default()
    };
    t.b.modify_qp(t.tb.qpn, VRDMA_QP_STATE, a).unwrap();
    let rq = t.tb.rq.as_mut().unwrap();
    rq.idx = t.b.mem.load_u32_acquire(rq.ctrl()).unwrap();
    t.tb.sq.idx = t.b.mem.load_u32_acquire(t.tb.sq.ctrl()).unwrap();
    let (tb, av) = (t.tb.clone(), t.b.av_to(&t.a));
    rts(&mut t.b, &tb, t.ta.qpn, av, RtsAttrs::mtu(3), (5000, 1000));
    t.b.out.take_events();
}

/// Write a raw receive WQE (header + SGEs as given) at the RQ producer and publish it.
fn post_raw_recv(t: &mut Bed, wr_id: u64, num_sge: u32, sges: &[(u64, u32, u32)]) {
    let mut rq = t.tb.rq.clone().unwrap();
    let mut b = vec![0u8; 1 << rq.shift];
    b[0..8].copy_from_slice(&wr_id.to_le_bytes());
    b[8..12].copy_from_slice(&num_sge.to_le_bytes());
    for (i, (a, l, k)) in sges.iter().enumerate() {
        let o = 16 + i * 16;
        b[o..o + 8].copy_from_slice(&a.to_le_bytes());
        b[o + 8..o + 12].copy_from_slice(&l.to_le_bytes());
        b[o + 12..o + 16].copy_from_slice(&k.to_le_bytes());
    }
    t.b.write(rq.entry_gpa(rq.idx), &b);
    rq.idx = rq.idx.wrapping_add(1);
    t.b.mem.store_u32_release(rq.ctrl(), rq.idx).unwrap();
    t.tb.rq = Some(rq);
}

const NAK_REM_OP: u8 = 0x63;

/// §14.4 / §14.6 receive-side outcomes: malformed receive WQEs and too-small receive buffers.
#[test]
fn receive_wqe_errors_have_the_spec_outcome() {
    struct Case {
        name: &'static str,
        num_sge: u32,
        sge: fn(&Bed) -> (u64, u32, u32),
        nak: u8,
        status: u8,
    }
    let cases = [
        Case {
            name: "num_sge above max_recv_sge",
            num_sge: 200,
            sge: |t| (t.tdst, 4096, t.tkb),
            nak: NAK_REM_OP,
            status: VRDMA_WC_LOC_QP_OP_ERR,
        },
        Case {
            name: "SGE with a stale key",
            num_sge: 1,
            sge: |t| (t.tdst, 4096, t.tkb ^ 1),
            nak: NAK_REM_OP,
            status: VRDMA_WC_LOC_PROT_ERR,
        },
        Case {
            name: "SGE outside guest memory (key of the MR, address beyond it)",
            num_sge: 1,
            sge: |t| (u64::MAX - 100, 4096, t.tkb),
            nak: NAK_REM_OP,
            status: VRDMA_WC_LOC_PROT_ERR,
        },
        Case {
            name: "receive buffer smaller than the SEND",
            num_sge: 1,
            sge: |t| (t.tdst, 100, t.tkb),
            nak: NAK_INV_REQ,
            status: VRDMA_WC_LOC_LEN_ERR,
        },
    ];
    for c in &cases {
        let (mut t, reqs) = fresh();
        reset_tb_empty(&mut t);
        let sge = (c.sge)(&t);
        post_raw_recv(&mut t, 0x5150, c.num_sge, &[sge]);
        // The SEND of the templates is 2500 bytes: SEND_FIRST carries 1024 of them.
        let mut f = with_psn(find(&reqs, 0x00), 1000);
        reseal(&mut f);
        let naks = feed_b(&mut t, &f);
        let cqes = t.b.poll_cq(&mut t.tcqb);
        let mine: Vec<_> = cqes.iter().filter(|x| x.wr_id == 0x5150).collect();
        assert_eq!(mine.len(), 1, "{}: receive completions {cqes:?}", c.name);
        assert_eq!(mine[0].status, c.status, "{}: status", c.name);
        assert_eq!(naks, vec![c.nak], "{}: answer", c.name);
        assert_eq!(t.b.qp_state(t.tb.qpn), VRDMA_QPS_ERR, "{}: state", c.name);
        check_canary(&t);
        healthy_round(&mut t, 1);
    }
}

/// RQ producer − consumer > depth: ring error INDEX, QP → ERR, QP_FATAL(INDEX) (§4.5, §14.4).
#[test]
fn rq_producer_beyond_depth() {
    let (mut t, reqs) = fresh();
    reset_tb_empty(&mut t);
    let rq = t.tb.rq.clone().unwrap();
    t.b.mem
        .store_u32_release(rq.ctrl(), rq.idx.wrapping_add(rq.depth + 1))
        .unwrap();
    let mut f = with_psn(find(&reqs, 0x00), 1000);
    reseal(&mut f);
    let _ = feed_b(&mut t, &f);
    assert_eq!(t.b.qp_state(t.tb.qpn), VRDMA_QPS_ERR);
    assert_eq!(
        t.b.mem.read_u32(rq.ctrl() + 132).unwrap(),
        VRDMA_RING_ERR_INDEX
    );
    let ev = t.b.events();
    assert!(
        ev.iter().any(|e| e.type_ == VRDMA_EV_QP_FATAL
            && e.id == t.tb.qpn
            && e.info == VRDMA_RING_ERR_INDEX),
        "{ev:?}"
    );
    healthy_round(&mut t, 1);
}
