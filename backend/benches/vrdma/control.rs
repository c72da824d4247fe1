//! `control-wait` section: how long a control command waits for the device while the data
//! path of another QP is busy. Today every control command takes the device-wide
//! `Mutex<Device>` that the engine holds per batch (ARCHITECTURE.md "Threads"); the planned
//! engine threads (#13 item 5) are to bound this by one batch of the command's own QP. This
//! measures the status quo: a probe thread takes device A's lock every 200 µs and records the
//! wait, once while one QP streams 64 KiB WRITEs over the fabric and once with the device idle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vrdma_backend::device::Device;

use crate::bed::{Bed, Mode, Reg};
use crate::engine::{stream, Op};
use crate::util::{fmt_secs, median, percentile};

/// Lock waits (seconds) of the probe until `stop` is set.
fn probe(dev: &Mutex<Device>, stop: &AtomicBool) -> Vec<f64> {
    let mut waits = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        // A poisoned lock means an engine panicked: the bench reports the wait all the same.
        drop(dev.lock());
        waits.push(t0.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_micros(200));
    }
    waits
}

/// "median M, p99 P, max X (N probes)" of `v`.
fn summary(v: &mut [f64]) -> String {
    if v.is_empty() {
        return "no probes".into();
    }
    format!(
        "median {}, p99 {}, max {} ({} probes)",
        fmt_secs(median(v)),
        fmt_secs(percentile(v, 99.0)),
        fmt_secs(percentile(v, 100.0)),
        v.len()
    )
}

pub fn run(quick: bool) {
    let bytes: u64 = if quick { 64 << 20 } else { 1 << 30 };
    let mut bed = Bed::new(Mode::Fabric, 4096, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
    stream(&mut bed, Op::Write, 64 << 10, 64);
    let Some(dev) = bed.device_a() else {
        unreachable!("a fabric bed runs engine threads");
    };
    let stop = AtomicBool::new(false);
    let n = bytes / (64 << 10);
    let (mut busy, elapsed) = std::thread::scope(|s| {
        let p = s.spawn(|| probe(&dev, &stop));
        let el = stream(&mut bed, Op::Write, 64 << 10, n);
        stop.store(true, Ordering::Relaxed);
        (p.join().unwrap_or_default(), el)
    });
    stop.store(false, Ordering::Relaxed);
    let mut idle = std::thread::scope(|s| {
        let p = s.spawn(|| probe(&dev, &stop));
        std::thread::sleep(elapsed);
        stop.store(true, Ordering::Relaxed);
        p.join().unwrap_or_default()
    });
    bed.finish();
    println!(
        "control-wait: device lock while one QP streams 64 KiB WRITEs ({:.0} MB/s): {}",
        (n * (64 << 10)) as f64 / elapsed.as_secs_f64() / 1e6,
        summary(&mut busy)
    );
    println!(
        "control-wait: device lock, device idle: {}",
        summary(&mut idle)
    );
}
