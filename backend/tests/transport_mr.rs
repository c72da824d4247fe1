//! Memory-related transport paths: fast registration (REG_MR WQE), LOCAL_INV, SEND_WITH_INV
//! (spec §6.1, §12) and on-demand paging at the requester and the responder (spec §10).

mod common;

use common::*;
use vrdma_spec::*;

/// An RC pair without MRs (16 ms ACK timeout) whose `wait` answers ODP page requests.
fn pair() -> RcPair {
    RcPair::new().timeout(12).no_mrs().serve_odp().build()
}

/// ALLOC_FAST_REG_MR of 16 pages in `pd` on `n`; returns its key.
fn alloc_frmr(n: &mut Node, pd: u32) -> u32 {
    let c = VrdmaCmdRegMr {
        pdn: pd,
        access: 0,
        iova: 0,
        length: 0,
        page_shift: 12,
        npages: 16,
    };
    let r = n
        .cmd(VRDMA_CMD_ALLOC_FAST_REG_MR, c.as_bytes())
        .expect("alloc fast reg");
    VrdmaRespRegMr::read_from(&r).unwrap().lkey
}

/// Allocate a fast-reg MR on B and register `[gpa, gpa+len)` into it with a REG_MR WQE posted on
/// B's own send queue. Returns the new key.
fn fast_reg(p: &mut RcPair, gpa: u64, len: u64, variant: u8) -> u32 {
    let k0 = alloc_frmr(&mut p.b, p.pdb);
    let key = (k0 & !0xff) | variant as u32;
    let np = len.div_ceil(4096);
    let list = p.b.alloc(np * 8);
    let bytes: Vec<u8> = (0..np)
        .flat_map(|i| (gpa + i * 4096).to_le_bytes())
        .collect();
    p.b.write(list, &bytes);
    p.post_b(&Wqe {
        wr_id: 900,
        opcode: VRDMA_WR_REG_MR,
        flags: VRDMA_SEND_SIGNALED,
        reg: Some((
            gpa,
            len,
            key,
            VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_WRITE,
            np as u32,
            12,
            list,
        )),
        ..Default::default()
    });
    let (_, gb) = p.wait(0, 1);
    assert_eq!(
        (gb[0].wr_id, gb[0].status, gb[0].opcode),
        (900, VRDMA_WC_SUCCESS, VRDMA_WC_REG_MR)
    );
    key
}

/// A signaled SEND_WITH_INV of one SGE that asks the responder to invalidate `key`.
fn send_with_inv(wr_id: u64, key: u32, sge: (u64, u32, u32)) -> Wqe {
    Wqe {
        wr_id,
        opcode: VRDMA_WR_SEND_WITH_INV,
        flags: VRDMA_SEND_SIGNALED,
        ex: key,
        sges: vec![sge],
        ..Default::default()
    }
}

fn write_to(p: &mut RcPair, src: u64, ka: u32, dst: u64, rkey: u32, wr_id: u64) {
    p.post(&rdma(wr_id, VRDMA_WR_RDMA_WRITE, (src, 64, ka), dst, rkey));
}

#[test]
fn fast_reg_then_local_inv() {
    let mut p = pair();
    let (src, ka) = p.mr(Side::A, 4096);
    p.a.write(src, &pattern(4, 64));
    let dst = p.b.alloc(8192);
    let key = fast_reg(&mut p, dst, 8192, 0x42);
    write_to(&mut p, src, ka, dst + 4096, key, 1);
    let (ga, _) = p.wait(1, 0);
    assert_eq!((ga[0].wr_id, ga[0].status), (1, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(dst + 4096, 64), pattern(4, 64));
    // LOCAL_INV on B's SQ, then the rkey is dead.
    p.post_b(&Wqe {
        wr_id: 901,
        opcode: VRDMA_WR_LOCAL_INV,
        flags: VRDMA_SEND_SIGNALED,
        ex: key,
        ..Default::default()
    });
    let (_, gb) = p.wait(0, 1);
    assert_eq!(
        (gb[0].wr_id, gb[0].status, gb[0].opcode),
        (901, VRDMA_WC_SUCCESS, VRDMA_WC_LOCAL_INV)
    );
    write_to(&mut p, src, ka, dst, key, 2);
    let (ga, _) = p.wait(1, 0);
    assert_eq!((ga[0].wr_id, ga[0].status), (2, VRDMA_WC_REM_ACCESS_ERR));
}

#[test]
fn send_with_invalidate() {
    let mut p = pair();
    let (src, ka) = p.mr(Side::A, 4096);
    let dst = p.b.alloc(8192);
    let key = fast_reg(&mut p, dst, 8192, 0x07);
    let (rbuf, kr) = p.mr(Side::B, 4096);
    p.post_recv_b(60, &[(rbuf, 4096, kr)]);
    p.post(&send_with_inv(3, key, (src, 32, ka)));
    let (ga, gb) = p.wait(1, 1);
    assert_eq!((ga[0].wr_id, ga[0].status), (3, VRDMA_WC_SUCCESS));
    let c = &gb[0];
    assert_eq!((c.wr_id, c.status, c.byte_len), (60, VRDMA_WC_SUCCESS, 32));
    assert_eq!(c.flags & VRDMA_WC_F_INV, VRDMA_WC_F_INV);
    assert_eq!(c.ex, key);
    write_to(&mut p, src, ka, dst, key, 4);
    let (ga, _) = p.wait(1, 0);
    assert_eq!((ga[0].wr_id, ga[0].status), (4, VRDMA_WC_REM_ACCESS_ERR));
}

#[test]
fn odp_at_requester_and_responder() {
    let mut p = RcPair::new()
        .nodes(Node::new_odp(1, 16), Node::new_odp(2, 16))
        .timeout(12)
        .no_mrs()
        .serve_odp()
        .build();
    let len = 3 << 20; // spans two 2 MiB chunks
    let src = p.a.alloc(len);
    let dst = p.b.alloc(len);
    let ka = p.a.reg_odp_mr(p.pda, src, len, ACC_ALL);
    let kb = p.b.reg_odp_mr(p.pdb, dst, len, ACC_ALL);
    let data = pattern(8, len as usize);
    p.a.write(src, &data);
    let w = rdma(5, VRDMA_WR_RDMA_WRITE, (src, len as u32, ka), dst, kb);
    p.post(&w);
    // The requester faults first (its QP waits), the responder RNR-NAKs and faults too.
    let (ga, _) = p.wait(1, 0);
    assert_eq!((ga[0].wr_id, ga[0].status), (5, VRDMA_WC_SUCCESS));
    assert!(p.b.read(dst, len as usize) == data, "ODP WRITE data");
    // Two chunks faulted on each side (spec §10), each answered once.
    assert_eq!(p.a.answered, 2, "requester page requests");
    assert_eq!(p.b.answered, 2, "responder page requests");
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_RTS);
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_RTS);
}

#[test]
fn send_with_invalidate_of_a_bad_rkey_is_an_invalid_request() {
    let mut p = pair();
    let (src, ka) = p.mr(Side::A, 4096);
    let (rbuf, kr) = p.mr(Side::B, 4096);
    p.post_recv_b(61, &[(rbuf, 4096, kr)]);
    // A page-list MR's key cannot be remotely invalidated (spec §14.6).
    p.post(&send_with_inv(7, kr, (src, 16, ka)));
    let (ga, gb) = p.wait(1, 1);
    assert_eq!((ga[0].wr_id, ga[0].status), (7, VRDMA_WC_REM_INV_REQ_ERR));
    assert_eq!((gb[0].wr_id, gb[0].status), (61, VRDMA_WC_REM_INV_REQ_ERR));
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_ERR);
}

/// REREG_MR between two RDMA WRITEs: the peer keeps using the same rkey and iova, the bytes land
/// in the new pages; a re-registration without remote write then refuses the next WRITE.
#[test]
fn rereg_mr_moves_the_target_and_keeps_the_rkey() {
    let mut p = pair();
    let (src, ka) = p.mr(Side::A, 4096);
    let (old, key) = p.mr(Side::B, 4096);
    p.a.write(src, &pattern(1, 64));
    write_to(&mut p, src, ka, old, key, 1);
    let (ga, _) = p.wait(1, 0);
    assert_eq!((ga[0].wr_id, ga[0].status), (1, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(old, 64), pattern(1, 64));

    let new = p.b.alloc(4096);
    let pdb = p.pdb;
    let rereg = |access| {
        let mut b = VrdmaCmdReregMr {
            key,
            pdn: pdb,
            access,
            page_shift: 12,
            iova: old,
            length: 4096,
            npages: 1,
            reserved: 0,
        }
        .as_bytes()
        .to_vec();
        b.extend_from_slice(&new.to_le_bytes());
        b
    };
    let r = p.b.cmd(VRDMA_CMD_REREG_MR, &rereg(ACC_ALL)).expect("rereg");
    assert_eq!(VrdmaRespRegMr::read_from(&r).unwrap().rkey, key);
    p.a.write(src, &pattern(2, 64));
    write_to(&mut p, src, ka, old, key, 2);
    let (ga, _) = p.wait(1, 0);
    assert_eq!((ga[0].wr_id, ga[0].status), (2, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(new, 64), pattern(2, 64), "lands in the new page");
    assert_eq!(
        p.b.read(old, 64),
        pattern(1, 64),
        "the old page is left alone"
    );

    p.b.cmd(VRDMA_CMD_REREG_MR, &rereg(VRDMA_ACCESS_LOCAL_WRITE))
        .expect("rereg without remote access");
    p.a.write(src, &pattern(3, 64));
    write_to(&mut p, src, ka, old, key, 3);
    let (ga, _) = p.wait(1, 0);
    assert_eq!((ga[0].wr_id, ga[0].status), (3, VRDMA_WC_REM_ACCESS_ERR));
    assert_eq!(
        p.b.read(new, 64),
        pattern(2, 64),
        "nothing written after the refusal"
    );
}

/// SEND_WITH_INV is checked like rxe's remote invalidation (spec §14.6): an earlier key variant
/// of a fast-reg MR, or a fast-reg MR of another PD, is an Invalid Request and nothing is
/// invalidated.
#[test]
fn send_with_invalidate_of_a_stale_variant_or_another_pd() {
    for case in 0..2 {
        let mut p = pair();
        let src = p.a.alloc(4096);
        let ka = p.a.reg_mr(p.pda, src, 4096, ACC_ALL);
        let dst = p.b.alloc(8192);
        let key = fast_reg(&mut p, dst, 8192, 0x21);
        let target = if case == 0 {
            // The key the MR had before this registration's variant.
            (key & !0xff) | 0x20
        } else {
            let other_pd = p.b.create_pd();
            alloc_frmr(&mut p.b, other_pd)
        };
        let rbuf = p.b.alloc(4096);
        let kr = p.b.reg_mr(p.pdb, rbuf, 4096, ACC_ALL);
        p.post_recv_b(62, &[(rbuf, 4096, kr)]);
        p.post(&send_with_inv(8, target, (src, 16, ka)));
        let (ga, gb) = p.wait(1, 1);
        assert_eq!(
            (ga[0].wr_id, ga[0].status),
            (8, VRDMA_WC_REM_INV_REQ_ERR),
            "case {case}"
        );
        assert_eq!(
            (gb[0].wr_id, gb[0].status),
            (62, VRDMA_WC_REM_INV_REQ_ERR),
            "case {case}"
        );
        // The registered MR is still valid.
        assert!(p
            .b
            .dev
            .mrs
            .write()
            .check_access(vrdma_backend::memory::Access {
                key,
                pd: p.pdb,
                iova: dst,
                len: 64,
                rights: VRDMA_ACCESS_REMOTE_WRITE,
            })
            .is_ok());
    }
}

#[test]
fn pinned_translations_run_beside_a_reader_of_the_mr_table() {
    // The engine workers translate pinned MRs under the MR table's read lock (`ctx::resolve`):
    // one worker's translation in progress (a read guard held here) does not hold back
    // another's. An ODP MR's translation changes the table and takes the write lock.
    use std::time::Duration;
    use vrdma_backend::memory::mr::MrError;
    use vrdma_backend::memory::Access;
    use vrdma_backend::transport::ctx;
    let mut a = Node::new_odp(1, 16);
    let pd = a.create_pd();
    let buf = a.alloc(3 << 20);
    let k = a.reg_mr(pd, buf, 8192, ACC_ALL);
    let k_odp = a.reg_odp_mr(pd, buf + (1 << 20), 1 << 20, ACC_ALL);
    let dev = &a.dev;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let held = dev.mrs.read();
        s.spawn(move || {
            let mut out = Vec::new();
            let a = Access {
                key: k,
                pd,
                iova: buf + 100,
                len: 5000,
                rights: 0,
            };
            let r = ctx::resolve(dev, None, a, &mut out);
            let _ = tx.send((r, out.iter().map(|r| r.len).sum::<u64>()));
        });
        let got = rx.recv_timeout(Duration::from_secs(30));
        drop(held);
        let (r, len) = got.expect("the translation waited for the other reader");
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(len, 5000);
    });
    let mut out = Vec::new();
    let odp = Access {
        key: k_odp,
        pd,
        iova: buf + (1 << 20),
        len: 64,
        rights: 0,
    };
    let r = ctx::resolve(dev, Some(7), odp, &mut out);
    assert!(matches!(r, Err(MrError::Fault { .. })), "{r:?}");
    assert_eq!(a.out.take_page_requests().len(), 1, "one FAULT sent");
}
