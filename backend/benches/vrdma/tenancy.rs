//! Many tenants on one fabric ([tenancy] issue 39, spec §16.4): an RC stream's rate beside a
//! port flooding its receiver, relative to alone; and 8 devices (4 RC pairs, 8 engine threads)
//! on one fabric at once: the aggregate rate, and the slowest pair against its fair share.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrdma_backend::device::RecordingOutput;
use vrdma_backend::fabric::{Fabric, PortId};

use crate::bed::Bed;
use crate::engine::{stream, Op};
use crate::util::median;

/// The flooding port's MAC (not a node's: those are 52:54:00:00:00:<id>).
const FLOOD_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xf1];
/// Frames per second the flooding port offers (`VRDMA_BENCH_FLOOD_FPS` overrides): a guest's
/// raw-socket flood on a real vCPU (the TCG guest managed 10,000; a KVM guest many
/// times that), more than the receiving engine drains, so its queue overflows (with one
/// shared queue, measured here: 3.5 million frames dropped in a run, RC retransmitting). Paced,
/// so the flooder's own CPU time does not decide the figure on a 2-core host.
const FLOOD_FPS: u64 = 1_000_000;
/// Frames per `Fabric::forward` call of the flooder.
const FLOOD_BATCH: usize = 64;

/// The MAC of bench node `id` (tests/common `Node`).
fn node_mac(id: u8) -> [u8; 6] {
    [0x52, 0x54, 0, 0, 0, id]
}

/// An IPv4/UDP frame from the flooder to `dst`, UDP destination `port`, `len` bytes. For port
/// 4791 its BTH names a QP that does not exist (the receiver drops it after parsing).
fn flood_frame(dst: [u8; 6], port: u16, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&FLOOD_MAC);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 0xf1]);
    f[30..34].copy_from_slice(&[10, 0, 0, dst[5]]);
    f[34..36].copy_from_slice(&49152u16.to_be_bytes());
    f[36..38].copy_from_slice(&port.to_be_bytes());
    f[38..40].copy_from_slice(&((len - 34) as u16).to_be_bytes());
    if port == 4791 {
        // BTH: RDMA WRITE ONLY to QP 0xabcde, PSN 0.
        f[42] = 0x0a;
        f[46..50].copy_from_slice(&0x000a_bcde_u32.to_be_bytes());
    }
    f
}

/// The flood: netdev unicast to `victim`, broadcasts, RoCE frames to `victim`, in turn.
fn flood_mix(victim: [u8; 6]) -> Vec<Vec<u8>> {
    let mut bcast = flood_frame(victim, 67, 342);
    bcast[..6].copy_from_slice(&[0xff; 6]);
    (0..FLOOD_BATCH)
        .map(|i| match i % 3 {
            0 => flood_frame(victim, 9, 1500),
            1 => bcast.clone(),
            _ => flood_frame(victim, 4791, 1100),
        })
        .collect()
}

/// Flood from `port` at [`FLOOD_FPS`] until `stop`, adding the frames offered to `sent`;
/// drains what the devices hand their guests (`outs`) as a guest's netdev would.
fn flood(
    fabric: &Fabric,
    port: PortId,
    outs: &[Arc<RecordingOutput>],
    stop: &AtomicBool,
    sent: &AtomicU64,
) {
    let frames = flood_mix(node_mac(2));
    let slices: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let fps = std::env::var("VRDMA_BENCH_FLOOD_FPS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(FLOOD_FPS);
    let start = Instant::now();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = start.elapsed().as_secs_f64() * fps as f64;
        if (n as f64) < due {
            fabric.forward(port, &slices);
            n += FLOOD_BATCH as u64;
            for o in outs {
                drop(o.take_frames());
            }
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    sent.fetch_add(n, Ordering::Relaxed);
}

/// MB/s of one 64 KiB RC WRITE stream of `bytes`, or 0 if it failed (a QP error).
fn one(bed: &mut Bed, bytes: u64) -> f64 {
    let n = (bytes / (64 << 10)).max(64);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        stream(bed, Op::Write, 64 << 10, n).as_secs_f64()
    }));
    match r {
        Ok(t) => (n * (64 << 10)) as f64 / t / 1e6,
        Err(_) => 0.0,
    }
}

/// A drop counter of the fabric's port `port` (`reason`), from its Prometheus text (`None`
/// if the fabric has no such counter).
fn drops(fabric: &Fabric, port: PortId, reason: &str) -> Option<u64> {
    let key = format!("port=\"port{port}\",kind=\"device\",reason=\"{reason}\"}} ");
    fabric
        .render_stats()
        .lines()
        .find_map(|l| l.split_once(&key).and_then(|(_, v)| v.trim().parse().ok()))
}

/// The fairness headline: (flooded / alone, alone MB/s, flooded MB/s, flood frames/s offered,
/// frames dropped at the receiver's queue, of them the stream's own if the fabric tells).
pub fn fairness(bytes: u64, runs: usize) -> (f64, f64, f64, f64, u64, Option<u64>) {
    let (mut beds, fabric, raw) = Bed::fabric_pairs(1, 4096, 16 << 20, &[FLOOD_MAC]);
    let mut bed = beds.pop().expect("one pair");
    stream(&mut bed, Op::Write, 64 << 10, 64);
    let (mut alone, mut flooded) = (Vec::new(), Vec::new());
    let sent = AtomicU64::new(0);
    let mut flood_secs = 0.0;
    let mut broken = false;
    for _ in 0..runs {
        alone.push(one(&mut bed, bytes));
        if broken {
            continue;
        }
        let stop = AtomicBool::new(false);
        let t0 = Instant::now();
        let outs = bed.outs.clone();
        let r = std::thread::scope(|s| {
            let (f, st, se, o) = (&fabric, &stop, &sent, &outs);
            let port = raw[0];
            let h = s.spawn(move || flood(f, port, o, st, se));
            // Let the flood fill the queues first.
            std::thread::sleep(Duration::from_millis(20));
            let r = one(&mut bed, bytes);
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
            r
        });
        flood_secs += t0.elapsed().as_secs_f64();
        broken = r == 0.0;
        flooded.push(r);
    }
    for o in &bed.outs {
        drop(o.take_frames());
    }
    if !broken {
        bed.finish();
    }
    let (a, f) = (median(&mut alone), median(&mut flooded));
    let fps = sent.load(Ordering::Relaxed) as f64 / flood_secs.max(1e-9);
    // Ports: the pair's A and B, then the flooder (`Bed::fabric_pairs`).
    let full = drops(&fabric, 1, "full").unwrap_or(0);
    (f / a, a, f, fps, full, drops(&fabric, 0, "over_share"))
}

/// The 8-device headline: (aggregate MB/s, slowest pair / fair share, one pair alone MB/s),
/// with the devices' engines in `group` if given (each pair placed as a network of its own).
pub fn eight_devices(
    bytes: u64,
    runs: usize,
    group: Option<&vrdma_backend::transport::engine::EngineGroup>,
) -> (f64, f64, f64) {
    let (mut beds, _fabric, _) = Bed::fabric_pairs_in(4, 4096, 16 << 20, &[], group);
    for b in beds.iter_mut() {
        stream(b, Op::Write, 64 << 10, 64);
    }
    let (mut alone, mut aggregate, mut slowest) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        alone.push(one(&mut beds[0], bytes));
        let t0 = Instant::now();
        let rates: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = beds
                .iter_mut()
                .map(|b| s.spawn(move || one(b, bytes)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).collect()
        });
        let wall = t0.elapsed().as_secs_f64();
        let agg = 4.0 * (bytes / (64 << 10)).max(64) as f64 * 65536.0 / wall / 1e6;
        aggregate.push(agg);
        // Each pair's own rate against the pairs' mean (the aggregate's wall time is the
        // slowest pair's, so against it the slowest pair would always be 1.00).
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        slowest.push(min / mean);
    }
    for b in beds {
        b.finish();
    }
    (
        median(&mut aggregate),
        median(&mut slowest),
        median(&mut alone),
    )
}
