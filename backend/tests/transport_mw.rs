//! Memory windows, type 1 and type 2B (spec §12.8, IBTA 10.6.7): ALLOC_MW / DEALLOC_MW, the
//! BIND_MW WQE and each of its error rules, remote access through a window (range, rights, QP
//! association, the bound MR gone), LOCAL_INV and SEND_WITH_INV of a window's rkey.

mod common;

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

/// What the windows' MR allows: local write and binding, no remote right of its own.
const MR_BIND: u32 = VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_MW_BIND;
const RW: u32 = VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_READ;

/// A connected RC pair, A → B; B owns the windows, a 16 KiB buffer `dst` and its MR `kb`
/// (registered with `mr_access`), A a 4 KiB `src`.
fn pair_of(b: Node, mr_access: u32) -> RcPair {
    RcPair::new()
        .node_b(b)
        .timeout(12)
        .mrs(4096, 16384)
        .b_access(mr_access)
        .build()
}

fn pair_with(mr_access: u32) -> RcPair {
    pair_of(Node::new(2, 16, 1500), mr_access)
}

fn pair() -> RcPair {
    pair_with(MR_BIND)
}

fn alloc_mw(n: &mut Node, pd: u32, type_: u32) -> Result<u32, u32> {
    let r = n.cmd(
        VRDMA_CMD_ALLOC_MW,
        VrdmaCmdAllocMw { pdn: pd, type_ }.as_bytes(),
    )?;
    Ok(VrdmaHandle::read_from(&r).unwrap().handle)
}

fn handle_cmd(n: &mut Node, op: u16, h: u32) -> Result<Vec<u8>, u32> {
    n.cmd(
        op,
        VrdmaHandle {
            handle: h,
            reserved: 0,
        }
        .as_bytes(),
    )
}

/// The next rkey of a window: same index, variant + 1 (what `ibv_inc_rkey` does).
fn inc(key: u32) -> u32 {
    (key & !0xff) | ((key + 1) & 0xff)
}

fn bind_wqe(wr_id: u64, mw: u32, new: u32, mr: u32, addr: u64, len: u64, access: u32) -> Wqe {
    Wqe {
        wr_id,
        opcode: VRDMA_WR_BIND_MW,
        flags: VRDMA_SEND_SIGNALED,
        bind: Some(VrdmaWqeBindMw {
            addr,
            length: len,
            mw_key: mw,
            new_key: new,
            mr_key: mr,
            access,
            reserved: [0; 2],
        }),
        ..Default::default()
    }
}

/// Post `w` on B's QP and return B's completion for it.
fn run_b(p: &mut RcPair, w: &Wqe) -> Cqe {
    p.post_b(w);
    let (_, gb) = p.wait(0, 1);
    gb[0]
}

/// Bind `mw` on B's QP to `[dst + off, dst + off + len)`; returns the window's new rkey.
fn bind_ok(p: &mut RcPair, mw: u32, off: u64, len: u64, access: u32) -> u32 {
    let new = inc(mw);
    let w = bind_wqe(77, mw, new, p.kb, p.dst + off, len, access);
    let c = run_b(p, &w);
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (77, VRDMA_WC_SUCCESS, VRDMA_WC_BIND_MW),
        "bind completes as BIND_MW"
    );
    new
}

/// A posts an RDMA WRITE (or READ) of 64 bytes at `raddr` with `rkey`; returns A's completion.
fn rdma(p: &mut RcPair, op: u8, raddr: u64, rkey: u32) -> Cqe {
    p.post(&Wqe {
        wr_id: 5,
        opcode: op,
        flags: VRDMA_SEND_SIGNALED,
        sges: vec![(p.src, 64, p.ka)],
        remote_addr: raddr,
        rkey,
        ..Default::default()
    });
    let (ga, _) = p.wait(1, 0);
    ga[0]
}

/// A second connected RC pair between `p`'s nodes (CQs of 64, timeout 12): A's QP in a new PD
/// (returned), B's in `p.pdb`.
fn second_conn(p: &mut RcPair) -> (u32, QpPair) {
    let pda2 = p.a.create_pd();
    let spec = QpPairSpec::rc(64, RtsAttrs::mtu(3).timeout(12));
    (pda2, QpPair::open(&mut p.a, &mut p.b, pda2, p.pdb, spec))
}

#[test]
fn type2_bind_write_read_then_local_invalidate() {
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).expect("alloc mw");
    // The MR has no remote right: without a window the write is an R_Key violation (checked on
    // another pair below); through the window it lands.
    let rkey = bind_ok(&mut p, mw, 4096, 8192, RW);
    p.a.write(p.src, &pattern(1, 64));
    let c = {
        let (ra, rk) = (p.dst + 4096 + 100, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_SUCCESS);
    assert_eq!(p.b.read(p.dst + 4196, 64), pattern(1, 64));
    p.b.write(p.dst + 8192, &pattern(2, 64));
    let c = {
        let (ra, rk) = (p.dst + 8192, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_READ, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_SUCCESS);
    assert_eq!(p.a.read(p.src, 64), pattern(2, 64));
    // LOCAL_INV on B frees the window; the rkey is dead (R_Key violation → remote access error).
    let c = run_b(
        &mut p,
        &Wqe {
            wr_id: 78,
            opcode: VRDMA_WR_LOCAL_INV,
            flags: VRDMA_SEND_SIGNALED,
            ex: rkey,
            ..Default::default()
        },
    );
    assert_eq!((c.status, c.opcode), (VRDMA_WC_SUCCESS, VRDMA_WC_LOCAL_INV));
    let c = {
        let (ra, rk) = (p.dst + 4096, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR);
}

#[test]
fn the_mr_alone_grants_no_remote_access() {
    let mut p = pair();
    let c = {
        let (ra, rk) = (p.dst, p.kb);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR);
}

#[test]
fn window_range_and_rights_are_checked() {
    // Outside the window (but inside the MR): R_Key violation.
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 4096, 4096, RW);
    let c = {
        let (ra, rk) = (p.dst + 8192 - 32, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(
        c.status, VRDMA_WC_REM_ACCESS_ERR,
        "write across the window end"
    );
    // A read-only window refuses a write.
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, VRDMA_ACCESS_REMOTE_READ);
    let c = {
        let (ra, rk) = (p.dst, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_READ, ra, rk)
    };
    assert_eq!(
        c.status, VRDMA_WC_SUCCESS,
        "read through a read-only window"
    );
    let c = {
        let (ra, rk) = (p.dst, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(
        c.status, VRDMA_WC_REM_ACCESS_ERR,
        "write through a read-only window"
    );
    // The window's rkey is not an lkey.
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, RW);
    let w = common::rdma(9, VRDMA_WR_RDMA_WRITE, (p.dst, 64, rkey), p.src, p.ka);
    let c = run_b(&mut p, &w);
    assert_eq!(c.status, VRDMA_WC_LOC_PROT_ERR, "a window rkey as lkey");
}

#[test]
fn zero_based_type2_window() {
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 4096, 4096, RW | VRDMA_ACCESS_ZERO_BASED);
    p.a.write(p.src, &pattern(3, 64));
    let c = {
        let (ra, rk) = (0x100, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_SUCCESS);
    assert_eq!(p.b.read(p.dst + 4096 + 0x100, 64), pattern(3, 64));
    // The window is [0, 4096): its MR address is out of range.
    let c = {
        let (ra, rk) = (p.dst + 4096, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR);
}

#[test]
fn send_with_invalidate_frees_a_type2_window() {
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, RW);
    let rbuf = p.dst + 8192;
    let mut rq = p.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, 60, &[(rbuf, 4096, p.kb)]);
    p.qb.rq = Some(rq);
    p.post(&Wqe {
        wr_id: 3,
        opcode: VRDMA_WR_SEND_WITH_INV,
        flags: VRDMA_SEND_SIGNALED,
        ex: rkey,
        sges: vec![(p.src, 16, p.ka)],
        ..Default::default()
    });
    let (ga, gb) = p.wait(1, 1);
    assert_eq!(ga[0].status, VRDMA_WC_SUCCESS);
    assert_eq!(
        (gb[0].status, gb[0].flags & VRDMA_WC_F_INV, gb[0].ex),
        (VRDMA_WC_SUCCESS, VRDMA_WC_F_INV, rkey)
    );
    let c = {
        let (ra, rk) = (p.dst, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR);
}

#[test]
fn type1_bind_rebind_and_unbind() {
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_1).unwrap();
    // Allocated but unbound: its rkey grants nothing. (Checked on a pair of its own: the
    // failure takes the QPs to ERROR.)
    {
        let mut q = pair();
        let m = alloc_mw(&mut q.b, q.pdb, VRDMA_MW_TYPE_1).unwrap();
        let c = {
            let (ra, rk) = (q.dst, m);
            rdma(&mut q, VRDMA_WR_RDMA_WRITE, ra, rk)
        };
        assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR, "unbound type 1 window");
    }
    let k1 = bind_ok(&mut p, mw, 0, 4096, RW);
    let c = {
        let (ra, rk) = (p.dst, k1);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_SUCCESS);
    // A type 1 window may be bound again while bound; its rkey changes, the range moves.
    let k2 = bind_ok(&mut p, k1, 8192, 4096, RW);
    assert_ne!(k1, k2);
    p.a.write(p.src, &pattern(5, 64));
    let c = {
        let (ra, rk) = (p.dst + 8192, k2);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_SUCCESS);
    assert_eq!(p.b.read(p.dst + 8192, 64), pattern(5, 64));
    // Length 0 unbinds (pyverbs' invalidate_mw_type1): the rkey changes and grants nothing.
    let k3 = bind_ok(&mut p, k2, 0, 0, 0);
    let c = {
        let (ra, rk) = (p.dst, k3);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR);
}

#[test]
fn type1_old_rkey_is_stale_after_a_rebind() {
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_1).unwrap();
    let k1 = bind_ok(&mut p, mw, 0, 4096, RW);
    let _k2 = bind_ok(&mut p, k1, 0, 4096, RW);
    let c = {
        let (ra, rk) = (p.dst, k1);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR);
}

/// One BIND_MW (after `setup`) that must complete with MW_BIND_ERR and take B's QP to ERROR.
fn bind_fails(what: &str, mr_access: u32, setup: impl FnOnce(&mut RcPair) -> Wqe) {
    let mut p = pair_with(mr_access);
    let w = setup(&mut p);
    let c = run_b(&mut p, &w);
    assert_eq!(
        (c.wr_id, c.status),
        (w.wr_id, VRDMA_WC_MW_BIND_ERR),
        "{what}: MW_BIND_ERR"
    );
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_ERR, "{what}: QP → ERR");
}

#[test]
fn bind_error_cases() {
    let t2 = |p: &mut RcPair| alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let t1 = |p: &mut RcPair| alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_1).unwrap();
    bind_fails(
        "MR without MW_BIND (C10-73)",
        VRDMA_ACCESS_LOCAL_WRITE,
        |p| {
            let mw = t2(p);
            bind_wqe(1, mw, inc(mw), p.kb, p.dst, 4096, RW)
        },
    );
    bind_fails(
        "remote write on an MR without LOCAL_WRITE (C10-74)",
        VRDMA_ACCESS_MW_BIND,
        |p| {
            let mw = t2(p);
            bind_wqe(2, mw, inc(mw), p.kb, p.dst, 4096, RW)
        },
    );
    bind_fails("range beyond the MR (C10-75)", MR_BIND, |p| {
        let mw = t2(p);
        bind_wqe(3, mw, inc(mw), p.kb, p.dst + 12288, 8192, RW)
    });
    bind_fails("range before the MR (C10-75)", MR_BIND, |p| {
        let mw = t2(p);
        bind_wqe(4, mw, inc(mw), p.kb, p.dst - 4096, 4096, RW)
    });
    bind_fails("range overflowing u64", MR_BIND, |p| {
        let mw = t2(p);
        bind_wqe(5, mw, inc(mw), p.kb, p.dst, u64::MAX, RW)
    });
    bind_fails("zero-based type 1 (o10-36.2.2)", MR_BIND, |p| {
        let mw = t1(p);
        bind_wqe(
            6,
            mw,
            inc(mw),
            p.kb,
            p.dst,
            4096,
            RW | VRDMA_ACCESS_ZERO_BASED,
        )
    });
    bind_fails("type 2B already bound (o10-37.2.30)", MR_BIND, |p| {
        let mw = t2(p);
        let k = bind_ok(p, mw, 0, 4096, RW);
        bind_wqe(7, k, inc(k), p.kb, p.dst, 4096, RW)
    });
    bind_fails("type 2B of length 0 (o10-37.2.40)", MR_BIND, |p| {
        let mw = t2(p);
        bind_wqe(8, mw, inc(mw), p.kb, p.dst, 0, RW)
    });
    bind_fails(
        "window of another PD than the QP's (C10-72)",
        MR_BIND,
        |p| {
            let pd2 = p.b.create_pd();
            let mw = alloc_mw(&mut p.b, pd2, VRDMA_MW_TYPE_1).unwrap();
            bind_wqe(9, mw, inc(mw), p.kb, p.dst, 4096, RW)
        },
    );
    bind_fails("MR of another PD than the QP's", MR_BIND, |p| {
        let pd2 = p.b.create_pd();
        let other = p.b.alloc(4096);
        let k = p.b.reg_mr(pd2, other, 4096, MR_BIND);
        let mw = t2(p);
        bind_wqe(10, mw, inc(mw), k, other, 4096, RW)
    });
    bind_fails("new_key with another index", MR_BIND, |p| {
        let mw = t2(p);
        bind_wqe(11, mw, mw + 0x100, p.kb, p.dst, 4096, RW)
    });
    bind_fails("stale window rkey", MR_BIND, |p| {
        let mw = t2(p);
        bind_wqe(12, inc(mw), inc(inc(mw)), p.kb, p.dst, 4096, RW)
    });
    bind_fails("mr_key naming a window", MR_BIND, |p| {
        let mw = t2(p);
        let other = t2(p);
        bind_wqe(13, mw, inc(mw), other, p.dst, 4096, RW)
    });
    bind_fails("unknown access bits", MR_BIND, |p| {
        let mw = t2(p);
        bind_wqe(
            14,
            mw,
            inc(mw),
            p.kb,
            p.dst,
            4096,
            RW | VRDMA_ACCESS_MW_BIND,
        )
    });
}

#[test]
fn bind_without_windows_or_with_sges_is_a_qp_operation_error() {
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let mut w = bind_wqe(1, mw, inc(mw), p.kb, p.dst, 4096, RW);
    w.sges = vec![(p.dst, 8, p.kb)];
    let c = run_b(&mut p, &w);
    assert_eq!(c.status, VRDMA_WC_LOC_QP_OP_ERR, "BIND_MW with an SGE");
    // A device without windows: ALLOC_MW is NOT_SUPPORTED, the opcode LOC_QP_OP_ERR.
    let b = Node::with_config(2, 16, 1500, gid_v4([10, 0, 0, 2]), |c| c.max_mw = 0);
    let mut q = pair_of(b, MR_BIND);
    assert_eq!(
        alloc_mw(&mut q.b, q.pdb, VRDMA_MW_TYPE_2),
        Err(VRDMA_STATUS_NOT_SUPPORTED)
    );
    let c = run_b(&mut q, &bind_wqe(2, 0x100, 0x101, 0x200, 0, 4096, RW));
    assert_eq!(c.status, VRDMA_WC_LOC_QP_OP_ERR, "BIND_MW without max_mw");
}

#[test]
fn type2_window_is_usable_only_by_its_qp() {
    let mut p = pair();
    // A second connected QP pair between the same nodes, B's QP in the same PD.
    let (pda2, second) = second_conn(&mut p);
    let QpPair {
        qa: qa2,
        cqa: cqa2,
        cqb: _cqb2,
        ..
    } = second;
    let src2 = p.a.alloc(4096);
    let ka2 = p.a.reg_mr(pda2, src2, 4096, ACC_ALL);
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, RW);
    // Through the other QP: R_Key violation (a type 2B window belongs to its QP, spec §12.8).
    (p.qa, p.cqa) = (qa2, cqa2);
    p.src = src2;
    p.ka = ka2;
    let c = {
        let (ra, rk) = (p.dst, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR);
}

#[test]
fn type2_send_with_invalidate_on_another_qp_is_refused() {
    let mut p = pair();
    let (pda2, second) = second_conn(&mut p);
    let QpPair {
        qa: mut qa2,
        qb: mut qb2,
        cqa: cqa2,
        cqb: cqb2,
        ..
    } = second;
    let src2 = p.a.alloc(4096);
    let ka2 = p.a.reg_mr(pda2, src2, 4096, ACC_ALL);
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, RW);
    let mut rq = qb2.rq.clone().unwrap();
    p.b.post_recv(&mut rq, 61, &[(p.dst + 8192, 4096, p.kb)]);
    qb2.rq = Some(rq);
    p.a.post_send(
        &mut qa2,
        &Wqe {
            wr_id: 4,
            opcode: VRDMA_WR_SEND_WITH_INV,
            flags: VRDMA_SEND_SIGNALED,
            ex: rkey,
            sges: vec![(src2, 16, ka2)],
            ..Default::default()
        },
    );
    (p.cqa, p.cqb) = (cqa2, cqb2);
    let (ga, gb) = p.wait(1, 1);
    assert_eq!(gb[0].status, VRDMA_WC_REM_INV_REQ_ERR);
    assert_eq!(ga[0].status, VRDMA_WC_REM_INV_REQ_ERR);
}

#[test]
fn invalidation_errors() {
    let inv = |p: &mut RcPair, key: u32| {
        run_b(
            p,
            &Wqe {
                wr_id: 50,
                opcode: VRDMA_WR_LOCAL_INV,
                flags: VRDMA_SEND_SIGNALED,
                ex: key,
                ..Default::default()
            },
        )
        .status
    };
    // A type 1 window cannot be invalidated (o10-37.2.26).
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_1).unwrap();
    let k = bind_ok(&mut p, mw, 0, 4096, RW);
    assert_eq!(inv(&mut p, k), VRDMA_WC_LOC_QP_OP_ERR, "type 1");
    // A free type 2B window has nothing to invalidate.
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    assert_eq!(inv(&mut p, mw), VRDMA_WC_LOC_QP_OP_ERR, "free 2B");
    // A fast-reg MR with a window bound to it cannot be invalidated (spec §12.8).
    let mut p = pair();
    let c = VrdmaCmdRegMr {
        pdn: p.pdb,
        npages: 4,
        page_shift: 12,
        ..Default::default()
    };
    let r = p.b.cmd(VRDMA_CMD_ALLOC_FAST_REG_MR, c.as_bytes()).unwrap();
    let fr = inc(VrdmaRespRegMr::read_from(&r).unwrap().lkey);
    let list = p.b.alloc(8);
    p.b.write(list, &p.dst.to_le_bytes());
    let w = Wqe {
        wr_id: 51,
        opcode: VRDMA_WR_REG_MR,
        flags: VRDMA_SEND_SIGNALED,
        reg: Some((p.dst, 4096, fr, MR_BIND, 1, 12, list)),
        ..Default::default()
    };
    let c = run_b(&mut p, &w);
    assert_eq!(c.status, VRDMA_WC_SUCCESS, "fast registration");
    p.kb = fr;
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    bind_ok(&mut p, mw, 0, 4096, RW);
    assert_eq!(
        inv(&mut p, fr),
        VRDMA_WC_LOC_QP_OP_ERR,
        "MR with a bound window"
    );
}

#[test]
fn dereg_of_the_mr_and_dealloc_of_the_window_end_access() {
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, RW);
    handle_cmd(&mut p.b, VRDMA_CMD_DEREG_MR, p.kb).expect("dereg the MR");
    let c = {
        let (ra, rk) = (p.dst, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(
        c.status, VRDMA_WC_REM_ACCESS_ERR,
        "window of a deregistered MR"
    );

    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_1).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, RW);
    handle_cmd(&mut p.b, VRDMA_CMD_DEALLOC_MW, rkey).expect("dealloc the window");
    let c = {
        let (ra, rk) = (p.dst, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR, "deallocated window");
}

#[test]
fn destroy_qp_frees_its_type2_windows() {
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, RW);
    // A second QP of B's PD, connected to a second QP on A.
    let (_, second) = second_conn(&mut p);
    let QpPair {
        qa: qa2,
        qb: qb2,
        cqa: cqa2,
        cqb: cqb2,
        ..
    } = second;
    handle_cmd(&mut p.b, VRDMA_CMD_DESTROY_QP, p.qb.qpn).expect("destroy the binding QP");
    // The window is free again: a bind through the other QP succeeds (a bound 2B window would
    // refuse it, o10-37.2.30).
    (p.qa, p.qb, p.cqa, p.cqb) = (qa2, qb2, cqa2, cqb2);
    bind_ok(&mut p, rkey, 0, 4096, RW);
}

#[test]
fn window_commands() {
    let mut n = Node::new(2, 16, 1500);
    let pd = n.create_pd();
    assert_eq!(alloc_mw(&mut n, pd, 3), Err(VRDMA_STATUS_INVALID), "type 3");
    assert_eq!(alloc_mw(&mut n, pd, 0), Err(VRDMA_STATUS_INVALID), "type 0");
    assert_eq!(
        alloc_mw(&mut n, pd + 100, VRDMA_MW_TYPE_1),
        Err(VRDMA_STATUS_NOT_FOUND),
        "unknown PD"
    );
    let buf = n.alloc(4096);
    let mr = n.reg_mr(pd, buf, 4096, MR_BIND);
    let mw = alloc_mw(&mut n, pd, VRDMA_MW_TYPE_2).unwrap();
    assert_ne!(mw >> 8, mr >> 8, "windows and MRs share one index space");
    assert_eq!(
        handle_cmd(&mut n, VRDMA_CMD_DEREG_MR, mw).err(),
        Some(VRDMA_STATUS_NOT_FOUND),
        "DEREG_MR of a window"
    );
    assert_eq!(
        handle_cmd(&mut n, VRDMA_CMD_DEALLOC_MW, mr).err(),
        Some(VRDMA_STATUS_NOT_FOUND),
        "DEALLOC_MW of an MR"
    );
    assert_eq!(
        handle_cmd(&mut n, VRDMA_CMD_DESTROY_PD, pd).err(),
        Some(VRDMA_STATUS_BUSY),
        "DESTROY_PD with a window"
    );
    handle_cmd(&mut n, VRDMA_CMD_DEALLOC_MW, mw).expect("dealloc");
    assert_eq!(
        handle_cmd(&mut n, VRDMA_CMD_DEALLOC_MW, mw).err(),
        Some(VRDMA_STATUS_NOT_FOUND),
        "double dealloc"
    );
    handle_cmd(&mut n, VRDMA_CMD_DEREG_MR, mr).expect("dereg");
    handle_cmd(&mut n, VRDMA_CMD_DESTROY_PD, pd).expect("destroy pd");
    // max_mw bounds the windows, not the MRs.
    let mut n = Node::with_config(3, 16, 1500, gid_v4([10, 0, 0, 3]), |c| c.max_mw = 1);
    let pd = n.create_pd();
    alloc_mw(&mut n, pd, VRDMA_MW_TYPE_1).unwrap();
    assert_eq!(
        alloc_mw(&mut n, pd, VRDMA_MW_TYPE_1),
        Err(VRDMA_STATUS_NO_RESOURCES)
    );
    let buf = n.alloc(4096);
    n.reg_mr(pd, buf, 4096, MR_BIND);
    let cfg = VrdmaConfig::read_from(&n.cmd(VRDMA_CMD_QUERY_DEVICE, &[]).unwrap()).unwrap();
    assert_eq!(cfg.max_mw, 1, "config space carries max_mw");
}

/// REREG_MR keeps the MR's key: a window bound to it reaches the new registration, but not
/// once the MR moved to another PD (spec §12.8).
#[test]
fn rereg_of_the_mr_keeps_or_cuts_its_windows() {
    let rereg = |p: &mut RcPair, pd: u32| {
        let pages: Vec<u64> = (0..4).map(|i| p.dst + i * 4096).collect();
        let c = VrdmaCmdReregMr {
            key: p.kb,
            pdn: pd,
            access: MR_BIND,
            page_shift: 12,
            iova: p.dst,
            length: 16384,
            npages: 4,
            reserved: 0,
        };
        p.b.cmd_pages(VRDMA_CMD_REREG_MR, &c, &pages)
            .expect("rereg");
    };
    let mut p = pair();
    let mw = alloc_mw(&mut p.b, p.pdb, VRDMA_MW_TYPE_2).unwrap();
    let rkey = bind_ok(&mut p, mw, 0, 4096, RW);
    let pdb = p.pdb;
    rereg(&mut p, pdb);
    let c = {
        let (ra, rk) = (p.dst, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(
        c.status, VRDMA_WC_SUCCESS,
        "same PD: the window still works"
    );
    let pd2 = p.b.create_pd();
    rereg(&mut p, pd2);
    let c = {
        let (ra, rk) = (p.dst, rkey);
        rdma(&mut p, VRDMA_WR_RDMA_WRITE, ra, rk)
    };
    assert_eq!(c.status, VRDMA_WC_REM_ACCESS_ERR, "MR moved to another PD");
}
