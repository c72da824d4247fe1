//! `make bench`: figures for the closing notes of the [engine] and [odp] issues (figures, not
//! pass/fail tests). Release build, plain `std::time::Instant`, medians of many runs.
//!
//! Usage: `cargo bench -p vrdma-backend --bench vrdma [-- SECTION...] [--quick]`
//! with SECTION among `engine`, `engine-inproc` (its in-process rows alone: one thread, for
//! `perf record`), `engine-qps`, `odp-reg`, `odp-touch`, `odp-steady`, `wire`,
//! `control-wait` (a control command's wait for the device lock while another QP streams),
//! `control-churn` (a QP's stream beside REG_DMA_MR+DEREG_MR pairs),
//! `headline` (default: all of these; `headline` last), `udp` (only the UDP headline points, for
//! `perf record`), `fabric`, `fabric-64`, `fabric-mtu`, `idle-qps`, `pair-ceiling`, `workers`, `fairness`,
//! `tenants-8` (the other headline points alone, likewise).
//! `VRDMA_BENCH_QUICK=1` is the same as `--quick` (fewer and shorter runs). `VRDMA_BENCH_REFS=1`:
//! fabric segments hold RC WRITE payloads by reference to every device (one copy,
//! `--payload-refs`); in a group they do so between the devices of a slot (a daemon's default)
//! unless `VRDMA_BENCH_COPY=1` (two copies, as before 2026-12-07).
//! `VRDMA_BENCH_SHARED=1`: the devices of the fabric benches share one engine group (a fabric
//! daemon's default; unset, the benches keep a thread per device, `--own-engine-threads`, so
//! their figures compare with earlier runs), each pair placed as a tenant network of its own
//! over `VRDMA_BENCH_SLOTS` slots (`--shared-engine-threads`; default: the CPUs the bench may use).
//! `VRDMA_BENCH_THREADS=N`: N engine workers per device in the benches
//! built on `Bed` (`--engine-threads`).

#[path = "../../tests/common/mod.rs"]
mod common;

mod bed;
mod control;
mod engine;
mod headline;
mod odp;
mod tenancy;
mod util;
mod wire;
mod workers;

use std::time::Instant;

const SECTIONS: [&str; 19] = [
    "engine",
    "engine-inproc",
    "engine-qps",
    "odp-reg",
    "odp-touch",
    "odp-steady",
    "wire",
    "headline",
    "udp",
    "fabric",
    "fabric-64",
    "fabric-mtu",
    "idle-qps",
    "pair-ceiling",
    "control-wait",
    "control-churn",
    "workers",
    "fairness",
    "tenants-8",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("VRDMA_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    // cargo bench passes `--bench`; other `--` flags are ignored too.
    let wanted: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    for w in &wanted {
        if !SECTIONS.contains(w) {
            eprintln!("unknown section {w:?}; sections: {}", SECTIONS.join(" "));
            std::process::exit(2);
        }
    }
    let on = |s: &str| wanted.is_empty() || wanted.contains(&s);
    let start = Instant::now();
    println!(
        "vrdma bench: {} mode, {} CPUs, load average {} at start{}",
        if cfg!(debug_assertions) {
            "DEBUG (figures meaningless)"
        } else {
            "release"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        util::loadavg(),
        if quick { ", quick" } else { "" }
    );
    if on("engine") {
        engine::run(
            quick,
            &[bed::Mode::InProc, bed::Mode::Fabric, bed::Mode::Udp],
        );
    }
    // Not part of the default run (`engine` has its rows).
    if wanted.contains(&"engine-inproc") {
        engine::run(quick, &[bed::Mode::InProc]);
    }
    if on("engine-qps") {
        engine::qp_scaling(quick);
    }
    if on("odp-reg") {
        odp::registration(quick);
    }
    if on("odp-touch") {
        odp::first_touch_table(quick);
    }
    if on("odp-steady") {
        odp::steady_state(quick);
    }
    if on("wire") {
        wire::run(quick);
    }
    if on("control-wait") {
        control::run(quick);
    }
    if on("control-churn") {
        control::churn(quick);
    }
    if on("headline") {
        headline::run(quick);
    }
    // Not part of the default run (headline measures it): the UDP points alone, to profile.
    if wanted.contains(&"udp") {
        headline::print_udp(&headline::udp(quick));
    }
    if wanted.contains(&"fabric") {
        headline::fabric_only(quick);
    }
    if wanted.contains(&"fabric-64") {
        headline::fabric_small(quick);
    }
    if wanted.contains(&"fabric-mtu") {
        headline::large_mtu_only(quick);
    }
    if wanted.contains(&"pair-ceiling") {
        headline::ceiling_only(quick);
    }
    if wanted.contains(&"workers") {
        headline::workers_only(quick);
    }
    if wanted.contains(&"idle-qps") {
        headline::idle_only(quick);
    }
    if wanted.contains(&"fairness") {
        headline::fairness_only(quick);
    }
    if wanted.contains(&"tenants-8") {
        headline::tenants_only(quick);
    }
    println!();
    println!(
        "vrdma bench: done in {:.1} s (load average {} at the end)",
        start.elapsed().as_secs_f64(),
        util::loadavg()
    );
}
