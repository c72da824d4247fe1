//! RC transport between two in-process devices: every operation, sizes from 0 B to 8 MiB with
//! every path MTU, data verified byte for byte in guest memory.

mod common;

use std::time::Duration;

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

const T: Duration = Duration::from_secs(60);

/// An RC pair over 9000-byte Ethernet at path MTU `mtu`, 1024-deep CQs, no MRs.
fn pair(mtu: u32, mem_mib: u64) -> RcPair {
    RcPair::new()
        .mem_mib(mem_mib)
        .eth_mtu(9000)
        .cq_depth(1024)
        .mtu(mtu)
        .no_mrs()
        .patience(T)
        .build()
}

#[test]
fn send_recv_small() {
    let mut p = pair(3, 16);
    let src = p.a.alloc(4096);
    let dst = p.b.alloc(4096);
    let ka = p.a.reg_mr(p.pda, src, 4096, ACC_ALL);
    let kb = p.b.reg_mr(p.pdb, dst, 4096, ACC_ALL);
    let data = pattern(1, 100);
    p.a.write(src, &data);
    let mut rq = p.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, 77, &[(dst, 4096, kb)]);
    let mut qa = p.qa.clone();
    p.a.post_send(&mut qa, &send(5, (src, 100, ka)));
    let (ca, cb) = p.wait(1, 1);
    assert_eq!(ca[0].wr_id, 5);
    assert_eq!(ca[0].status, VRDMA_WC_SUCCESS);
    assert_eq!(ca[0].opcode, VRDMA_WC_SEND);
    assert_eq!(cb[0].wr_id, 77);
    assert_eq!(cb[0].status, VRDMA_WC_SUCCESS);
    assert_eq!(cb[0].opcode, VRDMA_WC_RECV);
    assert_eq!(cb[0].byte_len, 100);
    assert_eq!(p.b.read(dst, 100), data);
}

/// Buffers registered on both sides.
struct Bufs {
    src: u64,
    dst: u64,
    ka: u32,
    kb: u32,
    _len: u64,
}

fn bufs(p: &mut RcPair, len: u64) -> Bufs {
    let src = p.a.alloc(len.max(1));
    let dst = p.b.alloc(len.max(1));
    let ka = p.a.reg_mr(p.pda, src, len.max(1), ACC_ALL);
    let kb = p.b.reg_mr(p.pdb, dst, len.max(1), ACC_ALL);
    Bufs {
        src,
        dst,
        ka,
        kb,
        _len: len,
    }
}

fn post(p: &mut RcPair, w: Wqe) {
    let mut qa = p.qa.clone();
    p.a.post_send(&mut qa, &w);
    p.qa = qa;
}

fn post_recv_b(p: &mut RcPair, wr_id: u64, sges: &[(u64, u32, u32)]) {
    let mut rq = p.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, wr_id, sges);
    p.qb.rq = Some(rq);
}

fn ok(c: &Cqe, wr_id: u64, opcode: u8) {
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (wr_id, VRDMA_WC_SUCCESS, opcode),
        "cqe {c:?}"
    );
}

/// SEND, WRITE and READ of `len` bytes with path MTU `mtu`, verified byte for byte.
fn transfer(p: &mut RcPair, len: u64, seed: u64) {
    let b = bufs(p, len);
    let data = pattern(seed, len as usize);
    p.a.write(b.src, &data);
    // SEND
    post_recv_b(p, 1, &[(b.dst, len as u32, b.kb)]);
    post(p, send(10, (b.src, len as u32, b.ka)));
    let (ca, cb) = p.wait(1, 1);
    ok(&ca[0], 10, VRDMA_WC_SEND);
    ok(&cb[0], 1, VRDMA_WC_RECV);
    assert_eq!(cb[0].byte_len as u64, len);
    assert!(p.b.read(b.dst, len as usize) == data, "SEND data len {len}");
    // WRITE (different data)
    let data2 = pattern(seed + 1000, len as usize);
    p.a.write(b.src, &data2);
    post(
        p,
        rdma(
            11,
            VRDMA_WR_RDMA_WRITE,
            (b.src, len as u32, b.ka),
            b.dst,
            b.kb,
        ),
    );
    let (ca, _) = p.wait(1, 0);
    ok(&ca[0], 11, VRDMA_WC_RDMA_WRITE);
    assert!(
        p.b.read(b.dst, len as usize) == data2,
        "WRITE data len {len}"
    );
    // READ back into a fresh buffer on A
    let (back, kback) = p.mr(Side::A, len.max(1));
    let data3 = pattern(seed + 2000, len as usize);
    p.b.write(b.dst, &data3);
    post(
        p,
        rdma(
            12,
            VRDMA_WR_RDMA_READ,
            (back, len as u32, kback),
            b.dst,
            b.kb,
        ),
    );
    let (ca, _) = p.wait(1, 0);
    ok(&ca[0], 12, VRDMA_WC_RDMA_READ);
    assert!(p.a.read(back, len as usize) == data3, "READ data len {len}");
}

#[test]
fn every_mtu_and_size() {
    for mtu in 1..=5u32 {
        let m = 128u64 << mtu;
        let mut p = pair(mtu, 64);
        for (i, len) in [0, 1, m - 1, m, m + 1, 3 * m + 5, 65536 + 3, (1 << 20) + 7]
            .into_iter()
            .enumerate()
        {
            transfer(&mut p, len, mtu as u64 * 100 + i as u64);
        }
    }
}

#[test]
fn eight_mib_messages() {
    for mtu in [1u32, 5] {
        let mut p = pair(mtu, 96);
        transfer(&mut p, 8 << 20, 7 + mtu as u64);
    }
}

#[test]
fn immediate_and_inline_and_multi_sge() {
    let mut p = pair(3, 16);
    let b = bufs(&mut p, 8192);
    let data = pattern(3, 8192);
    p.a.write(b.src, &data);
    // SEND_WITH_IMM, 3 SGEs on each side.
    post_recv_b(
        &mut p,
        2,
        &[
            (b.dst, 1000, b.kb),
            (b.dst + 4000, 3000, b.kb),
            (b.dst + 7000, 1192, b.kb),
        ],
    );
    post(
        &mut p,
        Wqe {
            wr_id: 20,
            opcode: VRDMA_WR_SEND_WITH_IMM,
            flags: VRDMA_SEND_SIGNALED,
            ex: u32::from_le_bytes([0xde, 0xad, 0xbe, 0xef]),
            sges: vec![
                (b.src, 3000, b.ka),
                (b.src + 3000, 100, b.ka),
                (b.src + 3100, 2000, b.ka),
            ],
            ..Default::default()
        },
    );
    let (ca, cb) = p.wait(1, 1);
    ok(&ca[0], 20, VRDMA_WC_SEND);
    ok(&cb[0], 2, VRDMA_WC_RECV);
    assert_eq!(cb[0].byte_len, 5100);
    assert_eq!(cb[0].flags & VRDMA_WC_F_IMM, VRDMA_WC_F_IMM);
    assert_eq!(cb[0].ex.to_le_bytes(), [0xde, 0xad, 0xbe, 0xef]);
    let got: Vec<u8> = [
        p.b.read(b.dst, 1000),
        p.b.read(b.dst + 4000, 3000),
        p.b.read(b.dst + 7000, 1100),
    ]
    .concat();
    assert_eq!(got, data[..5100]);

    // WRITE_WITH_IMM consumes a receive WQE; byte_len is the write length.
    post_recv_b(&mut p, 3, &[]);
    post(
        &mut p,
        Wqe {
            wr_id: 21,
            opcode: VRDMA_WR_RDMA_WRITE_WITH_IMM,
            flags: VRDMA_SEND_SIGNALED,
            ex: 0x0403_0201,
            sges: vec![(b.src, 2500, b.ka)],
            remote_addr: b.dst + 100,
            rkey: b.kb,
            ..Default::default()
        },
    );
    let (ca, cb) = p.wait(1, 1);
    ok(&ca[0], 21, VRDMA_WC_RDMA_WRITE);
    ok(&cb[0], 3, VRDMA_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(cb[0].byte_len, 2500);
    assert_eq!(cb[0].ex, 0x0403_0201);
    assert_eq!(p.b.read(b.dst + 100, 2500), data[..2500]);

    // Inline SEND, unsignaled WRITE before a signaled one (only one CQE).
    post_recv_b(&mut p, 4, &[(b.dst, 8192, b.kb)]);
    post(&mut p, send_inline(22, b"inline payload!"));
    let (ca, cb) = p.wait(1, 1);
    ok(&ca[0], 22, VRDMA_WC_SEND);
    assert_eq!(cb[0].byte_len, 15);
    assert_eq!(p.b.read(b.dst, 15), b"inline payload!");
    post(
        &mut p,
        Wqe {
            wr_id: 23,
            opcode: VRDMA_WR_RDMA_WRITE,
            sges: vec![(b.src, 10, b.ka)],
            remote_addr: b.dst,
            rkey: b.kb,
            ..Default::default()
        },
    );
    post(
        &mut p,
        rdma(24, VRDMA_WR_RDMA_WRITE, (b.src, 10, b.ka), b.dst + 20, b.kb),
    );
    let (ca, _) = p.wait(1, 0);
    pump_idle(&mut p.a, &mut p.b, &mut p.link);
    let more = p.a.poll_cq(&mut p.cqa);
    assert_eq!(ca.len() + more.len(), 1, "unsignaled WQE produced a CQE");
    ok(&ca[0], 24, VRDMA_WC_RDMA_WRITE);
}

#[test]
fn atomics() {
    let mut p = pair(3, 16);
    let b = bufs(&mut p, 4096);
    p.b.write(b.dst + 8, &100u64.to_le_bytes());
    // FETCH_ADD: returns 100, memory becomes 105.
    post(&mut p, fetch_add(30, (b.src, 8, b.ka), b.dst + 8, b.kb, 5));
    let (ca, _) = p.wait(1, 0);
    ok(&ca[0], 30, VRDMA_WC_FETCH_ADD);
    assert_eq!(p.a.read(b.src, 8), 100u64.to_le_bytes());
    assert_eq!(p.b.read(b.dst + 8, 8), 105u64.to_le_bytes());
    // CMP_SWP that fails (compare 7 != 105), then one that succeeds.
    for (wr, cmp, expect_mem) in [(31u64, 7u64, 105u64), (32, 105, 999)] {
        post(
            &mut p,
            cmp_swap(wr, (b.src + 16, 8, b.ka), b.dst + 8, b.kb, cmp, 999),
        );
        let (ca, _) = p.wait(1, 0);
        ok(&ca[0], wr, VRDMA_WC_COMP_SWAP);
        assert_eq!(p.a.read(b.src + 16, 8), 105u64.to_le_bytes());
        assert_eq!(p.b.read(b.dst + 8, 8), expect_mem.to_le_bytes());
    }
}

#[test]
fn fence_holds_a_write_behind_an_outstanding_read() {
    let mut p = pair(3, 16);
    let b = bufs(&mut p, 4096);
    let old = pattern(61, 512);
    p.b.write(b.dst, &old);
    let new = pattern(62, 512);
    p.a.write(b.src + 2048, &new);
    // READ dst into src[0..512], then a fenced WRITE of src[2048..2560] over dst.
    post(
        &mut p,
        rdma(40, VRDMA_WR_RDMA_READ, (b.src, 512, b.ka), b.dst, b.kb),
    );
    post(
        &mut p,
        Wqe {
            wr_id: 41,
            opcode: VRDMA_WR_RDMA_WRITE,
            flags: VRDMA_SEND_SIGNALED | VRDMA_SEND_FENCE,
            sges: vec![(b.src + 2048, 512, b.ka)],
            remote_addr: b.dst,
            rkey: b.kb,
            ..Default::default()
        },
    );
    // IBTA 10.8.3.3: the fenced WRITE is not sent while the READ is outstanding.
    assert_eq!(
        p.a.dev.outbox(0).frames.len(),
        1,
        "only the READ request goes out"
    );
    let (ca, _) = p.wait(2, 0);
    ok(&ca[0], 40, VRDMA_WC_RDMA_READ);
    ok(&ca[1], 41, VRDMA_WC_RDMA_WRITE);
    assert_eq!(
        p.a.read(b.src, 512),
        old,
        "the READ saw the data before the WRITE"
    );
    assert_eq!(p.b.read(b.dst, 512), new);
}
