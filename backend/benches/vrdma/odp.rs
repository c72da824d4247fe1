//! [odp] figures: registration latency of explicit ODP vs implicit vs pinned page-list MRs by
//! size (device level, `Device::handle_command`), first-touch cost per 2 MiB chunk with a driver
//! stand-in answering page requests, and steady-state WRITE throughput implicit vs pinned.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vrdma_backend::device::{Device, DeviceConfig, RecordingOutput};
use vrdma_backend::guest::GuestMem;
use vrdma_spec::*;

use crate::bed::{Bed, Mode, Reg, CHUNK, VA_A, VA_B};
use crate::common::{odp_mr_req, Wqe, ACC_ALL};
use crate::engine::{point, Op};
use crate::util::{fmt_secs, fmt_size, median, sample, Table};

const GIB: u64 = 1 << 30;
/// Guest RAM of the registration device: 1 GiB + 16 MiB at this GPA.
const RAM_BASE: u64 = 0x1_0000_0000;

fn cmd(dev: &mut Device, op: u16, req: &[u8]) -> (u32, Vec<u8>) {
    let mut resp = Vec::new();
    let st = dev.handle_command(op, req, &mut resp);
    (st.status().expect("bench commands complete at once"), resp)
}

fn dereg(dev: &mut Device, key: u32) {
    let h = VrdmaHandle {
        handle: key,
        reserved: 0,
    };
    let (st, _) = cmd(dev, VRDMA_CMD_DEREG_MR, h.as_bytes());
    assert_eq!(st, VRDMA_STATUS_OK, "DEREG_MR");
}

fn key_of(resp: &[u8]) -> u32 {
    VrdmaRespRegMr::read_from(resp).expect("reg resp").lkey
}

/// The REG_MR request for `[RAM_BASE, RAM_BASE + size)` with its 4 KiB page list, built the way
/// a driver does it (one GPA per page).
fn reg_mr_request(pd: u32, size: u64) -> Vec<u8> {
    let np = size / 4096;
    let c = VrdmaCmdRegMr {
        pdn: pd,
        access: ACC_ALL,
        iova: RAM_BASE,
        length: size,
        page_shift: 12,
        npages: np as u32,
    };
    let mut b = Vec::with_capacity(c.as_bytes().len() + np as usize * 8);
    b.extend_from_slice(c.as_bytes());
    for i in 0..np {
        b.extend_from_slice(&(RAM_BASE + i * 4096).to_le_bytes());
    }
    b
}

pub fn registration(quick: bool) {
    let mem = GuestMem::from_ranges(&[(RAM_BASE, (GIB + (16 << 20)) as usize)]).expect("1 GiB");
    let mut dev = Device::new(
        DeviceConfig::default(),
        mem,
        Arc::new(RecordingOutput::new()),
    );
    let (st, r) = cmd(
        &mut dev,
        VRDMA_CMD_CREATE_PD,
        VrdmaHandle::default().as_bytes(),
    );
    assert_eq!(st, VRDMA_STATUS_OK);
    let pd = VrdmaHandle::read_from(&r).unwrap().handle;
    let budget = Duration::from_millis(if quick { 60 } else { 250 });
    let (min_it, max_it) = (if quick { 5 } else { 9 }, 3001);

    let mut t = Table::new(
        "ODP: MR registration latency at the device (Device::handle_command), median",
        &[
            "MR size",
            "REG_ODP_MR",
            "REG_IMPLICIT_MR",
            "REG_MR (device)",
            "REG_MR (+build page list)",
            "samples (odp/impl/pinned)",
        ],
    );
    let mut implicit_col = Vec::new();
    for size in [4u64 << 10, 64 << 10, 2 << 20, 64 << 20, GIB] {
        // Explicit ODP MR over [VA, VA + size).
        let odp_req = odp_mr_req(pd, ACC_ALL | VRDMA_ACCESS_ON_DEMAND, VA_A, size);
        let mut odp = sample(budget, min_it, max_it, || {
            let t0 = Instant::now();
            let (st, r) = cmd(&mut dev, VRDMA_CMD_REG_ODP_MR, odp_req.as_bytes());
            let el = t0.elapsed().as_secs_f64();
            assert_eq!(st, VRDMA_STATUS_OK, "REG_ODP_MR {}", fmt_size(size));
            dereg(&mut dev, key_of(&r));
            el
        });
        // Implicit: the same command whatever the size the application will use.
        let imp_req = odp_mr_req(pd, ACC_ALL | VRDMA_ACCESS_ON_DEMAND, 0, u64::MAX);
        let mut imp = sample(budget, min_it, max_it, || {
            let t0 = Instant::now();
            let (st, r) = cmd(&mut dev, VRDMA_CMD_REG_IMPLICIT_MR, imp_req.as_bytes());
            let el = t0.elapsed().as_secs_f64();
            assert_eq!(st, VRDMA_STATUS_OK, "REG_IMPLICIT_MR");
            dereg(&mut dev, key_of(&r));
            el
        });
        // Pinned: request prebuilt (device cost only) ...
        let req = reg_mr_request(pd, size);
        let mut pinned = sample(budget, min_it, max_it, || {
            let t0 = Instant::now();
            let (st, r) = cmd(&mut dev, VRDMA_CMD_REG_MR, &req);
            let el = t0.elapsed().as_secs_f64();
            assert_eq!(st, VRDMA_STATUS_OK, "REG_MR {}", fmt_size(size));
            dereg(&mut dev, key_of(&r));
            el
        });
        drop(req);
        // ... and with the page list built each time (what the driver adds on top; the guest's
        // page pinning itself is not part of this figure).
        let mut pinned_b = sample(budget, min_it, max_it, || {
            let t0 = Instant::now();
            let req = reg_mr_request(pd, size);
            let (st, r) = cmd(&mut dev, VRDMA_CMD_REG_MR, &req);
            let el = t0.elapsed().as_secs_f64();
            assert_eq!(st, VRDMA_STATUS_OK, "REG_MR {}", fmt_size(size));
            dereg(&mut dev, key_of(&r));
            el
        });
        let samples = format!("{}/{}/{}", odp.len(), imp.len(), pinned.len());
        let mi = median(&mut imp);
        implicit_col.push(mi);
        t.row(vec![
            fmt_size(size),
            fmt_secs(median(&mut odp)),
            fmt_secs(mi),
            fmt_secs(median(&mut pinned)),
            fmt_secs(median(&mut pinned_b)),
            samples,
        ]);
    }
    t.print();
    let max = implicit_col.iter().cloned().fold(f64::MIN, f64::max);
    let min = implicit_col.iter().cloned().fold(f64::MAX, f64::min);
    let ratio = max / min;
    println!(
        "implicit column max/min = {ratio:.2} (flat if <= 2.00): {}",
        if ratio <= 2.0 {
            "HOLDS"
        } else {
            "DOES NOT HOLD"
        }
    );
}

/// First touch: a 2 MiB WRITE into a fresh chunk (responder-side fault on B's implicit MR, or
/// requester-side fault on A's implicit source), until the chunk is resident and until the WRITE
/// completes; then the same WRITE again with the chunk resident.
fn first_touch(fault_on_b: bool, chunks: u64) -> [Vec<f64>; 7] {
    let (ra, rb) = if fault_on_b {
        (Reg::Pinned, Reg::Implicit)
    } else {
        (Reg::Implicit, Reg::Pinned)
    };
    // 2 MiB of buffer per side; the implicit side maps `chunks` fresh VA chunks onto it.
    let mut bed = Bed::new(Mode::InProc, 4096, CHUNK, ra, rb, chunks * CHUNK);
    let (mut res, mut cold, mut warm, mut frames) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut cold_cpu, mut warm_cpu) = (Vec::new(), Vec::new());
    let mut cqes = Vec::new();
    let mut wr = 0u64;
    for i in 0..chunks {
        let (src, dst) = if fault_on_b {
            (bed.a.addr, VA_B + i * CHUNK)
        } else {
            (VA_A + i * CHUNK, bed.b.addr)
        };
        let touched = if fault_on_b { dst } else { src };
        assert!(!bed.resident(fault_on_b, touched), "chunk {i} not fresh");
        for pass in 0..2 {
            wr += 1;
            let w = Wqe {
                wr_id: wr,
                opcode: VRDMA_WR_RDMA_WRITE,
                flags: VRDMA_SEND_SIGNALED,
                sges: vec![(src, CHUNK as u32, bed.a.key)],
                remote_addr: dst,
                rkey: bed.b.key,
                ..Default::default()
            };
            bed.a.last_resp_at = None;
            bed.b.last_resp_at = None;
            let (ab0, _) = bed.frames.get();
            let c0 = bed.engine_cpu();
            let t0 = Instant::now();
            bed.post(&w);
            bed.doorbell();
            bed.wait_a_success(&mut cqes, false, t0, "first-touch WRITE");
            let el = t0.elapsed().as_secs_f64();
            let cpu = bed.engine_cpu() - c0;
            let (ab1, _) = bed.frames.get();
            assert!(
                bed.resident(fault_on_b, touched),
                "chunk {i} resident after the WRITE"
            );
            let side = if fault_on_b { &bed.b } else { &bed.a };
            if pass == 0 {
                let at = side.last_resp_at.expect("the fresh chunk was faulted in");
                res.push((at - t0).as_secs_f64());
                cold.push(el);
                cold_cpu.push(cpu);
                // 2 MiB at path MTU 4096: 512 data packets at least.
                frames.push((ab1 - ab0) as f64 / 512.0);
            } else {
                assert!(
                    side.last_resp_at.is_none(),
                    "a resident chunk faulted again"
                );
                warm.push(el);
                warm_cpu.push(cpu);
            }
        }
    }
    let side = if fault_on_b { &bed.b } else { &bed.a };
    let pager = side.pager_times.clone();
    assert!(
        pager.len() as u64 >= chunks,
        "one page request per fresh chunk"
    );
    bed.finish();
    [res, cold, warm, pager, frames, cold_cpu, warm_cpu]
}

pub fn first_touch_table(quick: bool) {
    let chunks = if quick { 16 } else { 64 };
    let mut t = Table::new(
        "ODP: first touch of a fresh 2 MiB chunk by a 2 MiB RDMA WRITE (in-process, path MTU \
         4096, driver stand-in answers at once), median per chunk",
        &[
            "fault side",
            "doorbell -> chunk resident",
            "ODP_PAGE_RESP (512 GPAs)",
            "cold WRITE total",
            "warm WRITE total",
            "cold - warm (wall)",
            "cold CPU",
            "warm CPU",
            "first-touch CPU (cold - warm)",
            "frames A->B / 512 (cold)",
            "chunks",
        ],
    );
    for on_b in [true, false] {
        let [mut res, mut cold, mut warm, mut pager, mut fr, mut cc, mut wc] =
            first_touch(on_b, chunks);
        let (ccm, wcm) = (median(&mut cc), median(&mut wc));
        let (c, w) = (median(&mut cold), median(&mut warm));
        t.row(vec![
            if on_b {
                "responder (B's implicit MR, RNR NAK + retry)".into()
            } else {
                "requester (A's implicit MR, QP suspended)".into()
            },
            fmt_secs(median(&mut res)),
            fmt_secs(median(&mut pager)),
            fmt_secs(c),
            fmt_secs(w),
            fmt_secs(c - w),
            fmt_secs(ccm),
            fmt_secs(wcm),
            fmt_secs(ccm - wcm),
            format!("{:.2}", median(&mut fr)),
            chunks.to_string(),
        ]);
    }
    t.print();
}

pub fn steady_state(quick: bool) {
    let runs = if quick { 3 } else { 5 };
    let bytes: u64 = if quick { 8 << 20 } else { 32 << 20 };
    let mut t = Table::new(
        "ODP: steady-state RDMA WRITE, both MRs implicit (all chunks resident) vs both pinned \
         (in-process, path MTU 4096, 16 MiB buffers; runs interleaved, medians)",
        &[
            "msg size",
            "pinned MB/s",
            "implicit MB/s",
            "pinned MB/CPU-s",
            "implicit MB/CPU-s",
            "implicit / pinned (CPU)",
        ],
    );
    let mut pinned = Bed::new(Mode::InProc, 4096, 16 << 20, Reg::Pinned, Reg::Pinned, 0);
    let mut imp = Bed::new(
        Mode::InProc,
        4096,
        16 << 20,
        Reg::Implicit,
        Reg::Implicit,
        0,
    );
    // Fault every chunk of both buffers in once.
    crate::engine::stream(&mut imp, Op::Write, 1 << 20, 16);
    let faults = imp.a.pager_times.len() + imp.b.pager_times.len();
    for size in [64u64 << 10, 1 << 20] {
        let (mut pw, mut iw, mut pc, mut ic) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Interleave the runs so both kinds see the same machine load.
        for _ in 0..runs {
            let p = point(&mut pinned, Op::Write, size, bytes, 1);
            let i = point(&mut imp, Op::Write, size, bytes, 1);
            pw.push(p.mbs);
            pc.push(p.mb_per_cpu);
            iw.push(i.mbs);
            ic.push(i.mb_per_cpu);
        }
        let (pcm, icm) = (median(&mut pc), median(&mut ic));
        t.row(vec![
            fmt_size(size),
            format!("{:.0}", median(&mut pw)),
            format!("{:.0}", median(&mut iw)),
            format!("{pcm:.0}"),
            format!("{icm:.0}"),
            format!("{:.2}", icm / pcm),
        ]);
    }
    let after = imp.a.pager_times.len() + imp.b.pager_times.len();
    t.print();
    println!(
        "page requests: {faults} during warm-up, {} during the measured runs (must be 0)",
        after - faults
    );
    pinned.finish();
    imp.finish();
}
