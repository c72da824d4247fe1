//! [engine] figures: RC throughput (WRITE at 4 KiB / 64 KiB / 1 MiB, SEND/RECV and READ at
//! 64 KiB) for path MTU 1024 and 4096, in-process and over UDP with the engine threads; 64 B
//! WRITE latency and message rate.

use std::time::{Duration, Instant};

use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

use crate::bed::{Bed, Mode, Reg};
use crate::common::Wqe;
use crate::util::{fmt_size, median, percentile, Table};

/// Keep this many WQEs per signaled one (the others are unsignaled).
const SIG_EVERY: u64 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    Send,
    Read,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "WRITE",
            Op::Send => "SEND/RECV",
            Op::Read => "READ",
        }
    }
}

/// Stream `n` messages of `size` bytes from A to B (READ: B's buffer into A's) with at most
/// `SQ_DEPTH - SIG_EVERY` WQEs outstanding; returns the elapsed wall time.
pub fn stream(bed: &mut Bed, op: Op, size: u64, n: u64) -> Duration {
    let max_out = (crate::bed::SQ_DEPTH as u64 - SIG_EVERY).min(512);
    let slots = (bed.buf_len / size).max(1);
    let (a_addr, a_key, b_addr, b_key) = (bed.a.addr, bed.a.key, bed.b.addr, bed.b.key);
    let mut cqes: Vec<Cqe> = Vec::new();
    // Receives for SEND: keep B's RQ full.
    let mut recv_posted = 0u64;
    let mut recv_done = 0u64;
    let rq_room = crate::bed::RQ_DEPTH as u64 - 1;
    if op == Op::Send {
        while recv_posted < n && recv_posted < rq_room {
            let off = (recv_posted % slots) * size;
            bed.post_recv_b(recv_posted, b_addr + off, size as u32);
            recv_posted += 1;
        }
    }
    let start = Instant::now();
    let (mut posted, mut completed) = (0u64, 0u64);
    let deadline = start + Duration::from_secs(60);
    while completed < n {
        let before = posted;
        while posted < n && posted - completed < max_out {
            let i = posted;
            let off = (i % slots) * size;
            let signaled = (i + 1) % SIG_EVERY == 0 || i + 1 == n;
            let w = Wqe {
                wr_id: i,
                opcode: match op {
                    Op::Write => VRDMA_WR_RDMA_WRITE,
                    Op::Send => VRDMA_WR_SEND,
                    Op::Read => VRDMA_WR_RDMA_READ,
                },
                flags: if signaled { VRDMA_SEND_SIGNALED } else { 0 },
                sges: vec![(a_addr + off, size as u32, a_key)],
                remote_addr: b_addr + off,
                rkey: b_key,
                ..Default::default()
            };
            bed.post(&w);
            posted += 1;
        }
        if posted != before {
            bed.doorbell();
        }
        bed.progress(false);
        cqes.clear();
        bed.poll_a(&mut cqes);
        for c in &cqes {
            assert_eq!(
                c.status,
                VRDMA_WC_SUCCESS,
                "{} {} completion failed: {c:?}",
                op.name(),
                fmt_size(size)
            );
            completed = completed.max(c.wr_id + 1);
        }
        if op == Op::Send {
            cqes.clear();
            bed.poll_b(&mut cqes);
            for c in &cqes {
                assert_eq!(c.status, VRDMA_WC_SUCCESS, "recv failed: {c:?}");
                recv_done += 1;
            }
            while recv_posted < n && recv_posted - recv_done < rq_room {
                let off = (recv_posted % slots) * size;
                bed.post_recv_b(recv_posted, b_addr + off, size as u32);
                recv_posted += 1;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} {} stream stuck: {completed}/{n} completed",
            op.name(),
            fmt_size(size)
        );
    }
    let el = start.elapsed();
    if op == Op::Send {
        // The last receives complete on B around the same time; collect them (not timed).
        let until = Instant::now() + Duration::from_secs(10);
        while recv_done < n && Instant::now() < until {
            bed.progress(false);
            cqes.clear();
            recv_done += bed.poll_b(&mut cqes) as u64;
        }
        assert_eq!(recv_done, n, "every SEND was received");
    }
    el
}

/// Check the last message of a WRITE stream landed intact in B.
fn verify_last(bed: &Bed, size: u64, n: u64) {
    let slots = (bed.buf_len / size).max(1);
    let off = ((n - 1) % slots) * size;
    let mut x = vec![0u8; size as usize];
    let mut y = vec![0u8; size as usize];
    bed.a.mem.read(bed.a.gpa + off, &mut x).unwrap();
    bed.b.mem.read(bed.b.gpa + off, &mut y).unwrap();
    assert!(x == y, "WRITE data differs at B");
}

/// Figures of one (op, size) point, medians over the runs.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    /// Payload MB (10^6 bytes) per wall-clock second.
    pub mbs: f64,
    pub msgs: f64,
    /// Payload MB per CPU second of the engine (both engine threads over UDP; the bench thread
    /// in-process): independent of how much of the shared machine the bench got.
    pub mb_per_cpu: f64,
    /// Data-carrying frames sent / the minimum (1.00 = no retransmission).
    pub data_frames: f64,
    /// The slowest and the fastest run's MB/s: on a shared machine the spread says how far
    /// the median can be trusted.
    pub mbs_range: (f64, f64),
}

/// Throughput of one (op, size) point: median over `runs` runs of `bytes` each.
pub fn point(bed: &mut Bed, op: Op, size: u64, bytes: u64, runs: usize) -> Point {
    let n = (bytes / size).max(64);
    // Warm-up (first touch of buffers, socket buffers, caches).
    stream(bed, op, size, n.min(64));
    let mtu = bed.path_mtu as u64;
    let min_frames = n * size.div_ceil(mtu).max(1);
    let (mut mbs, mut mps, mut cpu, mut fr) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (ab0, ba0) = bed.frames.get();
        let c0 = bed.engine_cpu();
        let t = stream(bed, op, size, n).as_secs_f64();
        let c = bed.engine_cpu() - c0;
        let (ab1, ba1) = bed.frames.get();
        let data = if op == Op::Read { ba1 - ba0 } else { ab1 - ab0 };
        mbs.push((n * size) as f64 / t / 1e6);
        mps.push(n as f64 / t);
        cpu.push((n * size) as f64 / c.max(1e-9) / 1e6);
        fr.push(data as f64 / min_frames as f64);
    }
    if op == Op::Write {
        verify_last(bed, size, n);
    }
    let mbs_range = mbs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
        (lo.min(v), hi.max(v))
    });
    Point {
        mbs_range,
        mbs: median(&mut mbs),
        msgs: median(&mut mps),
        mb_per_cpu: median(&mut cpu),
        data_frames: median(&mut fr),
    }
}

/// 64 B WRITE round trips (post signaled WRITE, ring, wait for its CQE): per-message seconds.
pub fn latency(bed: &mut Bed, size: u64, iters: usize) -> Vec<f64> {
    let mut cqes = Vec::new();
    let mut v = Vec::with_capacity(iters);
    for i in 0..iters as u64 + 20 {
        let w = Wqe {
            wr_id: i,
            opcode: VRDMA_WR_RDMA_WRITE,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(bed.a.addr, size as u32, bed.a.key)],
            remote_addr: bed.b.addr + (i % 64) * 4096,
            rkey: bed.b.key,
            ..Default::default()
        };
        let t0 = Instant::now();
        bed.post(&w);
        bed.doorbell();
        bed.wait_a_success(&mut cqes, true, t0, "64 B WRITE");
        if i >= 20 {
            v.push(t0.elapsed().as_secs_f64());
        }
    }
    v
}

/// 64 B WRITE streams of `n` messages after a 256-message warm-up, `runs` times: the message
/// rates and the engine CPU seconds per message of each run.
pub fn small_write_rates(bed: &mut Bed, n: u64, runs: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut rates, mut cpu) = (Vec::new(), Vec::new());
    stream(bed, Op::Write, 64, 256);
    for _ in 0..runs {
        let c0 = bed.engine_cpu();
        let t = stream(bed, Op::Write, 64, n).as_secs_f64();
        cpu.push((bed.engine_cpu() - c0) / n as f64);
        rates.push(n as f64 / t);
    }
    (rates, cpu)
}

/// The throughput and 64 B tables for the links `modes` (`engine`: all three;
/// `engine-inproc`: in-process only, one thread, for profiles of the per-packet work).
pub fn run(quick: bool, modes: &[Mode]) {
    let runs = if quick { 3 } else { 5 };
    let mut tput = Table::new(
        "Engine: RC throughput (A -> B; READ: B -> A), median of runs; MB = 10^6 bytes",
        &[
            "link",
            "path MTU",
            "op",
            "msg size",
            "MB/s",
            "msgs/s",
            "MB per engine CPU-s",
            "data frames / min",
        ],
    );
    let mut small = Table::new(
        "Engine: 64 B RDMA WRITE (path MTU 1024): latency = post + doorbell .. CQE polled",
        &[
            "link",
            "latency median",
            "latency p99",
            "msgs/s (streamed)",
            "engine CPU per msg",
        ],
    );
    for &mode in modes {
        for mtu in [1024u32, 4096] {
            let mut bed = Bed::new(mode, mtu, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
            let budget: u64 = match (mode, quick) {
                (_, true) => 8 << 20,
                (Mode::InProc, false) => 32 << 20,
                (Mode::Udp | Mode::Fabric, false) => 16 << 20,
            };
            let mut points = vec![
                (Op::Write, 4u64 << 10),
                (Op::Write, 64 << 10),
                (Op::Write, 1 << 20),
                (Op::Send, 64 << 10),
                (Op::Read, 64 << 10),
            ];
            if quick && mtu == 4096 {
                points.retain(|p| p.0 == Op::Write);
            }
            for (op, size) in points {
                let p = point(&mut bed, op, size, budget, runs);
                tput.row(vec![
                    mode.name().into(),
                    mtu.to_string(),
                    op.name().into(),
                    fmt_size(size),
                    format!("{:.0}", p.mbs),
                    format!("{:.0}", p.msgs),
                    format!("{:.0}", p.mb_per_cpu),
                    format!("{:.2}", p.data_frames),
                ]);
                eprintln!(
                    "  {} mtu {mtu} {} {}: {:.0} MB/s",
                    mode.name(),
                    op.name(),
                    fmt_size(size),
                    p.mbs
                );
            }
            if mtu == 1024 {
                let iters = match (mode, quick) {
                    (Mode::InProc | Mode::Fabric, _) => 2000,
                    (Mode::Udp, true) => 200,
                    (Mode::Udp, false) => 1000,
                };
                let mut l = latency(&mut bed, 64, iters);
                let n = if quick { 5000 } else { 20000 };
                let (mut rates, mut cpu) = small_write_rates(&mut bed, n, runs);
                small.row(vec![
                    mode.name().into(),
                    crate::util::fmt_secs(median(&mut l)),
                    crate::util::fmt_secs(percentile(&mut l, 99.0)),
                    format!("{:.0}", median(&mut rates)),
                    crate::util::fmt_secs(median(&mut cpu)),
                ]);
            }
            bed.finish();
        }
    }
    tput.print();
    small.print();
}

/// Cost of the per-batch timer scan with many QPs: `transport::on_tick` (which the engine calls
/// once per batch) and the 64 B WRITE message rate in-process, with `k` idle QPs per device.
pub fn qp_scaling(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    let mut t = Table::new(
        "Engine: cost of idle QPs (each device also holds K idle RC QPs; in-process, path MTU \
         1024)",
        &[
            "idle QPs K",
            "on_tick (one batch)",
            "64 B WRITE msgs/s",
            "engine CPU per msg",
        ],
    );
    for k in [0u32, 1000, 10000] {
        let mut bed =
            Bed::with_idle_qps(Mode::InProc, 1024, 1 << 20, Reg::Pinned, Reg::Pinned, 0, k);
        let mut tick = crate::util::sample(Duration::from_millis(100), 50, 20000, || {
            let t0 = Instant::now();
            bed.tick_a();
            t0.elapsed().as_secs_f64()
        });
        let n = if quick { 3000 } else { 10000 };
        let (mut rates, mut cpu) = small_write_rates(&mut bed, n, runs);
        t.row(vec![
            k.to_string(),
            crate::util::fmt_secs(median(&mut tick)),
            format!("{:.0}", median(&mut rates)),
            crate::util::fmt_secs(median(&mut cpu)),
        ]);
        bed.finish();
    }
    t.print();
}
