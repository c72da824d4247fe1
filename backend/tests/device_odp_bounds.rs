//! ODP state stays bounded whatever a peer or a local WQE does (spec §12.4, §12.6): transfers
//! larger than the resident budget make progress chunk by chunk, outstanding page requests are
//! capped per device, failed chunks expire, and the bookkeeping never grows with the number of
//! chunks touched.

mod common;

use common::odp::*;
use common::*;
use vrdma_backend::memory::odp::OdpConfig;
use vrdma_spec::*;

const CH: u64 = 2 << 20;

/// A 64 MiB RDMA READ from an ODP MR whose device keeps at most 4 chunks resident completes with
/// the right data: the responder resolves one packet at a time instead of the whole range.
#[test]
fn read_64m_with_4_chunk_budget_completes() {
    const LEN: u64 = 64 << 20;
    const NB: usize = 4;
    let cfg_b = OdpConfig {
        max_resident: NB,
        max_resident_per_mr: NB,
        ..OdpConfig::default()
    };
    let mut p = Pair::new(2 * LEN / (1 << 20) + 16, OdpConfig::default(), cfg_b, 1);
    p.budget_b = Some(NB);
    let dst = p.a.alloc(LEN);
    let ka = p.a.reg_mr(p.pda, dst, LEN, ACC_ALL);
    let va = 0x7100_0000_0000u64;
    let back = p.b.alloc(LEN);
    let kb = reg_odp(&mut p.b, p.pdb, va, LEN, false);
    p.pb.maps.push(Map {
        key: kb,
        va,
        gpa: back,
        len: LEN,
    });
    let data = pattern(64, LEN as usize);
    p.b.write(back, &data);
    p.post(
        0,
        &rdma(1, VRDMA_WR_RDMA_READ, (dst, LEN as u32, ka), va, kb),
    );
    let c = p.run_until(0, 1);
    assert_eq!(c[0].status, VRDMA_WC_SUCCESS, "{:?}", c[0]);
    assert!(p.a.read(dst, LEN as usize) == data, "READ data differs");
    let nch = (LEN / CH) as usize;
    assert!(
        p.pb.faults.len() < 2 * nch,
        "{} faults for {nch} chunks: the READ thrashed",
        p.pb.faults.len()
    );
}

/// A 64 MiB RDMA WRITE into an ODP MR with a 4-chunk budget completes: the first packet checks the
/// whole RETH range without faulting it in.
#[test]
fn write_64m_with_4_chunk_budget_completes() {
    const LEN: u64 = 64 << 20;
    const NB: usize = 4;
    let cfg_b = OdpConfig {
        max_resident: NB,
        max_resident_per_mr: NB,
        ..OdpConfig::default()
    };
    let mut p = Pair::new(2 * LEN / (1 << 20) + 16, OdpConfig::default(), cfg_b, 1);
    p.budget_b = Some(NB);
    let src = p.a.alloc(LEN);
    let ka = p.a.reg_mr(p.pda, src, LEN, ACC_ALL);
    let va = 0x7200_0000_0000u64;
    let back = p.b.alloc(LEN);
    let kb = reg_odp(&mut p.b, p.pdb, va, LEN, false);
    p.pb.maps.push(Map {
        key: kb,
        va,
        gpa: back,
        len: LEN,
    });
    let data = pattern(65, LEN as usize);
    p.a.write(src, &data);
    p.post(
        0,
        &rdma(1, VRDMA_WR_RDMA_WRITE, (src, LEN as u32, ka), va, kb),
    );
    let c = p.run_until(0, 1);
    assert_eq!(c[0].status, VRDMA_WC_SUCCESS, "{:?}", c[0]);
    assert!(p.b.read(back, LEN as usize) == data, "WRITE data differs");
    let nch = (LEN / CH) as usize;
    assert!(
        p.pb.faults.len() < 2 * nch,
        "{} faults for {nch} chunks: the WRITE thrashed",
        p.pb.faults.len()
    );
}

/// A 64 MiB RDMA WRITE whose local SGE is an ODP MR on a device with a 4-chunk budget completes:
/// the requester checks the SGE without faulting it in and resolves each packet's bytes.
#[test]
fn write_64m_from_odp_lkey_with_4_chunk_budget_completes() {
    const LEN: u64 = 64 << 20;
    const NB: usize = 4;
    let cfg_a = OdpConfig {
        max_resident: NB,
        max_resident_per_mr: NB,
        ..OdpConfig::default()
    };
    let mut p = Pair::new(2 * LEN / (1 << 20) + 16, cfg_a, OdpConfig::default(), 1);
    let va = 0x7300_0000_0000u64;
    let src = p.a.alloc(LEN);
    let ka = reg_odp(&mut p.a, p.pda, va, LEN, false);
    p.pa.maps.push(Map {
        key: ka,
        va,
        gpa: src,
        len: LEN,
    });
    let dst = p.b.alloc(LEN);
    let kb = p.b.reg_mr(p.pdb, dst, LEN, ACC_ALL);
    let data = pattern(66, LEN as usize);
    p.a.write(src, &data);
    p.post(
        0,
        &rdma(1, VRDMA_WR_RDMA_WRITE, (va, LEN as u32, ka), dst, kb),
    );
    let c = p.run_until(0, 1);
    assert_eq!(c[0].status, VRDMA_WC_SUCCESS, "{:?}", c[0]);
    assert!(p.a.dev.mrs.odp_resident_total() <= NB);
    assert!(p.b.read(dst, LEN as usize) == data, "WRITE data differs");
    let nch = (LEN / CH) as usize;
    assert!(
        p.pa.faults.len() < 2 * nch,
        "{} faults for {nch} chunks: the WRITE thrashed",
        p.pa.faults.len()
    );
}
