//! The closing headline lines of `make bench` ([datapath] issue), every figure measured in this
//! run: memcpy on one core as the yardstick, RC WRITE 64 KiB over the UDP uplink (two engine
//! threads on loopback) at Ethernet MTU 9000 (path MTU 4096) and 1500 (path MTU 1024), the
//! in-process and fabric (two devices of one daemon, an engine thread each) figures, and the 64 B
//! WRITE rate with 10000 idle QPs per device relative to none.

use std::hint::black_box;
use std::time::Instant;

use crate::bed::{Bed, Mode, Reg};
use crate::engine::{latency, point, stream, Op, Point};
use crate::util::{fmt_secs, loadavg, median};

/// Payload bytes per run of a 64 KiB point. A full run is long enough (tens to hundreds of
/// ms) for the scheduler to spread the engine threads over the cores: 32 MiB runs (about 8 ms
/// on the fabric) came out bimodal on a shared machine (3.0 and 5.0 GB/s in back-to-back
/// runs), apparently as both engines did or did not share one core for the whole run.
fn stream_bytes(quick: bool) -> u64 {
    if quick {
        8 << 20
    } else {
        256 << 20
    }
}

/// memcpy bandwidth of one core: 64 MiB copies (far beyond the caches), MB (10^6 B) per second.
fn memcpy_mbs(runs: usize) -> f64 {
    let len = 64 << 20;
    let src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src); // first touch
    let mut v = Vec::new();
    for _ in 0..runs.max(3) {
        let t0 = Instant::now();
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
        v.push(len as f64 / t0.elapsed().as_secs_f64() / 1e6);
    }
    median(&mut v)
}

/// 64 B WRITE message rate in-process with 10000 idle QPs per device relative to none, both
/// as wall-clock rate and per CPU second of the bench thread (which runs the transport itself;
/// independent of how much of the shared machine the bench got). The two beds alternate run by
/// run so load changes hit both alike.
/// Returns (rate with none, wall ratio, per-CPU-s ratio, bench-thread CPU seconds per message
/// with none).
fn idle_ratio(n: u64, runs: usize) -> (f64, f64, f64, f64) {
    let mut beds = [0u32, 10_000].map(|idle| {
        let mut b = Bed::with_idle_qps(
            Mode::InProc,
            1024,
            1 << 20,
            Reg::Pinned,
            Reg::Pinned,
            0,
            idle,
        );
        stream(&mut b, Op::Write, 64, 256);
        b
    });
    let (mut wall, mut cpu) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..runs {
        for (k, bed) in beds.iter_mut().enumerate() {
            let c0 = bed.engine_cpu();
            let el = stream(bed, Op::Write, 64, n).as_secs_f64();
            let c = bed.engine_cpu() - c0;
            wall[k].push(n as f64 / el);
            cpu[k].push(n as f64 / c.max(1e-9));
        }
    }
    for b in beds {
        b.finish();
    }
    let none = median(&mut wall[0]);
    let none_per_cpu = median(&mut cpu[0]);
    (
        none,
        median(&mut wall[1]) / none,
        median(&mut cpu[1]) / none_per_cpu,
        1.0 / none_per_cpu,
    )
}

/// The UDP uplink points only (`udp` section: what to profile with `perf record`).
pub fn udp(quick: bool) -> Vec<(u16, Point)> {
    let runs = if quick { 3 } else { 5 };
    let budget: u64 = stream_bytes(quick);
    let mut udp = Vec::new();
    for (eth, pmtu) in [(9000u16, 4096u32), (1500, 1024)] {
        let mut bed = Bed::new(Mode::Udp, pmtu, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
        assert_eq!(bed.eth_mtu, eth, "bed Ethernet MTU for path MTU {pmtu}");
        let p = point(&mut bed, Op::Write, 64 << 10, budget, runs);
        bed.finish();
        udp.push((eth, p));
    }
    udp
}

/// The fabric 64 KiB point alone (`fabric` section: what to profile with `perf record`).
pub fn fabric_only(quick: bool) {
    let runs = if quick { 3 } else { 10 };
    let budget: u64 = stream_bytes(quick);
    let mut bed = Bed::new(Mode::Fabric, 4096, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
    let p = point(&mut bed, Op::Write, 64 << 10, budget, runs);
    bed.finish();
    println!(
        "fabric RC WRITE 64 KiB 1 QP: {:.0} MB/s ({:.0} MB per engine CPU-s, runs {:.0}-{:.0})",
        p.mbs, p.mb_per_cpu, p.mbs_range.0, p.mbs_range.1
    );
}

/// Large messages at a small path MTU on the fabric: RC WRITE 1 MiB at path MTU 1024 against
/// 64 KiB at path MTU 4096 (the [cost] issue's pair) and 64 KiB at 1024, the beds alternated
/// run by run; medians. Returns (1 MiB@1024, 64 KiB@4096, 64 KiB@1024).
pub fn large_at_small_mtu(bytes: u64, runs: usize) -> (Point, Point, Point) {
    let cases = [(1024u32, 1u64 << 20), (4096, 64 << 10), (1024, 64 << 10)];
    let mut beds = cases.map(|(mtu, size)| {
        let mut b = Bed::new(Mode::Fabric, mtu, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
        stream(&mut b, Op::Write, size, 16);
        b
    });
    let mut per_run: [Vec<Point>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (k, bed) in beds.iter_mut().enumerate() {
            per_run[k].push(point(bed, Op::Write, cases[k].1, bytes, 1));
        }
    }
    for b in beds {
        b.finish();
    }
    let [a, b, c] = per_run.map(|v| {
        let mut mbs: Vec<f64> = v.iter().map(|p| p.mbs).collect();
        let mut cpu: Vec<f64> = v.iter().map(|p| p.mb_per_cpu).collect();
        let mut fr: Vec<f64> = v.iter().map(|p| p.data_frames).collect();
        let mut msgs: Vec<f64> = v.iter().map(|p| p.msgs).collect();
        let lo = mbs.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = mbs.iter().cloned().fold(0.0, f64::max);
        Point {
            mbs: median(&mut mbs),
            msgs: median(&mut msgs),
            mb_per_cpu: median(&mut cpu),
            data_frames: median(&mut fr),
            mbs_range: (lo, hi),
        }
    });
    (a, b, c)
}

pub fn print_large_at_small_mtu((big, base, small): (Point, Point, Point)) {
    println!(
        "headline: fabric RC WRITE 1 MiB path MTU 1024 vs 64 KiB path MTU 4096: {:.2} x per \
         engine CPU-s ({:.0} vs {:.0} MB per engine CPU-s; wall {:.0} vs {:.0} MB/s; 64 KiB at \
         MTU 1024: {:.0} MB per engine CPU-s, {:.0} MB/s; data frames / min {:.2})",
        big.mb_per_cpu / base.mb_per_cpu,
        big.mb_per_cpu,
        base.mb_per_cpu,
        big.mbs,
        base.mbs,
        small.mb_per_cpu,
        small.mbs,
        big.data_frames
    );
}

/// The large-message point alone (section `fabric-mtu`, for `perf record`).
pub fn large_mtu_only(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    print_large_at_small_mtu(large_at_small_mtu(stream_bytes(quick) / 4, runs));
}

/// What any sharding of one device's QPs over engine threads could gain on this machine at
/// most: the aggregate 64 KiB WRITE rate of two independent fabric pairs (two daemons' worth
/// of devices, four engine threads, two bench threads) run at the same time, relative to one
/// pair alone. Alternated run by run; medians. Not the `--engine-threads` figure
/// (`workers.rs`), the ceiling it meets.
fn pair_ceiling(bytes: u64, runs: usize) -> f64 {
    let one = |bed: &mut Bed| {
        let n = (bytes / (64 << 10)).max(64);
        let t = stream(bed, Op::Write, 64 << 10, n).as_secs_f64();
        (n * (64 << 10)) as f64 / t / 1e6
    };
    let new_bed = || {
        let mut b = Bed::new(Mode::Fabric, 4096, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
        stream(&mut b, Op::Write, 64 << 10, 64);
        b
    };
    let mut beds = [new_bed(), new_bed()];
    let (mut single, mut both) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        single.push(one(&mut beds[0]));
        let [a, b] = &mut beds;
        let (ra, rb) = std::thread::scope(|s| {
            let ta = s.spawn(|| one(a));
            let rb = one(b);
            (ta.join().unwrap_or(0.0), rb)
        });
        both.push(ra + rb);
    }
    for b in beds {
        b.finish();
    }
    median(&mut both) / median(&mut single)
}

/// The `--engine-threads` point alone (section `workers`).
pub fn workers_only(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    let w = crate::workers::two_vs_one(stream_bytes(quick), runs);
    println!("workers: {}", workers_figures(&w));
}

/// The 2-vs-1 engine threads figures, for the `workers` and `headline` lines.
fn workers_figures(w: &crate::workers::TwoVsOne) -> String {
    format!(
        "engine threads 2 vs 1, 4 QPs, 64 KiB WRITE: {:.2} x ({:.0} vs {:.0} MB/s); \
         engine CPU per message {:.2} x ({} vs {})",
        w.ratio,
        w.one_mbs,
        w.two_mbs,
        w.two_cpu / w.one_cpu,
        fmt_secs(w.two_cpu),
        fmt_secs(w.one_cpu)
    )
}

/// The engine-thread ceiling alone (section `pair-ceiling`).
pub fn ceiling_only(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    let budget: u64 = stream_bytes(quick);
    println!(
        "pair-ceiling: two independent fabric pairs at once vs one, 64 KiB WRITE: {:.2} x",
        pair_ceiling(budget, runs)
    );
}

/// The fabric 64 B points alone (`fabric-64` section: message rate and latency, to profile).
pub fn fabric_small(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    let n = if quick { 5000 } else { 50000 };
    let mut bed = Bed::new(Mode::Fabric, 1024, 1 << 20, Reg::Pinned, Reg::Pinned, 0);
    let (mut rates, mut cpu) = crate::engine::small_write_rates(&mut bed, n, runs);
    let c0 = bed.engine_cpu();
    let mut lat = latency(&mut bed, 64, 2000);
    let lat_cpu = (bed.engine_cpu() - c0) / lat.len() as f64;
    bed.finish();
    println!(
        "fabric 64 B RC WRITE: {:.2} Mpps ({} engine CPU per msg), median latency {} ({} engine \
         CPU per round trip)",
        median(&mut rates) / 1e6,
        fmt_secs(median(&mut cpu)),
        fmt_secs(median(&mut lat)),
        fmt_secs(lat_cpu)
    );
}

fn print_fairness(
    (ratio, alone, flooded, fps, full, mine): (f64, f64, f64, f64, u64, Option<u64>),
) {
    println!(
        "headline: fabric fairness, RC stream beside a flooding port: {ratio:.2} of alone \
         ({flooded:.0} vs {alone:.0} MB/s; 64 KiB WRITE, the flooder offering {:.0} kframes/s of \
         netdev unicast, broadcast and RoCE frames to the receiver; {full} frames dropped at its \
         queue, of them the stream's: {})",
        fps / 1e3,
        mine.map_or("not counted".to_string(), |n| n.to_string())
    );
}

/// The 8-device point: `threads` says what engine threads ran it.
fn print_tenants((aggregate, slowest, alone): (f64, f64, f64), threads: &str) {
    println!(
        "headline: 8 devices on one fabric, 4 RC pairs: aggregate {aggregate:.0} MB/s, slowest \
         pair {slowest:.2} of fair share (the pairs' mean rate; aggregate {:.2} of one pair alone, {alone:.0} MB/s; {threads}, \
         64 KiB WRITE)",
        aggregate / alone,
    );
}

/// The 8-device point twice: as the benches' engines run (a thread each unless
/// `VRDMA_BENCH_SHARED`), then in an engine group placed as the daemon's `--shared-engine`
/// places tenant networks (a pair each).
fn tenants_both(bytes: u64, runs: usize) -> [((f64, f64, f64), String); 2] {
    let usual = crate::tenancy::eight_devices(bytes, runs, None);
    let group = crate::bed::placed_group();
    let placed = crate::tenancy::eight_devices(bytes, runs, Some(&group));
    [
        (usual, crate::bed::engine_threads_of(8)),
        (placed, crate::bed::engine_threads_in(8, Some(&group))),
    ]
}

/// The fairness headline point alone (section `fairness`).
pub fn fairness_only(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    print_fairness(crate::tenancy::fairness(stream_bytes(quick), runs));
}

/// The 8-device headline point alone (section `tenants-8`).
pub fn tenants_only(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    for (t, threads) in tenants_both(stream_bytes(quick) / 4, runs) {
        print_tenants(t, &threads);
    }
}

/// The 10000-idle-QP headline point alone (section `idle-qps`, for `perf record`).
pub fn idle_only(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    let n = if quick { 5000 } else { 20000 };
    let (none, idle_wall, idle_cpu, _) = idle_ratio(n, runs);
    println!(
        "idle-qps: 10000 idle QPs: 64 B WRITE rate {idle_wall:.2} of none (per CPU-s: \
         {idle_cpu:.2}; none: {:.2} Mpps)",
        none / 1e6
    );
}

pub fn print_udp(udp: &[(u16, Point)]) {
    for (eth, p) in udp {
        println!(
            "headline: udp uplink RC WRITE 64 KiB MTU {eth}: {:.0} MB/s ({:.0} MB per engine \
             CPU-s, data frames / min {:.2}, runs {:.0}-{:.0})",
            p.mbs, p.mb_per_cpu, p.data_frames, p.mbs_range.0, p.mbs_range.1
        );
    }
}

pub fn run(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    let budget: u64 = stream_bytes(quick);
    println!();
    println!(
        "Headline (each figure measured in this run; load average {} before)",
        loadavg()
    );
    let memcpy = memcpy_mbs(runs);
    let udp = udp(quick);
    let mut bed = Bed::new(Mode::InProc, 4096, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
    let inproc = point(&mut bed, Op::Write, 64 << 10, budget, runs);
    bed.finish();
    let mut bed = Bed::new(Mode::InProc, 1024, 1 << 20, Reg::Pinned, Reg::Pinned, 0);
    let mut lat = latency(&mut bed, 64, 2000);
    bed.finish();
    let n = if quick { 5000 } else { 20000 };
    // Two devices of one daemon, each with its engine thread, on the fabric.
    let mut bed = Bed::new(Mode::Fabric, 4096, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
    let fabric = point(&mut bed, Op::Write, 64 << 10, budget, runs);
    bed.finish();
    let mut bed = Bed::new(Mode::Fabric, 1024, 1 << 20, Reg::Pinned, Reg::Pinned, 0);
    let (mut rates, mut fab_cpu) = crate::engine::small_write_rates(&mut bed, n, runs);
    let mut fab_lat = latency(&mut bed, 64, 2000);
    bed.finish();
    let (none, idle_wall, idle_cpu, inproc_cpu) = idle_ratio(n, runs);
    let large = large_at_small_mtu(budget / 4, runs);
    let ceiling = pair_ceiling(budget, runs);
    let w = crate::workers::two_vs_one(budget, runs);
    let fairness = crate::tenancy::fairness(budget, runs);
    let tenants = tenants_both(budget / 4, runs);
    println!("headline: memcpy 1 core: {memcpy:.0} MB/s");
    println!(
        "headline: in-process RC WRITE 64 KiB path MTU 4096 (one thread, both sides): {:.0} MB/s \
         ({:.1} % of memcpy; {:.0} MB per CPU-s of that thread)",
        inproc.mbs,
        inproc.mbs / memcpy * 100.0,
        inproc.mb_per_cpu
    );
    println!(
        "headline: in-process 64 B RC WRITE: {:.2} Mpps, median latency {} ({} CPU per msg, \
         one thread both sides)",
        none / 1e6,
        fmt_secs(median(&mut lat)),
        fmt_secs(inproc_cpu)
    );
    println!(
        "headline: fabric RC WRITE 64 KiB 1 QP: {:.0} MB/s ({:.1} % of memcpy; {:.0} MB per \
         engine CPU-s = {:.2} of memcpy, data frames / min {:.2}, runs {:.0}-{:.0})",
        fabric.mbs,
        fabric.mbs / memcpy * 100.0,
        fabric.mb_per_cpu,
        fabric.mb_per_cpu / memcpy,
        fabric.data_frames,
        fabric.mbs_range.0,
        fabric.mbs_range.1
    );
    println!(
        "headline: fabric 64 B RC WRITE: {:.2} Mpps, median latency {} ({} engine CPU per msg)",
        median(&mut rates) / 1e6,
        fmt_secs(median(&mut fab_lat)),
        fmt_secs(median(&mut fab_cpu))
    );
    print_large_at_small_mtu(large);
    print_udp(&udp);
    println!(
        "headline: {}; the workers of a device share it, each QP under its own lock; this \
         machine's ceiling for any sharding: two independent fabric pairs at once give \
         {ceiling:.2} x one pair",
        workers_figures(&w)
    );
    println!(
        "headline: 10000 idle QPs: 64 B WRITE rate {idle_wall:.2} of none (per CPU-s: \
         {idle_cpu:.2})"
    );
    print_fairness(fairness);
    for (t, threads) in tenants {
        print_tenants(t, &threads);
    }
    println!("headline: load average {} after", loadavg());
}
