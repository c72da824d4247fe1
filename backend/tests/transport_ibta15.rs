//! IBTA 1.5 ATOMIC WRITE and FLUSH between two engines (spec §6.1, §12.3, §14.6, §15.2): data,
//! ordering, the responder's checks and error outcomes on both sides, duplicate replay from the
//! responder resource cache, and both operations on implicit ODP MRs.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::odp::Pair as OdpPair;
use common::*;
use vrdma_backend::transport::{self, ctx::Cqe};
use vrdma_backend::wire::RocePacket;
use vrdma_spec::*;

const T: Duration = Duration::from_secs(30);

/// A connected RC pair (4 ms ACK timeout); B's 64 KiB target MR is registered with `b_access`.
fn pair(b_access: u32) -> RcPair {
    RcPair::new().timeout(10).b_access(b_access).build()
}
/// Untagged IPv4 frames: the BTH opcode byte.
const BTH_OPCODE_AT: usize = 14 + 20 + 8;
const OP_FLUSH: u8 = 0x1c;
const OP_ATOMIC_WRITE: u8 = 0x1d;
const OP_READ_RESPONSE_ONLY: u8 = 0x10;

fn atomic_write(wr_id: u64, raddr: u64, rkey: u32, value: u64) -> Wqe {
    Wqe {
        wr_id,
        opcode: VRDMA_WR_ATOMIC_WRITE,
        flags: VRDMA_SEND_SIGNALED,
        remote_addr: raddr,
        rkey,
        compare_add: value,
        ..Default::default()
    }
}

/// A global-visibility FLUSH of the range `len` bytes at `raddr` (the usual one).
fn range_flush(wr_id: u64, raddr: u64, rkey: u32, len: u64) -> Wqe {
    flush(
        wr_id,
        raddr,
        rkey,
        len,
        VRDMA_FLUSH_GLOBAL,
        VRDMA_FLUSH_RANGE,
    )
}

fn flush(wr_id: u64, raddr: u64, rkey: u32, len: u64, placement: u8, level: u8) -> Wqe {
    Wqe {
        wr_id,
        opcode: VRDMA_WR_FLUSH,
        flags: VRDMA_SEND_SIGNALED,
        remote_addr: raddr,
        rkey,
        compare_add: len,
        flush: Some((placement, level)),
        ..Default::default()
    }
}

fn write(p: &RcPair, wr_id: u64, off: u64, len: u32) -> Wqe {
    rdma(
        wr_id,
        VRDMA_WR_RDMA_WRITE,
        (p.src + off, len, p.ka),
        p.dst + off,
        p.kb,
    )
}

/// Post `w` (WR 1): it completes with `status` at A and takes B's QP to ERROR.
fn fails_at_b(p: &mut RcPair, w: &Wqe, status: u8) {
    p.post(w);
    let (ca, _) = p.wait(1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (1, status));
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_ERR);
}

fn has_event(n: &Node, ty: u32, qpn: u32) -> bool {
    n.events().iter().any(|e| e.type_ == ty && e.id == qpn)
}

/// A link that records the BTH opcode of every frame from A to B.
fn recording_link() -> (Link, Arc<Mutex<Vec<u8>>>) {
    let mut link = Link::clean();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    link.filter_ab = Some(Box::new(move |f| {
        if let Some(&op) = f.get(BTH_OPCODE_AT) {
            s2.lock().unwrap().push(op);
        }
        true
    }));
    (link, seen)
}

#[test]
fn atomic_write_stores_the_8_bytes_and_completes_like_a_read() {
    let mut p = pair(ACC_ALL);
    let (link, seen) = recording_link();
    p.link = link;
    p.b.write(p.dst + 56, &[0xaa; 24]);
    let v = 0x1122_3344_5566_7788u64;
    p.post(&atomic_write(1, p.dst + 64, p.kb, v));
    let (ca, _) = p.wait(1, 0);
    assert_eq!(
        (ca[0].wr_id, ca[0].status, ca[0].opcode, ca[0].byte_len),
        (1, VRDMA_WC_SUCCESS, VRDMA_WC_ATOMIC_WRITE, 8)
    );
    // Exactly the 8 bytes, in memory order; the neighbours are untouched.
    assert_eq!(p.b.read(p.dst + 64, 8), v.to_le_bytes());
    assert_eq!(p.b.read(p.dst + 56, 8), [0xaa; 8]);
    assert_eq!(p.b.read(p.dst + 72, 8), [0xaa; 8]);
    assert_eq!(*seen.lock().unwrap(), vec![OP_ATOMIC_WRITE]);
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_RTS);
}

#[test]
fn misaligned_atomic_write_is_invalid_request_on_both_sides() {
    let mut p = pair(ACC_ALL);
    p.b.write(p.dst, &[0x55; 16]);
    // The requester does not check the alignment: the responder does (spec §14.6).
    let w = atomic_write(1, p.dst + 4, p.kb, u64::MAX);
    fails_at_b(&mut p, &w, VRDMA_WC_REM_INV_REQ_ERR);
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_ERR);
    assert!(has_event(&p.b, VRDMA_EV_QP_REQ_ERR, p.qb.qpn));
    assert_eq!(p.b.read(p.dst, 16), [0x55; 16]);
}

#[test]
fn atomic_write_without_remote_write_is_access_error_c9_222_1_1() {
    let mut p = pair(VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_READ);
    p.b.write(p.dst + 8, &[0x77; 8]);
    let w = atomic_write(1, p.dst + 8, p.kb, 1);
    fails_at_b(&mut p, &w, VRDMA_WC_REM_ACCESS_ERR);
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_ERR);
    // Responder: not tied to a receive WQE → QP to ERROR and QP_ACCESS_ERR.
    assert!(has_event(&p.b, VRDMA_EV_QP_ACCESS_ERR, p.qb.qpn));
    assert_eq!(p.b.read(p.dst + 8, 8), [0x77; 8]);
}

#[test]
fn flush_range_and_whole_mr_succeed_after_the_writes_before_them() {
    let mut p = pair(ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
    let (link, seen) = recording_link();
    p.link = link;
    let d1 = pattern(1, 3000);
    let d2 = pattern(2, 100);
    p.a.write(p.src, &d1);
    p.a.write(p.src + 8192, &d2);
    p.post(&write(&p, 1, 0, 3000));
    p.post(&range_flush(2, p.dst, p.kb, 3000));
    p.post(&write(&p, 3, 8192, 100));
    // Whole-MR selectivity: VA and length are not checked.
    p.post(&flush(
        4,
        0,
        p.kb,
        1 << 31,
        VRDMA_FLUSH_GLOBAL,
        VRDMA_FLUSH_MR,
    ));
    let mut done: Vec<Cqe> = Vec::new();
    let (cqa, dst) = (&mut p.cqa, p.dst);
    let (mut flush_saw, mut flush_mr_saw) = (Vec::new(), Vec::new());
    pump_until(&mut p.a, &mut p.b, &mut p.link, T, |a, b| {
        for c in a.poll_cq(cqa) {
            // When a FLUSH completes, the WRITEs before it are in B's memory.
            if c.wr_id == 2 {
                flush_saw = b.read(dst, 3000);
            }
            if c.wr_id == 4 {
                flush_mr_saw = b.read(dst + 8192, 100);
            }
            done.push(c);
        }
        done.len() >= 4
    });
    let got: Vec<_> = done
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, VRDMA_WC_SUCCESS, VRDMA_WC_RDMA_WRITE, 3000),
            (2, VRDMA_WC_SUCCESS, VRDMA_WC_FLUSH, 0),
            (3, VRDMA_WC_SUCCESS, VRDMA_WC_RDMA_WRITE, 100),
            (4, VRDMA_WC_SUCCESS, VRDMA_WC_FLUSH, 0),
        ]
    );
    assert_eq!(flush_saw, d1);
    assert_eq!(flush_mr_saw, d2);
    // On the wire each FLUSH follows the WRITE packets posted before it.
    let ops = seen.lock().unwrap().clone();
    let flushes: Vec<usize> = (0..ops.len()).filter(|&i| ops[i] == OP_FLUSH).collect();
    assert_eq!(flushes.len(), 2, "{ops:x?}");
    assert!(ops[..flushes[0]].len() >= 3, "{ops:x?}"); // 3000 bytes at MTU 1024
    assert!(ops[flushes[0] + 1..flushes[1]].contains(&0x0a), "{ops:x?}");
}

#[test]
fn a_fenced_wqe_waits_for_an_outstanding_flush() {
    let mut p = pair(ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
    p.post(&range_flush(1, p.dst, p.kb, 64));
    let mut w = write(&p, 2, 0, 64);
    w.flags |= VRDMA_SEND_FENCE;
    p.post(&w);
    // Only the FLUSH left: the fenced WRITE waits for its response (ordered like a READ).
    let out = std::mem::take(&mut p.a.dev.outbox(0).frames);
    let ops: Vec<u8> = out.iter().map(|f| f[BTH_OPCODE_AT]).collect();
    assert_eq!(ops, vec![OP_FLUSH]);
    transport::on_frame(&p.b.dev, &out[0]);
    let resp = std::mem::take(&mut p.b.dev.outbox(0).frames);
    assert_eq!(resp.len(), 1);
    assert_eq!(resp[0][BTH_OPCODE_AT], OP_READ_RESPONSE_ONLY);
    transport::on_frame(&p.a.dev, &resp[0]);
    let out = std::mem::take(&mut p.a.dev.outbox(0).frames);
    let ops: Vec<u8> = out.iter().map(|f| f[BTH_OPCODE_AT]).collect();
    assert_eq!(
        ops,
        vec![0x0a],
        "the fenced WRITE goes once the FLUSH completed"
    );
}

#[test]
fn flush_without_flush_global_on_the_mr_is_access_error() {
    let mut p = pair(ACC_ALL);
    let w = range_flush(1, p.dst, p.kb, 64);
    fails_at_b(&mut p, &w, VRDMA_WC_REM_ACCESS_ERR);
    assert!(has_event(&p.b, VRDMA_EV_QP_ACCESS_ERR, p.qb.qpn));
}

#[test]
fn flush_out_of_the_mr_range_is_access_error() {
    let mut p = pair(ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
    let w = range_flush(1, p.dst + 65000, p.kb, 4096);
    fails_at_b(&mut p, &w, VRDMA_WC_REM_ACCESS_ERR);
}

#[test]
fn persistent_flush_is_not_offered() {
    let mut p = pair(ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
    // No MR can promise persistence...
    let c = VrdmaCmdRegMr {
        pdn: 1,
        access: ACC_ALL | VRDMA_ACCESS_FLUSH_PERSISTENT,
        iova: p.dst,
        length: 4096,
        page_shift: 12,
        npages: 1,
    };
    let mut req = c.as_bytes().to_vec();
    req.extend_from_slice(&p.dst.to_le_bytes());
    assert_eq!(
        p.b.cmd(VRDMA_CMD_REG_MR, &req),
        Err(VRDMA_STATUS_NOT_SUPPORTED)
    );
    // ...so a persistent FLUSH fails the R_Key check (the QP allows it): REM_ACCESS_ERR, as rxe
    // answers on memory that is not persistent.
    let w = flush(
        1,
        p.dst,
        p.kb,
        64,
        VRDMA_FLUSH_PERSISTENT,
        VRDMA_FLUSH_RANGE,
    );
    fails_at_b(&mut p, &w, VRDMA_WC_REM_ACCESS_ERR);
    assert!(has_event(&p.b, VRDMA_EV_QP_ACCESS_ERR, p.qb.qpn));
}

#[test]
fn malformed_flush_and_atomic_write_wqes_are_local_errors() {
    for (w, status) in [
        (
            flush(1, 0, 0, 64, 0, VRDMA_FLUSH_RANGE),
            VRDMA_WC_LOC_QP_OP_ERR,
        ),
        (
            flush(1, 0, 0, 64, 0x4, VRDMA_FLUSH_RANGE),
            VRDMA_WC_LOC_QP_OP_ERR,
        ),
        (
            flush(1, 0, 0, 64, VRDMA_FLUSH_GLOBAL, 2),
            VRDMA_WC_LOC_QP_OP_ERR,
        ),
        (
            flush(1, 0, 0, (1 << 31) + 1, VRDMA_FLUSH_GLOBAL, 0),
            VRDMA_WC_LOC_LEN_ERR,
        ),
        (
            Wqe {
                sges: vec![(0, 8, 0)],
                ..atomic_write(1, 0, 0, 0)
            },
            VRDMA_WC_LOC_QP_OP_ERR,
        ),
    ] {
        let mut p = pair(ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
        p.post(&w);
        let (ca, _) = p.wait(1, 0);
        assert_eq!((ca[0].wr_id, ca[0].status), (1, status), "{w:?}");
        assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_ERR);
        assert_eq!(p.link.frames_ab, 0, "nothing is sent for {w:?}");
    }
}

#[test]
fn duplicate_atomic_write_is_replayed_not_executed_again() {
    let mut p = pair(ACC_ALL);
    let target = p.dst + 16;
    p.post(&atomic_write(1, target, p.kb, 111));
    let aw = std::mem::take(&mut p.a.dev.outbox(0).frames);
    assert_eq!(aw.len(), 1);
    let aw_psn = RocePacket::parse(&aw[0]).unwrap().bth.psn;
    transport::on_frame(&p.b.dev, &aw[0]);
    for f in std::mem::take(&mut p.b.dev.outbox(0).frames) {
        transport::on_frame(&p.a.dev, &f);
    }
    assert_eq!(p.b.read(target, 8), 111u64.to_le_bytes());
    // A later RDMA WRITE changes the target.
    p.a.write(p.src, &222u64.to_le_bytes());
    let mut w = write(&p, 2, 0, 8);
    w.remote_addr = target;
    p.post(&w);
    let (ca, _) = p.wait(2, 0);
    assert_eq!(
        ca.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, VRDMA_WC_SUCCESS), (2, VRDMA_WC_SUCCESS)]
    );
    assert_eq!(p.b.read(target, 8), 222u64.to_le_bytes());
    // The ATOMIC WRITE arrives again (a resend whose response was lost): answered from the
    // resource cache with an empty READ response for its PSN, the store is not repeated.
    transport::on_frame(&p.b.dev, &aw[0]);
    assert_eq!(p.b.read(target, 8), 222u64.to_le_bytes());
    let replies = std::mem::take(&mut p.b.dev.outbox(0).frames);
    assert_eq!(replies.len(), 1);
    let r = RocePacket::parse(&replies[0]).unwrap();
    assert_eq!(r.bth.opcode.value(), OP_READ_RESPONSE_ONLY);
    assert_eq!(r.bth.psn, aw_psn);
    assert!(r.payload.is_empty());
    assert!(r.ext.aeth.is_some());
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_RTS);
}

#[test]
fn atomic_write_and_flush_fault_implicit_odp_pages_in() {
    let mut p = OdpPair::with(32).build();
    // B's implicit MR with FLUSH_GLOBAL too.
    let c = odp_mr_req(
        p.pdb,
        ACC_ALL | VRDMA_ACCESS_ON_DEMAND | VRDMA_ACCESS_FLUSH_GLOBAL,
        0,
        u64::MAX,
    );
    let r = p.b.cmd(VRDMA_CMD_REG_IMPLICIT_MR, c.as_bytes()).unwrap();
    let kb = VrdmaRespRegMr::read_from(&r).unwrap().lkey;
    let _ka = p.implicit_mr(Side::A);
    let ch = 2u64 << 20;
    let va_b = 0x7b00_0000_0000u64;
    let back_b = p.back(Side::B, kb, va_b, 2 * ch);
    // ATOMIC WRITE into chunk 0 (not resident): a write fault, then the store.
    p.post(0, &atomic_write(1, va_b + 0x100, kb, 0xfeed_f00d));
    let c = p.run_until(0, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (1, VRDMA_WC_SUCCESS, VRDMA_WC_ATOMIC_WRITE)
    );
    assert_eq!(p.b.read(back_b + 0x100, 8), 0xfeed_f00du64.to_le_bytes());
    let f = p.pb.faults_for(kb);
    assert_eq!(f.len(), 1);
    assert_ne!(f[0].flags & VRDMA_PAGEREQ_F_WRITE, 0);
    // A range FLUSH over chunk 1 (not resident) faults it in like a READ would.
    p.post(0, &range_flush(2, va_b + ch + 0x40, kb, 4096));
    let c = p.run_until(0, 2);
    assert_eq!(
        (c[1].wr_id, c[1].status, c[1].opcode),
        (2, VRDMA_WC_SUCCESS, VRDMA_WC_FLUSH)
    );
    let f = p.pb.faults_for(kb);
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!(f[1].iova, va_b + ch);
    // A whole-MR FLUSH of the implicit MR needs no fault.
    p.post(0, &flush(3, 0, kb, 0, VRDMA_FLUSH_GLOBAL, VRDMA_FLUSH_MR));
    let c = p.run_until(0, 3);
    assert_eq!((c[2].wr_id, c[2].status), (3, VRDMA_WC_SUCCESS));
    assert_eq!(p.pb.faults_for(kb).len(), 2);
}

#[test]
fn flush_right_after_an_atomic_write() {
    let mut p = pair(ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
    p.post(&atomic_write(1, p.dst + 64, p.kb, 5));
    let (ca, _) = p.wait(1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (1, VRDMA_WC_SUCCESS));
    p.post(&range_flush(2, p.dst, p.kb, 4096));
    let (ca, _) = p.wait(1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (2, VRDMA_WC_SUCCESS));
    p.post(&flush(
        3,
        p.dst,
        p.kb,
        0,
        VRDMA_FLUSH_GLOBAL,
        VRDMA_FLUSH_MR,
    ));
    let (ca, _) = p.wait(1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (3, VRDMA_WC_SUCCESS));
}

/// A QP not enabled for the operation answers Invalid Request, not Remote Access Error (spec
/// §14.6, IBTA 9.7.5.2, as rxe): the key is never looked at.
#[test]
fn rdma_write_to_a_qp_without_remote_write_is_invalid_request() {
    let mut p = pair(ACC_ALL);
    let only_read = VrdmaQpAttr {
        qp_access_flags: VRDMA_ACCESS_REMOTE_READ,
        ..Default::default()
    };
    p.b.modify_qp(p.qb.qpn, VRDMA_QP_ACCESS_FLAGS, only_read)
        .expect("RTS -> RTS with new access flags");
    p.b.write(p.dst, &[0x33; 64]);
    let w = write(&p, 1, 0, 64);
    fails_at_b(&mut p, &w, VRDMA_WC_REM_INV_REQ_ERR);
    assert!(has_event(&p.b, VRDMA_EV_QP_REQ_ERR, p.qb.qpn));
    assert_eq!(p.b.read(p.dst, 64), [0x33; 64], "nothing written");
}

/// The FLUSH's response is lost and a long READ follows: the requester resends both, and the
/// replayed FLUSH response must not be left behind (and then cleared with) the stale READ tail.
#[test]
fn lost_flush_response_before_a_long_read_is_replayed() {
    let mut p = pair(ACC_ALL | VRDMA_ACCESS_FLUSH_GLOBAL);
    let mut dropped = false;
    p.link.filter_ba = Some(Box::new(move |f| {
        // The first response B sends is the FLUSH's (READ RESPONSE ONLY): lose it.
        if !dropped && f.get(BTH_OPCODE_AT) == Some(&OP_READ_RESPONSE_ONLY) {
            dropped = true;
            return false;
        }
        true
    }));
    let len = 1u64 << 20; // 1024 responses at MTU 1024: far more than one reply burst
    let remote = p.b.alloc(len);
    let rk = p.b.reg_mr(p.pdb, remote, len, ACC_ALL);
    let data = pattern(9, len as usize);
    p.b.write(remote, &data);
    let local = p.a.alloc(len);
    let lk = p.a.reg_mr(p.pda, local, len, ACC_ALL);
    p.post(&range_flush(1, p.dst, p.kb, 4096));
    p.post(&rdma(
        2,
        VRDMA_WR_RDMA_READ,
        (local, len as u32, lk),
        remote,
        rk,
    ));
    let (ca, _) = p.wait(2, 0);
    let got: Vec<_> = ca.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(got, [(1, VRDMA_WC_SUCCESS), (2, VRDMA_WC_SUCCESS)]);
    assert!(p.a.read(local, len as usize) == data, "the READ data");
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_RTS);
}
