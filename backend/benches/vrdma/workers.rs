//! Engine workers (`--engine-threads`): the 64 KiB RC WRITE rate of 4 QPs between two fabric
//! devices with 2 engine workers per device against 1, measured side by side (runs alternate,
//! medians), with the engine CPU per message of each. The QPs are spread over the workers
//! (`qp::worker_of`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use vrdma_backend::fabric::FabricBuilder;
use vrdma_backend::transport::engine::{Engine, EngineOptions};
use vrdma_backend::transport::timers::set_workers;
use vrdma_spec::*;

use crate::common::engine::threads_cpu_secs_prefixed;
use crate::common::write_conn::WriteConn;
use crate::common::*;
use crate::util::median;

const QPS: usize = 4;
const MSG: usize = 64 << 10;
/// Buffer per QP and side: the WRITEs cycle through it.
const BUF: usize = 4 << 20;
/// Outstanding WRITEs per QP (all signaled).
const DEPTH: u64 = 32;

/// Two fabric devices with `workers` engine workers each and [`QPS`] connections a -> b.
struct Setup {
    a: Node,
    qps: Vec<WriteConn>,
    ea: Engine,
    eb: Engine,
}

fn setup(workers: usize) -> Setup {
    let mem = ((QPS * BUF) >> 20) as u64 + 16;
    let mut a = Node::new(1, mem, 9000);
    let mut b = Node::new(2, mem, 9000);
    set_workers(&mut a.dev, workers);
    set_workers(&mut b.dev, workers);
    let qps = (0..QPS as u64)
        .map(|i| WriteConn::new(&mut a, &mut b, BUF as u64, i))
        .collect();
    let mut fb = FabricBuilder::new();
    let pa = fb.add_device(a.mac).expect("port a");
    let pb = fb.add_device(b.mac).expect("port b");
    let fabric = fb.build();
    let opts = EngineOptions {
        threads: workers,
        ..Default::default()
    };
    let start = |n: &mut Node, port| {
        let port = fabric.device_port(port).expect("port").with_segments();
        Engine::start_with(detach(n), Arc::new(port), opts).expect("engine")
    };
    let ea = start(&mut a, pa);
    let eb = start(&mut b, pb);
    Setup { a, qps, ea, eb }
}

/// `per_qp` WRITEs of [`MSG`] on every QP at once; the time until the last completed.
fn stream(s: &mut Setup, per_qp: u64) -> Duration {
    let t0 = Instant::now();
    let mut posted = [0u64; QPS];
    let mut done = [0u64; QPS];
    let mut dbs = Vec::with_capacity(QPS);
    while done.iter().any(|&d| d < per_qp) {
        dbs.clear();
        for (i, qp) in s.qps.iter_mut().enumerate() {
            let before = posted[i];
            while posted[i] - done[i] < DEPTH && posted[i] < per_qp {
                let off = (posted[i] as usize * MSG % BUF) as u64;
                post_send_mem(
                    &s.a.mem,
                    &mut qp.qa,
                    &Wqe {
                        wr_id: posted[i],
                        opcode: VRDMA_WR_RDMA_WRITE,
                        flags: VRDMA_SEND_SIGNALED,
                        sges: vec![(qp.src + off, MSG as u32, qp.ka)],
                        remote_addr: qp.dst + off,
                        rkey: qp.kb,
                        ..Default::default()
                    },
                );
                posted[i] += 1;
            }
            if posted[i] != before {
                dbs.push(VrdmaDoorbell {
                    type_: VRDMA_DB_SQ,
                    id: qp.qa.qpn,
                });
            }
        }
        if !dbs.is_empty() {
            s.ea.sender().doorbells(&dbs);
        }
        for (i, qp) in s.qps.iter_mut().enumerate() {
            for c in s.a.poll_cq(&mut qp.cqa) {
                assert_eq!(c.status, VRDMA_WC_SUCCESS, "WRITE on QP {}", qp.qa.qpn);
                done[i] += 1;
            }
        }
        std::thread::yield_now();
    }
    t0.elapsed()
}

/// MB/s and engine CPU seconds per message of `per_qp` WRITEs per QP. The CPU is that of
/// every engine thread of the process: the other setup's engines are idle meanwhile.
fn rate(s: &mut Setup, per_qp: u64) -> (f64, f64) {
    let c0 = threads_cpu_secs_prefixed("vrdma-engine");
    let t = stream(s, per_qp).as_secs_f64();
    let cpu = threads_cpu_secs_prefixed("vrdma-engine") - c0;
    let msgs = (per_qp as usize * QPS) as f64;
    (msgs * MSG as f64 / t / 1e6, cpu / msgs)
}

/// The `--engine-threads` 2-vs-1 figures, medians of alternated runs.
#[derive(Debug, Clone, Copy)]
pub struct TwoVsOne {
    /// MB/s with 2 workers per device over MB/s with 1.
    pub ratio: f64,
    pub one_mbs: f64,
    pub two_mbs: f64,
    /// Engine CPU seconds per message (both devices' engine threads).
    pub one_cpu: f64,
    pub two_cpu: f64,
}

/// Runs of `bytes` in total with 1 and with 2 workers per device, alternated `runs` times.
pub fn two_vs_one(bytes: u64, runs: usize) -> TwoVsOne {
    let per_qp = (bytes / (QPS * MSG) as u64).max(64);
    let mut one = setup(1);
    let mut two = setup(2);
    rate(&mut one, 64);
    rate(&mut two, 64);
    let (mut r1, mut r2, mut c1, mut c2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (r, c) = rate(&mut one, per_qp);
        r1.push(r);
        c1.push(c);
        let (r, c) = rate(&mut two, per_qp);
        r2.push(r);
        c2.push(c);
    }
    for s in [one, two] {
        s.ea.stop();
        s.eb.stop();
    }
    let (one_mbs, two_mbs) = (median(&mut r1), median(&mut r2));
    TwoVsOne {
        ratio: two_mbs / one_mbs,
        one_mbs,
        two_mbs,
        one_cpu: median(&mut c1),
        two_cpu: median(&mut c2),
    }
}
