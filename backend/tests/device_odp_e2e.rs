//! ODP end to end between two in-process devices (device model + transport): the guest "pager"
//! answers page requests through ODP_PAGE_RESP commands while RC traffic runs, on the requester
//! side (local SGEs) and the responder side (RDMA WRITE target, RNR + retry), for explicit and
//! implicit ODP MRs, plus an error answer that must complete with an error.

mod common;

use common::odp::*;
use common::*;
use vrdma_spec::*;

/// Two ODP nodes (32 MiB each) with one RC connection at path MTU 1024.
fn pair() -> Pair {
    Pair::with(32).mtu(3).build()
}

/// B's first completion on connection `conn` (gathered now) is receive `wr_id` of `len` bytes,
/// successful.
fn assert_first_receive(p: &mut Pair, conn: usize, wr_id: u64, len: u32) {
    let c = &mut p.conns[conn];
    c.gb.extend(p.b.poll_cq(&mut c.qp.cqb));
    let cb = &c.gb;
    assert_eq!(
        (cb[0].wr_id, cb[0].status, cb[0].byte_len),
        (wr_id, VRDMA_WC_SUCCESS, len)
    );
}

#[test]
fn rdma_write_and_read_between_odp_mrs() {
    let mut p = pair();
    const LEN: u64 = 3 << 20; // spans two 2 MiB chunks on each side
                              // A: explicit ODP MR at a process VA, backed by guest pages.
    let va_a = 0x7f00_0010_0000;
    let (ka, gpa_a) = p.odp_mr(Side::A, va_a, LEN);
    // B: implicit ODP MR; the target VA range is backed by 4 MiB + alignment of guest pages.
    let va_b = 0x5500_0000_0000u64;
    let kb = p.implicit_mr(Side::B);
    let back_b = p.back(Side::B, kb, va_b, 8 << 20);
    let data = pattern(7, LEN as usize);
    p.a.write(gpa_a, &data);
    p.post_write(0, 1, (va_a, LEN as u32, ka), va_b + 0x1000, kb);
    let served = p.run_one_ok(0, 1);
    assert!(served >= 3, "faults on both sides were served ({served})");
    assert_eq!(p.b.read(back_b + 0x1000, LEN as usize), data);
    assert!(p.a.dev.mrs.write().odp_resident_total() >= 2);
    // READ it back into another part of A's MR.
    let zero = vec![0u8; 4096];
    p.a.write(gpa_a, &zero);
    p.post(
        0,
        &rdma(2, VRDMA_WR_RDMA_READ, (va_a, 4096, ka), va_b + 0x1000, kb),
    );
    p.run_one_ok(0, 2);
    assert_eq!(p.a.read(gpa_a, 4096), data[..4096].to_vec());
    // The driver invalidates B's range: the next WRITE faults again and still lands.
    p.b.odp_invalidate(kb, va_b, 8 << 20);
    assert_eq!(p.b.dev.mrs.write().odp_resident_total(), 0);
    p.post_write(0, 3, (va_a + 100, 1000, ka), va_b + 0x20_0000, kb);
    let served = p.run_one_ok(0, 3);
    assert!(served >= 1);
    assert_eq!(p.b.read(back_b + 0x20_0000, 1000), data[100..1100].to_vec());
}

#[test]
fn send_into_odp_receive_buffer() {
    let mut p = pair();
    let (src, ka) = p.mr(Side::A, 8192);
    let va_b = 0x6000_0000_0000u64;
    let (kb, back_b) = p.odp_mr(Side::B, va_b, 64 << 10);
    let data = pattern(9, 5000);
    p.a.write(src, &data);
    let mut rq = p.conns[0].qp.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, 50, &[(va_b + 8, 6000, kb)]);
    p.post(0, &send(4, (src, 5000, ka)));
    p.run_one_ok(0, 4);
    assert_first_receive(&mut p, 0, 50, 5000);
    assert_eq!(p.b.read(back_b + 8, 5000), data);
}

#[test]
fn pager_error_answer_fails_the_local_wqe() {
    let mut p = pair();
    let va_a = 0x7000_0000_0000u64;
    let (ka, _) = p.odp_mr(Side::A, va_a, 4096);
    let (dst, kb) = p.mr(Side::B, 4096);
    p.pa.status.insert(ka, VRDMA_STATUS_ACCESS);
    p.post_write(0, 9, (va_a, 64, ka), dst, kb);
    let (ca, served) = p.run_more(0, 1);
    assert_eq!(served, 1);
    let f = p.pa.faults_for(ka);
    assert!(
        f.len() == 1 && f[0].iova >= va_a && f[0].iova + f[0].length <= va_a + 4096,
        "one fault inside the mapped range: {f:?}"
    );
    assert_eq!((ca[0].wr_id, ca[0].status), (9, VRDMA_WC_LOC_PROT_ERR));
}

#[test]
fn atomics_on_odp_mrs() {
    let mut p = pair();
    let va_a = 0x7100_0000_0000u64;
    let (ka, gpa_a) = p.odp_mr(Side::A, va_a, 4096);
    let va_b = 0x7200_0000_0000u64;
    let (kb, gpa_b) = p.odp_mr(Side::B, va_b, 4096);
    p.b.write(gpa_b + 8, &100u64.to_le_bytes());
    p.post(0, &fetch_add(30, (va_a, 8, ka), va_b + 8, kb, 5));
    let served = p.run_one_ok(0, 30);
    assert_eq!(served, 2, "one fault per side");
    assert_eq!(p.a.read(gpa_a, 8), 100u64.to_le_bytes());
    assert_eq!(p.b.read(gpa_b + 8, 8), 105u64.to_le_bytes());
}

#[test]
fn srq_receive_into_odp_buffer() {
    let mut p = pair();
    // A second QP pair, B's on an SRQ.
    let (srqn, mut srq) = p.b.create_srq(p.pdb, 16, 4, 0);
    let i = p.conn(Some(srqn));
    let (src, ka) = p.mr(Side::A, 4096);
    let va_b = 0x6100_0000_0000u64;
    let (kb, back_b) = p.odp_mr(Side::B, va_b, 16 << 10);
    let data = pattern(11, 3000);
    p.a.write(src, &data);
    p.b.post_recv(&mut srq, 60, &[(va_b + 4096, 4096, kb)]);
    p.post(i, &send(6, (src, 3000, ka)));
    let served = p.run_one_ok(i, 6);
    assert_eq!(served, 1);
    assert_first_receive(&mut p, i, 60, 3000);
    assert_eq!(p.b.read(back_b + 4096, 3000), data);
}
