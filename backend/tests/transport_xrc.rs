//! XRC (spec §13.7): an XRC_INI QP on node A sends through an XRC_TGT QP on node B into the
//! XRC SRQ each WQE names (`xrc_srqn` → XRCETH); receives complete on that SRQ's CQ with the
//! target's QPN, memory accesses are checked in the SRQ's PD, and an XRCETH naming no XRC SRQ
//! of the target's domain is NAKed Invalid Request (spec §14.6). Also the XRC commands (§11.7).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

fn handle(r: &[u8]) -> u32 {
    VrdmaHandle::read_from(r).unwrap().handle
}

fn alloc_xrcd(n: &mut Node) -> u32 {
    handle(&n.cmd(VRDMA_CMD_ALLOC_XRCD, &[]).expect("xrcd"))
}

fn create_xrc_srq(
    n: &mut Node,
    pd: u32,
    xrcd: u32,
    cq: u32,
    depth: u32,
) -> Result<(u32, RingH), u32> {
    let ring = n.ring(depth, 8);
    let c = VrdmaCmdCreateSrq {
        pdn: pd,
        depth,
        wqe_shift: 8,
        srq_type: VRDMA_SRQT_XRC,
        reserved0: [0; 2],
        max_sge: 2,
        srq_limit: 0,
        npages: ring.pages.len() as u32,
        xrcdn: xrcd,
        cqn: cq,
    };
    let pages = ring.pages.clone();
    n.cmd_pages(VRDMA_CMD_CREATE_SRQ, &c, &pages)
        .map(|r| (handle(&r), ring))
}

fn qp_cmd(qp_type: u32, pd: u32, cq: u32, sq_depth: u32, sq_npages: u32) -> VrdmaCmdCreateQp {
    VrdmaCmdCreateQp {
        pdn: pd,
        qp_type,
        send_cqn: cq,
        recv_cqn: 0,
        srqn: VRDMA_NO_SRQ,
        sq_depth,
        rq_depth: 0,
        sq_wqe_shift: 8,
        rq_wqe_shift: 0,
        sq_sig_all: 0,
        reserved0: 0,
        max_send_sge: 4,
        max_recv_sge: 0,
        max_inline_data: 64,
        sq_npages,
        rq_npages: 0,
        xrcdn: 0,
    }
}

fn create_ini(n: &mut Node, pd: u32, cq: u32) -> QpH {
    let sq = n.ring(64, 8);
    let c = qp_cmd(VRDMA_QPT_XRC_INI, pd, cq, 64, sq.pages.len() as u32);
    let pages = sq.pages.clone();
    let r = n.cmd_pages(VRDMA_CMD_CREATE_QP, &c, &pages).expect("ini");
    QpH {
        qpn: VrdmaRespCreateQp::read_from(&r).unwrap().qpn,
        qp_type: VRDMA_QPT_XRC_INI,
        sq,
        rq: None,
    }
}

fn create_tgt(n: &mut Node, xrcd: u32) -> Result<u32, u32> {
    let c = VrdmaCmdCreateQp {
        xrcdn: xrcd,
        ..qp_cmd(VRDMA_QPT_XRC_TGT, 0, 0, 0, 0)
    };
    n.cmd(VRDMA_CMD_CREATE_QP, c.as_bytes())
        .map(|r| VrdmaRespCreateQp::read_from(&r).unwrap().qpn)
}

/// RESET → RTS with the masks Linux's `ib_modify_qp_is_ok` lets through for the XRC types.
fn xrc_rts(n: &mut Node, qpn: u32, tgt: bool, dest: u32, av: VrdmaAv, sq_psn: u32, rq_psn: u32) {
    let mut a = VrdmaQpAttr {
        qp_state: VRDMA_QPS_INIT,
        qp_access_flags: if tgt {
            VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_REMOTE_READ | VRDMA_ACCESS_REMOTE_ATOMIC
        } else {
            0
        },
        port_num: 1,
        ..Default::default()
    };
    let init = VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_ACCESS_FLAGS;
    n.modify_qp(qpn, init, a).expect("INIT");
    a.qp_state = VRDMA_QPS_RTR;
    a.av = av;
    a.path_mtu = 3;
    a.dest_qp_num = dest;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    let mut m =
        VRDMA_QP_STATE | VRDMA_QP_AV | VRDMA_QP_PATH_MTU | VRDMA_QP_DEST_QPN | VRDMA_QP_RQ_PSN;
    if tgt {
        m |= VRDMA_QP_MAX_DEST_RD_ATOMIC | VRDMA_QP_MIN_RNR_TIMER;
    }
    n.modify_qp(qpn, m, a).expect("RTR");
    a.qp_state = VRDMA_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = 10;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    let mut m = VRDMA_QP_STATE | VRDMA_QP_SQ_PSN | VRDMA_QP_TIMEOUT;
    if !tgt {
        m |= VRDMA_QP_RETRY_CNT | VRDMA_QP_RNR_RETRY | VRDMA_QP_MAX_QP_RD_ATOMIC;
    }
    n.modify_qp(qpn, m, a).expect("RTS");
}

struct Bed {
    a: Node,
    b: Node,
    ini: QpH,
    tgt: u32,
    xrcd: u32,
    cqa: RingH,
    /// The XRC SRQ's CQ on B.
    cqb: RingH,
    cqb_n: u32,
    pdb: u32,
    srqn: u32,
    srq: RingH,
    src: u64,
    dst: u64,
    ka: u32,
    /// MR on B in the SRQ's PD.
    kb: u32,
}

fn bed() -> Bed {
    let mut a = Node::new(1, 16, 1500);
    let mut b = Node::new(2, 16, 1500);
    let pda = a.create_pd();
    let (ca, cqa) = a.create_cq(64);
    let ini = create_ini(&mut a, pda, ca);
    let xrcd = alloc_xrcd(&mut b);
    let pdb = b.create_pd();
    let (cb, cqb) = b.create_cq(64);
    let (srqn, srq) = create_xrc_srq(&mut b, pdb, xrcd, cb, 16).expect("xrc srq");
    let tgt = create_tgt(&mut b, xrcd).expect("tgt");
    let (ava, avb) = (a.av_to(&b), b.av_to(&a));
    xrc_rts(&mut a, ini.qpn, false, tgt, ava, 1000, 5000);
    xrc_rts(&mut b, tgt, true, ini.qpn, avb, 5000, 1000);
    let MrPair { src, ka, dst, kb } = MrPair::new(&mut a, &mut b, pda, pdb, 65536);
    let _ = b.events();
    Bed {
        a,
        b,
        ini,
        tgt,
        xrcd,
        cqa,
        cqb,
        cqb_n: cb,
        pdb,
        srqn,
        srq,
        src,
        dst,
        ka,
        kb,
    }
}

/// Post `w` on the XRC_INI with `xrc_srqn` in the header (spec §6.1) and ring the doorbell.
fn post_xrc(t: &mut Bed, w: &Wqe, srqn: u32) {
    let slot = 1usize << t.ini.sq.shift;
    let mut b = w.bytes(slot, false);
    b[20..24].copy_from_slice(&srqn.to_le_bytes());
    let gpa = t.ini.sq.entry_gpa(t.ini.sq.idx);
    t.a.write(gpa, &b);
    t.ini.sq.idx = t.ini.sq.idx.wrapping_add(1);
    t.a.mem
        .store_u32_release(t.ini.sq.ctrl(), t.ini.sq.idx)
        .unwrap();
    t.a.doorbell(t.ini.qpn);
}

/// Frames A → B and B → A as (BTH opcode, bytes after the BTH) of untagged IPv4 frames.
type Seen = Arc<Mutex<Vec<(u8, Vec<u8>)>>>;

fn recording_link() -> (Link, Seen, Seen) {
    let mut link = Link::clean();
    let (ab, ba): (Seen, Seen) = Default::default();
    let (ab2, ba2) = (ab.clone(), ba.clone());
    link.filter_ab = Some(Box::new(move |f| {
        ab2.lock().unwrap().push((f[BTH], f[BTH + 12..].to_vec()));
        true
    }));
    link.filter_ba = Some(Box::new(move |f| {
        ba2.lock().unwrap().push((f[BTH], f[BTH + 12..].to_vec()));
        true
    }));
    (link, ab, ba)
}

/// Pump until A has `na` CQEs and B's SRQ CQ `nb`.
fn wait(t: &mut Bed, link: &mut Link, na: usize, nb: usize) -> (Vec<Cqe>, Vec<Cqe>) {
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    let (mut qa, mut qb) = (t.cqa.clone(), t.cqb.clone());
    pump_until(&mut t.a, &mut t.b, link, Duration::from_secs(10), |a, b| {
        ca.extend(a.poll_cq(&mut qa));
        cb.extend(b.poll_cq(&mut qb));
        ca.len() >= na && cb.len() >= nb
    });
    t.cqa = qa;
    t.cqb = qb;
    (ca, cb)
}

#[test]
fn send_goes_through_the_named_xrc_srq_with_xrceth_on_the_wire() {
    let mut t = bed();
    let data = pattern(1, 3000);
    t.a.write(t.src, &data);
    let (dst, kb) = (t.dst, t.kb);
    t.b.post_recv(&mut t.srq, 77, &[(dst, 4096, kb)]);
    let (mut link, ab, ba) = recording_link();
    let w = send(5, (t.src, 3000, t.ka));
    let srqn = t.srqn;
    post_xrc(&mut t, &w, srqn);
    let (ca, cb) = wait(&mut t, &mut link, 1, 1);
    assert_eq!((ca[0].wr_id, ca[0].status), (5, VRDMA_WC_SUCCESS));
    // The receive completes on the XRC SRQ's CQ, for the XRC_TGT QP (spec §13.7).
    assert_eq!(cb[0].wr_id, 77);
    assert_eq!(cb[0].status, VRDMA_WC_SUCCESS);
    assert_eq!(cb[0].opcode, VRDMA_WC_RECV);
    assert_eq!(cb[0].qpn, t.tgt);
    assert_eq!(cb[0].byte_len, 3000);
    assert_eq!(t.b.read(t.dst, 3000), data);
    // 3000 bytes at MTU 1024: XRC SEND FIRST, MIDDLE, LAST (0xa0, 0xa1, 0xa2), each with the
    // XRCETH right after the BTH; the ACK is XRC ACKNOWLEDGE (0xb1) with only an AETH.
    let ab = ab.lock().unwrap();
    let ops: Vec<u8> = ab.iter().map(|(o, _)| *o).collect();
    assert_eq!(ops, vec![0xa0, 0xa1, 0xa2]);
    for (_, rest) in ab.iter() {
        assert_eq!(rest[0], 0, "XRCETH reserved byte");
        assert_eq!(u32::from_be_bytes([0, rest[1], rest[2], rest[3]]), t.srqn);
    }
    let ba = ba.lock().unwrap();
    assert!(!ba.is_empty());
    for (op, rest) in ba.iter() {
        assert_eq!(*op, 0xb1);
        // AETH (4) + ICRC (4): no XRCETH in responses.
        assert_eq!(rest.len(), 8);
    }
}

#[test]
fn write_with_imm_read_and_atomic_use_the_srq_pd_and_cq() {
    let mut t = bed();
    let data = pattern(2, 2000);
    t.a.write(t.src, &data);
    let (dst, kb) = (t.dst, t.kb);
    t.b.post_recv(&mut t.srq, 9, &[(dst, 16, kb)]);
    let mut link = Link::clean();
    let (srqn, src, ka) = (t.srqn, t.src, t.ka);
    let w = Wqe {
        wr_id: 1,
        opcode: VRDMA_WR_RDMA_WRITE_WITH_IMM,
        flags: VRDMA_SEND_SIGNALED,
        ex: 0x1122_3344,
        sges: vec![(src, 2000, ka)],
        remote_addr: dst + 8192,
        rkey: kb,
        ..Default::default()
    };
    post_xrc(&mut t, &w, srqn);
    let (ca, cb) = wait(&mut t, &mut link, 1, 1);
    assert_eq!((ca[0].wr_id, ca[0].status), (1, VRDMA_WC_SUCCESS));
    assert_eq!(cb[0].opcode, VRDMA_WC_RECV_RDMA_WITH_IMM);
    assert_eq!((cb[0].wr_id, cb[0].qpn, cb[0].ex), (9, t.tgt, 0x1122_3344));
    assert_eq!(t.b.read(dst + 8192, 2000), data);
    // READ back into A (no receive WQE needed), then a FETCH_ADD on B's memory.
    let r = rdma(
        2,
        VRDMA_WR_RDMA_READ,
        (src + 4096, 2000, ka),
        dst + 8192,
        kb,
    );
    post_xrc(&mut t, &r, srqn);
    t.b.write(dst + 16384, &40u64.to_le_bytes());
    let f = fetch_add(3, (src + 8192, 8, ka), dst + 16384, kb, 2);
    post_xrc(&mut t, &f, srqn);
    let (ca, cb) = wait(&mut t, &mut link, 2, 0);
    assert!(cb.is_empty());
    assert_eq!((ca[0].wr_id, ca[0].status), (2, VRDMA_WC_SUCCESS));
    assert_eq!((ca[1].wr_id, ca[1].status), (3, VRDMA_WC_SUCCESS));
    assert_eq!(t.a.read(src + 4096, 2000), data);
    assert_eq!(t.a.read(src + 8192, 8), 40u64.to_le_bytes());
    assert_eq!(t.b.read(dst + 16384, 8), 42u64.to_le_bytes());
}

#[test]
fn unknown_srq_number_is_nak_invalid_request() {
    let mut t = bed();
    let mut link = Link::clean();
    let w = send(4, (t.src, 8, t.ka));
    post_xrc(&mut t, &w, 0x00ab_cdef);
    let (ca, _) = wait(&mut t, &mut link, 1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (4, VRDMA_WC_REM_INV_REQ_ERR));
    assert_eq!(t.b.qp_state(t.tgt), VRDMA_QPS_ERR);
    assert!(t
        .b
        .events()
        .iter()
        .any(|e| e.type_ == VRDMA_EV_QP_REQ_ERR && e.id == t.tgt));
}

#[test]
fn srq_of_another_xrc_domain_or_a_basic_srq_is_nak_invalid_request() {
    for basic in [false, true] {
        let mut t = bed();
        let other = if basic {
            t.b.create_srq(t.pdb, 16, 2, 0)
        } else {
            let x2 = alloc_xrcd(&mut t.b);
            create_xrc_srq(&mut t.b, t.pdb, x2, t.cqb_n, 16).expect("srq in other domain")
        };
        let (srqn, mut ring) = other;
        let (dst, kb) = (t.dst, t.kb);
        t.b.post_recv(&mut ring, 1, &[(dst, 64, kb)]);
        let mut link = Link::clean();
        let w = send(6, (t.src, 8, t.ka));
        post_xrc(&mut t, &w, srqn);
        let (ca, cb) = wait(&mut t, &mut link, 1, 0);
        assert_eq!(
            (ca[0].wr_id, ca[0].status),
            (6, VRDMA_WC_REM_INV_REQ_ERR),
            "basic {basic}"
        );
        assert!(cb.is_empty());
        assert_eq!(t.b.qp_state(t.tgt), VRDMA_QPS_ERR);
    }
}

#[test]
fn rkey_is_checked_in_the_srq_pd() {
    let mut t = bed();
    // An MR in another PD of B: the XRC SRQ's PD is the one that counts (spec §13.7).
    let pd2 = t.b.create_pd();
    let other = t.b.alloc(4096);
    let k2 = t.b.reg_mr(pd2, other, 4096, ACC_ALL);
    let mut link = Link::clean();
    let w = rdma(8, VRDMA_WR_RDMA_WRITE, (t.src, 64, t.ka), other, k2);
    let srqn = t.srqn;
    post_xrc(&mut t, &w, srqn);
    let (ca, _) = wait(&mut t, &mut link, 1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (8, VRDMA_WC_REM_ACCESS_ERR));
}

#[test]
fn xrc_ini_refuses_operations_xrc_has_no_opcode_for() {
    let mut t = bed();
    let mut link = Link::clean();
    let w = Wqe {
        wr_id: 10,
        opcode: VRDMA_WR_ATOMIC_WRITE,
        flags: VRDMA_SEND_SIGNALED,
        remote_addr: t.dst,
        rkey: t.kb,
        ..Default::default()
    };
    let srqn = t.srqn;
    post_xrc(&mut t, &w, srqn);
    let (ca, _) = wait(&mut t, &mut link, 1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (10, VRDMA_WC_LOC_QP_OP_ERR));
}

#[test]
fn xrc_commands_check_domains_and_references() {
    let mut b = Node::new(2, 16, 1500);
    let pd = b.create_pd();
    let (cq, _) = b.create_cq(16);
    let x = alloc_xrcd(&mut b);
    assert_ne!(alloc_xrcd(&mut b), x);
    // XRC_TGT: the domain must exist; no rings.
    assert_eq!(create_tgt(&mut b, 999), Err(VRDMA_STATUS_NOT_FOUND));
    let bad = VrdmaCmdCreateQp {
        xrcdn: x,
        sq_depth: 64,
        ..qp_cmd(VRDMA_QPT_XRC_TGT, 0, 0, 0, 0)
    };
    assert_eq!(
        b.cmd(VRDMA_CMD_CREATE_QP, bad.as_bytes()),
        Err(VRDMA_STATUS_INVALID)
    );
    // XRC SRQ: domain and CQ must exist; a basic SRQ carries neither.
    assert_eq!(
        create_xrc_srq(&mut b, pd, 999, cq, 16).err(),
        Some(VRDMA_STATUS_NOT_FOUND)
    );
    assert_eq!(
        create_xrc_srq(&mut b, pd, x, 999, 16).err(),
        Some(VRDMA_STATUS_NOT_FOUND)
    );
    let (srqn, _) = create_xrc_srq(&mut b, pd, x, cq, 16).expect("srq");
    // An XRC SRQ is never attached to a QP.
    let sq = b.ring(256, 9);
    let c = VrdmaCmdCreateQp {
        srqn,
        ..qp_cmd(VRDMA_QPT_RC, pd, cq, 256, sq.pages.len() as u32)
    };
    let c = VrdmaCmdCreateQp {
        recv_cqn: cq,
        sq_wqe_shift: 9,
        ..c
    };
    assert_eq!(
        b.cmd_pages(VRDMA_CMD_CREATE_QP, &c, &sq.pages),
        Err(VRDMA_STATUS_INVALID)
    );
    // XRC_INI: no receive queue.
    let sq = b.ring(64, 8);
    let c = VrdmaCmdCreateQp {
        rq_depth: 64,
        ..qp_cmd(VRDMA_QPT_XRC_INI, pd, cq, 64, sq.pages.len() as u32)
    };
    assert_eq!(
        b.cmd_pages(VRDMA_CMD_CREATE_QP, &c, &sq.pages),
        Err(VRDMA_STATUS_INVALID)
    );
    let tgt = create_tgt(&mut b, x).expect("tgt");
    let dealloc = |b: &mut Node, x: u32| b.cmd(VRDMA_CMD_DEALLOC_XRCD, handle_bytes(x).as_slice());
    // Busy while the SRQ and the TGT are in the domain; the CQ is busy while the SRQ uses it.
    assert_eq!(dealloc(&mut b, x), Err(VRDMA_STATUS_BUSY));
    assert_eq!(
        b.cmd(VRDMA_CMD_DESTROY_CQ, handle_bytes(cq).as_slice()),
        Err(VRDMA_STATUS_BUSY)
    );
    b.cmd(VRDMA_CMD_DESTROY_SRQ, handle_bytes(srqn).as_slice())
        .expect("destroy srq");
    assert_eq!(dealloc(&mut b, x), Err(VRDMA_STATUS_BUSY));
    b.cmd(VRDMA_CMD_DESTROY_QP, handle_bytes(tgt).as_slice())
        .expect("destroy tgt");
    dealloc(&mut b, x).expect("dealloc");
    assert_eq!(dealloc(&mut b, x), Err(VRDMA_STATUS_NOT_FOUND));
    b.cmd(VRDMA_CMD_DESTROY_CQ, handle_bytes(cq).as_slice())
        .expect("cq free again");
}

#[test]
fn modify_qp_masks_follow_the_xrc_rows_of_linux_table() {
    let mut b = Node::new(2, 16, 1500);
    let x = alloc_xrcd(&mut b);
    let tgt = create_tgt(&mut b, x).expect("tgt");
    let a = Node::new(1, 16, 1500);
    let av = b.av_to(&a);
    let mut at = VrdmaQpAttr {
        qp_state: VRDMA_QPS_INIT,
        port_num: 1,
        ..Default::default()
    };
    b.modify_qp(
        tgt,
        VRDMA_QP_STATE | VRDMA_QP_PKEY_INDEX | VRDMA_QP_PORT | VRDMA_QP_ACCESS_FLAGS,
        at,
    )
    .unwrap();
    at.qp_state = VRDMA_QPS_RTR;
    at.av = av;
    at.path_mtu = 3;
    at.dest_qp_num = 20;
    at.max_dest_rd_atomic = 1;
    let rtr =
        VRDMA_QP_STATE | VRDMA_QP_AV | VRDMA_QP_PATH_MTU | VRDMA_QP_DEST_QPN | VRDMA_QP_RQ_PSN;
    // The target is a responder: MAX_DEST_RD_ATOMIC and MIN_RNR_TIMER are required.
    assert_eq!(b.modify_qp(tgt, rtr, at), Err(VRDMA_STATUS_INVALID));
    b.modify_qp(
        tgt,
        rtr | VRDMA_QP_MAX_DEST_RD_ATOMIC | VRDMA_QP_MIN_RNR_TIMER,
        at,
    )
    .unwrap();
    at.qp_state = VRDMA_QPS_RTS;
    at.timeout = 10;
    // No send side: RETRY_CNT is not an attribute of an XRC_TGT at RTR → RTS.
    let rts = VRDMA_QP_STATE | VRDMA_QP_SQ_PSN | VRDMA_QP_TIMEOUT;
    assert_eq!(
        b.modify_qp(tgt, rts | VRDMA_QP_RETRY_CNT, at),
        Err(VRDMA_STATUS_INVALID)
    );
    b.modify_qp(tgt, rts, at).unwrap();
    assert_eq!(b.qp_state(tgt), VRDMA_QPS_RTS);
}

fn handle_bytes(h: u32) -> Vec<u8> {
    VrdmaHandle {
        handle: h,
        reserved: 0,
    }
    .as_bytes()
    .to_vec()
}

/// An XRC_TGT has no send queue: a doorbell the guest rings for it, or a response packet sent
/// to it, changes nothing and never touches guest memory (spec §13.7).
#[test]
fn tgt_without_rings_ignores_sq_doorbells() {
    let mut t = bed();
    t.b.doorbell(t.tgt);
    t.b.ring_doorbell(VRDMA_DB_RQ, t.tgt);
    let mut link = Link::clean();
    pump_idle(&mut t.a, &mut t.b, &mut link);
    // Still a working target.
    let (dst, kb) = (t.dst, t.kb);
    t.b.post_recv(&mut t.srq, 3, &[(dst, 64, kb)]);
    let w = send(12, (t.src, 16, t.ka));
    let srqn = t.srqn;
    post_xrc(&mut t, &w, srqn);
    let (ca, cb) = wait(&mut t, &mut link, 1, 1);
    assert_eq!(ca[0].status, VRDMA_WC_SUCCESS);
    assert_eq!((cb[0].wr_id, cb[0].qpn), (3, t.tgt));
}

/// Hostile XRC requests (spec §16: packets are untrusted): recorded XRC SEND / WRITE / READ
/// frames with random XRC SRQ numbers, truncations and bit flips, resealed so that they reach
/// the transport, never panic the target, and the device keeps answering commands.
#[test]
fn mutated_xrc_requests_never_panic_the_target() {
    let mut t = bed();
    let (dst, kb) = (t.dst, t.kb);
    t.b.post_recv(&mut t.srq, 100, &[(dst, 4096, kb)]);
    let mut link = Link::clean();
    let captured: Arc<Mutex<Vec<Vec<u8>>>> = Default::default();
    let c2 = captured.clone();
    link.filter_ab = Some(Box::new(move |f| {
        c2.lock().unwrap().push(f.to_vec());
        true
    }));
    let (srqn, src, ka) = (t.srqn, t.src, t.ka);
    for (i, (op, len)) in [
        (VRDMA_WR_SEND, 3000u32),
        (VRDMA_WR_RDMA_WRITE, 100),
        (VRDMA_WR_RDMA_READ, 100),
    ]
    .into_iter()
    .enumerate()
    {
        let w = Wqe {
            wr_id: i as u64,
            opcode: op,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(src, len, ka)],
            remote_addr: dst + 8192,
            rkey: kb,
            ..Default::default()
        };
        post_xrc(&mut t, &w, srqn);
    }
    let (ca, _) = wait(&mut t, &mut link, 3, 1);
    assert!(ca.iter().all(|c| c.status == VRDMA_WC_SUCCESS));
    let frames = captured.lock().unwrap().clone();
    assert!(frames.len() >= 5, "SEND x3, WRITE, READ request");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..3000 {
        let mut f = frames[round % frames.len()].clone();
        match next() % 4 {
            // Another (mostly nonexistent) XRC SRQ number.
            0 => {
                let v = (next() as u32 & 0x00ff_ffff).to_be_bytes();
                f[BTH + 13..BTH + 16].copy_from_slice(&v[1..]);
            }
            // Truncated into the XRCETH or the RETH.
            1 => {
                let n = BTH + 12 + (next() as usize % 24);
                f.truncate(n.min(f.len()));
            }
            // Bit flips in the transport headers.
            _ => {
                for _ in 0..(1 + next() % 4) {
                    let i = BTH + (next() as usize % (f.len() - BTH).min(40));
                    f[i] ^= 1 << (next() % 8);
                }
            }
        }
        reseal(&mut f);
        vrdma_backend::transport::on_frame(&t.b.dev, &f);
        t.b.dev.outbox(0).frames.clear();
    }
    let x = alloc_xrcd(&mut t.b);
    assert!(create_tgt(&mut t.b, x).is_ok());
}

/// Spec §5.2 with §13.7: when the XRC SRQ's CQ overflows, the XRC_TGT that posted on it goes
/// to ERROR with QP_FATAL like a QP on its own CQ.
#[test]
fn overflow_of_the_srq_cq_moves_the_target_to_error() {
    let mut t = bed();
    let (small, _ring) = t.b.create_cq(2);
    let (srq2, mut ring2) =
        create_xrc_srq(&mut t.b, t.pdb, t.xrcd, small, 16).expect("srq on a small cq");
    let (dst, kb) = (t.dst, t.kb);
    for i in 0..8 {
        t.b.post_recv(&mut ring2, i, &[(dst, 64, kb)]);
    }
    let mut link = Link::clean();
    let (src, ka) = (t.src, t.ka);
    for i in 0..8 {
        let w = send(i, (src, 8, ka));
        post_xrc(&mut t, &w, srq2);
    }
    pump_idle(&mut t.a, &mut t.b, &mut link);
    assert_eq!(t.b.qp_state(t.tgt), VRDMA_QPS_ERR);
    assert!(t
        .b
        .events()
        .iter()
        .any(|e| e.type_ == VRDMA_EV_QP_FATAL && e.id == t.tgt));
}
