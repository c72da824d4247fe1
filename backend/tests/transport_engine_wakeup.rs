//! Wake-ups between engines on the fabric (ARCHITECTURE.md "Threads"): while an engine
//! busy-polls its port's queue, frames pushed into it skip the eventfd, and the engine looks at
//! the queue once more before it sleeps. A wake-up lost there would leave a frame queued until
//! a timer woke the engine: with the ACK timeout at 8.6 s, a WRITE would then take seconds
//! instead of microseconds.

mod common;

use std::time::Duration;

use common::engine::*;
use common::rng::XorShift;
use common::*;
use vrdma_backend::transport::engine::EngineOptions;

/// 64 B WRITE round trips with pauses of varied length between them, so each engine is found
/// spinning, just stopping, or asleep when a frame arrives. Every WRITE completes well before
/// the requester's first retransmission could (timeout exponent 21: 8.6 s).
#[test]
fn frames_between_polling_engines_are_never_left_waiting_for_a_timer() {
    let mut p = RcPair::new()
        .mem_mib(4)
        .cq_depth(64)
        .timeout(21)
        .mrs(4096, 4096)
        .build();
    p.a.write(p.src, &pattern(5, 64));

    // A window short enough that pauses of up to 200 us often outlast it.
    let opts = EngineOptions {
        poll: Duration::from_micros(20),
        ..Default::default()
    };
    let (ea, eb) = fabric_engines(&mut p, opts);

    let mut rng = XorShift(0x77_1234_5678);
    let mut slowest = Duration::ZERO;
    for i in 0..2000u64 {
        let took = write_and_wait(
            &ea,
            &mut p,
            i,
            64,
            Duration::from_secs(4),
            "a frame was left in a queue (a lost wake-up)",
        );
        slowest = slowest.max(took);
        match rng.below(4) {
            0 => {}
            1 => std::thread::yield_now(),
            _ => std::thread::sleep(Duration::from_micros(rng.below(200))),
        }
    }
    eprintln!("slowest of 2000 WRITEs: {slowest:?}");
    assert_eq!(p.b.read(p.dst, 64), pattern(5, 64), "the data arrived");
    ea.stop();
    eb.stop();
}
