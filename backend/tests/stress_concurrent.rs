//! Concurrency stress: two devices, each with its engine (one worker, then two) on a real UDP
//! uplink, while a command thread per pair of devices plays the vhost-user side (it locks the
//! device as the daemon does, spec §3.1) with a seeded random mix of commands: hostile RC pairs
//! created, connected, aimed at memory their peer never granted, moved to ERR and destroyed; MRs with
//! aliased page lists registered and deregistered; ODP page requests answered; doorbell storms
//! for random objects; memory-table swaps (SET_MEM_TABLE). Meanwhile the test thread drives a
//! healthy RC pair (RDMA WRITEs into a page-list MR and into an ODP MR, SENDs).
//!
//! Invariants: no panic on any thread; every signaled WQE of the healthy pair completes exactly
//! once with success and its data lands; canary pages no MR covers stay intact; the budget
//! never exceeds its limit and returns to its start value once every object is destroyed.
//!
//! Duration: `VRDMA_STRESS_SECS` (default 6, at most 20); seed: `VRDMA_STRESS_SEED`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use common::rng::XorShift;
use common::*;
use vm_memory::GuestAddressSpace;
use vrdma_backend::device::Device;
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_backend::transport::engine::{Engine, EngineOptions, EngineSender};
use vrdma_spec::*;

const BUDGET: u64 = 64 << 20;
const CANARY: u64 = 64 << 10;

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// A node whose real device lives behind the mutex the engine locks. The node itself (guest
/// memory allocator, recording output, command helpers) is used by whoever holds `node`; lock
/// order: node, then device (A before B).
struct Side {
    node: Mutex<Node>,
    dev: Arc<HandoffLock<Device>>,
    db: EngineSender,
    mem: GuestMem,
}

/// `node` with its real device swapped in, for as long as the device lock is held.
struct Held<'a> {
    node: MutexGuard<'a, Node>,
    /// The mutex's content while held: the node's placeholder device.
    slot: RwLockWriteGuard<'a, Device>,
}

impl Held<'_> {
    fn new(s: &Side) -> Held<'_> {
        let mut node = s.node.lock().unwrap_or_else(|p| p.into_inner());
        let mut slot = s.dev.lock();
        std::mem::swap(&mut node.dev, &mut *slot);
        Held { node, slot }
    }
}

/// Run the destroy commands `objects` (opcode, handle) on `side`: its budget is back at `start`
/// and its peak stayed within `BUDGET`.
fn destroy_all(side: &Side, objects: &[(u16, u32)], start: u64, name: &str) {
    let mut h = Held::new(side);
    for &(op, id) in objects {
        h.cmd(op, handle(id).as_bytes()).unwrap();
    }
    assert_eq!(
        h.dev.budget.used(),
        start,
        "{name}'s budget after destroying everything"
    );
    assert!(h.dev.budget.peak() <= BUDGET);
}

impl std::ops::Deref for Held<'_> {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Node {
        &mut self.node
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        std::mem::swap(&mut self.node.dev, &mut *self.slot);
    }
}

fn node(id: u8) -> Node {
    Node::with_config(id, 128, 1500, gid_v4([10, 0, 0, id]), |c| {
        c.max_host_memory = BUDGET;
    })
}

fn handle(h: u32) -> VrdmaHandle {
    VrdmaHandle {
        handle: h,
        reserved: 0,
    }
}

fn poll(mem: &GuestMem, cq: &mut RingH) -> Vec<Cqe> {
    let prod = mem.load_u32_acquire(cq.ctrl()).unwrap();
    let mut v = Vec::new();
    while cq.idx != prod {
        let mut b = [0u8; 64];
        mem.read(cq.entry_gpa(cq.idx), &mut b).unwrap();
        v.push(Cqe::from_bytes(&b));
        cq.idx = cq.idx.wrapping_add(1);
    }
    mem.store_u32_release(cq.ctrl() + 64, cq.idx).unwrap();
    v
}

/// Swap in a copy of the current memory table (what SET_MEM_TABLE with an unchanged layout
/// does), racing the engine's accesses.
fn swap_mem_table(s: &Side) {
    let map = (*s.mem.atomic().memory()).clone();
    let atomic = vm_memory::GuestMemoryAtomic::new(map);
    s.dev.lock().set_guest_memory(&atomic);
}

/// What the command thread made and must destroy again.
#[derive(Default)]
struct Hostile {
    pairs: Vec<(QpH, QpH)>,
    mrs_b: Vec<u32>,
    /// QPs created so far: each takes fresh ring memory from the node's bump allocator.
    created: u32,
    /// Pairs made, and pairs a device refused for its budget.
    made: u32,
    refused: u32,
}

/// Most hostile pairs created in one run (ring memory is never reused).
const MAX_CREATED: u32 = 1500;

struct Fixture {
    pda: u32,
    pdb: u32,
    cqa: u32,
    cqb: u32,
    /// B's canary (never registered), the page B's hostile MRs alias, and A's page hostile
    /// WRITEs send from.
    canary: u64,
    /// B's ODP MR of the healthy pair, invalidated now and then (spec §12.5).
    odp: (u32, u64, u64),
    scratch_b: u64,
    scratch_a: u64,
}

/// iova of B's hostile MRs.
const HOSTILE_IOVA: u64 = 0x10_0000_0000;

/// One random command-side step.
fn churn_step(a: &Side, b: &Side, f: &Fixture, h: &mut Hostile, rng: &mut XorShift) {
    match rng.below(8) {
        0 | 1 if h.pairs.len() < 16 && h.created < MAX_CREATED => {
            h.created += 1;
            let (mut ha, mut hb) = (Held::new(a), Held::new(b));
            let qa = ha.try_create_qp(QpSpec {
                sq_depth: 64,
                rq_depth: 64,
                ..QpSpec::rc(f.pda, f.cqa)
            });
            let qb = hb.try_create_qp(QpSpec {
                sq_depth: 64,
                rq_depth: 64,
                ..QpSpec::rc(f.pdb, f.cqb)
            });
            // The hostile MRs (step 4) can fill a device's budget: then the device refuses
            // the QP (spec §16.1), and the half that was made goes again.
            let (qa, qb) = match (qa, qb) {
                (Ok(qa), Ok(qb)) => (qa, qb),
                (qa, qb) => {
                    for (held, q) in [(&mut ha, &qa), (&mut hb, &qb)] {
                        match q {
                            Ok(q) => {
                                held.cmd(VRDMA_CMD_DESTROY_QP, handle(q.qpn).as_bytes())
                                    .unwrap();
                            }
                            Err(status) => assert_eq!(
                                *status, VRDMA_STATUS_NO_RESOURCES,
                                "CREATE_QP refused with status {status}"
                            ),
                        }
                    }
                    h.refused += 1;
                    return;
                }
            };
            connect(
                &mut ha,
                &qa,
                &mut hb,
                &qb,
                RtsAttrs {
                    mtu: 3,
                    timeout: 10,
                    retry: 1,
                    rnr_retry: 1,
                },
            );
            h.pairs.push((qa, qb));
            h.made += 1;
        }
        2 if !h.pairs.is_empty() => {
            // A WRITE at B's canary with a random rkey or with the key of an MR that does not
            // cover it (both fail, the canary untouched), or through a hostile MR's aliased
            // pages (lands in the one scratch page).
            let i = rng.below(h.pairs.len() as u64) as usize;
            let hostile_key = h.mrs_b.get(rng.below(4) as usize).copied();
            let (rkey, remote_addr) = match (rng.below(3), hostile_key) {
                (0, Some(k)) => (k, f.canary + rng.below(CANARY / 4096) * 4096),
                (1, Some(k)) => (k, HOSTILE_IOVA),
                _ => (
                    rng.next() as u32,
                    f.canary + rng.below(CANARY / 4096) * 4096,
                ),
            };
            let src = f.scratch_a;
            let (qa, _) = &mut h.pairs[i];
            let ka = {
                let mut ha = Held::new(a);
                ha.reg_mr(f.pda, src, 4096, ACC_ALL)
            };
            post_send_mem(
                &a.mem,
                qa,
                &rdma(7, VRDMA_WR_RDMA_WRITE, (src, 4096, ka), remote_addr, rkey),
            );
            a.db.push(VrdmaDoorbell {
                type_: VRDMA_DB_SQ,
                id: qa.qpn,
            });
            let mut ha = Held::new(a);
            ha.cmd(VRDMA_CMD_DEREG_MR, handle(ka).as_bytes()).unwrap();
        }
        3 if !h.pairs.is_empty() => {
            let i = rng.below(h.pairs.len() as u64) as usize;
            let (qa, qb) = h.pairs.swap_remove(i);
            if rng.below(2) == 0 {
                Held::new(a).qp_to_err(qa.qpn);
            }
            Held::new(a)
                .cmd(VRDMA_CMD_DESTROY_QP, handle(qa.qpn).as_bytes())
                .unwrap();
            Held::new(b)
                .cmd(VRDMA_CMD_DESTROY_QP, handle(qb.qpn).as_bytes())
                .unwrap();
        }
        4 => {
            // An MR on B whose every page is the scratch page (aliased page list).
            if h.mrs_b.is_empty() || (h.mrs_b.len() < 128 && rng.below(3) != 0) {
                // Up to 1 MiB lists: 128 of them exceed the budget, so some get NO_RESOURCES.
                let np = 1 + rng.below(1 << 17);
                let c = VrdmaCmdRegMr {
                    pdn: f.pdb,
                    access: ACC_ALL,
                    iova: HOSTILE_IOVA,
                    length: np * 4096,
                    page_shift: 12,
                    npages: np as u32,
                };
                let mut req = c.as_bytes().to_vec();
                for _ in 0..np {
                    req.extend_from_slice(&f.scratch_b.to_le_bytes());
                }
                match Held::new(b).cmd(VRDMA_CMD_REG_MR, &req) {
                    Ok(r) => h.mrs_b.push(VrdmaRespRegMr::read_from(&r).unwrap().lkey),
                    Err(st) => assert_eq!(st, VRDMA_STATUS_NO_RESOURCES),
                }
            } else {
                let k = h
                    .mrs_b
                    .swap_remove(rng.below(h.mrs_b.len() as u64) as usize);
                Held::new(b)
                    .cmd(VRDMA_CMD_DEREG_MR, handle(k).as_bytes())
                    .unwrap();
            }
        }
        5 => swap_mem_table(if rng.below(2) == 0 { a } else { b }),
        7 => {
            // The guest unmaps part of the ODP MR: resident chunks are dropped, the healthy
            // WRITEs fault them in again.
            let (key, iova, len) = f.odp;
            let off = rng.below(len >> 12) << 12;
            let c = VrdmaCmdOdpInvalidate {
                mr_key: key,
                reserved: 0,
                iova: iova + off,
                length: 4096 * (1 + rng.below(1024)),
            };
            let r = Held::new(b).cmd(VRDMA_CMD_ODP_INVALIDATE, c.as_bytes());
            assert!(r.is_ok(), "ODP_INVALIDATE: {r:?}");
        }
        6 => {
            // A doorbell storm: random types and ids, existing or not.
            let s = if rng.below(2) == 0 { a } else { b };
            let dbs: Vec<VrdmaDoorbell> = (0..64)
                .map(|_| VrdmaDoorbell {
                    type_: rng.below(6) as u32,
                    id: if rng.below(2) == 0 {
                        rng.next() as u32
                    } else {
                        rng.below(64) as u32
                    },
                })
                .collect();
            s.db.doorbells(&dbs);
        }
        _ => {}
    }
}

/// Page requests answered by [`answer_pages`].
static ANSWERED: AtomicUsize = AtomicUsize::new(0);

/// The pager: answer a side's page requests as the driver would, identity-mapped. A request
/// that ODP_INVALIDATE cancelled meanwhile is answered NOT_FOUND (spec §12.5).
fn answer_pages(s: &Side) {
    let mut h = Held::new(s);
    for r in h.out.take_page_requests() {
        if r.type_ != VRDMA_PAGEREQ_FAULT {
            continue;
        }
        let sp = r.iova & !4095;
        let ep = (r.iova + r.length + 4095) & !4095;
        let c = VrdmaCmdOdpPageResp {
            req_id: r.req_id,
            mr_key: r.mr_key,
            status: VRDMA_STATUS_OK,
            flags: VRDMA_ODP_RESP_F_WRITABLE,
            iova: sp,
            npages: ((ep - sp) >> 12) as u32,
            reserved: 0,
        };
        let mut req = c.as_bytes().to_vec();
        for p in (sp..ep).step_by(4096) {
            req.extend_from_slice(&p.to_le_bytes());
        }
        match h.cmd(VRDMA_CMD_ODP_PAGE_RESP, &req) {
            Ok(_) | Err(VRDMA_STATUS_NOT_FOUND) => {}
            Err(st) => panic!("ODP_PAGE_RESP: status {st}"),
        }
        ANSWERED.fetch_add(1, Ordering::Relaxed);
    }
}

/// One run at a time: each keeps every core busy for its whole duration.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn engines_and_commands_concurrently_lose_nothing() {
    stress(1);
}

/// The same with two engine workers per device (`--engine-threads 2`): the healthy and the
/// hostile QPs spread over both, ODP resumptions and doorbell storms routed to their workers.
#[test]
fn engines_with_two_workers_and_commands_concurrently_lose_nothing() {
    stress(2);
}

fn stress(threads: usize) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let secs = std::env::var("VRDMA_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(6)
        .clamp(1, 20);
    let seed = std::env::var("VRDMA_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0x5eed_cafe);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |i| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        hook(i);
    }));

    let mut a = node(1);
    let mut b = node(2);
    let (start_a, start_b) = (a.dev.budget.used(), b.dev.budget.used());
    let (pda, pdb) = (a.create_pd(), b.create_pd());
    // The healthy pair.
    let (hca, mut hcqa) = a.create_cq(4096);
    let (hcb, mut hcqb) = b.create_cq(4096);
    let mut qa = a.create_qp(QpSpec::rc(pda, hca));
    let qb = b.create_qp(QpSpec::rc(pdb, hcb));
    // Transport timeout 18 (1.07 s, 8.6 s with its 7 retries): nothing is lost on this
    // loopback, so a timeout fires only when the engines are starved. With 14 (67 ms, 0.5 s in
    // all) a release run beside builds at load 10-16 ended the healthy WRITEs RETRY_EXC_ERR.
    connect(&mut a, &qa, &mut b, &qb, RtsAttrs::mtu(3).timeout(18));
    let src = a.alloc(1 << 20);
    let dst = b.alloc(1 << 20);
    let odp = b.alloc(4 << 20);
    let ka = a.reg_mr(pda, src, 1 << 20, ACC_ALL);
    let kb = b.reg_mr(pdb, dst, 1 << 20, ACC_ALL);
    let kodp = b.reg_odp_mr(pdb, odp, 4 << 20, ACC_ALL);
    // Hostile QPs' CQs, B's canary and the scratch page.
    let (cqa, mut hostile_cqa) = a.create_cq(4096);
    let (cqb, mut hostile_cqb) = b.create_cq(4096);
    let canary = b.alloc(CANARY);
    let canary_data = pattern(0xca, CANARY as usize);
    b.write(canary, &canary_data);
    let f = Fixture {
        pda,
        pdb,
        cqa,
        cqb,
        canary,
        odp: (kodp, odp, 4 << 20),
        scratch_b: b.alloc(4096),
        scratch_a: a.alloc(4096),
    };

    let (ua, ub) = udp_pair();
    let (mem_a, mem_b) = (a.mem.clone(), b.mem.clone());
    let da = detach(&mut a);
    let db = detach(&mut b);
    let opts = EngineOptions {
        threads,
        ..Default::default()
    };
    let ea = Engine::start_with(da.clone(), Arc::new(ua), opts).expect("engine a");
    let eb = Engine::start_with(db.clone(), Arc::new(ub), opts).expect("engine b");
    let sa = Arc::new(Side {
        node: Mutex::new(a),
        dev: da.clone(),
        db: ea.sender(),
        mem: mem_a.clone(),
    });
    let sb = Arc::new(Side {
        node: Mutex::new(b),
        dev: db.clone(),
        db: eb.sender(),
        mem: mem_b.clone(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let f = Arc::new(f);
    let churn = {
        let (sa, sb, stop, f) = (sa.clone(), sb.clone(), stop.clone(), f.clone());
        let (ma, mb) = (mem_a.clone(), mem_b.clone());
        std::thread::spawn(move || {
            let mut rng = XorShift(seed | 1);
            let mut h = Hostile::default();
            let mut steps = 0u64;
            let mut hostile_errors = 0usize;
            while !stop.load(Ordering::Acquire) {
                churn_step(&sa, &sb, &f, &mut h, &mut rng);
                answer_pages(&sb);
                // Hostile CQEs are drained so the CQs never overflow; any status is fine.
                hostile_errors += poll(&ma, &mut hostile_cqa)
                    .iter()
                    .filter(|c| c.status != VRDMA_WC_SUCCESS)
                    .count();
                let _ = poll(&mb, &mut hostile_cqb);
                for s in [&sa, &sb] {
                    let dev = s.dev.lock();
                    assert!(dev.budget.used() <= dev.budget.limit());
                }
                steps += 1;
            }
            // Destroy everything the churn made.
            for (qa, qb) in h.pairs.drain(..) {
                Held::new(&sa)
                    .cmd(VRDMA_CMD_DESTROY_QP, handle(qa.qpn).as_bytes())
                    .unwrap();
                Held::new(&sb)
                    .cmd(VRDMA_CMD_DESTROY_QP, handle(qb.qpn).as_bytes())
                    .unwrap();
            }
            for k in h.mrs_b.drain(..) {
                Held::new(&sb)
                    .cmd(VRDMA_CMD_DEREG_MR, handle(k).as_bytes())
                    .unwrap();
            }
            (steps, hostile_errors, h.made, h.refused)
        })
    };
    // The pager also runs here between rounds, so the healthy ODP WRITEs never wait for the
    // churn thread alone.
    let mut rng = XorShift(seed.rotate_left(17) | 1);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut rounds = 0u64;
    let mut rq = qb.rq.clone().unwrap();
    while Instant::now() < deadline {
        let base = rounds * 16;
        let mut want = Vec::new();
        let mut expect_data = Vec::new();
        for i in 0..8u64 {
            let len = 1 + rng.below(16 << 10);
            let off = i * (64 << 10);
            let data = pattern(base + i, len as usize);
            mem_a.write(src + off, &data).unwrap();
            post_send_mem(
                &mem_a,
                &mut qa,
                &rdma(
                    base + i,
                    VRDMA_WR_RDMA_WRITE,
                    (src + off, len as u32, ka),
                    dst + off,
                    kb,
                ),
            );
            want.push(base + i);
            expect_data.push((dst + off, data));
        }
        // Into the ODP MR: faults, RNR NAKs and page answers on the way.
        let odp_off = rng.below(4 << 20 >> 12) << 12;
        let odp_len = 4096.min((4 << 20) - odp_off);
        let odp_data = pattern(base + 8, odp_len as usize);
        mem_a.write(src + (8 << 16), &odp_data).unwrap();
        post_send_mem(
            &mem_a,
            &mut qa,
            &rdma(
                base + 8,
                VRDMA_WR_RDMA_WRITE,
                (src + (8 << 16), odp_len as u32, ka),
                odp + odp_off,
                kodp,
            ),
        );
        want.push(base + 8);
        expect_data.push((odp + odp_off, odp_data));
        // A SEND into a posted receive.
        let msg = pattern(base + 9, 512);
        mem_a.write(src + (9 << 16), &msg).unwrap();
        {
            let mut hb = Held::new(&sb);
            hb.post_recv(&mut rq, base + 9, &[(dst + (15 << 16), 4096, kb)]);
        }
        post_send_mem(&mem_a, &mut qa, &send(base + 9, (src + (9 << 16), 512, ka)));
        want.push(base + 9);
        sa.db.push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: qa.qpn,
        });
        let (mut got, mut recv) = (Vec::new(), Vec::new());
        let t0 = Instant::now();
        while got.len() < want.len() || recv.is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "round {rounds}: lost CQEs: got {got:?} recv {recv:?}"
            );
            answer_pages(&sb);
            std::thread::sleep(Duration::from_millis(1));
            got.extend(poll(&mem_a, &mut hcqa));
            recv.extend(poll(&mem_b, &mut hcqb));
        }
        assert!(
            got.iter().all(|c| c.status == VRDMA_WC_SUCCESS),
            "round {rounds}: {got:?}"
        );
        let ids = sorted_wr_ids(&got);
        assert_eq!(
            ids, want,
            "round {rounds}: each signaled WQE completes once"
        );
        assert_eq!(recv.len(), 1);
        assert_eq!(
            (recv[0].wr_id, recv[0].status),
            (base + 9, VRDMA_WC_SUCCESS)
        );
        for (gpa, data) in &expect_data {
            let mut buf = vec![0u8; data.len()];
            mem_b.read(*gpa, &mut buf).unwrap();
            assert!(buf == *data, "round {rounds}: WRITE data at {gpa:#x}");
        }
        let mut buf = vec![0u8; 512];
        mem_b.read(dst + (15 << 16), &mut buf).unwrap();
        assert_eq!(buf, msg, "round {rounds}: SEND data");
        rounds += 1;
    }
    stop.store(true, Ordering::Release);
    let (steps, hostile_errors, made, refused) = churn.join().expect("command thread panicked");
    let answered = ANSWERED.load(Ordering::Relaxed);
    // Nothing arrives late on the healthy CQs: no CQE twice.
    std::thread::sleep(Duration::from_millis(50));
    assert!(poll(&mem_a, &mut hcqa).is_empty(), "a CQE completed twice");
    let mut canary_now = vec![0u8; CANARY as usize];
    mem_b.read(canary, &mut canary_now).unwrap();
    assert!(canary_now == canary_data, "a peer wrote outside its MRs");

    // Destroy the healthy objects too: the budget goes back to where it started.
    destroy_all(
        &sa,
        &[
            (VRDMA_CMD_DESTROY_QP, qa.qpn),
            (VRDMA_CMD_DEREG_MR, ka),
            (VRDMA_CMD_DESTROY_CQ, hca),
            (VRDMA_CMD_DESTROY_CQ, cqa),
        ],
        start_a,
        "A",
    );
    destroy_all(
        &sb,
        &[
            (VRDMA_CMD_DESTROY_QP, qb.qpn),
            (VRDMA_CMD_DEREG_MR, kb),
            (VRDMA_CMD_DEREG_MR, kodp),
            (VRDMA_CMD_DESTROY_CQ, hcb),
            (VRDMA_CMD_DESTROY_CQ, cqb),
        ],
        start_b,
        "B",
    );
    ea.stop();
    eb.stop();
    assert!(
        !da.is_poisoned() && !db.is_poisoned(),
        "a device lock is poisoned"
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a thread panicked");
    eprintln!(
        "stress ({threads} engine workers): {rounds} healthy rounds, {steps} command steps, {made} hostile pairs made \
         ({refused} refused for the budget), {hostile_errors} hostile error CQEs, {answered} \
         page requests answered in {secs} s"
    );
    assert!(made > 0, "no hostile pair was made ({refused} refused)");
    assert!(
        rounds > 0 && steps > 0,
        "rounds {rounds}, command steps {steps}"
    );
    assert!(
        hostile_errors > 0,
        "no hostile WRITE was refused: the churn tested nothing"
    );
    assert!(answered > 0, "no ODP fault happened");
}
