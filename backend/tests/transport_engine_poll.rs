//! The engine's busy-poll (`--poll-us`, ARCHITECTURE.md "Threads"): engines on the in-process
//! fabric spin for work before they sleep, and an idle engine does not spin. One test per file:
//! the CPU time is read for every thread named `vrdma-engine` in the process.

mod common;

use std::time::{Duration, Instant};

use common::engine::*;
use common::*;
use vrdma_backend::transport::engine::{EngineOptions, DEFAULT_POLL};

/// 64 B WRITE round trips between two engines on one fabric with the default poll window (the
/// engines spin between them), then one second without work: the two engines together use at
/// most 20 ms of CPU in it. An engine that kept spinning (no bound, no back-off) uses the
/// whole second.
#[test]
fn an_idle_engine_does_not_spin() {
    assert!(!DEFAULT_POLL.is_zero(), "the default polls");
    let mut p = RcPair::new()
        .mem_mib(4)
        .cq_depth(64)
        .mrs(4096, 4096)
        .build();
    p.a.write(p.src, &pattern(3, 64));

    let (ea, eb) = fabric_engines(&mut p, EngineOptions::default());

    for i in 0..200u64 {
        write_and_wait(&ea, &mut p, i, 64, Duration::from_secs(20), "stuck");
    }
    assert_eq!(p.b.read(p.dst, 64), pattern(3, 64), "the data arrived");

    // The ACK timer and the last spins end within a few ms; then nothing is due.
    std::thread::sleep(Duration::from_millis(50));
    let c0 = threads_cpu_secs("vrdma-engine");
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let used = threads_cpu_secs("vrdma-engine") - c0;
    let wall = t0.elapsed().as_secs_f64();
    assert!(
        used < 0.020,
        "idle engines used {:.1} ms of CPU in {:.2} s",
        used * 1e3,
        wall
    );
    ea.stop();
    eb.stop();
}
