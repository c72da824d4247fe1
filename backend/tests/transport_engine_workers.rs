//! Engine workers (`--engine-threads`, `transport/workers.rs`): QPs spread over the workers,
//! doorbells and frames routed to a QP's worker, traffic correct whichever worker sends or
//! receives — between QPs of one device (looped frames routed between workers) and between
//! devices on a fabric (worker 0 receives and hands on).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::engine::*;
use common::write_conn::{fabric_pair, FabricPair, WriteConn};
use common::*;
use vrdma_backend::device::Device;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::qp::worker_of;
use vrdma_backend::transport::engine::{Engine, EngineOptions};
use vrdma_backend::transport::timers::set_workers;
use vrdma_backend::vhost_user::RdmaDevice;
use vrdma_spec::*;

fn two_workers() -> EngineOptions {
    EngineOptions {
        threads: 2,
        ..Default::default()
    }
}

#[test]
fn new_qps_are_spread_round_robin_over_the_workers() {
    let mut a = Node::new(1, 16, 1500);
    set_workers(&mut a.dev, 3);
    let pd = a.create_pd();
    let (cq, _) = a.create_cq(64);
    let owners: Vec<usize> = (0..6)
        .map(|_| worker_of(a.create_qp(QpSpec::rc(pd, cq)).qpn, 3))
        .collect();
    assert_eq!(owners, [0, 1, 2, 0, 1, 2]);
    assert_eq!(a.dev.timers().shards(), 3);
}

#[test]
fn rc_between_qps_of_one_device_on_different_workers() {
    let mut a = Node::new(1, 64, 1500);
    set_workers(&mut a.dev, 2);
    let pd = a.create_pd();
    let (cq, mut cqr) = a.create_cq(256);
    let mut q1 = a.create_qp(QpSpec::rc(pd, cq));
    let q2 = a.create_qp(QpSpec::rc(pd, cq));
    assert_ne!(worker_of(q1.qpn, 2), worker_of(q2.qpn, 2));
    connect_loopback(&mut a, &q1, &q2, RtsAttrs::mtu(3).timeout(12));
    let len = 256 << 10;
    let buf = a.alloc(2 * len as u64 + 4096);
    let k = a.reg_mr(pd, buf, 2 * len as u64 + 4096, ACC_ALL);
    let mut rq = q2.rq.clone().unwrap();
    a.post_recv(&mut rq, 77, &[(buf, 4096, k)]);

    let up = CountingUplink::new();
    let stats = a.dev.port_stats.clone();
    let e = Engine::start_with(detach(&mut a), up.clone(), two_workers()).expect("engine");
    assert_eq!(e.sender().workers(), 2);

    // A SEND and a 256 KiB WRITE (256 packets at MTU 1024), q1 -> q2: q1's worker sends,
    // q2's worker receives and acknowledges, q1's worker completes.
    let src = buf + 4096;
    let dst = src + len as u64;
    let data = pattern(9, len);
    a.write(src, &data);
    post_sq(&e, &a.mem, &mut q1, &send_inline(5, b"to the other worker"));
    post_sq(
        &e,
        &a.mem,
        &mut q1,
        &rdma(6, VRDMA_WR_RDMA_WRITE, (src, len as u32, k), dst, k),
    );
    assert_all_succeed(&mut a, &mut cqr, &[5, 6, 77], Duration::from_secs(30));
    assert_eq!(a.read(buf, 19), b"to the other worker");
    assert!(a.read(dst, len) == data, "WRITE data differs");
    e.stop();
    // Each looped frame was received by the other QP's worker.
    assert!(stats.routed_to_worker.load(Ordering::Relaxed) > 0);
    assert_eq!(stats.drop_worker_busy.load(Ordering::Relaxed), 0);
    assert_eq!(
        up.sent.load(Ordering::SeqCst),
        0,
        "frames leaked to the uplink"
    );
}

const CONN_LEN: usize = 2 << 20;

#[test]
fn four_connections_between_two_fabric_devices_with_two_workers_each() {
    four_connections(false);
}

#[test]
fn by_reference_segments_are_received_by_the_qps_own_worker() {
    // `--payload-refs` (spec §16.2 rule 6): the WRITEs' segments reach b's worker 0 by
    // reference and go on, references and all, to the worker of their QP, which takes the
    // QP's responder state and queues its ACKs in its own outbox.
    four_connections(true);
}

/// Four RC connections between two fabric devices, two workers each, 2 MiB of WRITEs each
/// at once; `refs`: the ports carry by-reference segments.
fn four_connections(refs: bool) {
    let FabricPair {
        mut a,
        b,
        mut conns,
        da,
        db,
        ea,
        eb,
    } = fabric_pair(4, CONN_LEN as u64, 40, 2, refs);
    // Both workers of each side own some of the QPs.
    for w in 0..2 {
        assert!(conns.iter().any(|c| worker_of(c.qa.qpn, 2) == w));
    }
    let stats_a = da.read().port_stats.clone();
    let stats_b = db.read().port_stats.clone();

    // All four at once, one signaled WRITE each (in 256 KiB WQEs).
    let chunk: usize = 256 << 10;
    for c in &mut conns {
        let n = CONN_LEN / chunk;
        for i in 0..n {
            let off = (i * chunk) as u64;
            let flags = if i == n - 1 { VRDMA_SEND_SIGNALED } else { 0 };
            post_send_mem(
                &a.mem,
                &mut c.qa,
                &Wqe {
                    wr_id: i as u64,
                    opcode: VRDMA_WR_RDMA_WRITE,
                    flags,
                    sges: vec![(c.src + off, chunk as u32, c.ka)],
                    remote_addr: c.dst + off,
                    rkey: c.kb,
                    ..Default::default()
                },
            );
        }
    }
    let dbs: Vec<VrdmaDoorbell> = conns
        .iter()
        .map(|c| VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: c.qa.qpn,
        })
        .collect();
    ea.sender().doorbells(&dbs);
    for c in &mut conns {
        let got = wait_cqes(&mut a, &mut c.cqa, 1, Duration::from_secs(60), "WRITE");
        assert_eq!(got[0].status, VRDMA_WC_SUCCESS);
        assert!(
            b.read(c.dst, CONN_LEN) == c.data,
            "WRITE data differs on QP {}",
            c.qa.qpn
        );
    }
    ea.stop();
    eb.stop();
    for s in [&stats_a, &stats_b] {
        assert_eq!(s.drop_worker_busy.load(Ordering::Relaxed), 0);
        assert!(s.rx_to_engine.load(Ordering::Relaxed) > 0);
        // Worker 0 receives: the frames for worker 1's QPs (b: requests, a: ACKs) went on.
        assert!(s.routed_to_worker.load(Ordering::Relaxed) > 0);
    }
    let by_ref = stats_b.rx_by_reference.load(Ordering::Relaxed);
    if refs {
        assert!(by_ref > 0, "no WRITE arrived by reference");
    } else {
        assert_eq!(by_ref, 0);
    }
}

#[test]
fn doorbells_rung_while_suspended_run_on_every_worker_after_resume() {
    // Spec §17.1: a suspended device sends nothing; the doorbells it got meanwhile become the
    // resume sweep, which each worker runs for its own QPs.
    let mut a = Node::new(1, 64, 1500);
    set_workers(&mut a.dev, 2);
    let pd = a.create_pd();
    let (cq, mut cqr) = a.create_cq(256);
    let mut q1 = a.create_qp(QpSpec::rc(pd, cq));
    let mut q2 = a.create_qp(QpSpec::rc(pd, cq));
    assert_ne!(worker_of(q1.qpn, 2), worker_of(q2.qpn, 2));
    connect_loopback(&mut a, &q1, &q2, RtsAttrs::mtu(3).timeout(12));
    let len = 64 << 10;
    let buf = a.alloc(4 * len as u64);
    let k = a.reg_mr(pd, buf, 4 * len as u64, ACC_ALL);
    let (d1, d2) = (pattern(1, len), pattern(2, len));
    a.write(buf, &d1);
    a.write(buf + len as u64, &d2);
    let up = CountingUplink::new();
    let dev = detach(&mut a);
    let e = Engine::start_with(dev.clone(), up, two_workers()).expect("engine");

    RdmaDevice::suspend(&mut *dev.lock());
    let w1 = rdma(
        1,
        VRDMA_WR_RDMA_WRITE,
        (buf, len as u32, k),
        buf + 2 * len as u64,
        k,
    );
    let w2 = rdma(
        2,
        VRDMA_WR_RDMA_WRITE,
        (buf + len as u64, len as u32, k),
        buf + 3 * len as u64,
        k,
    );
    post_sq(&e, &a.mem, &mut q1, &w1);
    post_sq(&e, &a.mem, &mut q2, &w2);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        a.poll_cq(&mut cqr).is_empty(),
        "a suspended device completed work"
    );

    RdmaDevice::resume(&mut *dev.lock());
    e.sender().kick();
    let got = wait_cqes(
        &mut a,
        &mut cqr,
        2,
        Duration::from_secs(30),
        "both WRITEs after resume",
    );
    let mut ids: Vec<(u64, u8)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    ids.sort();
    assert_eq!(ids, [(1, VRDMA_WC_SUCCESS), (2, VRDMA_WC_SUCCESS)]);
    assert!(a.read(buf + 2 * len as u64, len) == d1, "q1's WRITE data");
    assert!(a.read(buf + 3 * len as u64, len) == d2, "q2's WRITE data");
    e.stop();
}

#[test]
fn a_cq_overflow_on_one_worker_flushes_another_workers_qp_on_its_own_worker() {
    // q1 (one worker) overflows CQ `shared`, which q3 (the other worker) sends to as well, so
    // spec §5.2 moves q3 to ERR from q1's worker. q3's flush takes its protocol state, which
    // only q3's worker may (its doorbells and frames need it next): q1's worker queues it for
    // q3's worker and kicks it, which flushes q3's posted receives into q3's own healthy CQ.
    let mut a = Node::new(1, 64, 1500);
    set_workers(&mut a.dev, 2);
    let pd = a.create_pd();
    let (shared, _shared_ring) = a.create_cq(1);
    let (peer_cq, mut peer_ring) = a.create_cq(64);
    let (q3_rcq, mut q3_ring) = a.create_cq(64);
    let mut q1 = a.create_qp(QpSpec::rc(pd, shared));
    let mut s3 = QpSpec::rc(pd, shared);
    s3.rcq = q3_rcq;
    let q3 = a.create_qp(s3);
    let q2 = a.create_qp(QpSpec::rc(pd, peer_cq));
    assert_ne!(worker_of(q1.qpn, 2), worker_of(q3.qpn, 2));
    connect_loopback(&mut a, &q1, &q2, RtsAttrs::mtu(3).timeout(12));
    a.qp_to_init(q3.qpn);
    let buf = a.alloc(8192);
    let k = a.reg_mr(pd, buf, 8192, ACC_ALL);
    let mut rq2 = q2.rq.clone().unwrap();
    for id in 20..23 {
        a.post_recv(&mut rq2, id, &[(buf, 1024, k)]);
    }
    let mut rq3 = q3.rq.clone().unwrap();
    for id in 30..33 {
        a.post_recv(&mut rq3, id, &[(buf + 4096, 1024, k)]);
    }
    let _ = a.events();

    let up = CountingUplink::new();
    let dev = detach(&mut a);
    let e = Engine::start_with(dev.clone(), up, two_workers()).expect("engine");
    // Two signaled SENDs into a CQ of depth 1 that nobody polls: the second overflows it.
    for id in 1..=2 {
        post_sq(&e, &a.mem, &mut q1, &send_inline(id, b"overflow"));
    }
    let flushed = wait_cqes(
        &mut a,
        &mut q3_ring,
        3,
        Duration::from_secs(30),
        "q3's receives flushed by its worker",
    );
    let mut got: Vec<(u64, u8)> = flushed.iter().map(|c| (c.wr_id, c.status)).collect();
    got.sort();
    assert_eq!(
        got,
        [
            (30, VRDMA_WC_WR_FLUSH_ERR),
            (31, VRDMA_WC_WR_FLUSH_ERR),
            (32, VRDMA_WC_WR_FLUSH_ERR)
        ]
    );
    // The peer got both SENDs before q1 went to ERR.
    let peer = wait_cqes(
        &mut a,
        &mut peer_ring,
        2,
        Duration::from_secs(30),
        "q2 received both SENDs",
    );
    assert!(
        peer.iter().all(|c| c.status == VRDMA_WC_SUCCESS),
        "{peer:?}"
    );
    {
        let d = dev.lock_long();
        for q in [q1.qpn, q3.qpn] {
            assert_eq!(
                vrdma_backend::transport::ctx::qp_state(&d, q).map(|s| s.as_u32()),
                Some(VRDMA_QPS_ERR)
            );
        }
    }
    let events = a.events();
    assert_eq!(
        events
            .iter()
            .filter(|v| v.type_ == VRDMA_EV_CQ_ERR && v.id == shared)
            .count(),
        1,
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|v| v.type_ == VRDMA_EV_QP_FATAL && v.id == q3.qpn),
        "{events:?}"
    );
    e.stop();
}

/// Signaled WRITE `i` of connection `c`, into slot `i % slots` of `chunk` bytes (source and
/// destination at the same offset).
fn write_wqe(c: &WriteConn, i: u64, slots: u64, chunk: u64) -> Wqe {
    rdma(
        i,
        VRDMA_WR_RDMA_WRITE,
        (c.src + i % slots * chunk, chunk as u32, c.ka),
        c.dst + i % slots * chunk,
        c.kb,
    )
}

/// Post `n` WRITEs of `chunk` bytes on every connection, then ring their SQ doorbells at once.
fn stream_writes(ea: &Engine, a: &Node, conns: &mut [WriteConn], n: u64, chunk: u64) {
    for c in conns.iter_mut() {
        for i in 0..n {
            let w = write_wqe(c, i, n, chunk);
            post_send_mem(&a.mem, &mut c.qa, &w);
        }
    }
    let dbs: Vec<VrdmaDoorbell> = conns
        .iter()
        .map(|c| VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: c.qa.qpn,
        })
        .collect();
    ea.sender().doorbells(&dbs);
}

#[test]
fn modify_qp_to_err_beside_traffic_flushes_on_the_qps_worker() {
    // MODIFY_QP runs on the shared device (`Device::handle_shared`) while both workers of each
    // side stream WRITEs on four connections: the QP it moves to ERR completes each WQE once,
    // in order (done before, flushed after), later WQEs are flushed, and the other three
    // connections are untouched.
    const LEN: u64 = 8 << 20;
    const CHUNK: u64 = 256 << 10;
    let FabricPair {
        mut a,
        b,
        mut conns,
        da,
        ea,
        eb,
        ..
    } = fabric_pair(4, LEN, 60, 2, false);
    let n = LEN / CHUNK;
    stream_writes(&ea, &a, &mut conns, n, CHUNK);
    // Once the victim's first WRITE completed: to ERR from the control queue's thread.
    let victim = conns[0].qa.qpn;
    let mut got = wait_cqes(
        &mut a,
        &mut conns[0].cqa,
        1,
        Duration::from_secs(60),
        "first",
    );
    let c = VrdmaCmdModifyQp {
        qpn: victim,
        attr_mask: VRDMA_QP_STATE,
        attr: VrdmaQpAttr {
            qp_state: VRDMA_QPS_ERR,
            ..Default::default()
        },
    };
    let mut resp = Vec::new();
    let status = std::thread::scope(|s| {
        s.spawn(|| {
            da.read()
                .handle_shared(VRDMA_CMD_MODIFY_QP, c.as_bytes(), &mut resp)
        })
        .join()
        .unwrap()
    });
    assert_eq!(status, Some(VRDMA_STATUS_OK));
    // What the vhost-user control queue does after every command batch.
    ea.sender().kick();
    // Two more WQEs on the QP in ERR: flushed (IBTA 10.3.1).
    for i in n..n + 2 {
        let w = write_wqe(&conns[0], i, n, CHUNK);
        post_sq(&ea, &a.mem, &mut conns[0].qa, &w);
    }
    got.extend(wait_cqes(
        &mut a,
        &mut conns[0].cqa,
        (n + 2) as usize - got.len(),
        Duration::from_secs(60),
        "the victim's WQEs",
    ));
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(
        ids,
        (0..n + 2).collect::<Vec<_>>(),
        "each WQE once, in order"
    );
    let first_flush = got
        .iter()
        .position(|c| c.status != VRDMA_WC_SUCCESS)
        .expect("the WQEs posted in ERR are flushed");
    assert!(
        got[first_flush..]
            .iter()
            .all(|c| c.status == VRDMA_WC_WR_FLUSH_ERR),
        "{got:?}"
    );
    for c in &mut conns[1..] {
        let done = wait_cqes(
            &mut a,
            &mut c.cqa,
            n as usize,
            Duration::from_secs(60),
            "rest",
        );
        assert!(
            done.iter().all(|c| c.status == VRDMA_WC_SUCCESS),
            "{done:?}"
        );
        assert!(
            b.read(c.dst, LEN as usize) == c.data,
            "data of QP {}",
            c.qa.qpn
        );
    }
    assert_eq!(
        vrdma_backend::transport::ctx::qp_state(&da.read(), victim).map(|s| s.as_u32()),
        Some(VRDMA_QPS_ERR)
    );
    ea.stop();
    eb.stop();
}

#[test]
fn dereg_mr_beside_traffic_stops_every_write_into_it() {
    // DEREG_MR of the responder's MR on b, beside b's workers (`Device::handle_shared`):
    // once it has answered, not a byte lands in it (a worker copying through a translation it
    // made before is waited for: `tables/units.rs`).
    dereg_beside_traffic(false);
}

#[test]
fn dereg_of_the_source_mr_beside_a_by_reference_stream_reads_no_new_byte() {
    // DEREG_MR of the requester's source MR on a, beside a's workers, while its WRITEs go by
    // reference (spec §16.2 rule 6): once it has answered, the guest may reuse the buffer.
    // Bytes written there afterwards must never reach b: a reference made before must be
    // stale, including one whose translation raced with the DEREG.
    dereg_beside_traffic(true);
}

/// Both workers of each side stream 64 KiB WRITEs on two connections from a to b; once the
/// victim's first WRITE completed, DEREG_MR runs beside the workers on b's destination MR
/// or (`source`, by-reference segments) on a's source MR. Two WRITEs posted after it answered
/// fail; the other connection completes untouched.
fn dereg_beside_traffic(source: bool) {
    const LEN: u64 = 8 << 20;
    const CHUNK: u64 = 64 << 10;
    let FabricPair {
        mut a,
        b,
        mut conns,
        da,
        db,
        ea,
        eb,
    } = fabric_pair(2, LEN, 80, 2, source);
    let n = LEN / CHUNK;
    stream_writes(&ea, &a, &mut conns, n, CHUNK);
    let victim = &mut conns[0];
    let mut got = wait_cqes(&mut a, &mut victim.cqa, 1, Duration::from_secs(60), "first");
    let (dev, key) = if source {
        (&da, victim.ka)
    } else {
        (&db, victim.kb)
    };
    let h = VrdmaHandle {
        handle: key,
        ..Default::default()
    };
    let mut resp = Vec::new();
    let status = std::thread::scope(|s| {
        s.spawn(|| {
            dev.read()
                .handle_shared(VRDMA_CMD_DEREG_MR, h.as_bytes(), &mut resp)
        })
        .join()
        .unwrap()
    });
    assert_eq!(status, Some(VRDMA_STATUS_OK));
    // What the guest may do once DEREG_MR answered: reuse the source buffer.
    let new: Vec<u8> = victim.data.iter().map(|x| !x).collect();
    if source {
        a.write(victim.src, &new);
    }
    let at_dereg = b.read(victim.dst, LEN as usize);
    for i in n..n + 2 {
        let w = write_wqe(victim, i, n, CHUNK);
        post_sq(&ea, &a.mem, &mut victim.qa, &w);
    }
    got.extend(wait_cqes(
        &mut a,
        &mut victim.cqa,
        (n + 2) as usize - got.len(),
        Duration::from_secs(60),
        "the victim's WQEs",
    ));
    assert!(
        got[n as usize..]
            .iter()
            .all(|c| c.status != VRDMA_WC_SUCCESS),
        "a WRITE through the deregistered MR succeeded: {:?}",
        &got[n as usize..]
    );
    let after = b.read(victim.dst, LEN as usize);
    if source {
        let leaked = after
            .iter()
            .zip(&new)
            .zip(&victim.data)
            .filter(|((b, n), o)| b == n && n != o && **n != 0)
            .count();
        assert_eq!(leaked, 0, "bytes written after DEREG_MR reached the peer");
    } else {
        let changed = at_dereg.iter().zip(&after).filter(|(x, y)| x != y).count();
        assert_eq!(changed, 0, "bytes landed in the MR after DEREG_MR answered");
    }
    let other = &mut conns[1];
    let done = wait_cqes(
        &mut a,
        &mut other.cqa,
        n as usize,
        Duration::from_secs(60),
        "the other connection",
    );
    assert!(
        done.iter().all(|c| c.status == VRDMA_WC_SUCCESS),
        "{done:?}"
    );
    assert!(b.read(other.dst, LEN as usize) == other.data);
    ea.stop();
    eb.stop();
}

/// Run `op` as the control queue does: beside the workers if the device allows
/// (`handle_shared`), else on the exclusive device. The status, the response, and whether it
/// ran beside the workers.
fn control(dev: &HandoffLock<Device>, op: u16, req: &[u8]) -> (u32, Vec<u8>, bool) {
    let mut resp = Vec::new();
    if let Some(status) = dev.read().handle_shared(op, req, &mut resp) {
        return (status, resp, true);
    }
    match dev.lock().handle_command(op, req, &mut resp) {
        vrdma_backend::device::CmdOutcome::Done(status) => (status, resp, false),
        other => panic!("command {op} parked: {other:?}"),
    }
}

#[test]
fn qps_created_and_destroyed_beside_traffic_leave_the_stream_whole() {
    // CREATE_QP and DESTROY_QP run beside the workers (`qp/table.rs`): while both workers of
    // each side stream WRITEs on two connections, each side creates 60 more QPs (enough that
    // the QPN index grows once, on the exclusive device) and destroys them, twice over. Every
    // WRITE completes with its bytes; every create and destroy succeeds; the tables end as
    // they began.
    const CHUNK: u64 = 64 << 10;
    const WRITES: u64 = 48;
    const EXTRA: usize = 60;
    let FabricPair {
        mut a,
        mut b,
        mut conns,
        da,
        db,
        ea,
        eb,
    } = fabric_pair(2, CHUNK * WRITES, 90, 2, false);
    let setup = |n: &mut Node, d: &HandoffLock<Device>| {
        let (st, pd, _) = control(d, VRDMA_CMD_CREATE_PD, &[0; 8]);
        assert_eq!(st, VRDMA_STATUS_OK);
        let pd = VrdmaHandle::read_from(&pd).unwrap().handle;
        let ring = n.ring(64, 5);
        let c = VrdmaCmdCreateCq {
            depth: 64,
            npages: ring.pages.len() as u32,
            ..Default::default()
        };
        let mut req = c.as_bytes().to_vec();
        ring.pages
            .iter()
            .for_each(|p| req.extend_from_slice(&p.to_le_bytes()));
        let (st, cq, _) = control(d, VRDMA_CMD_CREATE_CQ, &req);
        assert_eq!(st, VRDMA_STATUS_OK);
        let cq = VrdmaHandle::read_from(&cq).unwrap().handle;
        let spec = QpSpec {
            sq_depth: 16,
            rq_depth: 16,
            sq_shift: 7,
            rq_shift: 6,
            max_sge: 2,
            max_inline: 0,
            ..QpSpec::rc(pd, cq)
        };
        (0..EXTRA)
            .map(|_| {
                let (sq, rq) = (n.ring(16, 7), n.ring(16, 6));
                spec.request(&sq, Some(&rq))
            })
            .collect::<Vec<_>>()
    };
    let reqs = [setup(&mut a, &da), setup(&mut b, &db)];
    let before = [da.read().qps.len(), db.read().qps.len()];
    stream_writes(&ea, &a, &mut conns, WRITES, CHUNK);
    let churned = std::thread::scope(|s| {
        let churn = s.spawn(|| {
            let (mut shared, mut exclusive) = (0, 0);
            for _ in 0..2 {
                let mut live = Vec::new();
                for (i, pair) in reqs[0].iter().zip(&reqs[1]).enumerate() {
                    for (side, (d, req)) in [(&da, pair.0), (&db, pair.1)].into_iter().enumerate() {
                        let (st, resp, beside) = control(d, VRDMA_CMD_CREATE_QP, req);
                        assert_eq!(st, VRDMA_STATUS_OK, "CREATE_QP {i} on side {side}");
                        let qpn = VrdmaRespCreateQp::read_from(&resp).unwrap().qpn;
                        live.push((side, qpn));
                        if beside {
                            shared += 1
                        } else {
                            exclusive += 1
                        }
                    }
                }
                for (side, qpn) in live {
                    let d = [&da, &db][side];
                    let h = VrdmaHandle {
                        handle: qpn,
                        ..Default::default()
                    };
                    let (st, _, beside) = control(d, VRDMA_CMD_DESTROY_QP, h.as_bytes());
                    assert_eq!(st, VRDMA_STATUS_OK, "DESTROY_QP {qpn:#x}");
                    if beside {
                        shared += 1
                    } else {
                        exclusive += 1
                    }
                }
            }
            (shared, exclusive)
        });
        for c in &mut conns {
            let got = wait_cqes(
                &mut a,
                &mut c.cqa,
                WRITES as usize,
                Duration::from_secs(120),
                "WRITE",
            );
            assert!(got.iter().all(|e| e.status == VRDMA_WC_SUCCESS), "{got:?}");
            assert!(
                b.read(c.dst, c.len as usize) == c.data,
                "WRITE data differs on QP {}",
                c.qa.qpn
            );
        }
        churn.join().expect("churn")
    });
    ea.stop();
    eb.stop();
    let (shared, exclusive) = churned;
    assert!(exclusive >= 1, "the QPN index never grew");
    assert!(
        shared >= 9 * (shared + exclusive) / 10,
        "{exclusive} of {} commands needed the exclusive device",
        shared + exclusive
    );
    assert_eq!([da.read().qps.len(), db.read().qps.len()], before);
}
