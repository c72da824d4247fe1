//! Helpers for tests that run `Engine` threads on detached nodes: the driver's post + doorbell,
//! and polling a CQ from the test thread while the engines work.

use std::time::{Duration, Instant};

use vrdma_backend::guest::GuestMem;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_backend::transport::engine::Engine;
use vrdma_spec::*;

use super::*;

/// Post `w` on `qp` in `mem` and ring its SQ doorbell through `e`, as the vhost-user thread does.
pub fn post_sq(e: &Engine, mem: &GuestMem, qp: &mut QpH, w: &Wqe) {
    post_send_mem(mem, qp, w);
    e.sender().push(VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: qp.qpn,
    });
}

/// Poll `cq` of `n` (1 ms apart) until it gave at least `want` CQEs; fails with `what` after
/// `limit`. Returns them all.
pub fn wait_cqes(
    n: &mut Node,
    cq: &mut RingH,
    want: usize,
    limit: Duration,
    what: &str,
) -> Vec<Cqe> {
    let start = Instant::now();
    let mut got = Vec::new();
    loop {
        got.extend(n.poll_cq(cq));
        if got.len() >= want {
            return got;
        }
        assert!(start.elapsed() < limit, "{what}: CQEs so far {got:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
