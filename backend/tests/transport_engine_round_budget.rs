//! The round budget (`transport/engine/worker.rs` `ROUND_DOORBELLS`): a worker runs at most a
//! share of its queued doorbell records per round and the rest in the rounds that follow,
//! without being woken for them; what `EngineSender::fence` waits for counts only the records a
//! round ran (`DoorbellQueue::take_at_most`).

mod common;

use std::time::Duration;

use common::engine::*;
use common::write_conn::{fabric_pair, FabricPair, WriteConn};
use common::*;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::Device;
use vrdma_spec::*;

/// Several rounds' worth of QPs (the budget is 32 records a round).
const CONNS: u64 = 100;
/// Each connection's WRITE: 32 packets at path MTU 4096, so a round of 32 records sends
/// about 4 MiB and takes a millisecond or more.
const LEN: u64 = 128 << 10;

/// Devices a and b on one fabric, an engine of one worker each, [`CONNS`] connections a -> b.
fn bed() -> FabricPair {
    fabric_pair(CONNS, LEN, 300, 1, false)
}

fn sq_doorbells(conns: &[WriteConn]) -> Vec<VrdmaDoorbell> {
    conns
        .iter()
        .map(|c| VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: c.qa.qpn,
        })
        .collect()
}

/// The QPs of `dev` that have sent nothing yet.
fn silent_qps(dev: &HandoffLock<Device>) -> Vec<u32> {
    let d = dev.lock();
    d.qps
        .iter()
        .filter(|q| q.stats.tx_packets == 0)
        .map(|q| q.qpn)
        .collect()
}

/// Records nobody else wakes the worker for (SQ doorbells of QPs with nothing posted: no
/// frame leaves, no ACK comes back) still all run: the rounds after the first follow without
/// a kick, so the fence, which waits for every record accepted before it, ends. A worker that
/// slept with records left would hold the fence until its limit.
#[test]
fn records_left_by_a_round_run_without_a_wake_up() {
    let t = bed();
    t.ea.sender().doorbells(&sq_doorbells(&t.conns));
    assert!(
        t.ea.sender().fence(Duration::from_secs(20)),
        "the worker ran all {CONNS} records without being woken again"
    );
    t.ea.stop();
    t.eb.stop();
}

/// The fence after many rung QPs returns only once every one of them has run: each QP has
/// sent its first packets by then (a round that published the whole queue's count would end
/// the fence after the first share, with most QPs still silent). Then every WRITE completes
/// with its data.
#[test]
fn a_fence_after_many_doorbells_waits_for_every_share() {
    let mut t = bed();
    for (i, c) in t.conns.iter_mut().enumerate() {
        let w = rdma(
            i as u64,
            VRDMA_WR_RDMA_WRITE,
            (c.src, LEN as u32, c.ka),
            c.dst,
            c.kb,
        );
        post_send_mem(&t.a.mem, &mut c.qa, &w);
    }
    t.ea.sender().doorbells(&sq_doorbells(&t.conns));
    assert!(t.ea.sender().fence(Duration::from_secs(30)), "fence ended");
    assert_eq!(
        silent_qps(&t.da),
        Vec::<u32>::new(),
        "QPs whose doorbell had not run when the fence ended"
    );
    for c in &mut t.conns {
        let got = wait_cqes(&mut t.a, &mut c.cqa, 1, Duration::from_secs(60), "WRITE");
        assert_eq!(got[0].status, VRDMA_WC_SUCCESS, "QP {}", c.qa.qpn);
        assert!(
            t.b.read(c.dst, LEN as usize) == c.data,
            "WRITE data differs on QP {}",
            c.qa.qpn
        );
    }
    t.ea.stop();
    t.eb.stop();
}
