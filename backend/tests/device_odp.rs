//! On-demand paging: registration matrix, faults (single chunk, cross-chunk, concurrent → one
//! request), page responses (good, error, hostile), invalidation, reclaim budgets, timeouts,
//! ADVISE_MR, and the command layer.
//!
//! One long file because these cases share the pager fixtures and follow one chunk's life
//! (fault, answer, invalidate, reclaim, time out); a binary per stage would repeat the set-up.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::rng::XorShift;
use common::*;
use vrdma_backend::device::{CmdOutcome, RecordingOutput};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::memory::mr::*;
use vrdma_backend::memory::odp::{FAIL_HOLD, ODP_STATUS_TIMEOUT};
use vrdma_backend::memory::{GuestRange, MrError, MrTable, OdpConfig};
use vrdma_spec::*;

const CHUNK: u64 = 2 << 20;
const LW: u32 = VRDMA_ACCESS_LOCAL_WRITE;

fn odp_cfg() -> OdpConfig {
    OdpConfig {
        enabled: true,
        implicit: true,
        ..OdpConfig::default()
    }
}

fn setup(cfg: OdpConfig) -> (MrTable, Arc<RecordingOutput>, GuestMem) {
    let mem = GuestMem::from_ranges(&[(0, 64 << 20)]).unwrap();
    let out = Arc::new(RecordingOutput::new());
    (MrTable::new(100, mem.clone(), out.clone(), cfg), out, mem)
}

/// Answer a FAULT request with pages at `base` (contiguous GPAs).
fn answer(t: &mut MrTable, r: &VrdmaPageReq, base: u64, writable: bool) -> u32 {
    let start = r.iova & !4095;
    let end = (r.iova + r.length).next_multiple_of(4096);
    let pages: Vec<u64> = (0..(end - start) / 4096).map(|i| base + i * 4096).collect();
    t.odp_page_resp(
        r.req_id,
        r.mr_key,
        VRDMA_STATUS_OK,
        if writable {
            VRDMA_ODP_RESP_F_WRITABLE
        } else {
            0
        },
        start,
        &pages,
    )
}

/// A pinned (page-list) MR of one page at 0x100000 in PD 1, no access rights: a key that is
/// not ODP.
fn one_page_mr(t: &mut MrTable) -> u32 {
    let spec = PageListSpec {
        pd: 1,
        access: 0,
        iova: 0,
        length: 4096,
        page_shift: 12,
        pages: &[0x100000],
    };
    t.reg_page_list(&spec, 1 << 40).unwrap()
}

/// Reading MR `k` (PD 1) at iova 0 fails: its first chunk is failed with `status`.
fn assert_first_chunk_failed(t: &mut MrTable, k: u32, status: u32) {
    assert_eq!(
        t.resolve(k, 1, 0, 8, 0),
        Err(MrError::OdpFailed {
            key: k,
            iova: 0,
            status
        })
    );
}

#[test]
fn registration_matrix() {
    let (mut t, _, _) = setup(odp_cfg());
    assert!(t.reg_odp(1, LW, 0x1000, 0x1000, false, 1 << 40).is_ok());
    assert!(matches!(
        t.reg_odp(1, LW, 0x1000, 0, false, 1 << 40),
        Err(MrError::Invalid(_))
    ));
    assert!(t
        .reg_odp(1, LW, u64::MAX - 5, 0x10, false, 1 << 40)
        .is_err());
    assert!(t.reg_odp(1, LW, 0, 1 << 41, false, 1 << 40).is_err());
    assert_eq!(
        t.reg_odp(1, VRDMA_ACCESS_REMOTE_WRITE, 0, 4096, false, 1 << 40),
        Err(MrError::BadAccess(VRDMA_ACCESS_REMOTE_WRITE))
    );
    let k = t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap();
    assert!(t.get(k).unwrap().is_odp());
    assert!(t.reg_odp(1, LW, 4096, u64::MAX, true, 1 << 40).is_err());
    assert!(t.reg_odp(1, LW, 0, 1 << 20, true, 1 << 40).is_err());
    // Feature switches.
    let (mut t, _, _) = setup(OdpConfig {
        enabled: true,
        implicit: false,
        ..OdpConfig::default()
    });
    assert!(t.reg_odp(1, LW, 0, 4096, false, 1 << 40).is_ok());
    assert_eq!(
        t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40),
        Err(MrError::NotSupported)
    );
    let (mut t, _, _) = setup(OdpConfig {
        enabled: false,
        implicit: false,
        ..OdpConfig::default()
    });
    assert_eq!(
        t.reg_odp(1, LW, 0, 4096, false, 1 << 40),
        Err(MrError::NotSupported)
    );
}

#[test]
fn single_chunk_fault_then_resident() {
    let (mut t, out, _) = setup(odp_cfg());
    // Explicit MR over [0x1000_0800, +3 MiB): its first chunk is clipped at the MR start.
    let iova = 0x1000_0800;
    let k = t.reg_odp(1, LW, iova, 3 << 20, false, 1 << 40).unwrap();
    assert!(
        out.take_page_requests().is_empty(),
        "nothing at registration"
    );
    let e = t
        .resolve_for(Some(20), k, 1, iova + 0x100, 64, 0)
        .unwrap_err();
    assert_eq!(
        e,
        MrError::Fault {
            key: k,
            iova: iova + 0x100
        }
    );
    let reqs = out.take_page_requests();
    assert_eq!(reqs.len(), 1);
    let r = reqs[0];
    assert_eq!(r.type_, VRDMA_PAGEREQ_FAULT);
    assert_eq!(r.mr_key, k);
    assert_eq!(r.flags, 0);
    assert_eq!(r.iova, iova, "clipped to the MR start");
    assert_eq!(r.iova + r.length, 0x1020_0000, "ends at the chunk end");
    assert_eq!(answer(&mut t, &r, 0x100000, false), VRDMA_STATUS_OK);
    assert_eq!(t.take_resumed(), vec![20]);
    let g = t.resolve(k, 1, iova + 0x100, 64, 0).unwrap();
    // Page 0 of the answer covers 0x1000_0000..; iova+0x100 is at 0x900 in it.
    assert_eq!(
        g,
        vec![GuestRange {
            gpa: 0x100900,
            len: 64
        }]
    );
    assert_eq!(t.odp_resident_total(), 1);
    assert!(out.take_page_requests().is_empty());
    // A write to a read-only chunk faults again with F_WRITE.
    assert!(matches!(
        t.resolve(k, 1, iova, 8, LW),
        Err(MrError::Fault { .. })
    ));
    let reqs = out.take_page_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].flags, VRDMA_PAGEREQ_F_WRITE);
    assert_eq!(answer(&mut t, &reqs[0], 0x100000, true), VRDMA_STATUS_OK);
    assert!(t.resolve(k, 1, iova, 8, LW).is_ok());
    // Bounds still apply to ODP MRs.
    assert!(matches!(
        t.resolve(k, 1, iova - 1, 8, 0),
        Err(MrError::OutOfBounds { .. })
    ));
}

#[test]
fn cross_chunk_sge_requests_both_chunks() {
    let (mut t, out, _) = setup(odp_cfg());
    let k = t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap();
    let iova = 5 * CHUNK - 100;
    assert_eq!(
        t.resolve_for(Some(30), k, 1, iova, 200, 0),
        Err(MrError::Fault { key: k, iova })
    );
    let reqs = out.take_page_requests();
    assert_eq!(reqs.len(), 2, "both chunks requested at once");
    assert_eq!((reqs[0].iova, reqs[0].length), (4 * CHUNK, CHUNK));
    assert_eq!((reqs[1].iova, reqs[1].length), (5 * CHUNK, CHUNK));
    assert_ne!(reqs[0].req_id, reqs[1].req_id);
    answer(&mut t, &reqs[1], 8 << 20, false);
    // Still one chunk missing: fault on the first chunk, no new request.
    assert!(matches!(
        t.resolve_for(Some(30), k, 1, iova, 200, 0),
        Err(MrError::Fault { .. })
    ));
    assert!(out.take_page_requests().is_empty());
    answer(&mut t, &reqs[0], 16 << 20, false);
    let g = t.resolve(k, 1, iova, 200, 0).unwrap();
    assert_eq!(
        g,
        vec![
            GuestRange {
                gpa: (16 << 20) + CHUNK - 100,
                len: 100
            },
            GuestRange {
                gpa: 8 << 20,
                len: 100
            }
        ]
    );
    assert_eq!(t.take_resumed(), vec![30]);
}

#[test]
fn concurrent_faults_share_one_request() {
    let (mut t, out, _) = setup(odp_cfg());
    let k = t.reg_odp(1, LW, 0, 8 << 20, false, 1 << 40).unwrap();
    for qpn in [16, 17, 18, 17] {
        assert!(matches!(
            t.resolve_for(Some(qpn), k, 1, 0x1000 * qpn as u64, 8, 0),
            Err(MrError::Fault { .. })
        ));
    }
    let reqs = out.take_page_requests();
    assert_eq!(reqs.len(), 1, "one request per chunk");
    assert_eq!(t.odp_pending_requests(), 1);
    assert_eq!(answer(&mut t, &reqs[0], 0x200000, true), VRDMA_STATUS_OK);
    assert_eq!(t.take_resumed(), vec![16, 17, 18]);
    assert!(t.take_resumed().is_empty());
    // A duplicate / late answer to the same request id.
    assert_eq!(
        answer(&mut t, &reqs[0], 0x200000, true),
        VRDMA_STATUS_NOT_FOUND
    );
}

#[test]
fn error_answers_and_hostile_responses() {
    let (mut t, out, _) = setup(odp_cfg());
    let k = t.reg_odp(1, LW, 0, 16 << 20, false, 1 << 40).unwrap();
    // Driver answers ACCESS: the access fails (then the transport completes with LOC_PROT_ERR).
    let _ = t.resolve_for(Some(16), k, 1, 0, 8, 0);
    let r = out.take_page_requests()[0];
    assert_eq!(
        t.odp_page_resp(r.req_id, k, VRDMA_STATUS_ACCESS, 0, 0, &[]),
        VRDMA_STATUS_OK
    );
    assert_eq!(t.take_resumed(), vec![16]);
    assert_first_chunk_failed(&mut t, k, VRDMA_STATUS_ACCESS);
    assert!(
        out.take_page_requests().is_empty(),
        "no re-fault while failed"
    );
    // Any other error status (e.g. the driver ran out of memory) is accepted the same way.
    let _ = t.resolve(k, 1, 5 * CHUNK, 8, 0);
    let r = out.take_page_requests()[0];
    assert_eq!(
        t.odp_page_resp(r.req_id, k, VRDMA_STATUS_NO_RESOURCES, 0, 0, &[]),
        VRDMA_STATUS_OK
    );
    assert!(matches!(
        t.resolve(k, 1, 5 * CHUNK, 8, 0),
        Err(MrError::OdpFailed {
            status: VRDMA_STATUS_NO_RESOURCES,
            ..
        })
    ));

    // Chunk 1: hostile answers.
    let _ = t.resolve(k, 1, CHUNK, 8, 0);
    let r = out.take_page_requests()[0];
    let good: Vec<u64> = (0..512).map(|i| 0x400000 + i * 4096).collect();
    // Wrong key: not a request of this MR (spec §12.4 step 4); the request stays outstanding.
    assert_eq!(
        t.odp_page_resp(r.req_id, k + 1, 0, 0, CHUNK, &good),
        VRDMA_STATUS_NOT_FOUND
    );
    // Unknown request id.
    assert_eq!(
        t.odp_page_resp(9999, k, 0, 0, CHUNK, &good),
        VRDMA_STATUS_NOT_FOUND
    );
    // More pages than the chunk holds → INVALID, chunk fails.
    let too_many: Vec<u64> = (0..513).map(|i| 0x400000 + i * 4096).collect();
    assert_eq!(
        t.odp_page_resp(r.req_id, k, 0, 0, CHUNK, &too_many),
        VRDMA_STATUS_INVALID
    );
    assert!(matches!(
        t.resolve(k, 1, CHUNK, 8, 0),
        Err(MrError::OdpFailed { .. })
    ));
    // Chunk 2: a page outside guest memory → BAD_ADDRESS.
    let _ = t.resolve(k, 1, 2 * CHUNK, 8, 0);
    let r = out.take_page_requests()[0];
    let mut bad = good.clone();
    bad[100] = 1 << 40;
    assert_eq!(
        t.odp_page_resp(r.req_id, k, 0, 0, 2 * CHUNK, &bad),
        VRDMA_STATUS_BAD_ADDRESS
    );
    assert!(matches!(
        t.resolve(k, 1, 2 * CHUNK, 8, 0),
        Err(MrError::OdpFailed {
            status: VRDMA_STATUS_BAD_ADDRESS,
            ..
        })
    ));
    // Chunk 3: unaligned page and wrong start.
    let _ = t.resolve(k, 1, 3 * CHUNK, 8, 0);
    let r = out.take_page_requests()[0];
    let mut un = good.clone();
    un[0] += 8;
    assert_eq!(
        t.odp_page_resp(r.req_id, k, 0, 0, 3 * CHUNK, &un),
        VRDMA_STATUS_INVALID
    );
    let _ = t.resolve(k, 1, 4 * CHUNK, 8, 0);
    let r = out.take_page_requests()[0];
    assert_eq!(
        t.odp_page_resp(r.req_id, k, 0, 0, 4 * CHUNK + 4096, &good),
        VRDMA_STATUS_INVALID
    );
    // An answer for a non-ODP key.
    let pl = one_page_mr(&mut t);
    assert_eq!(t.odp_page_resp(1, pl, 0, 0, 0, &[]), VRDMA_STATUS_NOT_FOUND);
}

#[test]
fn invalidate_drops_translations_and_cancels_requests() {
    let (mut t, out, _) = setup(odp_cfg());
    let k = t.reg_odp(1, LW, 0, 8 << 20, false, 1 << 40).unwrap();
    let _ = t.resolve(k, 1, 0, 8, 0);
    let r0 = out.take_page_requests()[0];
    answer(&mut t, &r0, 0x100000, true);
    let _ = t.resolve_for(Some(21), k, 1, CHUNK, 8, 0);
    let r1 = out.take_page_requests()[0];
    assert!(t.resolve(k, 1, 0, 8, 0).is_ok());
    // Invalidate a range touching both chunks.
    assert_eq!(t.odp_invalidate(k, CHUNK - 4096, 8192), VRDMA_STATUS_OK);
    assert_eq!(t.odp_resident_total(), 0);
    assert_eq!(
        t.take_resumed(),
        vec![21],
        "waiters of a cancelled request resume"
    );
    // The cancelled request's late answer is refused.
    assert_eq!(answer(&mut t, &r1, 0x300000, true), VRDMA_STATUS_NOT_FOUND);
    // Next access faults again.
    assert!(matches!(
        t.resolve(k, 1, 0, 8, 0),
        Err(MrError::Fault { .. })
    ));
    assert_eq!(out.take_page_requests().len(), 1);
    // Invalidate outside resident chunks / zero length / wrong key.
    assert_eq!(t.odp_invalidate(k, 6 << 20, 0), VRDMA_STATUS_OK);
    assert_eq!(t.odp_invalidate(k ^ 0x80, 0, 8), VRDMA_STATUS_NOT_FOUND);
    let pl = one_page_mr(&mut t);
    assert_eq!(t.odp_invalidate(pl, 0, 8), VRDMA_STATUS_INVALID);
    // Implicit MR: a huge invalidation range is cheap.
    let imp = t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap();
    assert_eq!(t.odp_invalidate(imp, 0, u64::MAX), VRDMA_STATUS_OK);
}

#[test]
fn reclaim_respects_device_and_mr_budgets() {
    let (mut t, out, _) = setup(OdpConfig {
        max_resident: 3,
        max_resident_per_mr: 2,
        ..odp_cfg()
    });
    let a = t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap();
    let b = t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap();
    let fault_in = |t: &mut MrTable, key: u32, c: u64| {
        let _ = t.resolve(key, 1, c * CHUNK, 8, 0);
        let reqs = out.take_page_requests();
        let f: Vec<_> = reqs
            .iter()
            .filter(|r| r.type_ == VRDMA_PAGEREQ_FAULT)
            .collect();
        assert_eq!(f.len(), 1);
        answer(t, f[0], 0x100000, false);
        out.take_page_requests()
    };
    // The generation fabric references through an MR record (spec §16.2 rule 6).
    let gen = |t: &MrTable, key: u32| t.reference_gen(key).map(|(_, g)| g).unwrap();
    let (ga, gb) = (gen(&t, a), gen(&t, b));
    assert!(fault_in(&mut t, a, 0).is_empty());
    assert!(fault_in(&mut t, a, 1).is_empty());
    assert_eq!(
        gen(&t, a),
        ga,
        "an install without reclaim keeps references valid"
    );
    // Touch chunk 0 so chunk 1 becomes the LRU of MR a.
    t.resolve(a, 1, 0, 8, 0).unwrap();
    // Third chunk of MR a: per-MR budget 2 → chunk 1 reclaimed.
    let rec = fault_in(&mut t, a, 2);
    assert_eq!(gen(&t, a), ga + 1, "a reclaim fences the MR's references");
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0].type_, VRDMA_PAGEREQ_RECLAIM);
    assert_eq!(
        (rec[0].mr_key, rec[0].iova, rec[0].length),
        (a, CHUNK, CHUNK)
    );
    assert_eq!(t.odp_resident_total(), 2);
    // MR b's first chunk: device total 3, fine. Second: device budget → global LRU (a's chunk 0).
    assert!(fault_in(&mut t, b, 7).is_empty());
    let rec = fault_in(&mut t, b, 8);
    assert_eq!(rec.len(), 1);
    assert_eq!((rec[0].mr_key, rec[0].iova), (a, 0));
    // The device budget's victim is MR a's chunk: a's references die, b's (installed) live.
    assert_eq!((gen(&t, a), gen(&t, b)), (ga + 2, gb));
    assert_eq!(t.odp_resident_total(), 3);
    // Reclaimed chunks fault again.
    assert!(matches!(
        t.resolve(a, 1, 0, 8, 0),
        Err(MrError::Fault { .. })
    ));
    // Deregistering an MR gives its budget back.
    t.dereg(b).unwrap();
    assert_eq!(t.odp_resident_total(), 1);
}

#[test]
fn timeout_fails_waiters() {
    let (mut t, out, _) = setup(OdpConfig {
        timeout: Duration::from_millis(50),
        ..odp_cfg()
    });
    let k = t.reg_odp(1, LW, 0, 8 << 20, false, 1 << 40).unwrap();
    let _ = t.resolve_for(Some(40), k, 1, 0, 8, 0);
    let r = out.take_page_requests()[0];
    let now = Instant::now();
    let next = t
        .odp_tick(now)
        .expect("a deadline while a request is pending");
    assert!(next <= now + Duration::from_millis(50));
    assert!(t.take_resumed().is_empty());
    // After the deadline: failed with the timeout status, waiter resumed; the next deadline is
    // the failed chunk's expiry.
    assert_eq!(
        t.odp_tick(now + Duration::from_millis(60)),
        Some(now + Duration::from_millis(60) + FAIL_HOLD)
    );
    assert_eq!(t.take_resumed(), vec![40]);
    assert_first_chunk_failed(&mut t, k, ODP_STATUS_TIMEOUT);
    assert_eq!(answer(&mut t, &r, 0x100000, true), VRDMA_STATUS_NOT_FOUND);
    // resolve() itself notices an expired request too. (The ODP clock is now the tick time,
    // 60 ms ahead of the wall clock: wait past both.)
    let _ = t.resolve_for(Some(41), k, 1, CHUNK, 8, 0);
    std::thread::sleep(Duration::from_millis(130));
    assert!(matches!(
        t.resolve_for(Some(41), k, 1, CHUNK, 8, 0),
        Err(MrError::OdpFailed {
            status: ODP_STATUS_TIMEOUT,
            ..
        })
    ));
}

#[test]
fn advise_prefetch() {
    let (mut t, out, _) = setup(odp_cfg());
    let k = t.reg_odp(1, LW, 0, 8 << 20, false, 1 << 40).unwrap();
    let CmdOutcome::Parked(ticket) = t.odp_advise(
        k,
        VRDMA_ADVISE_PREFETCH_WRITE,
        VRDMA_ADVISE_F_FLUSH,
        0,
        5 << 20,
    ) else {
        panic!("a flush advise over absent chunks completed at once");
    };
    let reqs = out.take_page_requests();
    assert_eq!(reqs.len(), 3);
    assert!(reqs.iter().all(|r| r.flags == VRDMA_PAGEREQ_F_WRITE));
    for r in &reqs {
        assert!(out.take_done().is_empty(), "completed before every answer");
        answer(&mut t, r, 0x100000, true);
    }
    assert_eq!(out.take_done(), vec![(ticket, VRDMA_STATUS_OK)]);
    assert!(t.resolve(k, 1, 0, 5 << 20, LW).is_ok());
    // Already resident: nothing requested, a flush completes at once.
    assert_eq!(
        t.odp_advise(k, VRDMA_ADVISE_PREFETCH, 0, 0, 4096),
        CmdOutcome::Done(VRDMA_STATUS_OK)
    );
    assert_eq!(
        t.odp_advise(k, VRDMA_ADVISE_PREFETCH, VRDMA_ADVISE_F_FLUSH, 0, 4096),
        CmdOutcome::Done(VRDMA_STATUS_OK)
    );
    assert!(out.take_page_requests().is_empty());
    assert_eq!(
        t.odp_advise(k, VRDMA_ADVISE_PREFETCH_NO_FAULT, 0, 6 << 20, 4096),
        CmdOutcome::Done(VRDMA_STATUS_OK)
    );
    assert!(out.take_page_requests().is_empty());
    let done = |s| CmdOutcome::Done(s);
    assert_eq!(t.odp_advise(k, 7, 0, 0, 4096), done(VRDMA_STATUS_INVALID));
    assert_eq!(t.odp_advise(k, 0, 2, 0, 4096), done(VRDMA_STATUS_INVALID));
    assert_eq!(
        t.odp_advise(k, 0, 0, 7 << 20, 2 << 20),
        done(VRDMA_STATUS_INVALID),
        "beyond the MR"
    );
    assert_eq!(
        t.odp_advise(k + 1, 0, 0, 0, 1),
        done(VRDMA_STATUS_NOT_FOUND)
    );
    let ro = t.reg_odp(1, 0, 0, 4096, false, 1 << 40).unwrap();
    assert_eq!(
        t.odp_advise(ro, VRDMA_ADVISE_PREFETCH_WRITE, 0, 0, 4096),
        done(VRDMA_STATUS_ACCESS)
    );
    assert!(out.take_done().is_empty());
}

#[test]
fn odp_through_commands() {
    let mut e = Node::bare_odp();
    let pd = e.create_pd();
    let reg = odp_mr_req(
        pd,
        VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_READ | VRDMA_ACCESS_ON_DEMAND,
        0x7f00_0000_0000,
        1 << 20,
    );
    let key = e.ok_handle(VRDMA_CMD_REG_ODP_MR, reg.as_bytes());
    let err = e
        .dev
        .mrs
        .write()
        .resolve_for(
            Some(16),
            key,
            pd,
            0x7f00_0000_0010,
            16,
            VRDMA_ACCESS_REMOTE_READ,
        )
        .unwrap_err();
    assert!(matches!(err, MrError::Fault { .. }));
    let r = e.out.take_page_requests()[0];
    assert_eq!((r.iova, r.length), (0x7f00_0000_0000, 1 << 20));
    let pages = e.pages(256);
    let resp = VrdmaCmdOdpPageResp {
        req_id: r.req_id,
        mr_key: key,
        status: VRDMA_STATUS_OK,
        flags: VRDMA_ODP_RESP_F_WRITABLE,
        iova: r.iova,
        npages: 256,
        reserved: 0,
    };
    // Trailing list too short → INVALID.
    assert_eq!(
        e.cmd_status(
            VRDMA_CMD_ODP_PAGE_RESP,
            &req_with_pages(&resp, &pages[..255])
        )
        .0,
        VRDMA_STATUS_INVALID
    );
    assert_eq!(
        e.cmd_status(VRDMA_CMD_ODP_PAGE_RESP, &req_with_pages(&resp, &pages))
            .0,
        VRDMA_STATUS_OK
    );
    assert_eq!(e.dev.take_resumed_qps(), vec![16]);
    let g = e
        .resolve(key, pd, 0x7f00_0000_0010, 16, VRDMA_ACCESS_REMOTE_READ)
        .unwrap();
    assert_eq!(g[0].gpa, pages[0] + 0x10);
    let inv = VrdmaCmdOdpInvalidate {
        mr_key: key,
        reserved: 0,
        iova: 0x7f00_0000_0000,
        length: 4096,
    };
    assert_eq!(
        e.cmd_status(VRDMA_CMD_ODP_INVALIDATE, inv.as_bytes()).0,
        VRDMA_STATUS_OK
    );
    assert!(e.resolve(key, pd, 0x7f00_0000_0010, 16, 0).is_err());
    let adv = VrdmaCmdAdviseMr {
        lkey: key,
        advice: VRDMA_ADVISE_PREFETCH,
        flags: 0,
        reserved: 0,
        iova: 0x7f00_0000_0000,
        length: 4096,
    };
    assert_eq!(
        e.cmd_status(VRDMA_CMD_ADVISE_MR, adv.as_bytes()).0,
        VRDMA_STATUS_OK
    );
    // Implicit MR through the command.
    let mut imp = reg;
    imp.iova = 0;
    imp.length = u64::MAX;
    let ik = e.ok_handle(VRDMA_CMD_REG_IMPLICIT_MR, imp.as_bytes());
    assert!(matches!(
        e.resolve(ik, pd, 0x5555_0000_1000, 8, 0),
        Err(MrError::Fault { .. })
    ));
    imp.length = 1 << 20;
    assert_eq!(
        e.cmd_status(VRDMA_CMD_REG_IMPLICIT_MR, imp.as_bytes()).0,
        VRDMA_STATUS_INVALID
    );
    assert_eq!(e.cmd_status(VRDMA_CMD_DEREG_MR, &h(ik)).0, VRDMA_STATUS_OK);
}

/// Random interleavings of accesses, answers (good, bad, late, duplicate), invalidations,
/// prefetches, timeouts, registrations and deregistrations: the bookkeeping stays consistent and
/// budgets hold after every step.
#[test]
fn random_odp_operations_keep_invariants() {
    let (mut t, out, _) = setup(OdpConfig {
        max_resident: 6,
        max_resident_per_mr: 4,
        chunk_shift: 16,
        timeout: Duration::from_millis(200),
        ..odp_cfg()
    });
    const C: u64 = 1 << 16;
    let mut rng = XorShift(0xfeed_beef_1234_5678);
    let mut keys: Vec<u32> = Vec::new();
    let mut reqs: Vec<VrdmaPageReq> = Vec::new();
    let mut now = Instant::now();
    let (mut oks, mut reclaims, mut answered) = (0u32, 0u32, 0u32);
    let mut parked = std::collections::HashSet::new();
    let mut flushes = 0u32;
    let mut hist = [0u32; 10];
    for step in 0..20_000 {
        match rng.below(10) {
            0 if keys.len() < 3 => {
                let k = if rng.below(2) == 0 {
                    t.reg_odp(1, LW, 0, 16 * C, false, 1 << 40).unwrap()
                } else {
                    t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap()
                };
                keys.push(k);
            }
            1 if !keys.is_empty() && rng.below(4) == 0 => {
                let i = rng.below(keys.len() as u64) as usize;
                t.dereg(keys.swap_remove(i)).unwrap();
            }
            2..=4 if !keys.is_empty() => {
                let k = keys[rng.below(keys.len() as u64) as usize];
                let iova = rng.below(16 * C - 64);
                let span = if rng.below(8) == 0 { 2 * C } else { C / 8 };
                let len = 1 + rng.below(span).min(16 * C - iova - 1);
                let acc = if rng.below(2) == 0 { LW } else { 0 };
                let qpn = 16 + rng.below(8) as u32;
                match t.resolve_for(Some(qpn), k, 1, iova, len, acc) {
                    Ok(r) => {
                        assert_eq!(r.iter().map(|g| g.len).sum::<u64>(), len);
                        oks += 1;
                    }
                    Err(MrError::Fault { .. }) | Err(MrError::OdpFailed { .. }) => {}
                    Err(e) => panic!("step {step}: unexpected {e:?}"),
                }
            }
            5 | 6 if !reqs.is_empty() => {
                answered += 1;
                // Mostly the newest request (a prompt driver); sometimes an old or duplicate one.
                let i = if rng.below(4) != 0 {
                    reqs.len() - 1
                } else {
                    rng.below(reqs.len() as u64) as usize
                };
                let r = reqs[i];
                if rng.below(6) != 0 {
                    reqs.swap_remove(i);
                }
                let status = match rng.below(8) {
                    0 => VRDMA_STATUS_ACCESS,
                    1 => 1234,
                    _ => VRDMA_STATUS_OK,
                };
                let start = r.iova & !4095;
                let end = (r.iova + r.length).next_multiple_of(4096);
                let mut n = ((end - start) / 4096) as usize;
                if rng.below(10) == 0 {
                    n = n.saturating_sub(1);
                }
                let pages: Vec<u64> = (0..n as u64).map(|i| 0x100000 + i * 4096).collect();
                let s = t.odp_page_resp(
                    r.req_id,
                    r.mr_key,
                    status,
                    (rng.below(2) as u32) * VRDMA_ODP_RESP_F_WRITABLE,
                    start,
                    &pages,
                );
                assert!(s <= VRDMA_STATUS_NEEDS_RESET);
                hist[s as usize] += 1;
            }
            7 if !keys.is_empty() => {
                let k = keys[rng.below(keys.len() as u64) as usize];
                let s = t.odp_invalidate(k, rng.below(16 * C), rng.below(4 * C));
                assert_eq!(s, VRDMA_STATUS_OK);
            }
            8 if !keys.is_empty() => {
                let k = keys[rng.below(keys.len() as u64) as usize];
                let flush = rng.below(2) as u32 * VRDMA_ADVISE_F_FLUSH;
                let s = t.odp_advise(
                    k,
                    rng.below(3) as u32,
                    flush,
                    rng.below(8 * C),
                    rng.below(8 * C),
                );
                match s {
                    CmdOutcome::Parked(tk) => {
                        assert!(flush != 0, "step {step}: parked without F_FLUSH");
                        assert!(parked.insert(tk), "step {step}: ticket reused");
                        flushes += 1;
                    }
                    CmdOutcome::Done(st) => assert!(
                        st == VRDMA_STATUS_OK
                            || st == VRDMA_STATUS_INVALID
                            || (flush != 0 && st == VRDMA_STATUS_NO_RESOURCES),
                        "step {step}: advise status {st}"
                    ),
                }
            }
            9 => {
                now += Duration::from_millis(rng.below(40));
                t.odp_tick(now);
                t.take_resumed();
            }
            _ => {}
        }
        for r in out.take_page_requests() {
            if r.type_ == VRDMA_PAGEREQ_FAULT {
                reqs.push(r);
            } else {
                reclaims += 1;
            }
        }
        for (tk, st) in out.take_done() {
            assert!(parked.remove(&tk), "step {step}: unknown completion {tk:?}");
            assert_eq!(st, VRDMA_STATUS_OK);
        }
        assert_eq!(t.odp_parked_advises(), parked.len(), "step {step}");
        if let Err(e) = t.odp_check_invariants() {
            panic!("step {step}: {e}");
        }
    }
    // Whatever is still parked completes by the timeout.
    t.odp_tick(now + Duration::from_secs(1));
    for (tk, _) in out.take_done() {
        assert!(parked.remove(&tk));
    }
    assert!(
        parked.is_empty(),
        "{} advises never completed",
        parked.len()
    );
    assert!(flushes > 50, "only {flushes} flush advises parked");
    assert!(
        oks > 200,
        "only {oks} successful translations ({answered} answers {hist:?})"
    );
    assert!(reclaims > 10, "only {reclaims} reclaims");
}

/// The last page of the 64-bit space can never be covered by an answer: accesses there fail
/// instead of translating partially.
#[test]
fn top_of_address_space() {
    let (mut t, out, _) = setup(odp_cfg());
    let k = t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap();
    let iova = u64::MAX - 100;
    assert!(matches!(
        t.resolve(k, 1, iova, 50, 0),
        Err(MrError::Fault { .. })
    ));
    let r = out.take_page_requests()[0];
    assert_eq!(r.iova, !(CHUNK - 1));
    assert_eq!(r.iova.checked_add(r.length), Some(u64::MAX));
    let n = ((!4095u64 - r.iova) / 4096) as usize;
    let pages: Vec<u64> = (0..n as u64).map(|i| 0x100000 + (i % 16) * 4096).collect();
    assert_eq!(
        t.odp_page_resp(r.req_id, k, VRDMA_STATUS_OK, 0, r.iova, &pages),
        VRDMA_STATUS_OK
    );
    assert!(t.resolve(k, 1, r.iova, 4096, 0).is_ok());
    assert!(matches!(
        t.resolve(k, 1, iova, 50, 0),
        Err(MrError::OdpFailed { .. })
    ));
    assert!(matches!(
        t.resolve(k, 1, iova, 101, 0),
        Err(MrError::OutOfBounds { .. })
    ));
    t.odp_check_invariants().unwrap();
}

/// §12.4 step 3: an answer may cover part of the chunk; the rest faults again and the next answer
/// is merged with what is already resident (the driver answers one mappable segment at a time).
#[test]
fn partial_answers_merge() {
    let (mut t, out, _mem) = setup(odp_cfg());
    let k = t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap();
    // Fault the chunk through its page 10; answer pages 8..16 only, read-only.
    let at = CHUNK + 10 * 4096;
    assert!(matches!(
        t.resolve(k, 1, at, 8, 0),
        Err(MrError::Fault { .. })
    ));
    let r = out.take_page_requests()[0];
    let seg: Vec<u64> = (0..8).map(|i| 0x400000 + i * 4096).collect();
    assert_eq!(
        t.odp_page_resp(r.req_id, k, 0, 0, CHUNK + 8 * 4096, &seg),
        VRDMA_STATUS_OK
    );
    let ranges = t.resolve(k, 1, at, 8, 0).expect("covered page resolves");
    assert_eq!(ranges[0].gpa, 0x400000 + 2 * 4096);
    // A page outside the answered segment faults again with one new request.
    assert!(matches!(
        t.resolve(k, 1, CHUNK, 8, 0),
        Err(MrError::Fault { .. })
    ));
    let reqs = out.take_page_requests();
    assert_eq!(reqs.len(), 1);
    // Answer pages 0..4 writable: merged, both segments now resolve.
    let seg2: Vec<u64> = (0..4).map(|i| 0x500000 + i * 4096).collect();
    assert_eq!(
        t.odp_page_resp(
            reqs[0].req_id,
            k,
            0,
            VRDMA_ODP_RESP_F_WRITABLE,
            CHUNK,
            &seg2
        ),
        VRDMA_STATUS_OK
    );
    assert_eq!(t.resolve(k, 1, CHUNK, 8, 0).unwrap()[0].gpa, 0x500000);
    assert_eq!(
        t.resolve(k, 1, at, 8, 0).unwrap()[0].gpa,
        0x400000 + 2 * 4096
    );
    assert_eq!(t.odp_resident_total(), 1);
    // Pages 4..8 were never answered: still absent.
    assert!(matches!(
        t.resolve(k, 1, CHUNK + 5 * 4096, 8, 0),
        Err(MrError::Fault { .. })
    ));
    let r = out.take_page_requests()[0];
    assert_eq!(
        t.odp_page_resp(
            r.req_id,
            k,
            0,
            VRDMA_ODP_RESP_F_WRITABLE,
            CHUNK + 4 * 4096,
            &seg2
        ),
        VRDMA_STATUS_OK
    );
    // Writing the read-only segment faults again, asking for write access.
    assert!(t.resolve(k, 1, CHUNK, 8, LW).is_ok());
    assert!(matches!(
        t.resolve(k, 1, at, 8, LW),
        Err(MrError::Fault { .. })
    ));
    let r = out.take_page_requests()[0];
    assert_ne!(r.flags & VRDMA_PAGEREQ_F_WRITE, 0);
}

/// Records, for each RECLAIM notice, the generation of the watched MR slot at that moment.
#[derive(Default)]
struct ReclaimWatch {
    gen: std::sync::Mutex<Option<vrdma_backend::memory::fence::SlotGen>>,
    seen: std::sync::Mutex<Vec<(VrdmaPageReq, u64)>>,
}

impl vrdma_backend::device::DeviceOutput for ReclaimWatch {
    fn event(&self, _ev: VrdmaEvent) {}
    fn page_request(&self, req: VrdmaPageReq) {
        let g = self
            .gen
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, |g| g.load(std::sync::atomic::Ordering::Acquire));
        self.seen.lock().unwrap().push((req, g));
    }
    fn eth_rx(&self, _frame: &[u8], _port: Option<usize>) {}
    fn command_done(&self, _ticket: vrdma_backend::device::Ticket, _status: u32) {}
}

#[test]
fn a_reclaim_notice_goes_out_after_the_fence() {
    // Spec §12.6 / §16.2 rule 6b: the driver may unmap a reclaimed chunk as soon as it reads
    // the notice, so fabric references through the MR must be dead by then: the slot's
    // generation has moved when the notice is delivered, for the per-MR and the device budget.
    for (per_mr, device) in [(2, 8), (8, 2)] {
        let mem = GuestMem::from_ranges(&[(0, 64 << 20)]).unwrap();
        let out = Arc::new(ReclaimWatch::default());
        let cfg = OdpConfig {
            max_resident: device,
            max_resident_per_mr: per_mr,
            ..odp_cfg()
        };
        let mut t = MrTable::new(100, mem, out.clone(), cfg);
        let a = t.reg_odp(1, LW, 0, u64::MAX, true, 1 << 40).unwrap();
        let (g, g0) = {
            let (g, v) = t.reference_gen(a).unwrap();
            (g.clone(), v)
        };
        *out.gen.lock().unwrap() = Some(g);
        for c in 0..3u64 {
            let _ = t.resolve(a, 1, c * CHUNK, 8, 0);
            let req = out.seen.lock().unwrap().last().map(|s| s.0).unwrap();
            assert_eq!(req.type_, VRDMA_PAGEREQ_FAULT);
            answer(&mut t, &req, 0x100000, false);
        }
        let seen = out.seen.lock().unwrap();
        let reclaims: Vec<_> = seen
            .iter()
            .filter(|(r, _)| r.type_ == VRDMA_PAGEREQ_RECLAIM)
            .collect();
        assert_eq!(reclaims.len(), 1, "budget {per_mr}/{device}: {seen:?}");
        assert_eq!(
            reclaims[0].1,
            g0 + 1,
            "budget {per_mr}/{device}: the notice went out before the fence"
        );
    }
}
