//! Hostile send queues (spec §4.5, §6, §14.3, §14.4): QPs whose SQ holds random bytes and
//! mutated WQEs (random opcodes and flags, num_sge beyond the maximum, huge inline_len, SGE
//! address/length overflowing u64, lkeys of another PD / stale variants / deregistered, UD AH
//! indices unknown or of another PD), producer indices jumping beyond the depth, doorbells for
//! unknown QPs, and ring pages that disappear from the memory table. The daemon must not panic,
//! must answer with error CQEs / QP ERROR / async events as the spec says, and a healthy QP on
//! the same device keeps transferring data correctly meanwhile.
//!
//! Long because each hostile WQE family has its generator and its expected outcome beside the
//! shared healthy-QP check; one binary.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::rng::Rng;
use common::*;
use vm_memory::{GuestAddress, GuestAddressSpace, GuestRegionMmap};
use vrdma_backend::guest::memory::GuestMemoryMap;
use vrdma_backend::transport;
use vrdma_spec::*;

/// Second guest RAM region of node a; the hostile rings live here so it can be removed.
const R2: u64 = BASE + (64 << 20);
const R2_LEN: usize = 1 << 20;

/// Create a QP whose SQ/RQ pages are consecutive pages at `at`.
fn create_qp_at(n: &mut Node, s: QpSpec, at: u64) -> QpH {
    let mk = |base: u64, depth: u32, shift: u32| {
        let np = 1 + ((depth as u64) << shift).div_ceil(4096);
        RingH {
            pages: (0..np).map(|i| base + i * 4096).collect(),
            depth,
            shift,
            idx: 0,
        }
    };
    let sq = mk(at, s.sq_depth, s.sq_shift as u32);
    let rq = mk(
        at + sq.pages.len() as u64 * 4096,
        s.rq_depth,
        s.rq_shift as u32,
    );
    let c = VrdmaCmdCreateQp {
        pdn: s.pd,
        qp_type: s.qp_type,
        send_cqn: s.scq,
        recv_cqn: s.rcq,
        srqn: VRDMA_NO_SRQ,
        sq_depth: s.sq_depth,
        rq_depth: s.rq_depth,
        sq_wqe_shift: s.sq_shift,
        rq_wqe_shift: s.rq_shift,
        sq_sig_all: 0,
        reserved0: 0,
        max_send_sge: s.max_sge,
        max_recv_sge: s.max_sge,
        max_inline_data: s.max_inline,
        sq_npages: sq.pages.len() as u32,
        rq_npages: rq.pages.len() as u32,
        xrcdn: 0,
    };
    let mut b = c.as_bytes().to_vec();
    for p in sq.pages.iter().chain(rq.pages.iter()) {
        b.extend_from_slice(&p.to_le_bytes());
    }
    let r = n.cmd(VRDMA_CMD_CREATE_QP, &b).expect("create hostile qp");
    QpH {
        qpn: VrdmaRespCreateQp::read_from(&r).unwrap().qpn,
        qp_type: s.qp_type,
        sq,
        rq: Some(rq),
    }
}

struct Bed {
    a: Node,
    b: Node,
    link: Link,
    /// a's memory table without R2.
    map_without_r2: GuestMemoryMap,
    healthy: HealthyPair,
    /// Hostile RC QP on a (rings in R2) and its peer on b.
    xa: QpH,
    xb: QpH,
    /// Hostile UD QP on a (rings in R2) and its peer on b.
    ua: QpH,
    ub: QpH,
    xcqa: RingH,
    xcqb: RingH,
    /// Keys and AHs for mutations.
    keys: Vec<u32>,
    ahs: Vec<u32>,
    xbuf: u64,
    xbufb: u64,
    xkb: u32,
}

/// Short timeouts and few retries so that the hostile QP errs out quickly.
const HOSTILE_RTS: RtsAttrs = RtsAttrs {
    mtu: 3,
    timeout: 8,
    retry: 1,
    rnr_retry: 1,
};

fn bed() -> Bed {
    let mut a = Node::new(1, 32, 1500);
    let mut b = Node::new(2, 32, 1500);
    let map_without_r2: GuestMemoryMap = (*a.mem.atomic().memory()).clone();
    let r2 = GuestRegionMmap::<vrdma_backend::guest::DirtyBitmap>::from_range(
        GuestAddress(R2),
        R2_LEN,
        None,
    )
    .unwrap();
    let with = map_without_r2.insert_region(Arc::new(r2)).unwrap();
    a.mem.set_memory(with);
    assert!(a.mem.check_range(R2, R2_LEN as u64));

    let pda = a.create_pd();
    let pdb = b.create_pd();
    let healthy = HealthyPair::new(&mut a, &mut b, pda, pdb);

    // Hostile QPs: their own PD and CQs (the CQs in region 1).
    let pdx = a.create_pd();
    let pdxb = b.create_pd();
    let (xca, xcqa) = a.create_cq(4096);
    let (xcb, xcqb) = b.create_cq(4096);
    let mut s = QpSpec::rc(pdx, xca);
    s.sq_depth = 64;
    s.rq_depth = 16;
    s.max_sge = 4;
    s.max_inline = 128;
    s.sq_shift = 8;
    let xa = create_qp_at(&mut a, s, R2);
    let mut sb = QpSpec::rc(pdxb, xcb);
    sb.rq_depth = 256;
    let xb = b.create_qp(sb);
    connect(&mut a, &xa, &mut b, &xb, HOSTILE_RTS);
    let mut us = s;
    us.qp_type = VRDMA_QPT_UD;
    let ua = create_qp_at(&mut a, us, R2 + 256 * 1024);
    let mut ubs = sb;
    ubs.qp_type = VRDMA_QPT_UD;
    let ub = b.create_qp(ubs);
    ud_rts(&mut a, &ua, 0x2222);
    ud_rts(&mut b, &ub, 0x2222);

    // Keys: valid in pdx, valid in the healthy PD (other PD), stale, deregistered, DMA-less.
    let xbuf = a.alloc(65536);
    let kx = a.reg_mr(pdx, xbuf, 65536, ACC_ALL);
    let kro = a.reg_mr(pdx, xbuf, 4096, 0);
    let kdead = a.reg_mr(pdx, xbuf, 4096, ACC_ALL);
    a.cmd(
        VRDMA_CMD_DEREG_MR,
        VrdmaHandle {
            handle: kdead,
            reserved: 0,
        }
        .as_bytes(),
    )
    .unwrap();
    // Memory windows of both types in pdx (spec §12.8): their rkeys as lkeys, LOCAL_INV
    // targets and BIND_MW arguments.
    let mut mws = [VRDMA_MW_TYPE_1, VRDMA_MW_TYPE_2].map(|type_| {
        let r = a
            .cmd(
                VRDMA_CMD_ALLOC_MW,
                VrdmaCmdAllocMw { pdn: pdx, type_ }.as_bytes(),
            )
            .unwrap();
        VrdmaHandle::read_from(&r).unwrap().handle
    });
    let kbind = a.reg_mr(pdx, xbuf, 65536, ACC_ALL | VRDMA_ACCESS_MW_BIND);
    mws.sort_unstable();
    let keys = vec![
        kx,
        kx,
        kx,
        kro,
        healthy.ka,
        kx ^ 1,
        kdead,
        0,
        u32::MAX,
        mws[0],
        mws[1],
        kbind,
    ];
    let ah_ok = a.create_ah(pdx, a.av_to(&b));
    let ah_other = a.create_ah(pda, a.av_to(&b));
    let ahs = vec![ah_ok, ah_ok, ah_other, 0, 12345, u32::MAX];
    let xbufb = b.alloc(65536);
    let xkb = b.reg_mr(pdxb, xbufb, 65536, ACC_ALL);
    let mut t = Bed {
        a,
        b,
        link: Link::clean(),
        map_without_r2,
        healthy,
        xa,
        xb,
        ua,
        ub,
        xcqa,
        xcqb,
        keys,
        ahs,
        xbuf,
        xbufb,
        xkb,
    };
    post_peer_recvs(&mut t);
    t
}

/// Receives on b's hostile peers so that SENDs from the hostile QPs can land.
fn post_peer_recvs(t: &mut Bed) {
    for which in 0..2 {
        let q = if which == 0 { &mut t.xb } else { &mut t.ub };
        let mut rq = q.rq.clone().unwrap();
        let consumer = t.b.mem.load_u32_acquire(rq.ctrl() + 64).unwrap();
        if rq.idx.wrapping_sub(consumer) + 8 > rq.depth {
            continue;
        }
        for i in 0..8u64 {
            t.b.post_recv(&mut rq, 500 + i, &[(t.xbufb, 8192, t.xkb)]);
        }
        q.rq = Some(rq);
    }
}

/// Mark the send WQE bytes `b` inline (flags, byte 9) with an inline length of `len` (bytes
/// 16..20).
fn set_inline_len(b: &mut [u8], len: u32) {
    b[9] |= VRDMA_SEND_INLINE;
    b[16..20].copy_from_slice(&len.to_le_bytes());
}

/// A WQE that is sometimes valid and usually broken.
fn hostile_wqe(r: &mut Rng, t: &Bed, slot: usize, ud: bool) -> Vec<u8> {
    if r.below(5) == 0 {
        return (0..slot).map(|_| r.next() as u8).collect();
    }
    let addr = match r.below(6) {
        0 => u64::MAX - r.below(64),
        1 => r.next(),
        2 => 0,
        _ => t.xbuf + r.below(70000),
    };
    let len = match r.below(6) {
        0 => u32::MAX,
        1 => 0x8000_0000,
        2 => 8,
        _ => r.below(5000) as u32,
    };
    let nsge = r.below(6) as usize;
    let sges: Vec<(u64, u32, u32)> = (0..nsge).map(|_| (addr, len, r.pick(&t.keys))).collect();
    let mut w = Wqe {
        wr_id: r.next(),
        opcode: if r.below(4) == 0 {
            r.next() as u8
        } else {
            // Every defined opcode (0..=VRDMA_WR_BIND_MW) and one beyond.
            r.below(u64::from(VRDMA_WR_BIND_MW) + 2) as u8
        },
        flags: if r.below(3) == 0 {
            r.next() as u8 & !VRDMA_SEND_INLINE
        } else {
            VRDMA_SEND_SIGNALED
        },
        ex: r.pick(&t.keys),
        sges,
        remote_addr: t.xbuf.wrapping_add(r.below(70000)),
        rkey: t.xkb,
        compare_add: r.next(),
        swap: r.next(),
        ah: r.pick(&t.ahs),
        remote_qpn: if r.below(2) == 0 {
            t.ub.qpn
        } else {
            r.next() as u32
        },
        remote_qkey: r.pick(&[0x2222, 0x8000_0000, 0, 1]),
        reg: None,
        bind: None,
        inline: None,
        num_sge: if r.below(4) == 0 {
            Some(r.next() as u8)
        } else {
            None
        },
        // FLUSH type/level: valid, reserved bits, or random.
        flush: Some(match r.below(3) {
            0 => (VRDMA_FLUSH_GLOBAL, r.below(2) as u8),
            1 => (VRDMA_FLUSH_PERSISTENT | VRDMA_FLUSH_GLOBAL, 1),
            _ => (r.next() as u8, r.next() as u8),
        }),
    };
    if r.below(4) == 0 {
        w.inline = Some((0..r.below(200)).map(|_| r.next() as u8).collect());
    }
    if !ud && r.below(6) == 0 {
        w.opcode = VRDMA_WR_REG_MR;
        w.reg = Some((
            r.next(),
            r.next(),
            r.pick(&t.keys),
            r.below(64) as u32,
            r.next() as u32,
            r.pick(&[12, 13, 0, 63, 64, 255]),
            {
                let x = r.next();
                r.pick(&[t.xbuf, 0, u64::MAX - 7, x])
            },
        ));
    }
    if !ud && w.reg.is_none() && r.below(6) == 0 {
        // Memory window binds (spec §12.8) with keys of the bed and random geometry / rights.
        w.opcode = VRDMA_WR_BIND_MW;
        w.bind = Some(VrdmaWqeBindMw {
            addr: {
                let x = r.next();
                r.pick(&[t.xbuf, 0, u64::MAX - 7, x])
            },
            length: {
                let x = r.next();
                r.pick(&[0, 4096, u64::MAX, x])
            },
            mw_key: r.pick(&t.keys),
            new_key: r.pick(&t.keys).wrapping_add(r.below(2) as u32),
            mr_key: r.pick(&t.keys),
            access: r.next() as u32 & 0x7f,
            reserved: [0; 2],
        });
    }
    let mut b = w.bytes(slot, ud);
    // Inline length beyond the slot / the QP max.
    if r.below(6) == 0 {
        set_inline_len(&mut b, r.pick(&[u32::MAX, 4096, 129, 1 << 31, 193]));
    }
    b
}

fn healthy_round(t: &mut Bed, round: u64) {
    t.healthy
        .round(&mut t.a, &mut t.b, &mut t.link, round, 6000, 2000);
}

/// After RESET the device restarts the SQ/RQ indices at 0 and writes the control page (§4.3;
/// the kernel driver and libvrdma re-read `producer` from it): take the driver's producer from
/// there, as the drivers do.
fn resync(n: &Node, q: &mut QpH) {
    q.sq.idx = n.mem.load_u32_acquire(q.sq.ctrl()).unwrap();
    if let Some(rq) = q.rq.as_mut() {
        rq.idx = n.mem.load_u32_acquire(rq.ctrl()).unwrap();
    }
}

/// Bring a hostile QP (and for RC its peer) back to RTS after it erred.
fn revive(t: &mut Bed, rc: bool) {
    let reset = VrdmaQpAttr {
        qp_state: VRDMA_QPS_RESET,
        ..Default::default()
    };
    if rc {
        t.a.modify_qp(t.xa.qpn, VRDMA_QP_STATE, reset).unwrap();
        t.b.modify_qp(t.xb.qpn, VRDMA_QP_STATE, reset).unwrap();
        resync(&t.a, &mut t.xa);
        resync(&t.b, &mut t.xb);
        let (xa, xb) = (t.xa.clone(), t.xb.clone());
        connect(&mut t.a, &xa, &mut t.b, &xb, HOSTILE_RTS);
        post_peer_recvs(t);
    } else {
        t.a.modify_qp(t.ua.qpn, VRDMA_QP_STATE, reset).unwrap();
        resync(&t.a, &mut t.ua);
        let ua = t.ua.clone();
        ud_rts(&mut t.a, &ua, 0x2222);
    }
}

fn run(seed: u64, budget: Duration) {
    let mut t = bed();
    healthy_round(&mut t, 1);
    let mut r = Rng::new(seed);
    let start = Instant::now();
    let mut round = 2;
    let mut cqes = 0usize;
    let mut fatal = 0usize;
    while start.elapsed() < budget {
        let rc = r.below(2) == 0;
        let mut q = if rc { t.xa.clone() } else { t.ua.clone() };
        let slot = 1usize << q.sq.shift;
        let n = 1 + r.below(6);
        for _ in 0..n {
            let w = hostile_wqe(&mut r, &t, slot, !rc);
            t.a.write(q.sq.entry_gpa(q.sq.idx), &w);
            q.sq.idx = q.sq.idx.wrapping_add(1);
        }
        // Sometimes the producer jumps beyond the depth (or far away).
        let prod = match r.below(8) {
            0 => q.sq.idx.wrapping_add(q.sq.depth + r.below(1000) as u32),
            1 => r.next() as u32,
            _ => q.sq.idx,
        };
        t.a.mem.store_u32_release(q.sq.ctrl(), prod).unwrap();
        q.sq.idx = prod;
        let qpn = q.qpn;
        if rc {
            t.xa = q;
        } else {
            t.ua = q;
        }
        let res = catch_unwind(AssertUnwindSafe(|| {
            transport::on_doorbell(
                &t.a.dev,
                VrdmaDoorbell {
                    type_: VRDMA_DB_SQ,
                    id: qpn,
                },
            );
            // Doorbells for unknown objects and of unknown types: ignored.
            transport::on_doorbell(
                &t.a.dev,
                VrdmaDoorbell {
                    type_: r.below(8) as u32,
                    id: r.next() as u32,
                },
            );
        }));
        assert!(res.is_ok(), "seed {seed} round {round}: doorbell panicked");
        // The healthy QP moves data while the hostile ones misbehave (hostile packets flow too).
        healthy_round(&mut t, round);
        let xs = t.a.poll_cq(&mut t.xcqa);
        for c in &xs {
            assert!(
                c.status <= VRDMA_WC_GENERAL_ERR,
                "undefined CQE status {c:?}"
            );
        }
        cqes += xs.len();
        t.b.poll_cq(&mut t.xcqb);
        for e in t.a.events() {
            if e.type_ == VRDMA_EV_QP_FATAL {
                assert!(e.id == t.xa.qpn || e.id == t.ua.qpn, "fatal for {e:?}");
                fatal += 1;
            }
            assert_ne!(e.type_, VRDMA_EV_DEVICE_FATAL, "device fatal on a bad WQE");
        }
        if t.a.qp_state(t.xa.qpn) != VRDMA_QPS_RTS {
            revive(&mut t, true);
        }
        if t.a.qp_state(t.ua.qpn) != VRDMA_QPS_RTS {
            revive(&mut t, false);
        }
        // Top up b's receive rings for the hostile senders now and then.
        if round % 8 == 0 {
            post_peer_recvs(&mut t);
        }
        round += 1;
    }
    assert!(round > 5, "too few rounds");
    assert!(cqes > 0, "hostile WQEs never completed");
    let _ = fatal;
    assert!(!t.a.dev.needs_reset);
}

#[test]
fn hostile_sq_contents_and_indices() {
    for seed in [1u64, 2] {
        run(seed, Duration::from_millis(3000));
    }
}

/// Producer − consumer > depth → ring error INDEX, QP → ERR, QP_FATAL(INDEX) (§4.5, §14.4).
#[test]
fn producer_beyond_depth_is_an_index_error() {
    let mut t = bed();
    let q = t.xa.clone();
    t.a.mem
        .store_u32_release(q.sq.ctrl(), q.sq.depth + 1)
        .unwrap();
    t.a.doorbell(q.qpn);
    assert_eq!(t.a.qp_state(q.qpn), VRDMA_QPS_ERR);
    let err = t.a.mem.read_u32(q.sq.ctrl() + 132).unwrap();
    assert_eq!(err, VRDMA_RING_ERR_INDEX);
    let ev = t.a.events();
    assert!(
        ev.iter().any(|e| e.type_ == VRDMA_EV_QP_FATAL
            && e.id == q.qpn
            && e.info == VRDMA_RING_ERR_INDEX),
        "{ev:?}"
    );
    healthy_round(&mut t, 5);
}

/// The hostile QPs' ring pages vanish from the memory table (memory hot-unplug / a new
/// SET_MEM_TABLE): their doorbells fail the QPs with QP_FATAL, nothing panics, and the healthy
/// QP, whose rings are elsewhere, keeps working.
#[test]
fn ring_pages_removed_from_guest_memory() {
    let mut t = bed();
    healthy_round(&mut t, 1);
    let mut q = t.xa.clone();
    let mut u = t.ua.clone();
    let w = rdma(1, VRDMA_WR_RDMA_WRITE, (t.xbuf, 100, t.keys[0]), 0, t.xkb);
    t.a.post_send_nodb(&mut q, &w);
    t.a.post_send_nodb(&mut u, &w);
    let map = t.map_without_r2.clone();
    t.a.mem.set_memory(map);
    assert!(!t.a.mem.check_range(R2, 1));
    for qpn in [q.qpn, u.qpn] {
        let res = catch_unwind(AssertUnwindSafe(|| t.a.doorbell(qpn)));
        assert!(res.is_ok(), "doorbell on a QP with vanished rings panicked");
    }
    healthy_round(&mut t, 2);
    for qpn in [q.qpn, u.qpn] {
        assert_eq!(t.a.qp_state(qpn), VRDMA_QPS_ERR, "qp {qpn}");
    }
    let ev = t.a.events();
    for qpn in [q.qpn, u.qpn] {
        assert!(
            ev.iter()
                .any(|e| e.type_ == VRDMA_EV_QP_FATAL && e.id == qpn),
            "no QP_FATAL for {qpn}: {ev:?}"
        );
    }
    // Destroying them works, and the device still works.
    for qpn in [q.qpn, u.qpn] {
        t.a.cmd(
            VRDMA_CMD_DESTROY_QP,
            VrdmaHandle {
                handle: qpn,
                reserved: 0,
            }
            .as_bytes(),
        )
        .unwrap();
    }
    healthy_round(&mut t, 3);
}

/// §14.3 outcomes, one invalid WQE at a time: the CQE status, the QP state (RC → ERR, UD stays
/// RTS), and the healthy QP is unaffected.
#[test]
fn send_wqe_errors_have_the_spec_status() {
    struct Case {
        name: &'static str,
        ud: bool,
        make: fn(&Bed) -> Vec<u8>,
        status: u8,
    }
    fn rc(w: Wqe) -> Vec<u8> {
        w.bytes(256, false)
    }
    fn ud(w: Wqe) -> Vec<u8> {
        w.bytes(256, true)
    }
    fn write(t: &Bed) -> Wqe {
        rdma(
            0xabc,
            VRDMA_WR_RDMA_WRITE,
            (t.xbuf, 100, t.keys[0]),
            t.xbufb,
            t.xkb,
        )
    }
    fn send_ud(t: &Bed) -> Wqe {
        Wqe {
            ah: t.ahs[0],
            remote_qpn: t.ub.qpn,
            remote_qkey: 0x2222,
            ..send(0xabc, (t.xbuf, 100, t.keys[0]))
        }
    }
    let cases = [
        Case {
            name: "unknown opcode",
            ud: false,
            make: |t| {
                rc(Wqe {
                    opcode: 77,
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_QP_OP_ERR,
        },
        Case {
            name: "unknown flag bits",
            ud: false,
            make: |t| {
                rc(Wqe {
                    flags: 0x80 | VRDMA_SEND_SIGNALED,
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_QP_OP_ERR,
        },
        Case {
            name: "num_sge above max_send_sge",
            ud: false,
            make: |t| {
                rc(Wqe {
                    num_sge: Some(5),
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_QP_OP_ERR,
        },
        Case {
            name: "num_sge 255 (does not fit the slot)",
            ud: false,
            make: |t| {
                rc(Wqe {
                    num_sge: Some(255),
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_QP_OP_ERR,
        },
        Case {
            name: "inline_len above max_inline_data",
            ud: false,
            make: |t| {
                let mut b = rc(write(t));
                set_inline_len(&mut b, 129);
                b
            },
            status: VRDMA_WC_LOC_LEN_ERR,
        },
        Case {
            name: "inline_len u32::MAX",
            ud: false,
            make: |t| {
                let mut b = rc(write(t));
                set_inline_len(&mut b, u32::MAX);
                b
            },
            status: VRDMA_WC_LOC_LEN_ERR,
        },
        Case {
            name: "lkey of another PD",
            ud: false,
            make: |t| {
                rc(Wqe {
                    sges: vec![(t.xbuf, 100, t.keys[4])],
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_PROT_ERR,
        },
        Case {
            name: "stale lkey variant",
            ud: false,
            make: |t| {
                rc(Wqe {
                    sges: vec![(t.xbuf, 100, t.keys[5])],
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_PROT_ERR,
        },
        Case {
            name: "deregistered lkey",
            ud: false,
            make: |t| {
                rc(Wqe {
                    sges: vec![(t.xbuf, 100, t.keys[6])],
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_PROT_ERR,
        },
        Case {
            name: "SGE addr + len overflowing u64",
            ud: false,
            make: |t| {
                rc(Wqe {
                    sges: vec![(u64::MAX - 10, 100, t.keys[0])],
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_PROT_ERR,
        },
        Case {
            name: "SGE beyond the MR",
            ud: false,
            make: |t| {
                rc(Wqe {
                    sges: vec![(t.xbuf + 65536 - 10, 100, t.keys[0])],
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_PROT_ERR,
        },
        Case {
            name: "total length overflowing u32 (two 2 GiB SGEs)",
            ud: false,
            make: |t| {
                rc(Wqe {
                    sges: vec![
                        (t.xbuf, 0x8000_0000, t.keys[0]),
                        (t.xbuf, 0x8000_0000, t.keys[0]),
                    ],
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_LEN_ERR,
        },
        Case {
            name: "READ into a read-only MR",
            ud: false,
            make: |t| {
                rc(Wqe {
                    opcode: VRDMA_WR_RDMA_READ,
                    sges: vec![(t.xbuf, 100, t.keys[3])],
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_PROT_ERR,
        },
        Case {
            name: "atomic with a 16-byte SGE",
            ud: false,
            make: |t| {
                rc(Wqe {
                    opcode: VRDMA_WR_ATOMIC_FETCH_AND_ADD,
                    sges: vec![(t.xbuf, 16, t.keys[0])],
                    ..write(t)
                })
            },
            status: VRDMA_WC_LOC_LEN_ERR,
        },
        Case {
            name: "UD: unknown AH",
            ud: true,
            make: |t| {
                ud(Wqe {
                    ah: 12345,
                    ..send_ud(t)
                })
            },
            status: VRDMA_WC_LOC_QP_OP_ERR,
        },
        Case {
            name: "UD: AH of another PD",
            ud: true,
            make: |t| {
                ud(Wqe {
                    ah: t.ahs[2],
                    ..send_ud(t)
                })
            },
            status: VRDMA_WC_LOC_QP_OP_ERR,
        },
        Case {
            name: "UD: RDMA WRITE is not valid on UD",
            ud: true,
            make: |t| {
                ud(Wqe {
                    opcode: VRDMA_WR_RDMA_WRITE,
                    ..send_ud(t)
                })
            },
            status: VRDMA_WC_LOC_QP_OP_ERR,
        },
        Case {
            name: "UD: message above the MTU",
            ud: true,
            make: |t| {
                ud(Wqe {
                    sges: vec![(t.xbuf, 5000, t.keys[0])],
                    ..send_ud(t)
                })
            },
            status: VRDMA_WC_LOC_LEN_ERR,
        },
        Case {
            name: "UD: lkey of another PD",
            ud: true,
            make: |t| {
                ud(Wqe {
                    sges: vec![(t.xbuf, 100, t.keys[4])],
                    ..send_ud(t)
                })
            },
            status: VRDMA_WC_LOC_PROT_ERR,
        },
    ];
    let mut t = bed();
    for (i, c) in cases.iter().enumerate() {
        let mut b = (c.make)(&t);
        let wr_id = 0xabc00 + i as u64;
        b[0..8].copy_from_slice(&wr_id.to_le_bytes());
        let mut q = if c.ud { t.ua.clone() } else { t.xa.clone() };
        t.a.write(q.sq.entry_gpa(q.sq.idx), &b);
        q.sq.idx = q.sq.idx.wrapping_add(1);
        t.a.mem.store_u32_release(q.sq.ctrl(), q.sq.idx).unwrap();
        if c.ud {
            t.ua = q.clone();
        } else {
            t.xa = q.clone();
        }
        t.a.doorbell(q.qpn);
        healthy_round(&mut t, 10 + i as u64);
        let cqes = t.a.poll_cq(&mut t.xcqa);
        let mine: Vec<_> = cqes.iter().filter(|x| x.qpn == q.qpn).collect();
        assert_eq!(mine.len(), 1, "{}: completions {mine:?}", c.name);
        assert_eq!(mine[0].wr_id, wr_id, "{}: wr_id", c.name);
        assert_eq!(
            mine[0].status, c.status,
            "{}: status ({:?})",
            c.name, mine[0]
        );
        let want = if c.ud { VRDMA_QPS_RTS } else { VRDMA_QPS_ERR };
        assert_eq!(t.a.qp_state(q.qpn), want, "{}: QP state", c.name);
        if !c.ud {
            revive(&mut t, true);
        }
        t.a.events();
    }
}
