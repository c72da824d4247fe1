//! The host-memory budget (spec §16, `budget.rs`): every object kind driven to its limit with
//! aliased inputs (one guest page named in every page-list and ring entry, the longest lists
//! the limits allow) stops at the budget with NO_RESOURCES; the charged total never exceeds it,
//! the daemon's real heap growth (counted by this binary's global allocator) stays under the
//! budget plus a fixed slack, and destroying everything gives the charge back.
//!
//! The tests of this binary run one at a time (`heap::serial`): the allocator counts every thread.

mod common;

use std::time::Duration;

use common::heap;
use common::*;
use vrdma_backend::transport;
use vrdma_spec::*;

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

const MIB: u64 = 1 << 20;
const BUDGET: u64 = 64 * MIB;
/// Entries of the MR page lists the test registers: 8 MiB lists.
const MR_PAGES: u64 = 1 << 20;
/// Heap growth allowed beyond the budget: the transient copies of one command's page list (the
/// decoded request, and for REREG_MR the new list while the old one is still held; the largest
/// command here carries a 16 MiB list) plus table growth the charges only estimate (vector
/// doubling, hash-map buckets).
const SLACK: i64 = (2 * 16 * MIB + 4 * MIB) as i64;

fn node(id: u8, budget: u64) -> Node {
    Node::with_config(id, 8, 1500, gid_v4([10, 0, 0, id]), |c| {
        c.max_host_memory = budget;
        // The budget, not the cap on outstanding page requests (§12.4), is what these tests
        // drive ODP into.
        c.odp.max_requests = 1 << 24;
    })
}

/// An RC pair of `node`s with these budgets, 64-deep CQs, no MRs.
fn pair(budget_a: u64, budget_b: u64) -> RcPair {
    RcPair::new()
        .nodes(node(1, budget_a), node(2, budget_b))
        .cq_depth(64)
        .no_mrs()
        .build()
}

fn with_pages<T: Abi>(req: &T, npages: u64, page: u64) -> Vec<u8> {
    let mut b = req.as_bytes().to_vec();
    b.reserve(npages as usize * 8);
    for _ in 0..npages {
        b.extend_from_slice(&page.to_le_bytes());
    }
    b
}

fn handle_of(r: &[u8]) -> u32 {
    VrdmaHandle::read_from(r).unwrap().handle
}

/// Run `make` until it fails; every failure must be NO_RESOURCES from the budget. Returns the
/// handles made. Checks the charge never passed the limit.
fn fill(n: &mut Node, what: &str, mut make: impl FnMut(&mut Node) -> Result<u32, u32>) -> Vec<u32> {
    let mut made = Vec::new();
    loop {
        match make(n) {
            Ok(h) => made.push(h),
            Err(st) => {
                assert_eq!(st, VRDMA_STATUS_NO_RESOURCES, "{what}: {}", made.len());
                break;
            }
        }
        assert!(n.dev.budget.used() <= BUDGET, "{what}");
        assert!(made.len() < 1 << 20, "{what}: no limit reached");
    }
    assert!(!made.is_empty(), "{what}: not even one fits");
    // What stopped it is the budget: less than one more object's worth is left.
    assert!(n.dev.budget.used() > BUDGET / 2, "{what}: stopped early");
    made
}

/// `fill` with `make`, then free every object with the `free` command (DESTROY_* / DEREG_MR): the
/// budget is back at `start`.
fn fill_and_free(
    n: &mut Node,
    what: &str,
    free: u16,
    start: u64,
    make: impl FnMut(&mut Node) -> Result<u32, u32>,
) {
    for h in fill(n, what, make) {
        n.cmd(free, handle(h).as_bytes()).unwrap();
    }
    assert_eq!(
        n.dev.budget.used(),
        start,
        "{what}: the charge is given back"
    );
}

#[test]
fn every_object_kind_stops_at_the_budget_with_aliased_inputs() {
    let _g = heap::serial();
    let mut n = node(1, BUDGET);
    let pd = n.create_pd();
    let (cq0, _) = n.create_cq(64);
    let page = n.alloc(4096);
    let cfg = n.dev.config.clone();
    // Requests built before the baseline: they are the driver's memory, not the daemon's.
    let reg = with_pages(
        &VrdmaCmdRegMr {
            pdn: pd,
            access: VRDMA_ACCESS_LOCAL_WRITE,
            iova: 0,
            length: MR_PAGES * 4096,
            page_shift: 12,
            npages: MR_PAGES as u32,
        },
        MR_PAGES,
        page,
    );
    let cq_pages = 1 + u64::from(cfg.max_cqe) * 64 / 4096;
    let create_cq = with_pages(
        &VrdmaCmdCreateCq {
            cqn: 0,
            depth: cfg.max_cqe,
            npages: cq_pages as u32,
            reserved: 0,
        },
        cq_pages,
        page,
    );
    let ring_pages = 1 + u64::from(cfg.max_qp_wr); // 4 KiB slots: one page per entry
    let create_qp = with_pages(
        &VrdmaCmdCreateQp {
            pdn: pd,
            qp_type: VRDMA_QPT_RC,
            send_cqn: cq0,
            recv_cqn: cq0,
            srqn: VRDMA_NO_SRQ,
            sq_depth: cfg.max_qp_wr,
            rq_depth: cfg.max_qp_wr,
            sq_wqe_shift: 12,
            rq_wqe_shift: 12,
            sq_sig_all: 0,
            reserved0: 0,
            max_send_sge: cfg.max_send_sge,
            max_recv_sge: cfg.max_recv_sge,
            max_inline_data: cfg.max_inline_data,
            sq_npages: ring_pages as u32,
            rq_npages: ring_pages as u32,
            xrcdn: 0,
        },
        2 * ring_pages,
        page,
    );
    let srq_pages = 1 + u64::from(cfg.max_srq_wr);
    let create_srq = with_pages(
        &VrdmaCmdCreateSrq {
            pdn: pd,
            depth: cfg.max_srq_wr,
            wqe_shift: 12,
            srq_type: 0,
            reserved0: [0; 2],
            xrcdn: 0,
            cqn: 0,
            max_sge: cfg.max_srq_sge,
            srq_limit: 0,
            npages: srq_pages as u32,
        },
        srq_pages,
        page,
    );
    let frmr = VrdmaCmdRegMr {
        pdn: pd,
        npages: cfg.max_fast_reg_page_list_len,
        ..Default::default()
    };
    let implicit = odp_mr_req(
        pd,
        VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_ON_DEMAND,
        0,
        u64::MAX,
    );
    let rereg = |npages: u64| {
        with_pages(
            &VrdmaCmdReregMr {
                key: 0, // set once the MR exists (bytes 0..4)
                pdn: pd,
                access: VRDMA_ACCESS_LOCAL_WRITE,
                page_shift: 12,
                iova: 0,
                length: npages * 4096,
                npages: npages as u32,
                reserved: 0,
            },
            npages,
            page,
        )
    };
    let (mut rereg_same, mut rereg_long, mut rereg_short) =
        (rereg(MR_PAGES), rereg(2 * MR_PAGES), rereg(MR_PAGES / 2));
    let start = n.dev.budget.used();
    let base = heap::mark();

    // MR page lists: 8 MiB each, every entry the same page.
    let mrs = fill(&mut n, "REG_MR", |n| {
        n.cmd(VRDMA_CMD_REG_MR, &reg)
            .map(|r| VrdmaRespRegMr::read_from(&r).unwrap().lkey)
    });
    assert!(
        n.dev.mrs.write().pages_held() < cfg.max_mr_pages,
        "the page count stopped it"
    );
    // REREG_MR at the limit (§11.8): the current list counts as given back, so the same length
    // fits, a longer one does not (less than one MR's worth is free), a shorter one gives
    // bytes back.
    let full = n.dev.budget.used();
    let key = mrs[0].to_le_bytes();
    for r in [&mut rereg_same, &mut rereg_long, &mut rereg_short] {
        r[..4].copy_from_slice(&key);
    }
    n.cmd(VRDMA_CMD_REREG_MR, &rereg_same)
        .expect("same length fits");
    assert_eq!(n.dev.budget.used(), full);
    assert_eq!(
        n.cmd(VRDMA_CMD_REREG_MR, &rereg_long),
        Err(VRDMA_STATUS_NO_RESOURCES)
    );
    n.cmd(VRDMA_CMD_REREG_MR, &rereg_short)
        .expect("shorter fits");
    assert_eq!(n.dev.budget.used(), full - MR_PAGES / 2 * 8);
    for k in mrs {
        n.cmd(VRDMA_CMD_DEREG_MR, handle(k).as_bytes()).unwrap();
    }
    assert_eq!(n.dev.budget.used(), start, "MRs gave their charge back");

    // Fast-registration MRs reserve their whole capacity.
    fill_and_free(
        &mut n,
        "ALLOC_FAST_REG_MR",
        VRDMA_CMD_DEREG_MR,
        start,
        |n| {
            n.cmd(VRDMA_CMD_ALLOC_FAST_REG_MR, frmr.as_bytes())
                .map(|r| VrdmaRespRegMr::read_from(&r).unwrap().lkey)
        },
    );

    // CQs of the largest depth, every ring page the same page.
    fill_and_free(&mut n, "CREATE_CQ", VRDMA_CMD_DESTROY_CQ, start, |n| {
        n.cmd(VRDMA_CMD_CREATE_CQ, &create_cq)
            .map(|r| handle_of(&r))
    });

    // QPs with the deepest rings of the largest slots.
    fill_and_free(&mut n, "CREATE_QP", VRDMA_CMD_DESTROY_QP, start, |n| {
        n.cmd(VRDMA_CMD_CREATE_QP, &create_qp)
            .map(|r| VrdmaRespCreateQp::read_from(&r).unwrap().qpn)
    });

    // SRQs.
    fill_and_free(&mut n, "CREATE_SRQ", VRDMA_CMD_DESTROY_SRQ, start, |n| {
        n.cmd(VRDMA_CMD_CREATE_SRQ, &create_srq)
            .map(|r| handle_of(&r))
    });

    // ODP chunk entries: ADVISE_MR PREFETCH over fresh ranges of an implicit MR (one page
    // request per chunk, never answered) until the budget refuses the next advise.
    let key = VrdmaRespRegMr::read_from(
        &n.cmd(VRDMA_CMD_REG_IMPLICIT_MR, implicit.as_bytes())
            .unwrap(),
    )
    .unwrap()
    .lkey;
    let span = 1u64 << (cfg.odp.chunk_shift + 10); // 1024 chunks per advise
    let mut at = 0u64;
    let mut requested = 0usize;
    let advised = fill(&mut n, "ADVISE_MR", |n| {
        let a = VrdmaCmdAdviseMr {
            lkey: key,
            advice: VRDMA_ADVISE_PREFETCH,
            flags: 0,
            reserved: 0,
            iova: at,
            length: span,
        };
        at += span;
        let r = n.cmd(VRDMA_CMD_ADVISE_MR, a.as_bytes()).map(|_| 0);
        requested += n.out.take_page_requests().len();
        r
    });
    assert_eq!(
        requested,
        advised.len() * 1024,
        "a refused advise sends nothing"
    );
    n.cmd(VRDMA_CMD_DEREG_MR, handle(key).as_bytes()).unwrap();
    assert_eq!(
        n.dev.budget.used(),
        start,
        "ODP entries gave their charge back"
    );

    assert!(n.dev.budget.peak() <= BUDGET);
    let growth = heap::peak() - base;
    assert!(
        growth <= BUDGET as i64 + SLACK,
        "heap grew by {growth} bytes, budget {BUDGET} + slack {SLACK}"
    );
}

fn handle(h: u32) -> VrdmaHandle {
    VrdmaHandle {
        handle: h,
        reserved: 0,
    }
}

/// Fill `n`'s budget with one-page MRs until less than `leave` bytes are free.
fn exhaust(n: &mut Node, pd: u32, page: u64, leave: u64) -> Vec<u32> {
    let mut keys = Vec::new();
    let mut pages = 4096u64;
    while pages >= 1 {
        let req = with_pages(
            &VrdmaCmdRegMr {
                pdn: pd,
                access: VRDMA_ACCESS_LOCAL_WRITE,
                iova: 0,
                length: pages * 4096,
                page_shift: 12,
                npages: pages as u32,
            },
            pages,
            page,
        );
        loop {
            let free = n.dev.budget.limit() - n.dev.budget.used();
            if free < leave {
                return keys;
            }
            match n.cmd(VRDMA_CMD_REG_MR, &req) {
                Ok(r) => keys.push(VrdmaRespRegMr::read_from(&r).unwrap().lkey),
                Err(_) => break,
            }
        }
        pages /= 2;
    }
    keys
}

/// Send 256 signaled RDMA WRITEs of 8 SGEs on `a` with `leave` bytes of budget free; returns
/// the most WQEs `a`'s requester ever held fetched.
fn writes_with_free_budget(budget: u64, leave: u64) -> usize {
    let mut p = RcPair::new()
        .nodes(node(1, budget), node(2, 64 * MIB))
        .cq_depth(1024)
        .build();
    let page = p.a.alloc(4096);
    let _fill = exhaust(&mut p.a, p.pda, page, leave);
    let used = p.a.dev.budget.used();
    for i in 0..256u64 {
        p.a.post_send_nodb(
            &mut p.qa,
            &Wqe {
                wr_id: i,
                opcode: VRDMA_WR_RDMA_WRITE,
                flags: VRDMA_SEND_SIGNALED,
                sges: (0..8).map(|s| (p.src + s * 64, 64, p.ka)).collect(),
                remote_addr: p.dst + (i % 64) * 512,
                rkey: p.kb,
                ..Default::default()
            },
        );
    }
    p.a.doorbell(p.qa.qpn);
    let mut cqes = Vec::new();
    let mut most = 0usize;
    let mut link = Link::clean();
    let qpn = p.qa.qpn;
    pump_until(
        &mut p.a,
        &mut p.b,
        &mut link,
        Duration::from_secs(60),
        |a, _| {
            most = most.max(a.dev.qps.get(qpn).map_or(0, |q| q.req.wqes.len()));
            assert!(a.dev.budget.used() <= a.dev.budget.limit());
            cqes.extend(a.poll_cq(&mut p.cqa));
            cqes.len() >= 256
        },
    );
    let ids = sorted_wr_ids(&cqes);
    assert_eq!(
        ids,
        (0..256).collect::<Vec<_>>(),
        "each WQE completes exactly once"
    );
    assert!(cqes.iter().all(|c| c.status == VRDMA_WC_SUCCESS));
    assert_eq!(p.a.qp_state(qpn), VRDMA_QPS_RTS);
    assert_eq!(
        p.a.dev.budget.used(),
        used,
        "the fetched WQEs gave their charge back"
    );
    most
}

/// With the budget exhausted the requester keeps at most the WQEs its own charge covers plus
/// what fits, fetches the rest as earlier ones retire, and loses none (spec §16).
#[test]
fn an_exhausted_budget_makes_the_fetch_wait_without_losing_wqes() {
    let _g = heap::serial();
    let roomy = writes_with_free_budget(64 * MIB, 64 * MIB);
    assert!(
        roomy > 64,
        "with room the requester caches many WQEs ({roomy})"
    );
    let tight = writes_with_free_budget(4 * MIB, 256);
    assert!(
        (1..=4).contains(&tight),
        "an exhausted budget caps the fetched WQEs ({tight})"
    );
}

/// An ODP access that needs a chunk entry the budget cannot hold sends no page request; the
/// responder RNR-NAKs (spec §14.6, §16.1) and the requester keeps retrying in RTS. Once memory
/// is given back the retry faults the chunk in and the WRITE completes.
#[test]
fn odp_without_budget_room_rnr_naks_then_completes() {
    let _g = heap::serial();
    let mut p = pair(64 * MIB, 4 * MIB);
    let src = p.a.alloc(8192);
    let ka = p.a.reg_mr(p.pda, src, 8192, ACC_ALL);
    let dst = p.b.alloc(4 << 20);
    let kodp = p.b.reg_odp_mr(p.pdb, dst, 4 << 20, ACC_ALL);
    let page = p.b.alloc(4096);
    let fill = exhaust(&mut p.b, p.pdb, page, 64);
    let data = pattern(77, 8192);
    p.a.write(src, &data);
    p.a.post_send(
        &mut p.qa,
        &rdma(1, VRDMA_WR_RDMA_WRITE, (src, 8192, ka), dst + 4096, kodp),
    );
    let mut link = Link::clean();
    let mut steps = 0;
    let mut cqes = Vec::new();
    pump_until(
        &mut p.a,
        &mut p.b,
        &mut link,
        Duration::from_secs(30),
        |a, b| {
            steps += 1;
            assert!(b.out.take_page_requests().is_empty(), "no room, no request");
            cqes.extend(a.poll_cq(&mut p.cqa));
            steps > 200
        },
    );
    assert!(cqes.is_empty(), "{cqes:?}");
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_RTS);
    assert!(
        link.frames_ba > 2,
        "RNR NAKs went back ({})",
        link.frames_ba
    );
    for k in fill {
        p.b.cmd(VRDMA_CMD_DEREG_MR, handle(k).as_bytes()).unwrap();
    }
    pump_until(
        &mut p.a,
        &mut p.b,
        &mut link,
        Duration::from_secs(30),
        |a, b| {
            b.answer_page_requests();
            cqes.extend(a.poll_cq(&mut p.cqa));
            !cqes.is_empty()
        },
    );
    assert_eq!((cqes[0].wr_id, cqes[0].status), (1, VRDMA_WC_SUCCESS));
    assert!(p.b.answered > 0);
    assert_eq!(p.b.read(dst + 4096, 8192), data);
}

/// A local ODP SGE whose chunk entry does not fit the requester's budget: the WQE waits (no
/// page request, no error, QP in RTS), is retried from `odp_tick`, and completes once memory
/// is given back (spec §14.4, §16.1).
#[test]
fn local_odp_sge_without_budget_room_waits_then_completes() {
    let _g = heap::serial();
    let mut p = pair(4 * MIB, 64 * MIB);
    let src = p.a.alloc(4 << 20);
    let kodp = p.a.reg_odp_mr(p.pda, src, 4 << 20, ACC_ALL);
    let dst = p.b.alloc(8192);
    let kb = p.b.reg_mr(p.pdb, dst, 8192, ACC_ALL);
    let page = p.a.alloc(4096);
    let fill = exhaust(&mut p.a, p.pda, page, 64);
    let data = pattern(78, 8192);
    p.a.write(src + 8192, &data);
    p.a.post_send(
        &mut p.qa,
        &rdma(2, VRDMA_WR_RDMA_WRITE, (src + 8192, 8192, kodp), dst, kb),
    );
    let mut link = Link::clean();
    let mut cqes = Vec::new();
    let t0 = std::time::Instant::now();
    let mut retries = 0;
    // The engine's loop: transport timers (which resume waiting QPs), then the ODP tick.
    while t0.elapsed() < Duration::from_millis(100) {
        let now = std::time::Instant::now();
        transport::on_tick(&p.a.dev, now);
        if p.a.dev.odp_tick(now).is_some() {
            retries += 1;
        }
        assert!(
            p.a.dev.outbox(0).frames.is_empty(),
            "nothing is sent while the WQE waits"
        );
        assert!(
            p.a.out.take_page_requests().is_empty(),
            "no room, no request"
        );
        cqes.extend(p.a.poll_cq(&mut p.cqa));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(cqes.is_empty(), "{cqes:?}");
    assert!(
        retries > 0,
        "odp_tick keeps a retry deadline while a QP waits for room"
    );
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_RTS);
    for k in fill {
        p.a.cmd(VRDMA_CMD_DEREG_MR, handle(k).as_bytes()).unwrap();
    }
    pump_until(
        &mut p.a,
        &mut p.b,
        &mut link,
        Duration::from_secs(30),
        |a, _| {
            a.dev.odp_tick(std::time::Instant::now());
            transport::resume_odp(&a.dev, std::time::Instant::now());
            a.answer_page_requests();
            cqes.extend(a.poll_cq(&mut p.cqa));
            !cqes.is_empty()
        },
    );
    assert_eq!((cqes[0].wr_id, cqes[0].status), (2, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(dst, 8192), data);
}

/// UD sends complete as they are sent, so no response comes to resume a fetch the budget
/// stopped: the requester fetches again as retiring makes room, within the same doorbell, and
/// all 64 complete (spec §14.4, §16.1).
#[test]
fn ud_sends_on_an_exhausted_budget_all_complete_on_one_doorbell() {
    let _g = heap::serial();
    let mut a = node(1, 4 * MIB);
    let b = node(2, 64 * MIB);
    let pd = a.create_pd();
    let (cq, mut cqr) = a.create_cq(256);
    let mut q = a.create_qp(QpSpec {
        qp_type: VRDMA_QPT_UD,
        sq_depth: 128,
        ..QpSpec::rc(pd, cq)
    });
    ud_rts(&mut a, &q, 0x1234);
    let av = a.av_to(&b);
    let ah = a.create_ah(pd, av);
    let src = a.alloc(4096);
    let ka = a.reg_mr(pd, src, 4096, ACC_ALL);
    let page = a.alloc(4096);
    let _fill = exhaust(&mut a, pd, page, 64);
    for i in 0..64u64 {
        a.post_send_nodb(
            &mut q,
            &Wqe {
                wr_id: i,
                opcode: VRDMA_WR_SEND,
                flags: VRDMA_SEND_SIGNALED,
                sges: (0..8).map(|s| (src + s * 64, 64, ka)).collect(),
                ah,
                remote_qpn: 77,
                remote_qkey: 0x1234,
                ..Default::default()
            },
        );
    }
    a.doorbell(q.qpn);
    let cqes = a.poll_cq(&mut cqr);
    let ids: Vec<u64> = cqes.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..64).collect::<Vec<_>>(), "{cqes:?}");
    assert!(cqes.iter().all(|c| c.status == VRDMA_WC_SUCCESS));
    assert_eq!(a.dev.outbox(0).frames.len(), 64);
}

/// Finding 5 of issue 39 (spec §16.1): two devices of one daemon whose registrations each fit
/// their own bound and the daemon's, but not both together: the second REG_MR gets
/// NO_RESOURCES and changes nothing; once the first device deregisters, it fits.
#[test]
fn two_devices_together_stop_at_the_daemon_bound() {
    let _g = heap::serial();
    const PAGES: u64 = 3 << 19; // a 12 MiB page list
    let daemon = vrdma_backend::budget::Budget::new(20 * MIB);
    let in_daemon = |id| {
        let pool = daemon.clone();
        Node::with_config(id, 8, 1500, gid_v4([10, 0, 0, id]), move |c| {
            c.max_host_memory = 16 * MIB;
            c.host_memory_pool = Some(pool);
        })
    };
    let (mut a, mut b) = (in_daemon(1), in_daemon(2));
    let reg = |n: &mut Node| {
        let pd = n.create_pd();
        let page = n.alloc(4096);
        let req = with_pages(
            &VrdmaCmdRegMr {
                pdn: pd,
                access: VRDMA_ACCESS_LOCAL_WRITE,
                iova: 0,
                length: PAGES * 4096,
                page_shift: 12,
                npages: PAGES as u32,
            },
            PAGES,
            page,
        );
        n.cmd(VRDMA_CMD_REG_MR, &req)
    };
    // Each alone fits: a's registration within its 16 MiB and the daemon's 20 MiB.
    let mr_a = handle_of(&reg(&mut a).expect("a alone fits"));
    let used_a = daemon.used();
    assert!(used_a > 10 * MIB && used_a <= 16 * MIB, "{used_a}");
    assert_eq!(
        reg(&mut b).unwrap_err(),
        VRDMA_STATUS_NO_RESOURCES,
        "together beyond the daemon's bound"
    );
    assert!(
        b.dev.budget.used() < MIB,
        "the refused REG_MR left nothing charged on b"
    );
    assert_eq!(
        daemon.used(),
        a.dev.budget.used() + b.dev.budget.used(),
        "the daemon's charge is its devices'"
    );
    assert!(daemon.peak() <= 20 * MIB);
    a.cmd(VRDMA_CMD_DEREG_MR, handle(mr_a).as_bytes()).unwrap();
    reg(&mut b).expect("b alone fits");
}
