//! `control-wait` section: how long a control command waits for the device while the data
//! path of another QP is busy. A command that changes the device takes the device's
//! `HandoffLock` exclusively (`lock`); the engine's workers hold it shared per batch and hand
//! it to a waiting command between two units of work (one doorbell record, one received
//! buffer; ARCHITECTURE.md "Threads"). Queries and MODIFY_QP/CQ/SRQ take it shared (`read`,
//! `Device::handle_shared`), beside the workers, and wait for no unit of another QP ("Locks"). A probe thread takes device A's lock every 200 µs
//! and records the wait while one QP streams 64 KiB WRITEs over the fabric, alternating
//! between the two, then with the device idle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vrdma_backend::device::Device;
use vrdma_backend::guest::CmdOutcome;
use vrdma_backend::handoff::HandoffLock;
use vrdma_spec::*;

use crate::bed::{Bed, Mode, Reg};
use crate::engine::{stream, Op};
use crate::util::{fmt_secs, median, percentile};

/// Lock waits (seconds) of the probe until `stop` is set: exclusive (`lock`, handed off by the
/// engine) and shared (`read`, a query's), taken in turn so both see the same traffic.
fn probe(dev: &HandoffLock<Device>, stop: &AtomicBool) -> (Vec<f64>, Vec<f64>) {
    let (mut exclusive, mut shared) = (Vec::new(), Vec::new());
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        drop(dev.lock());
        exclusive.push(t0.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_micros(200));
        let t0 = Instant::now();
        drop(dev.read());
        shared.push(t0.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_micros(200));
    }
    (exclusive, shared)
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
    let ((mut busy, mut busy_query), elapsed) = std::thread::scope(|s| {
        let p = s.spawn(|| probe(&dev, &stop));
        let el = stream(&mut bed, Op::Write, 64 << 10, n);
        stop.store(true, Ordering::Relaxed);
        (p.join().unwrap_or_default(), el)
    });
    stop.store(false, Ordering::Relaxed);
    let (mut idle, _) = std::thread::scope(|s| {
        let p = s.spawn(|| probe(&dev, &stop));
        std::thread::sleep(elapsed);
        stop.store(true, Ordering::Relaxed);
        p.join().unwrap_or_default()
    });
    bed.finish();
    let ratio = |a: &mut [f64], b: &mut [f64]| {
        if a.is_empty() || b.is_empty() {
            return "no probes".to_string();
        }
        let (ma, pa) = (median(a), percentile(a, 99.0));
        let (mb, pb) = (median(b), percentile(b, 99.0));
        format!("median {:.2} x, p99 {:.2} x", ma / mb, pa / pb)
    };
    let exclusive_vs_query = ratio(&mut busy, &mut busy_query);
    println!(
        "control-wait: device lock while one QP streams 64 KiB WRITEs ({:.0} MB/s), exclusive \
         (handed off): {}",
        (n * (64 << 10)) as f64 / elapsed.as_secs_f64() / 1e6,
        summary(&mut busy)
    );
    println!(
        "control-wait: same stream, shared (a query or MODIFY_QP/CQ/SRQ, beside the \
         workers): {}",
        summary(&mut busy_query)
    );
    println!("control-wait: exclusive wait / shared wait: {exclusive_vs_query}");
    println!(
        "control-wait: device lock, device idle: {}",
        summary(&mut idle)
    );
}

/// Round trips (seconds) of the REG_DMA_MR and DEREG_MR commands.
#[derive(Default)]
struct Times {
    reg: Vec<f64>,
    dereg: Vec<f64>,
}

impl Times {
    fn push(&mut self, reg: f64, dereg: f64) {
        self.reg.push(reg);
        self.dereg.push(dereg);
    }
}

/// A command as the control queue runs it (`vhost_user::controlq`): beside the workers when
/// the device allows it, else on the exclusive device.
fn command(dev: &HandoffLock<Device>, op: u16, req: &[u8], resp: &mut Vec<u8>) -> u32 {
    if let Some(s) = dev.read().handle_shared(op, req, resp) {
        return s;
    }
    match dev.lock().handle_command(op, req, resp) {
        CmdOutcome::Done(s) => s,
        CmdOutcome::Parked(_) => VRDMA_STATUS_INVALID,
    }
}

/// REG_DMA_MR + DEREG_MR pairs, one every ~`PACE`, until `stop`: each command's round trip
/// and whether every command succeeded.
fn registration_churn(dev: &HandoffLock<Device>, stop: &AtomicBool) -> (Times, bool) {
    const PACE: Duration = Duration::from_micros(50);
    let mut resp = Vec::new();
    let mut ok = command(dev, VRDMA_CMD_CREATE_PD, &[], &mut resp) == VRDMA_STATUS_OK;
    let pd = VrdmaHandle::read_from(&resp).map_or(0, |h| h.handle);
    let mut times = Times::default();
    while ok && !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let c = VrdmaCmdRegMr {
            pdn: pd,
            access: VRDMA_ACCESS_LOCAL_WRITE,
            ..Default::default()
        };
        ok &= command(dev, VRDMA_CMD_REG_DMA_MR, c.as_bytes(), &mut resp) == VRDMA_STATUS_OK;
        let h = VrdmaHandle {
            handle: VrdmaRespRegMr::read_from(&resp).map_or(0, |r| r.lkey),
            ..Default::default()
        };
        let t1 = Instant::now();
        ok &= command(dev, VRDMA_CMD_DEREG_MR, h.as_bytes(), &mut resp) == VRDMA_STATUS_OK;
        times.push((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64());
        std::thread::sleep(PACE);
    }
    let h = VrdmaHandle {
        handle: pd,
        ..Default::default()
    };
    ok &= command(dev, VRDMA_CMD_DESTROY_PD, h.as_bytes(), &mut resp) == VRDMA_STATUS_OK;
    (times, ok)
}

/// `control-churn` section: a registration cache's churn (REG_DMA_MR + DEREG_MR pairs, as UCX
/// or MPI register and evict buffers) on device A while one QP streams 64 KiB WRITEs over the
/// fabric: the stream's rate with and without it, and the pairs' round trip. DEREG_MR runs
/// beside the workers (the unit fence) where the device allows it; on the exclusive device
/// every pair stops the workers for a hand-off.
pub fn churn(quick: bool) {
    let bytes: u64 = if quick { 256 << 20 } else { 2 << 30 };
    let mut bed = Bed::new(Mode::Fabric, 4096, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
    stream(&mut bed, Op::Write, 64 << 10, 64);
    let Some(dev) = bed.device_a() else {
        unreachable!("a fabric bed runs engine threads");
    };
    let n = bytes / (64 << 10);
    let rate = |el: Duration| (n * (64 << 10)) as f64 / el.as_secs_f64() / 1e6;
    let alone = rate(stream(&mut bed, Op::Write, 64 << 10, n));
    let stop = AtomicBool::new(false);
    let ((mut times, ok), with) = std::thread::scope(|s| {
        let c = s.spawn(|| registration_churn(&dev, &stop));
        let el = stream(&mut bed, Op::Write, 64 << 10, n);
        stop.store(true, Ordering::Relaxed);
        (c.join().unwrap_or_default(), rate(el))
    });
    bed.finish();
    let per_s = times.reg.len() as f64 / (bytes as f64 / 1e6 / with);
    println!(
        "control-churn: one QP's 64 KiB WRITE stream alone {alone:.0} MB/s, beside \
         REG_DMA_MR+DEREG_MR pairs ({per_s:.0}/s{}) {with:.0} MB/s: {:.2} x",
        if ok { "" } else { ", A COMMAND FAILED" },
        with / alone
    );
    println!(
        "control-churn: beside the stream, REG_DMA_MR: {}",
        summary(&mut times.reg)
    );
    println!(
        "control-churn: beside the stream, DEREG_MR (waits for the units in flight): {}",
        summary(&mut times.dereg)
    );
}
