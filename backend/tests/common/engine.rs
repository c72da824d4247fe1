//! Helpers for tests that run `Engine` threads on detached nodes: the driver's post + doorbell,
//! polling a CQ from the test thread while the engines work, and the CPU time the engine threads
//! use.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vrdma_backend::fabric::FabricBuilder;
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_backend::transport::engine::{Engine, EngineGroup, EngineOptions, GroupSlot};
use vrdma_backend::transport::Device;
use vrdma_spec::*;

use super::*;

/// Start an engine for each node of `p` (detached: the engines own the devices), linked by a
/// fabric of their two device ports. Returns (a's engine, b's engine).
pub fn fabric_engines(p: &mut RcPair, opts: EngineOptions) -> (Engine, Engine) {
    let (ea, eb, _) = fabric_engines_in(None, p, opts);
    (ea, eb)
}

/// A pair whose MRs hold `bytes` (a's source filled from `seed`) and whose requester
/// retransmits only after 4.3 s without an ACK (timeout 20): a thread of a loaded host is never
/// descheduled that long, so a retransmission means a frame an engine overlooked, not a slow
/// scheduler.
pub fn patient_pair(seed: u64, bytes: usize) -> RcPair {
    let p = RcPair::new()
        .mem_mib(4)
        .timeout(20)
        .cq_depth(256)
        .mrs(bytes as u64, bytes as u64)
        .build();
    p.a.write(p.src, &pattern(seed, bytes));
    p
}

/// [`fabric_engines`] with both engines' workers in a group's slot if given
/// (`--shared-engine`); also returns the two devices (a's, b's) to read their counters.
pub fn fabric_engines_in(
    group: Option<(&EngineGroup, GroupSlot)>,
    p: &mut RcPair,
    opts: EngineOptions,
) -> (Engine, Engine, [Arc<HandoffLock<Device>>; 2]) {
    let mut fb = FabricBuilder::new();
    let pa = fb.add_device(p.a.mac).expect("port a");
    let pb = fb.add_device(p.b.mac).expect("port b");
    let fabric = fb.build();
    let (da, db) = (detach(&mut p.a), detach(&mut p.b));
    let start = |dev: &Arc<HandoffLock<Device>>, port| {
        let uplink = Arc::new(fabric.device_port(port).expect("device port"));
        match group {
            Some((g, slot)) => Engine::start_in(g, slot, Arc::clone(dev), uplink, opts),
            None => Engine::start_with(Arc::clone(dev), uplink, opts),
        }
        .expect("engine")
    };
    (start(&da, pa), start(&db, pb), [da, db])
}

/// One signaled `len`-byte WRITE from `p.src` to `p.dst` through a's engine `ea`, then poll
/// a's CQ from this thread until its CQE: it must be a success within `patience` (`what` says
/// what it means if not). Returns how long it took.
pub fn write_and_wait(
    ea: &Engine,
    p: &mut RcPair,
    wr_id: u64,
    len: u32,
    patience: Duration,
    what: &str,
) -> Duration {
    let w = rdma(wr_id, VRDMA_WR_RDMA_WRITE, (p.src, len, p.ka), p.dst, p.kb);
    post_sq(ea, &p.a.mem, &mut p.qa, &w);
    let t0 = Instant::now();
    loop {
        if let Some(c) = p.a.poll_cq(&mut p.cqa).first() {
            assert_eq!(c.status, VRDMA_WC_SUCCESS, "WRITE {wr_id}");
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < patience,
            "WRITE {wr_id} waited {patience:?}: {what}"
        );
        std::thread::yield_now();
    }
}

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

/// Waits (up to `limit`) for one completion per id of `wr_ids` on `cq` and checks that they are
/// exactly those, all successful, in any order.
pub fn assert_all_succeed(n: &mut Node, cq: &mut RingH, wr_ids: &[u64], limit: Duration) {
    let got = wait_cqes(n, cq, wr_ids.len(), limit, "completions");
    let mut ids: Vec<(u64, u8)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    ids.sort();
    let mut want: Vec<(u64, u8)> = wr_ids.iter().map(|&id| (id, VRDMA_WC_SUCCESS)).collect();
    want.sort();
    assert_eq!(ids, want);
}

/// An uplink that counts what it is asked to send and never receives: for traffic that must
/// stay inside one device (looped back).
pub struct CountingUplink {
    sock: std::net::UdpSocket,
    pub sent: std::sync::atomic::AtomicUsize,
}

impl CountingUplink {
    pub fn new() -> Arc<CountingUplink> {
        Arc::new(CountingUplink {
            sock: std::net::UdpSocket::bind("127.0.0.1:0").expect("bind a UDP socket"),
            sent: Default::default(),
        })
    }
}

impl vrdma_backend::uplink::Uplink for CountingUplink {
    fn send(&self, _frame: &[u8]) -> Result<(), vrdma_backend::uplink::UplinkError> {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, vrdma_backend::uplink::UplinkError> {
        Ok(None)
    }
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        std::os::unix::io::AsRawFd::as_raw_fd(&self.sock)
    }
}

/// CPU seconds of this process's threads named `name` (e.g. "vrdma-engine"), from
/// /proc/self/task/*/schedstat (nanoseconds on a CPU).
pub fn threads_cpu_secs(name: &str) -> f64 {
    threads_cpu_secs_where(|comm| comm == name)
}

/// CPU seconds of every thread of this process whose name starts with `prefix` (engine worker
/// w > 0 is `vrdma-engine{w}`).
pub fn threads_cpu_secs_prefixed(prefix: &str) -> f64 {
    threads_cpu_secs_where(|comm| comm.starts_with(prefix))
}

/// How many threads of this process are named `name`.
pub fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

fn threads_cpu_secs_where(matches: impl Fn(&str) -> bool) -> f64 {
    let mut ns = 0u64;
    for e in std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .flatten()
    {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if !matches(comm.trim_end()) {
            continue;
        }
        let st = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
        ns += st
            .split_whitespace()
            .next()
            .and_then(|x| x.parse::<u64>().ok())
            .unwrap_or(0);
    }
    ns as f64 * 1e-9
}
