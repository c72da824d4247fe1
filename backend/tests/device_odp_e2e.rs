//! ODP end to end between two in-process devices (device model + transport): the guest "pager"
//! answers page requests through ODP_PAGE_RESP commands while RC traffic runs, on the requester
//! side (local SGEs) and the responder side (RDMA WRITE target, RNR + retry), for explicit and
//! implicit ODP MRs, plus an error answer that must complete with an error.

mod common;

use std::time::{Duration, Instant};

use common::*;
use vrdma_backend::device::{Device, DeviceConfig};
use vrdma_backend::transport::{self, ctx::Cqe};
use vrdma_spec::*;

/// Rebuild a node's device with ODP (explicit + implicit) enabled.
fn enable_odp(n: &mut Node) {
    let mut cfg = DeviceConfig {
        mac: n.mac,
        mtu: 9000,
        ..DeviceConfig::default()
    };
    cfg.odp.enabled = true;
    cfg.odp.implicit = true;
    n.dev = Device::new(cfg, n.mem.clone(), n.out.clone());
    n.dev.flush_hook = Some(transport::flush);
    let g = VrdmaCmdGid {
        index: 0,
        type_: VRDMA_GID_TYPE_ROCE_V2,
        gid: n.gid,
    };
    n.cmd(VRDMA_CMD_ADD_GID, g.as_bytes()).expect("gid");
}

/// A process-VA → GPA mapping the pager uses: [va, va+len) is backed by [gpa, gpa+len).
#[derive(Clone, Copy)]
struct Map {
    key: u32,
    va: u64,
    gpa: u64,
    len: u64,
}

/// Answer every FAULT request of `n` (status from `status_for`), return how many were answered.
fn serve(n: &mut Node, maps: &[Map], status: u32) -> usize {
    let mut k = 0;
    for r in n.out.take_page_requests() {
        if r.type_ != VRDMA_PAGEREQ_FAULT {
            continue;
        }
        let m = maps
            .iter()
            .find(|m| m.key == r.mr_key)
            .expect("fault for a known MR");
        let start = r.iova & !4095;
        let end = (r.iova + r.length).next_multiple_of(4096);
        assert!(
            start >= m.va && end <= m.va + m.len,
            "fault outside the mapped range"
        );
        let pages: Vec<u64> = (start..end)
            .step_by(4096)
            .map(|va| m.gpa + (va - m.va))
            .collect();
        let c = VrdmaCmdOdpPageResp {
            req_id: r.req_id,
            mr_key: r.mr_key,
            status,
            flags: VRDMA_ODP_RESP_F_WRITABLE,
            iova: start,
            npages: pages.len() as u32,
            reserved: 0,
        };
        let mut b = c.as_bytes().to_vec();
        for p in &pages {
            b.extend_from_slice(&p.to_le_bytes());
        }
        n.cmd(VRDMA_CMD_ODP_PAGE_RESP, &b)
            .expect("page resp accepted");
        k += 1;
    }
    k
}

/// Move frames, serve page requests and fire timers in virtual time until `done`.
#[allow(clippy::too_many_arguments)]
fn run(
    a: &mut Node,
    b: &mut Node,
    maps_a: &[Map],
    maps_b: &[Map],
    status: u32,
    cqa: &mut RingH,
    cqb: &mut RingH,
    want_a: usize,
) -> (Vec<Cqe>, Vec<Cqe>, usize) {
    let start = Instant::now();
    let mut vt = Instant::now();
    let (mut ga, mut gb, mut served) = (Vec::new(), Vec::new(), 0);
    loop {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out");
        served += serve(a, maps_a, status) + serve(b, maps_b, status);
        for f in std::mem::take(&mut a.dev.outbox) {
            transport::on_frame(&mut b.dev, &f);
        }
        for f in std::mem::take(&mut b.dev.outbox) {
            transport::on_frame(&mut a.dev, &f);
        }
        ga.extend(a.poll_cq(cqa));
        gb.extend(b.poll_cq(cqb));
        if ga.len() >= want_a {
            return (ga, gb, served);
        }
        // Advance virtual time (RNR / retransmit timers) a little each round.
        vt += Duration::from_millis(5);
        let now = Instant::now().max(vt);
        transport::on_tick(&mut a.dev, now);
        transport::on_tick(&mut b.dev, now);
    }
}

fn reg_odp(n: &mut Node, pd: u32, va: u64, len: u64, implicit: bool) -> u32 {
    let c = VrdmaCmdRegMr {
        pdn: pd,
        access: ACC_ALL | VRDMA_ACCESS_ON_DEMAND,
        iova: if implicit { 0 } else { va },
        length: if implicit { u64::MAX } else { len },
        page_shift: 12,
        npages: 0,
    };
    let op = if implicit {
        VRDMA_CMD_REG_IMPLICIT_MR
    } else {
        VRDMA_CMD_REG_ODP_MR
    };
    let r = n.cmd(op, c.as_bytes()).expect("reg odp");
    VrdmaRespRegMr::read_from(&r).unwrap().lkey
}

struct Setup {
    a: Node,
    b: Node,
    qa: QpH,
    qb: QpH,
    cqa: RingH,
    cqb: RingH,
    pda: u32,
    pdb: u32,
}

fn setup() -> Setup {
    let mut a = Node::new(1, 32, 9000);
    let mut b = Node::new(2, 32, 9000);
    enable_odp(&mut a);
    enable_odp(&mut b);
    let pda = a.create_pd();
    let pdb = b.create_pd();
    let (ca, cqa) = a.create_cq(256);
    let (cb, cqb) = b.create_cq(256);
    let qa = a.create_qp(QpSpec::rc(pda, ca));
    let qb = b.create_qp(QpSpec::rc(pdb, cb));
    // rnr_retry 7 = infinite: the responder RNR-NAKs while a chunk is being faulted in.
    connect(&mut a, &qa, &mut b, &qb, 3, 14, 7, 7);
    Setup {
        a,
        b,
        qa,
        qb,
        cqa,
        cqb,
        pda,
        pdb,
    }
}

#[test]
fn rdma_write_and_read_between_odp_mrs() {
    let mut s = setup();
    const LEN: u64 = 3 << 20; // spans two 2 MiB chunks on each side
                              // A: explicit ODP MR at a process VA, backed by guest pages.
    let va_a = 0x7f00_0010_0000;
    let gpa_a = s.a.alloc(LEN);
    let ka = reg_odp(&mut s.a, s.pda, va_a, LEN, false);
    // B: implicit ODP MR; the target VA range is backed by 4 MiB + alignment of guest pages.
    let va_b = 0x5500_0000_0000u64;
    let back_b = s.b.alloc(8 << 20);
    let kb = reg_odp(&mut s.b, s.pdb, 0, 0, true);
    let maps_a = [Map {
        key: ka,
        va: va_a,
        gpa: gpa_a,
        len: LEN,
    }];
    let maps_b = [Map {
        key: kb,
        va: va_b,
        gpa: back_b,
        len: 8 << 20,
    }];
    let data = pattern(7, LEN as usize);
    s.a.write(gpa_a, &data);
    let mut qa = s.qa.clone();
    s.a.post_send(
        &mut qa,
        &Wqe {
            wr_id: 1,
            opcode: VRDMA_WR_RDMA_WRITE,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(va_a, LEN as u32, ka)],
            remote_addr: va_b + 0x1000,
            rkey: kb,
            ..Default::default()
        },
    );
    let (ca, _, served) = run(
        &mut s.a,
        &mut s.b,
        &maps_a,
        &maps_b,
        VRDMA_STATUS_OK,
        &mut s.cqa,
        &mut s.cqb,
        1,
    );
    assert_eq!(
        (ca[0].wr_id, ca[0].status),
        (1, VRDMA_WC_SUCCESS),
        "{:?}",
        ca[0]
    );
    assert!(served >= 3, "faults on both sides were served ({served})");
    assert_eq!(s.b.read(back_b + 0x1000, LEN as usize), data);
    assert!(s.a.dev.mrs.odp_resident_total() >= 2);
    // READ it back into another part of A's MR.
    let zero = vec![0u8; 4096];
    s.a.write(gpa_a, &zero);
    s.a.post_send(
        &mut qa,
        &Wqe {
            wr_id: 2,
            opcode: VRDMA_WR_RDMA_READ,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(va_a, 4096, ka)],
            remote_addr: va_b + 0x1000,
            rkey: kb,
            ..Default::default()
        },
    );
    let (ca, _, _) = run(
        &mut s.a,
        &mut s.b,
        &maps_a,
        &maps_b,
        VRDMA_STATUS_OK,
        &mut s.cqa,
        &mut s.cqb,
        1,
    );
    assert_eq!(
        (ca[0].wr_id, ca[0].status),
        (2, VRDMA_WC_SUCCESS),
        "{:?}",
        ca[0]
    );
    assert_eq!(s.a.read(gpa_a, 4096), data[..4096].to_vec());
    // The driver invalidates B's range: the next WRITE faults again and still lands.
    let inv = VrdmaCmdOdpInvalidate {
        mr_key: kb,
        reserved: 0,
        iova: va_b,
        length: 8 << 20,
    };
    s.b.cmd(VRDMA_CMD_ODP_INVALIDATE, inv.as_bytes()).unwrap();
    assert_eq!(s.b.dev.mrs.odp_resident_total(), 0);
    s.a.post_send(
        &mut qa,
        &Wqe {
            wr_id: 3,
            opcode: VRDMA_WR_RDMA_WRITE,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(va_a + 100, 1000, ka)],
            remote_addr: va_b + 0x20_0000,
            rkey: kb,
            ..Default::default()
        },
    );
    let (ca, _, served) = run(
        &mut s.a,
        &mut s.b,
        &maps_a,
        &maps_b,
        VRDMA_STATUS_OK,
        &mut s.cqa,
        &mut s.cqb,
        1,
    );
    assert_eq!((ca[0].wr_id, ca[0].status), (3, VRDMA_WC_SUCCESS));
    assert!(served >= 1);
    assert_eq!(s.b.read(back_b + 0x20_0000, 1000), data[100..1100].to_vec());
}

#[test]
fn send_into_odp_receive_buffer() {
    let mut s = setup();
    let src = s.a.alloc(8192);
    let ka = s.a.reg_mr(s.pda, src, 8192, ACC_ALL);
    let va_b = 0x6000_0000_0000u64;
    let back_b = s.b.alloc(64 << 10);
    let kb = reg_odp(&mut s.b, s.pdb, va_b, 64 << 10, false);
    let maps_b = [Map {
        key: kb,
        va: va_b,
        gpa: back_b,
        len: 64 << 10,
    }];
    let data = pattern(9, 5000);
    s.a.write(src, &data);
    let mut rq = s.qb.rq.clone().unwrap();
    s.b.post_recv(&mut rq, 50, &[(va_b + 8, 6000, kb)]);
    let mut qa = s.qa.clone();
    s.a.post_send(
        &mut qa,
        &Wqe {
            wr_id: 4,
            opcode: VRDMA_WR_SEND,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(src, 5000, ka)],
            ..Default::default()
        },
    );
    let (ca, mut cb, _) = run(
        &mut s.a,
        &mut s.b,
        &[],
        &maps_b,
        VRDMA_STATUS_OK,
        &mut s.cqa,
        &mut s.cqb,
        1,
    );
    assert_eq!((ca[0].wr_id, ca[0].status), (4, VRDMA_WC_SUCCESS));
    cb.extend(s.b.poll_cq(&mut s.cqb));
    assert_eq!(
        (cb[0].wr_id, cb[0].status, cb[0].byte_len),
        (50, VRDMA_WC_SUCCESS, 5000)
    );
    assert_eq!(s.b.read(back_b + 8, 5000), data);
}

#[test]
fn pager_error_answer_fails_the_local_wqe() {
    let mut s = setup();
    let va_a = 0x7000_0000_0000u64;
    let gpa_a = s.a.alloc(4096);
    let ka = reg_odp(&mut s.a, s.pda, va_a, 4096, false);
    let dst = s.b.alloc(4096);
    let kb = s.b.reg_mr(s.pdb, dst, 4096, ACC_ALL);
    let maps_a = [Map {
        key: ka,
        va: va_a,
        gpa: gpa_a,
        len: 4096,
    }];
    let mut qa = s.qa.clone();
    s.a.post_send(
        &mut qa,
        &Wqe {
            wr_id: 9,
            opcode: VRDMA_WR_RDMA_WRITE,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(va_a, 64, ka)],
            remote_addr: dst,
            rkey: kb,
            ..Default::default()
        },
    );
    let (ca, _, served) = run(
        &mut s.a,
        &mut s.b,
        &maps_a,
        &[],
        VRDMA_STATUS_ACCESS,
        &mut s.cqa,
        &mut s.cqb,
        1,
    );
    assert_eq!(served, 1);
    assert_eq!((ca[0].wr_id, ca[0].status), (9, VRDMA_WC_LOC_PROT_ERR));
}

#[test]
fn atomics_on_odp_mrs() {
    let mut s = setup();
    let va_a = 0x7100_0000_0000u64;
    let gpa_a = s.a.alloc(4096);
    let ka = reg_odp(&mut s.a, s.pda, va_a, 4096, false);
    let va_b = 0x7200_0000_0000u64;
    let gpa_b = s.b.alloc(4096);
    let kb = reg_odp(&mut s.b, s.pdb, va_b, 4096, false);
    let maps_a = [Map {
        key: ka,
        va: va_a,
        gpa: gpa_a,
        len: 4096,
    }];
    let maps_b = [Map {
        key: kb,
        va: va_b,
        gpa: gpa_b,
        len: 4096,
    }];
    s.b.write(gpa_b + 8, &100u64.to_le_bytes());
    let mut qa = s.qa.clone();
    s.a.post_send(
        &mut qa,
        &Wqe {
            wr_id: 30,
            opcode: VRDMA_WR_ATOMIC_FETCH_AND_ADD,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(va_a, 8, ka)],
            remote_addr: va_b + 8,
            rkey: kb,
            compare_add: 5,
            ..Default::default()
        },
    );
    let (ca, _, served) = run(
        &mut s.a,
        &mut s.b,
        &maps_a,
        &maps_b,
        VRDMA_STATUS_OK,
        &mut s.cqa,
        &mut s.cqb,
        1,
    );
    assert_eq!(
        (ca[0].wr_id, ca[0].status),
        (30, VRDMA_WC_SUCCESS),
        "{:?}",
        ca[0]
    );
    assert_eq!(served, 2, "one fault per side");
    assert_eq!(s.a.read(gpa_a, 8), 100u64.to_le_bytes());
    assert_eq!(s.b.read(gpa_b + 8, 8), 105u64.to_le_bytes());
}

#[test]
fn srq_receive_into_odp_buffer() {
    let mut s = setup();
    // A second QP pair on B with an SRQ.
    let (srqn, mut srq) = s.b.create_srq(s.pdb, 16, 4, 0);
    let (cb2, mut cqb2) = s.b.create_cq(64);
    let mut spec = QpSpec::rc(s.pdb, cb2);
    spec.srq = Some(srqn);
    let qb2 = s.b.create_qp(spec);
    let (ca2, mut cqa2) = s.a.create_cq(64);
    let qa2 = s.a.create_qp(QpSpec::rc(s.pda, ca2));
    connect(&mut s.a, &qa2, &mut s.b, &qb2, 3, 14, 7, 7);
    let src = s.a.alloc(4096);
    let ka = s.a.reg_mr(s.pda, src, 4096, ACC_ALL);
    let va_b = 0x6100_0000_0000u64;
    let back_b = s.b.alloc(16 << 10);
    let kb = reg_odp(&mut s.b, s.pdb, va_b, 16 << 10, false);
    let maps_b = [Map {
        key: kb,
        va: va_b,
        gpa: back_b,
        len: 16 << 10,
    }];
    let data = pattern(11, 3000);
    s.a.write(src, &data);
    s.b.post_recv(&mut srq, 60, &[(va_b + 4096, 4096, kb)]);
    let mut qa = qa2.clone();
    s.a.post_send(
        &mut qa,
        &Wqe {
            wr_id: 6,
            opcode: VRDMA_WR_SEND,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(src, 3000, ka)],
            ..Default::default()
        },
    );
    let (ca, mut cb, served) = run(
        &mut s.a,
        &mut s.b,
        &[],
        &maps_b,
        VRDMA_STATUS_OK,
        &mut cqa2,
        &mut cqb2,
        1,
    );
    assert_eq!((ca[0].wr_id, ca[0].status), (6, VRDMA_WC_SUCCESS));
    assert_eq!(served, 1);
    cb.extend(s.b.poll_cq(&mut cqb2));
    assert_eq!(
        (cb[0].wr_id, cb[0].status, cb[0].byte_len),
        (60, VRDMA_WC_SUCCESS, 3000)
    );
    assert_eq!(s.b.read(back_b + 4096, 3000), data);
}
