//! The [odp] engine-level test matrix, with traffic: two in-process devices joined by the real
//! transport, a driver stand-in answering page requests through ODP_PAGE_RESP, and every
//! transfer checked byte for byte in guest memory. Chunks are the default 2 MiB.

mod common;

use std::time::Duration;

use common::odp::*;
use common::*;
use vrdma_backend::memory::odp::OdpConfig;
use vrdma_spec::*;

const CH: u64 = 2 << 20;

/// The chunk starts (relative to `va`) of the faults in `reqs`, sorted.
fn chunks(reqs: &[VrdmaPageReq], va: u64) -> Vec<u64> {
    let mut v: Vec<u64> = reqs.iter().map(|r| r.iova - va).collect();
    v.sort_unstable();
    v
}

/// Case 1: A 64 KiB RDMA WRITE whose local SGE uses an implicit lkey (one chunk): exactly one page
/// request, data correct.
#[test]
fn write_64k_from_implicit_lkey_one_request() {
    let mut p = Pair::with(32).build();
    let va = 0x7f00_0000_0000u64;
    let (ka, back) = p.implicit_backed(Side::A, va, CH);
    let (dst, kb) = p.mr(Side::B, 64 << 10);
    let data = pattern(1, 64 << 10);
    p.a.write(back + 0x3000, &data);
    p.post_write(0, 1, (va + 0x3000, 64 << 10, ka), dst, kb);
    p.run_ok(0, 0, 1, 1);
    let f = p.pa.faults_for(ka);
    assert_eq!(f.len(), 1, "exactly one page request: {f:?}");
    assert_eq!((f[0].iova, f[0].length), (va, CH));
    assert_eq!(
        f[0].flags & VRDMA_PAGEREQ_F_WRITE,
        0,
        "a WRITE source is read"
    );
    assert!(p.pb.faults.is_empty());
    assert_eq!(p.b.read(dst, 64 << 10), data);
}

/// Case 2: Two 1 MiB WRITEs from buffers in different 2 MiB chunks of one implicit MR: one request
/// per chunk.
#[test]
fn two_1m_writes_from_two_chunks_one_request_each() {
    let mut p = Pair::with(32).build();
    let va = 0x7e00_0000_0000u64;
    let (ka, back) = p.implicit_backed(Side::A, va, 2 * CH);
    let (dst, kb) = p.mr(Side::B, 2 << 20);
    let d0 = pattern(20, 1 << 20);
    let d1 = pattern(21, 1 << 20);
    p.a.write(back + 0x1_0000, &d0);
    p.a.write(back + CH + 0x8_0000, &d1);
    p.post_write(0, 1, (va + 0x1_0000, 1 << 20, ka), dst, kb);
    p.post_write(0, 2, (va + CH + 0x8_0000, 1 << 20, ka), dst + (1 << 20), kb);
    p.run_ok(0, 0, 2, 1);
    assert_eq!(chunks(&p.pa.faults_for(ka), va), vec![0, CH]);
    assert_eq!(p.b.read(dst, 1 << 20), d0);
    assert_eq!(p.b.read(dst + (1 << 20), 1 << 20), d1);
}

/// Case 3: One 128 KiB WRITE whose single SGE spans a 2 MiB boundary, at odd offsets: both chunks
/// requested (once each), data correct.
#[test]
fn write_128k_sge_across_chunk_boundary() {
    let mut p = Pair::with(32).build();
    let va = 0x7d00_0000_0000u64;
    let (ka, back) = p.implicit_backed(Side::A, va, 2 * CH);
    let (dst, kb) = p.mr(Side::B, 128 << 10);
    for (i, back_off) in [1u64, 4095, 65537, 4096, 131071].into_iter().enumerate() {
        let off = CH - back_off;
        let data = pattern(30 + i as u64, 128 << 10);
        p.a.write(back + off, &data);
        p.b.write(dst, &[0u8; 128 << 10]);
        let before = p.pa.faults.len();
        p.post_write(0, i as u64, (va + off, 128 << 10, ka), dst, kb);
        let c = p.run_until(0, i + 1);
        assert_eq!(
            (c[i].wr_id, c[i].status),
            (i as u64, VRDMA_WC_SUCCESS),
            "offset boundary - {back_off}: {:?}",
            c[i]
        );
        assert_eq!(
            chunks(&p.pa.faults[before..], va),
            vec![0, CH],
            "offset boundary - {back_off}: both chunks requested once"
        );
        assert_eq!(
            p.b.read(dst, 128 << 10),
            data,
            "offset boundary - {back_off}"
        );
        // Drop both chunks so the next offset faults again.
        p.a.odp_invalidate(ka, va, 2 * CH);
        assert_eq!(p.a.dev.mrs.write().odp_resident_total(), 0);
    }
}

/// Case 4: Remote WRITE and READ into / from an implicit MR via its rkey; CMP_SWP and FETCH_ADD on an
/// implicit MR (result buffers in an implicit MR of the requester too).
#[test]
fn remote_write_read_atomics_on_implicit_rkey() {
    let mut p = Pair::with(32).build();
    let ka = p.implicit_mr(Side::A);
    let kb = p.implicit_mr(Side::B);
    let va_a = 0x7c00_0000_0000u64;
    let va_b = 0x7b00_0000_0000u64;
    let back_a = p.back(Side::A, ka, va_a, CH);
    let back_b = p.back(Side::B, kb, va_b, 2 * CH);
    // WRITE 64 KiB into chunk 0 of B's implicit MR.
    let wdata = pattern(40, 64 << 10);
    p.a.write(back_a, &wdata);
    p.post_write(0, 1, (va_a, 64 << 10, ka), va_b + 0x2345, kb);
    p.run_ok(0, 0, 1, 1);
    assert_eq!(p.b.read(back_b + 0x2345, 64 << 10), wdata);
    let fb = p.pb.faults_for(kb);
    assert_eq!(fb.len(), 1);
    assert_ne!(
        fb[0].flags & VRDMA_PAGEREQ_F_WRITE,
        0,
        "a WRITE target needs write"
    );
    // READ 64 KiB from chunk 1 of B (not resident yet) into A's implicit MR.
    let rdata = pattern(41, 64 << 10);
    p.b.write(back_b + CH + 0x777, &rdata);
    p.post(
        0,
        &rdma(
            2,
            VRDMA_WR_RDMA_READ,
            (va_a + 0x10_0000, 64 << 10, ka),
            va_b + CH + 0x777,
            kb,
        ),
    );
    p.run_ok(0, 1, 2, 2);
    assert_eq!(p.a.read(back_a + 0x10_0000, 64 << 10), rdata);
    assert_eq!(chunks(&p.pb.faults_for(kb), va_b), vec![0, CH]);
    // Atomics on an invalidated (absent) chunk of B: they fault it in again.
    p.b.odp_invalidate(kb, va_b, 2 * CH);
    p.b.write(back_b + 0x100, &1000u64.to_le_bytes());
    p.b.write(back_b + CH + 0x200, &0xdead_beefu64.to_le_bytes());
    p.post(
        0,
        &fetch_add(3, (va_a + 0x20_0000 - 64, 8, ka), va_b + 0x100, kb, 23),
    );
    p.post(
        0,
        &cmp_swap(
            4,
            (va_a + 0x20_0000 - 32, 8, ka),
            va_b + CH + 0x200,
            kb,
            0xdead_beef,
            0x1234_5678_9abc_def0,
        ),
    );
    // A CMP_SWP whose compare does not match leaves the target alone.
    p.post(
        0,
        &cmp_swap(
            5,
            (va_a + 0x20_0000 - 24, 8, ka),
            va_b + CH + 0x200,
            kb,
            0xdead_beef,
            7,
        ),
    );
    p.run_ok(0, 2, 5, 3);
    assert_eq!(p.a.read(back_a + 0x20_0000 - 64, 8), 1000u64.to_le_bytes());
    assert_eq!(p.b.read(back_b + 0x100, 8), 1023u64.to_le_bytes());
    assert_eq!(
        p.a.read(back_a + 0x20_0000 - 32, 8),
        0xdead_beefu64.to_le_bytes()
    );
    assert_eq!(
        p.a.read(back_a + 0x20_0000 - 24, 8),
        0x1234_5678_9abc_def0u64.to_le_bytes()
    );
    assert_eq!(
        p.b.read(back_b + CH + 0x200, 8),
        0x1234_5678_9abc_def0u64.to_le_bytes()
    );
    assert_eq!(chunks(&p.pb.faults_for(kb), va_b), vec![0, 0, CH, CH]);
}

/// Case 5: Two QPs fault the same chunk at once (requester side: same source chunk; responder side:
/// same target chunk): exactly one page request per side, both complete.
#[test]
fn two_qps_fault_same_chunk_once() {
    let mut p = Pair::with(32).conns(2).build();
    let ka = p.implicit_mr(Side::A);
    let kb = p.implicit_mr(Side::B);
    let va = 0x7a00_0000_0000u64;
    let back_a = p.back(Side::A, ka, va, CH);
    let back_b = p.back(Side::B, kb, va, CH);
    let d0 = pattern(50, 200 << 10);
    let d1 = pattern(51, 200 << 10);
    p.a.write(back_a + 0x1000, &d0);
    p.a.write(back_a + 0x10_0000, &d1);
    p.post_write(0, 1, (va + 0x1000, 200 << 10, ka), va + 0x4_0000, kb);
    p.post_write(1, 2, (va + 0x10_0000, 200 << 10, ka), va + 0x14_0000, kb);
    // Both QPs are waiting for the same request before the pager ran.
    p.serve();
    assert_eq!(p.pa.faults.len(), 1, "one request for both QPs");
    p.run_until(0, 1);
    p.run_until(1, 1);
    for (i, c) in p.conns.iter().enumerate() {
        assert_eq!(c.ga.len(), 1);
        assert_eq!(
            (c.ga[0].wr_id, c.ga[0].status),
            (i as u64 + 1, VRDMA_WC_SUCCESS)
        );
    }
    assert_eq!(p.pa.faults.len(), 1, "A: exactly one page request");
    assert_eq!(p.pb.faults.len(), 1, "B: exactly one page request");
    assert_eq!(p.b.read(back_b + 0x4_0000, 200 << 10), d0);
    assert_eq!(p.b.read(back_b + 0x14_0000, 200 << 10), d1);
}

/// Case 6: ODP_INVALIDATE racing with WRITEs in flight into an ODP MR: once it completed no byte lands
/// in the old pages (canary untouched); the driver stand-in answers the re-fault with new pages
/// and the rest of the traffic, and later traffic, lands there.
#[test]
fn invalidate_races_with_inflight_writes() {
    let mut p = Pair::with(32).build();
    let (src, ka) = p.mr(Side::A, 1 << 20);
    let kb = p.implicit_mr(Side::B);
    let va = 0x7900_0000_0000u64;
    let new = p.b.alloc(CH);
    let old = p.back(Side::B, kb, va, CH);
    // Fault the chunk in with a first WRITE.
    let first = pattern(60, 4096);
    p.a.write(src, &first);
    p.post_write(0, 100, (src, 4096, ka), va, kb);
    let c = p.run_until(0, 1);
    assert_eq!(c[0].status, VRDMA_WC_SUCCESS);
    assert_eq!(p.b.read(old, 4096), first);
    // Eight 64 KiB WRITEs (16 packets each) into the chunk.
    const N: u64 = 8;
    const L: u64 = 64 << 10;
    let data = pattern(61, (N * L) as usize);
    p.a.write(src, &data);
    for i in 0..N {
        p.post_write(
            0,
            i,
            (src + i * L, L as u32, ka),
            va + 0x10_0000 + i * L,
            kb,
        );
    }
    // Deliver only part of the packets: the rest are on the wire when the invalidation runs.
    let queued = p.a.dev.outbox(0).frames.len();
    assert!(queued > 20, "enough packets in flight ({queued})");
    p.deliver(20);
    let landed = p.b.read(old + 0x10_0000, (N * L) as usize);
    assert_eq!(
        &landed[..20 * 4096],
        &data[..20 * 4096],
        "first packets landed"
    );
    let inv = VrdmaCmdOdpInvalidate {
        mr_key: kb,
        reserved: 0,
        iova: va,
        length: CH,
    };
    assert!(p.b.cmd(VRDMA_CMD_ODP_INVALIDATE, inv.as_bytes()).is_ok());
    assert_eq!(p.b.dev.mrs.write().odp_resident_total(), 0);
    assert!(
        p.conns[0].ga.len() < 1 + N as usize,
        "WRITEs still in flight"
    );
    // The driver moves the range to new pages; the old ones get a canary.
    let canary = vec![0xa5u8; CH as usize];
    p.b.write(old, &canary);
    p.pb.remap(Map {
        key: kb,
        va,
        gpa: new,
        len: CH,
    });
    p.finish_step();
    let c = p.run_until(0, 1 + N as usize);
    for c in &c[1..] {
        assert_eq!(c.status, VRDMA_WC_SUCCESS, "{c:?}");
    }
    assert!(
        p.b.read(old, CH as usize) == canary,
        "a byte landed in the old pages"
    );
    // Every byte that landed in the new pages is the data written there, and the packets that
    // were still on the wire (everything after the first 20) landed there.
    let got = p.b.read(new + 0x10_0000, (N * L) as usize);
    assert_eq!(&got[20 * 4096..], &data[20 * 4096..]);
    assert!(
        got[..20 * 4096].iter().all(|&b| b == 0),
        "delivered before the invalidation"
    );
    assert_eq!(chunks(&p.pb.faults_for(kb), va), vec![0, 0]);
    // Later traffic lands in the new pages, and READ sees them.
    let later = pattern(62, 100_000);
    p.a.write(src, &later);
    p.post_write(0, 200, (src, 100_000, ka), va + 7, kb);
    let c = p.run_until(0, 2 + N as usize);
    assert_eq!(c[1 + N as usize].status, VRDMA_WC_SUCCESS);
    assert_eq!(p.b.read(new + 7, 100_000), later);
    assert!(p.b.read(old, CH as usize) == canary);
}

/// Case 7: Reclaim with a budget of N chunks (DeviceConfig.odp, what --odp-max-resident sets) while
/// traffic touches 4N chunks: resident never above N after any step, RECLAIM notices for the
/// dropped chunks, data correct after faulting back.
#[test]
fn reclaim_budget_with_traffic() {
    const NB: usize = 2;
    let cfg_b = OdpConfig {
        max_resident: NB,
        ..OdpConfig::default()
    };
    let mut p = Pair::with(48).odp_b(cfg_b).build();
    p.budget_b = Some(NB);
    let (src, ka) = p.mr(Side::A, 1 << 20);
    let kb = p.implicit_mr(Side::B);
    let va = 0x7800_0000_0000u64;
    let nch = 4 * NB as u64;
    let back = p.back(Side::B, kb, va, nch * CH);
    const L: u64 = 96 << 10;
    let data: Vec<Vec<u8>> = (0..nch).map(|i| pattern(70 + i, L as usize)).collect();
    for i in 0..nch {
        p.a.write(src, &data[i as usize]);
        p.post_write(0, i, (src, L as u32, ka), va + i * CH + 0x3000, kb);
        let c = p.run_until(0, i as usize + 1);
        assert_eq!(
            c[i as usize].status, VRDMA_WC_SUCCESS,
            "{:?}",
            c[i as usize]
        );
        assert!(p.b.dev.mrs.write().odp_resident_total() <= NB);
    }
    assert_eq!(p.pb.faults.len(), nch as usize, "one fault per chunk");
    // Every install beyond the budget dropped the LRU chunk: 0, 1, ... in order.
    let rec: Vec<(u64, u64)> =
        p.pb.reclaims
            .iter()
            .map(|r| (r.iova - va, r.length))
            .collect();
    let want: Vec<(u64, u64)> = (0..nch - NB as u64).map(|i| (i * CH, CH)).collect();
    assert_eq!(rec, want, "RECLAIM notices");
    assert!(p
        .pb
        .reclaims
        .iter()
        .all(|r| r.mr_key == kb && r.req_id == 0));
    for i in 0..nch {
        assert_eq!(
            p.b.read(back + i * CH + 0x3000, L as usize),
            data[i as usize]
        );
    }
    // READ every chunk back (the dropped ones fault in again), still within the budget.
    for i in 0..nch {
        p.a.write(src, &vec![0u8; L as usize]);
        let n = p.conns[0].ga.len();
        p.post(
            0,
            &rdma(
                100 + i,
                VRDMA_WR_RDMA_READ,
                (src, L as u32, ka),
                va + i * CH + 0x3000,
                kb,
            ),
        );
        let c = p.run_until(0, n + 1);
        assert_eq!(c[n].status, VRDMA_WC_SUCCESS, "{:?}", c[n]);
        assert_eq!(
            p.a.read(src, L as usize),
            data[i as usize],
            "chunk {i} read back"
        );
    }
    // Reading chunk i (in order 0..8) faults it in and drops the LRU chunk: 6 and 7 were
    // dropped by the reads of 0 and 1 before they were read themselves, so every read faulted.
    assert_eq!(
        p.pb.faults.len(),
        2 * nch as usize,
        "reclaimed chunks faulted back"
    );
    assert_eq!(p.pb.reclaims.len(), want.len() + nch as usize);
}

/// Case 8a: A page request answered with an error: local access → LOC_PROT_ERR at the requester;
/// responder access → NAK remote access error → REM_ACCESS_ERR at the requester (§12.4 step 5).
#[test]
fn error_answers_local_and_remote() {
    let mut p = Pair::with(32).conns(2).build();
    let ka = p.implicit_mr(Side::A);
    let kb = p.implicit_mr(Side::B);
    p.pa.status.insert(ka, VRDMA_STATUS_ACCESS);
    p.pb.status.insert(kb, VRDMA_STATUS_BAD_ADDRESS);
    let (dst, kdst) = p.mr(Side::B, 8192);
    let (src, ksrc) = p.mr(Side::A, 8192);
    p.post_write(0, 1, (0x7000_0000_0000, 64, ka), dst, kdst);
    p.post_write(1, 2, (src, 64, ksrc), 0x7100_0000_0000, kb);
    p.run_until(0, 1);
    p.run_until(1, 1);
    let (c0, c1) = (p.conns[0].ga[0], p.conns[1].ga[0]);
    assert_eq!((c0.wr_id, c0.status), (1, VRDMA_WC_LOC_PROT_ERR), "{c0:?}");
    assert_eq!(
        (c1.wr_id, c1.status),
        (2, VRDMA_WC_REM_ACCESS_ERR),
        "{c1:?}"
    );
    assert_eq!(p.pa.faults.len(), 1);
    assert_eq!(p.pb.faults.len(), 1);
    assert_eq!(p.b.read(dst, 64), vec![0u8; 64], "nothing written");
    // Both requester QPs are in ERROR (RC error completion).
    assert_eq!(p.a.qp_state(p.conns[0].qp.qa.qpn), VRDMA_QPS_ERR);
    assert_eq!(p.a.qp_state(p.conns[1].qp.qa.qpn), VRDMA_QPS_ERR);
}

/// Case 8b: The driver never answers: the WQEs complete with an error after the (shortened) timeout —
/// LOC_PROT_ERR for a local SGE, REM_ACCESS_ERR for a remote target — while another QP of the
/// same devices keeps transferring data correctly.
#[test]
fn unanswered_fault_times_out_other_qp_continues() {
    // Long enough that conn 2 completes several WQEs before it even on a loaded host (the ODP
    // clock follows the wall clock when that is ahead of the test's virtual time).
    let timeout = Duration::from_millis(1000);
    let cfg = OdpConfig {
        timeout,
        ..OdpConfig::default()
    };
    let mut p = Pair::with(32)
        .odp_a(cfg.clone())
        .odp_b(cfg)
        .conns(3)
        .build();
    let ka = p.implicit_mr(Side::A);
    let kb = p.implicit_mr(Side::B);
    p.pa.silent.push(ka);
    p.pb.silent.push(kb);
    let (src, ksrc) = p.mr(Side::A, 1 << 20);
    let (dst, kdst) = p.mr(Side::B, 1 << 20);
    let t0 = p.vt;
    p.post_write(0, 1, (0x7000_0000_0000, 4096, ka), dst, kdst);
    p.post_write(1, 2, (src, 4096, ksrc), 0x7100_0000_0000, kb);
    // Conn 2 moves 32 KiB per WQE, one after the other, while conns 0 and 1 wait.
    let mut done = 0usize;
    let mut posted = 0usize;
    while p.conns[0].ga.is_empty() || p.conns[1].ga.is_empty() {
        if posted == done {
            let d = pattern(80 + posted as u64, 32 << 10);
            let off = (posted as u64 % 32) * (32 << 10);
            p.a.write(src + off, &d);
            p.post_write(
                2,
                posted as u64,
                (src + off, 32 << 10, ksrc),
                dst + off,
                kdst,
            );
            posted += 1;
        }
        p.step();
        assert!(p.started.elapsed() < Duration::from_secs(30), "timed out");
        if p.conns[2].ga.len() > done {
            let c = p.conns[2].ga[done];
            assert_eq!(
                (c.wr_id, c.status),
                (done as u64, VRDMA_WC_SUCCESS),
                "{c:?}"
            );
            let off = (done as u64 % 32) * (32 << 10);
            assert_eq!(
                p.b.read(dst + off, 32 << 10),
                pattern(80 + done as u64, 32 << 10)
            );
            done += 1;
        }
    }
    let elapsed = p.vt - t0;
    assert!(
        elapsed >= timeout,
        "errors only after the timeout ({elapsed:?})"
    );
    let (c0, c1) = (p.conns[0].ga[0], p.conns[1].ga[0]);
    assert_eq!((c0.wr_id, c0.status), (1, VRDMA_WC_LOC_PROT_ERR), "{c0:?}");
    assert_eq!(
        (c1.wr_id, c1.status),
        (2, VRDMA_WC_REM_ACCESS_ERR),
        "{c1:?}"
    );
    assert!(done >= 3, "the other QP kept transferring ({done} WQEs)");
    assert_eq!(p.pa.faults.len(), 1);
    assert!(!p.pb.faults.is_empty());
    // The other QP still works after the errors.
    let d = pattern(99, 32 << 10);
    p.a.write(src, &d);
    let n = p.conns[2].ga.len();
    p.post_write(2, 999, (src, 32 << 10, ksrc), dst, kdst);
    let c = p.run_until(2, n + 1);
    assert_eq!(c.last().unwrap().status, VRDMA_WC_SUCCESS);
    assert_eq!(p.b.read(dst, 32 << 10), d);
}
