//! Allocations on the fabric's data path: a steady-state RC WRITE stream between two devices of
//! one daemon, each with its engine thread on a `fabric::DevicePort`. Every allocation in the
//! process is counted while the stream runs (the test thread only waits, without allocating),
//! so the figure covers the engines, the fabric and its queues ([datapath] issue item 3).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vrdma_backend::fabric::FabricBuilder;
use vrdma_backend::transport::engine::Engine;
use vrdma_spec::*;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ON: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards every call to the system allocator unchanged; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Same bound as the in-process stream (`transport_alloc.rs`): what remains is per message.
const MAX_ALLOCS_PER_PACKET: f64 = 0.25;

#[test]
fn steady_state_fabric_rc_write_allocations_per_packet() {
    // 64 KiB messages, path MTU 4096: 16 data frames each.
    assert_allocations_at_most(64 << 10, 16, false, MAX_ALLOCS_PER_PACKET, "packet");
}

/// The same with the payloads by reference (one copy, spec §16.2 rule 6): the references are
/// pooled, so a segment costs no allocation either.
#[test]
fn steady_state_fabric_rc_write_by_reference_allocations_per_packet() {
    assert_allocations_at_most(64 << 10, 16, true, MAX_ALLOCS_PER_PACKET, "packet");
}

/// Small messages are one packet each: what a message costs is what a packet costs (WQE fetch,
/// SGE list, completion), so this bound covers the per-WQE work too.
#[test]
fn steady_state_fabric_64_byte_writes_allocate_nothing_per_packet() {
    assert_allocations_at_most(64, 256, false, MAX_ALLOCS_PER_SMALL_PACKET, "64 B message");
}

/// For 64 B messages: a few allocations in a run of thousands (a queue growing once) pass,
/// one per message does not.
const MAX_ALLOCS_PER_SMALL_PACKET: f64 = 0.05;

/// [`allocations_per_packet`]`(msg, slots, refs)` is at most `bound` (allocations per `unit`).
fn assert_allocations_at_most(msg: u64, slots: u64, refs: bool, bound: f64, unit: &str) {
    let per_packet = allocations_per_packet(msg, slots, refs);
    assert!(
        per_packet <= bound,
        "{per_packet:.3} allocations per {unit} (bound {bound})"
    );
}

/// Stream `slots`-message batches of `msg`-byte RC WRITEs from a to b (message i carries the
/// byte i+1) and count every allocation while the engines work; returns allocations per data
/// frame.
fn allocations_per_packet(msg: u64, slots: u64, refs: bool) -> f64 {
    // The counter is process-wide: one measurement at a time.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let (mut a, mut b, pda, pdb) = Sides::new(64, 9000).parts();
    let (ca, _) = a.create_cq(1024);
    let (cb, _) = b.create_cq(1024);
    let mut qa = a.create_qp(QpSpec {
        sq_depth: 1024,
        ..QpSpec::rc(pda, ca)
    });
    let qb = b.create_qp(QpSpec::rc(pdb, cb));
    connect(&mut a, &qa, &mut b, &qb, RtsAttrs::mtu(5));
    let MrPair { src, ka, dst, kb } = MrPair::new(&mut a, &mut b, pda, pdb, msg * slots);
    // Message i carries the byte i+1 everywhere, so its arrival is visible in its last byte.
    let post = |qa: &mut QpH, a: &Node, i: u64| {
        let k = i % slots;
        a.write(src + k * msg, &vec![(i % 250 + 1) as u8; msg as usize]);
        post_send_mem(
            &a.mem,
            qa,
            &Wqe {
                wr_id: i,
                opcode: VRDMA_WR_RDMA_WRITE,
                flags: 0,
                sges: vec![(src + k * msg, msg as u32, ka)],
                remote_addr: dst + k * msg,
                rkey: kb,
                ..Default::default()
            },
        );
    };
    let mut fb = FabricBuilder::new();
    let pa = fb.add_device(a.mac).unwrap();
    let pb = fb.add_device(b.mac).unwrap();
    let fabric = fb.build();
    // Segments (spec §16.2 rule 6) on, as the daemon runs a port without a wrapper.
    let port = |p| {
        let d = fabric.device_port(p).unwrap().with_segments();
        Arc::new(if refs { d.with_payload_refs() } else { d })
    };
    let ea = Engine::start(detach(&mut a), port(pa)).unwrap();
    let eb = Engine::start(detach(&mut b), port(pb)).unwrap();
    let db = VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: qa.qpn,
    };
    // Waits for message `i` to land without allocating.
    let wait_for = |b: &Node, i: u64| {
        let k = i % slots;
        let mut last = [0u8; 1];
        let t0 = Instant::now();
        loop {
            b.mem.read(dst + (k + 1) * msg - 1, &mut last).unwrap();
            if last[0] == (i % 250 + 1) as u8 {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "message {i} never landed"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    // Warm-up: pools, queues and tables reach their steady-state capacity.
    for i in 0..slots {
        post(&mut qa, &a, i);
    }
    ea.sender().push(db);
    wait_for(&b, slots - 1);
    std::thread::sleep(Duration::from_millis(50));
    // Measured: `rounds` batches of `slots` messages; posting happens between the counted spans.
    let rounds = 40u64;
    let mut allocs = 0;
    for r in 1..=rounds {
        for i in r * slots..(r + 1) * slots {
            post(&mut qa, &a, i);
        }
        ON.store(true, Ordering::Relaxed);
        let a0 = ALLOCS.load(Ordering::Relaxed);
        ea.sender().push(db);
        wait_for(&b, (r + 1) * slots - 1);
        std::thread::sleep(Duration::from_millis(5)); // the ACKs
        allocs += ALLOCS.load(Ordering::Relaxed) - a0;
        ON.store(false, Ordering::Relaxed);
    }
    let frames = rounds * slots * msg.div_ceil(4096);
    let per_packet = allocs as f64 / frames as f64;
    println!("{msg} B: {allocs} allocations for {frames} data frames: {per_packet:.3} per packet");
    let s = fabric.port_stats(pb).unwrap();
    assert!(
        s.out_frames.load(Ordering::Relaxed) >= frames,
        "frames crossed the fabric"
    );
    ea.stop();
    eb.stop();
    per_packet
}
