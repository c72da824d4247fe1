//! `control-wait` section: how long a control command waits for the device while the data
//! path of another QP is busy. A command that changes the device takes the device's
//! `HandoffLock` exclusively (`lock`); the engine's workers hold it shared per batch and hand
//! it to a waiting command between two units of work (one doorbell record, one received
//! buffer; ARCHITECTURE.md "Locks"). Queries and MODIFY_QP/CQ/SRQ take it shared (`read`,
//! `Device::handle_shared`), beside the workers, and wait for no unit of another QP ("Control commands"). A probe thread takes device A's lock every 200 µs
//! and records the wait while one QP streams 64 KiB WRITEs over the fabric, alternating
//! between the two, then with the device idle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vrdma_backend::device::Device;
use vrdma_backend::guest::CmdOutcome;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::engine::EngineSender;
use vrdma_backend::vhost_user::controlq::ordered_after_doorbells;
use vrdma_backend::vhost_user::DOORBELL_FENCE_LIMIT;
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

/// Round trips (seconds) of the two commands of each pair, the part of the undo's spent in
/// the doorbell fence, and how many commands needed the exclusive device.
#[derive(Default)]
struct Times {
    make: Vec<f64>,
    undo: Vec<f64>,
    fence: Vec<f64>,
    exclusive: usize,
}

/// The control queue's doorbell fence (spec §8) before `op`, if `op` is one of the commands
/// that wait for it (`controlq::ordered_after_doorbells`): the seconds it took.
fn fence(sender: &EngineSender, op: u16) -> Option<f64> {
    let hdr = VrdmaCmdHdr {
        opcode: op,
        ..Default::default()
    };
    if !ordered_after_doorbells(hdr.as_bytes()) {
        return None;
    }
    let t0 = Instant::now();
    sender.fence(DOORBELL_FENCE_LIMIT);
    Some(t0.elapsed().as_secs_f64())
}

/// A command as the control queue runs it (`vhost_user::controlq`): beside the workers when
/// the device allows it, else on the exclusive device. The status, and whether it ran beside
/// the workers.
fn command(dev: &HandoffLock<Device>, op: u16, req: &[u8], resp: &mut Vec<u8>) -> (u32, bool) {
    if let Some(s) = dev.read().handle_shared(op, req, resp) {
        return (s, true);
    }
    match dev.lock().handle_command(op, req, resp) {
        CmdOutcome::Done(s) => (s, false),
        CmdOutcome::Parked(_) => (VRDMA_STATUS_INVALID, false),
    }
}

/// One kind of pair: a command that makes an object, the one that undoes it, and where the
/// made object's handle is in the response.
struct Pair<'a> {
    make: (u16, &'a [u8]),
    undo: u16,
    handle: fn(&[u8]) -> u32,
}

/// `pair` over and over, one every ~`PACE`, until `stop`: each command's round trip and
/// whether every command succeeded.
fn churn_pairs(
    dev: &HandoffLock<Device>,
    sender: &EngineSender,
    pair: &Pair,
    stop: &AtomicBool,
) -> (Times, bool) {
    const PACE: Duration = Duration::from_micros(50);
    let mut resp = Vec::new();
    let mut times = Times::default();
    let mut ok = true;
    let run = |op, req: &[u8], resp: &mut Vec<u8>, times: &mut Times| {
        let (status, beside) = command(dev, op, req, resp);
        times.exclusive += usize::from(!beside);
        status == VRDMA_STATUS_OK
    };
    while ok && !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        ok &= run(pair.make.0, pair.make.1, &mut resp, &mut times);
        let h = VrdmaHandle {
            handle: (pair.handle)(&resp),
            ..Default::default()
        };
        let t1 = Instant::now();
        if let Some(f) = fence(sender, pair.undo) {
            times.fence.push(f);
        }
        ok &= run(pair.undo, h.as_bytes(), &mut resp, &mut times);
        times.make.push((t1 - t0).as_secs_f64());
        times.undo.push(t1.elapsed().as_secs_f64());
        std::thread::sleep(PACE);
    }
    (times, ok)
}

/// `control-churn` section: a registration cache's churn (REG_DMA_MR + DEREG_MR pairs, as UCX
/// or MPI register and evict buffers) and a connection churn (CREATE_QP + DESTROY_QP pairs,
/// as rdma_cm servers accept and close) on device A while one QP streams 64 KiB WRITEs over
/// the fabric: the stream's rate with and without each, the pairs' round trip and how many
/// commands needed the exclusive device. DEREG_MR and DESTROY_QP run beside the workers (the
/// unit fence) where the device allows it; on the exclusive device every pair stops the
/// workers for a hand-off. Before either, as in the control queue, the doorbell fence waits
/// until the workers have run the doorbells rung so far (the stream's, here).
pub fn churn(quick: bool) {
    let bytes: u64 = if quick { 256 << 20 } else { 2 << 30 };
    let mut bed = Bed::new(Mode::Fabric, 4096, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
    stream(&mut bed, Op::Write, 64 << 10, 64);
    let (Some(dev), Some(sender)) = (bed.device_a(), bed.sender_a()) else {
        unreachable!("a fabric bed runs engine threads");
    };
    let mut resp = Vec::new();
    let (st, _) = command(&dev, VRDMA_CMD_CREATE_PD, &[0; 8], &mut resp);
    let pd = VrdmaHandle::read_from(&resp).map_or(0, |h| h.handle);
    let reg = VrdmaCmdRegMr {
        pdn: pd,
        access: VRDMA_ACCESS_LOCAL_WRITE,
        ..Default::default()
    };
    let spare_qp = bed.spare_qp_a.clone();
    let pairs = [
        (
            "REG_DMA_MR+DEREG_MR",
            Pair {
                make: (VRDMA_CMD_REG_DMA_MR, reg.as_bytes()),
                undo: VRDMA_CMD_DEREG_MR,
                handle: |r| VrdmaRespRegMr::read_from(r).map_or(0, |r| r.lkey),
            },
        ),
        (
            "CREATE_QP+DESTROY_QP",
            Pair {
                make: (VRDMA_CMD_CREATE_QP, &spare_qp),
                undo: VRDMA_CMD_DESTROY_QP,
                handle: |r| VrdmaRespCreateQp::read_from(r).map_or(0, |r| r.qpn),
            },
        ),
    ];
    let n = bytes / (64 << 10);
    let rate = |el: Duration| (n * (64 << 10)) as f64 / el.as_secs_f64() / 1e6;
    let alone = rate(stream(&mut bed, Op::Write, 64 << 10, n));
    let mut lines = Vec::new();
    for (what, pair) in &pairs {
        let stop = AtomicBool::new(false);
        let ((times, ok), with) = std::thread::scope(|s| {
            let c = s.spawn(|| churn_pairs(&dev, &sender, pair, &stop));
            let el = stream(&mut bed, Op::Write, 64 << 10, n);
            stop.store(true, Ordering::Relaxed);
            (c.join().unwrap_or_default(), rate(el))
        });
        lines.push((
            *what,
            pair.make.0,
            pair.undo,
            times,
            ok && st == VRDMA_STATUS_OK,
            with,
        ));
    }
    bed.finish();
    for (what, make, undo, mut times, ok, with) in lines {
        let per_s = times.make.len() as f64 / (bytes as f64 / 1e6 / with);
        println!(
            "control-churn: one QP's 64 KiB WRITE stream alone {alone:.0} MB/s, beside \
             {what} pairs ({per_s:.0}/s, {} of {} commands exclusive{}) {with:.0} MB/s: {:.2} x",
            times.exclusive,
            2 * times.make.len(),
            if ok { "" } else { ", A COMMAND FAILED" },
            with / alone
        );
        println!(
            "control-churn: beside the stream, {}: {}",
            opcode_name(make),
            summary(&mut times.make)
        );
        println!(
            "control-churn: beside the stream, {} (the doorbell fence, then it waits for the \
             units in flight): {}",
            opcode_name(undo),
            summary(&mut times.undo)
        );
        println!(
            "control-churn: of which the doorbell fence: {}",
            summary(&mut times.fence)
        );
    }
}

fn opcode_name(op: u16) -> &'static str {
    match op {
        VRDMA_CMD_REG_DMA_MR => "REG_DMA_MR",
        VRDMA_CMD_DEREG_MR => "DEREG_MR",
        VRDMA_CMD_CREATE_QP => "CREATE_QP",
        VRDMA_CMD_DESTROY_QP => "DESTROY_QP",
        _ => "command",
    }
}
