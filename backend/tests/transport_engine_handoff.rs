//! A control command gets the device in the middle of an engine batch (`handoff.rs`): the
//! engine hands the device lock to a waiting command after the buffer it is working on, not
//! after its whole batch, and a command that suspends the device there (spec §17.1) stops the
//! rest of the batch from reaching the guest.
//!
//! The batch: `FRAMES` non-RoCE Ethernet frames for the device's MAC, queued on an in-memory
//! uplink before the engine starts, so one receive call takes them all. Each goes to the
//! guest's netdev (`DeviceOutput::eth_rx`, under the device lock); the output holds the engine
//! inside the first one until the command has announced itself. Commands that run on the
//! shared device (queries, MODIFY_QP, the registrations and the creates) answer while the
//! engine is held there.
//!
//! Long because every case needs the same staged engine (a batch held at a known buffer) and
//! the hand-off protocol is one concept; one binary.

mod common;

use std::collections::VecDeque;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use vrdma_backend::device::{Device, DeviceConfig, DeviceOutput, Ticket};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::transport::engine::Engine;
use vrdma_backend::uplink::{Uplink, UplinkError};
use vrdma_backend::vhost_user::RdmaDevice;
use vrdma_spec::*;

const FRAMES: usize = 16;
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x00, 0x00, 0x07];
const LONG: Duration = Duration::from_secs(60);

/// Frames queued before the engine starts; nothing sent is kept.
#[derive(Default)]
struct Queued(Mutex<VecDeque<Vec<u8>>>);

impl Uplink for Queued {
    fn send(&self, _frame: &[u8]) -> Result<(), UplinkError> {
        Ok(())
    }
    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        Ok(self.0.lock().unwrap().pop_front().map(|f| {
            buf[..f.len()].copy_from_slice(&f);
            f.len()
        }))
    }
    fn as_raw_fd(&self) -> RawFd {
        -1
    }
}

/// Counts the frames the guest's netdev got; holds the engine inside the first one until a
/// control command waits for the device.
#[derive(Default)]
struct Gate {
    delivered: AtomicUsize,
    dev: OnceLock<Weak<HandoffLock<Device>>>,
    /// Hold the engine inside the first frame until `released`, instead of until a control
    /// command waits for the device.
    hold: bool,
    released: AtomicBool,
    /// Page requests the device sent (ODP).
    page_requests: AtomicUsize,
    /// The page requests and RECLAIM notices themselves, in order.
    sent_requests: Mutex<Vec<VrdmaPageReq>>,
}

impl DeviceOutput for Gate {
    fn event(&self, _ev: VrdmaEvent) {}
    fn page_request(&self, req: VrdmaPageReq) {
        self.page_requests.fetch_add(1, Ordering::SeqCst);
        self.sent_requests.lock().unwrap().push(req);
    }
    fn command_done(&self, _ticket: Ticket, _status: u32) {}
    fn eth_rx(&self, _frame: &[u8], _port: Option<usize>) {
        if self.delivered.fetch_add(1, Ordering::SeqCst) != 0 {
            return;
        }
        let t0 = Instant::now();
        if self.hold {
            while !self.released.load(Ordering::SeqCst) {
                assert!(t0.elapsed() < LONG, "the test never released the engine");
                std::thread::yield_now();
            }
            return;
        }
        let dev = self.dev.get().and_then(Weak::upgrade).expect("device set");
        while !dev.contended() {
            assert!(t0.elapsed() < LONG, "no control command announced itself");
            std::thread::yield_now();
        }
    }
}

/// An ARP frame for `mac`, the device's: the port gives it to the guest's netdev.
fn arp_frame(mac: [u8; 6], i: u8) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&mac);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, i]);
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    f
}

/// A device with the gate as its output and the queued batch on its uplink, its engine
/// started: returns the device, the gate, and the engine (stopped when dropped).
fn start() -> (Arc<HandoffLock<Device>>, Arc<Gate>, Engine) {
    start_gated(Gate::default())
}

/// [`start`] with the gate given.
fn start_gated(gate: Gate) -> (Arc<HandoffLock<Device>>, Arc<Gate>, Engine) {
    let gate = Arc::new(gate);
    let mem = GuestMem::from_ranges(&[(0x10_0000, 1 << 20)]).expect("guest memory");
    let cfg = DeviceConfig {
        mac: MAC,
        ..DeviceConfig::default()
    };
    let dev = Device::new(cfg, mem, gate.clone());
    start_device(dev, MAC, gate)
}

/// Start `dev` (its output is `gate`, its MAC `mac`) on the queued batch.
fn start_device(
    dev: Device,
    mac: [u8; 6],
    gate: Arc<Gate>,
) -> (Arc<HandoffLock<Device>>, Arc<Gate>, Engine) {
    let dev = Arc::new(HandoffLock::with_limit(dev, LONG));
    assert!(
        gate.dev.set(Arc::downgrade(&dev)).is_ok(),
        "device set twice"
    );
    let uplink = Arc::new(Queued::default());
    uplink
        .0
        .lock()
        .unwrap()
        .extend((0..FRAMES as u8).map(|i| arp_frame(mac, i)));
    let engine = Engine::start(dev.clone(), uplink).expect("engine");
    (dev, gate, engine)
}

/// Start node `n`'s device (its objects made by the test) on the queued batch with a gate that
/// holds the engine inside the first frame until released; returns once it is held there.
/// `n` keeps its guest memory, so its rings stay readable.
fn start_node_held(n: &mut common::Node) -> (Arc<HandoffLock<Device>>, Arc<Gate>, Engine) {
    let gate = Arc::new(Gate {
        hold: true,
        ..Gate::default()
    });
    n.dev.set_output(gate.clone());
    let dev = std::mem::replace(
        &mut n.dev,
        Device::new(DeviceConfig::default(), GuestMem::empty(), gate.clone()),
    );
    let (dev, gate, engine) = start_device(dev, n.mac, gate);
    wait_for("the first frame", || {
        gate.delivered.load(Ordering::SeqCst) >= 1
    });
    (dev, gate, engine)
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < LONG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_control_command_gets_the_device_after_one_buffer_of_the_batch() {
    let (dev, gate, engine) = start();
    wait_for("the first frame", || {
        gate.delivered.load(Ordering::SeqCst) >= 1
    });
    let seen = {
        let _d = dev.lock();
        gate.delivered.load(Ordering::SeqCst)
    };
    // Before hand-offs the command waited for the batch: it saw all FRAMES.
    assert_eq!(seen, 1, "the command waited for {seen} of {FRAMES} frames");
    // The engine goes on with the rest of its batch.
    wait_for("the rest of the batch", || {
        gate.delivered.load(Ordering::SeqCst) == FRAMES
    });
    engine.stop();
}

#[test]
fn a_suspend_at_a_hand_off_point_ends_the_batch() {
    let (dev, gate, engine) = start();
    wait_for("the first frame", || {
        gate.delivered.load(Ordering::SeqCst) >= 1
    });
    dev.lock().suspend();
    // The engine sees the suspension when it takes the device back, and drops the rest of
    // its batch; give it ample time to (wrongly) deliver them.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        gate.delivered.load(Ordering::SeqCst),
        1,
        "frames reached the guest after the device was suspended"
    );
    assert!(dev.lock().suspended());
    engine.stop();
}

#[test]
fn a_query_runs_beside_a_worker_inside_a_unit() {
    // A query only reads (`Device::handle_query`): the control queue runs it on the device
    // shared with the engine's workers (`HandoffLock::read`), so it answers while a worker is
    // in the middle of a unit of work, without waiting for its hand-off.
    let gate = Gate {
        hold: true,
        ..Gate::default()
    };
    let (dev, gate, engine) = start_gated(gate);
    wait_for("the first frame", || {
        gate.delivered.load(Ordering::SeqCst) >= 1
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let query = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let mut resp = Vec::new();
            let status = dev
                .read()
                .handle_shared(VRDMA_CMD_QUERY_DEVICE, &[], &mut resp);
            let _ = tx.send((status, resp.len()));
        })
    };
    let answer = rx.recv_timeout(LONG);
    let inside = gate.delivered.load(Ordering::SeqCst);
    gate.released.store(true, Ordering::SeqCst);
    let (status, len) = answer.expect("the query waited for the worker's unit");
    assert_eq!(status, Some(VRDMA_STATUS_OK));
    assert!(len > 0, "QUERY_DEVICE answered without a body");
    assert_eq!(
        inside, 1,
        "the worker had left its unit before the query answered"
    );
    query.join().unwrap();
    wait_for("the rest of the batch", || {
        gate.delivered.load(Ordering::SeqCst) == FRAMES
    });
    engine.stop();
}

#[test]
fn a_modify_qp_runs_beside_a_worker_inside_a_unit() {
    // MODIFY_QP changes one QP under its own lock (`Device::handle_shared`): it does not wait
    // for a worker busy with another unit. Moving the QP to ERR there only queues its flush for
    // its worker, which flushes after the kick that follows every command batch.
    let mut n = common::Node::new(7, 16, 1500);
    let pd = n.create_pd();
    let (cq, mut cqr) = n.create_cq(64);
    let q = n.create_qp(common::QpSpec::rc(pd, cq));
    n.qp_to_init(q.qpn);
    let buf = n.alloc(4096);
    let k = n.reg_mr(pd, buf, 4096, common::ACC_ALL);
    let mut rq = q.rq.clone().unwrap();
    n.post_recv(&mut rq, 41, &[(buf, 4096, k)]);
    let (dev, gate, engine) = start_node_held(&mut n);
    let (tx, rx) = std::sync::mpsc::channel();
    let modify = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let c = VrdmaCmdModifyQp {
                qpn: q.qpn,
                attr_mask: VRDMA_QP_STATE,
                attr: VrdmaQpAttr {
                    qp_state: VRDMA_QPS_ERR,
                    ..Default::default()
                },
            };
            let mut resp = Vec::new();
            let status = dev
                .read()
                .handle_shared(VRDMA_CMD_MODIFY_QP, c.as_bytes(), &mut resp);
            let _ = tx.send(status);
        })
    };
    let answer = rx.recv_timeout(LONG);
    let inside = gate.delivered.load(Ordering::SeqCst);
    // Not flushed by the command's thread, beside the worker that owns the QP.
    let early = n.poll_cq(&mut cqr);
    gate.released.store(true, Ordering::SeqCst);
    let status = answer.expect("MODIFY_QP waited for the worker's unit");
    assert!(early.is_empty(), "flushed beside its worker: {early:?}");
    assert_eq!(status, Some(VRDMA_STATUS_OK));
    assert_eq!(
        inside, 1,
        "the worker had left its unit before MODIFY_QP answered"
    );
    modify.join().unwrap();
    engine.sender().kick();
    let got = common::engine::wait_cqes(&mut n, &mut cqr, 1, LONG, "the flush");
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (41, VRDMA_WC_WR_FLUSH_ERR),
        "the QP's worker flushed its receive queue"
    );
    let mut resp = Vec::new();
    let h = VrdmaHandle {
        handle: q.qpn,
        ..Default::default()
    };
    let status = dev
        .read()
        .handle_shared(VRDMA_CMD_QUERY_QP, h.as_bytes(), &mut resp);
    assert_eq!(status, Some(VRDMA_STATUS_OK));
    let attr = VrdmaQpAttr::read_from(&resp).expect("QUERY_QP body");
    assert_eq!(attr.qp_state, VRDMA_QPS_ERR);
    engine.stop();
}

#[test]
fn mr_registration_and_ahs_run_beside_a_worker_inside_a_unit() {
    // Adding an MR takes a free slot under the MR table's write lock (`Device::handle_shared`),
    // an AH is added and removed under the AH table's: neither waits for a worker busy with a
    // unit. Taking an MR away (DEREG_MR) runs beside the workers too, but a worker may be
    // copying through it: it answers only once the unit in flight is over (the unit fence,
    // `tables/units.rs`).
    let mut n = common::Node::new(8, 16, 1500);
    let pd = n.create_pd();
    let av = n.av_to(&n);
    let (dev, gate, engine) = start_node_held(&mut n);
    let (tx, rx) = std::sync::mpsc::channel();
    let (dereg_tx, dereg_rx) = std::sync::mpsc::channel();
    let reg = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let c = VrdmaCmdRegMr {
                pdn: pd,
                access: VRDMA_ACCESS_LOCAL_WRITE,
                ..Default::default()
            };
            let mut resp = Vec::new();
            let status = dev
                .read()
                .handle_shared(VRDMA_CMD_REG_DMA_MR, c.as_bytes(), &mut resp);
            let key = VrdmaRespRegMr::read_from(&resp).map(|r| r.lkey);
            // An AH too (CREATE_AH / DESTROY_AH under the AH table's lock).
            let c = VrdmaCmdCreateAh {
                pdn: pd,
                av,
                ..Default::default()
            };
            let created = dev
                .read()
                .handle_shared(VRDMA_CMD_CREATE_AH, c.as_bytes(), &mut resp);
            let ah = VrdmaHandle::read_from(&resp).map_or(u32::MAX, |h| h.handle);
            let h = VrdmaHandle {
                handle: ah,
                ..Default::default()
            };
            let destroyed = dev
                .read()
                .handle_shared(VRDMA_CMD_DESTROY_AH, h.as_bytes(), &mut resp);
            assert_eq!(
                (created, destroyed),
                (Some(VRDMA_STATUS_OK), Some(VRDMA_STATUS_OK))
            );
            let _ = tx.send((status, key));
            let h = VrdmaHandle {
                handle: key.unwrap_or(0),
                ..Default::default()
            };
            let dereg = dev
                .read()
                .handle_shared(VRDMA_CMD_DEREG_MR, h.as_bytes(), &mut resp);
            let _ = dereg_tx.send(dereg);
        })
    };
    let answer = rx.recv_timeout(LONG);
    let inside = gate.delivered.load(Ordering::SeqCst);
    wait_for("DEREG_MR waiting for the unit", || {
        dev.read().fences_waiting() == 1
    });
    let early = dereg_rx.recv_timeout(Duration::from_millis(300));
    let still_inside = gate.delivered.load(Ordering::SeqCst);
    gate.released.store(true, Ordering::SeqCst);
    let (status, key) = answer.expect("REG_DMA_MR waited for the worker's unit");
    assert_eq!(status, Some(VRDMA_STATUS_OK));
    assert!(key.is_some_and(|k| k != 0), "no key in the response");
    assert_eq!(
        inside, 1,
        "the worker had left its unit before REG_DMA_MR answered"
    );
    assert!(
        early.is_err() && still_inside == 1,
        "DEREG_MR answered while the worker was inside its unit: {early:?}"
    );
    let dereg = dereg_rx
        .recv_timeout(LONG)
        .expect("DEREG_MR never answered after the unit");
    assert_eq!(dereg, Some(VRDMA_STATUS_OK));
    reg.join().unwrap();
    // The key is gone.
    let c = VrdmaHandle {
        handle: key.unwrap_or(0),
        ..Default::default()
    };
    let mut resp = Vec::new();
    let again = dev
        .read()
        .handle_shared(VRDMA_CMD_DEREG_MR, c.as_bytes(), &mut resp);
    assert_ne!(again, Some(VRDMA_STATUS_OK));
    engine.stop();
}

#[test]
fn objects_are_created_and_destroyed_beside_a_worker_inside_a_unit() {
    // CREATE_PD, ALLOC_XRCD, CREATE_CQ and CREATE_SRQ grow their tables through a shared borrow
    // (`objects::LockedTable`): none waits for a worker busy with a unit. Their destroys run
    // there too: one refused as BUSY answers at once, a CQ's or SRQ's that goes ahead waits
    // for the unit in flight (`tables/units.rs`), which may still post to it.
    let mut n = common::Node::new(8, 16, 1500);
    let rings = [n.ring(64, 6), n.ring(64, 8), n.ring(64, 8), n.ring(64, 6)];
    let (dev, gate, engine) = start_node_held(&mut n);
    let shared = |op: u16, req: Vec<u8>| {
        let mut resp = Vec::new();
        let status = dev.read().handle_shared(op, &req, &mut resp);
        let h = VrdmaHandle::read_from(&resp).map_or(0, |h| h.handle);
        (status, h)
    };
    let handle = |h: u32| {
        VrdmaHandle {
            handle: h,
            ..Default::default()
        }
        .as_bytes()
        .to_vec()
    };
    let with_pages = |head: &[u8], ring: &common::RingH| {
        let mut b = head.to_vec();
        ring.pages
            .iter()
            .for_each(|p| b.extend_from_slice(&p.to_le_bytes()));
        b
    };
    let cq_cmd = |ring: &common::RingH| {
        let c = VrdmaCmdCreateCq {
            depth: 64,
            npages: ring.pages.len() as u32,
            ..Default::default()
        };
        with_pages(c.as_bytes(), ring)
    };
    let srq_cmd = |pd: u32, ring: &common::RingH, xrc: Option<(u32, u32)>| {
        let c = VrdmaCmdCreateSrq {
            pdn: pd,
            depth: 64,
            wqe_shift: 8,
            srq_type: if xrc.is_some() {
                VRDMA_SRQT_XRC
            } else {
                VRDMA_SRQT_BASIC
            },
            xrcdn: xrc.map_or(0, |x| x.0),
            cqn: xrc.map_or(0, |x| x.1),
            max_sge: 4,
            npages: ring.pages.len() as u32,
            ..Default::default()
        };
        with_pages(c.as_bytes(), ring)
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (late_tx, late_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            let pd = shared(VRDMA_CMD_CREATE_PD, handle(0));
            let xrcd = shared(VRDMA_CMD_ALLOC_XRCD, Vec::new());
            let cq = shared(VRDMA_CMD_CREATE_CQ, cq_cmd(&rings[0]));
            let srq = shared(VRDMA_CMD_CREATE_SRQ, srq_cmd(pd.1, &rings[1], None));
            let xsrq = shared(
                VRDMA_CMD_CREATE_SRQ,
                srq_cmd(pd.1, &rings[2], Some((xrcd.1, cq.1))),
            );
            let spare = shared(VRDMA_CMD_CREATE_CQ, cq_cmd(&rings[3]));
            // Refused before any fence: answers while the worker is still inside its unit.
            let busy = (
                shared(VRDMA_CMD_DESTROY_CQ, handle(cq.1)).0,
                shared(VRDMA_CMD_DESTROY_PD, handle(pd.1)).0,
            );
            let _ = tx.send(([pd, xrcd, cq, srq, xsrq, spare], busy));
            // Goes ahead: waits for the unit.
            let _ = late_tx.send(shared(VRDMA_CMD_DESTROY_CQ, handle(spare.1)).0);
        });
        let answer = rx.recv_timeout(LONG);
        let inside = gate.delivered.load(Ordering::SeqCst);
        wait_for("DESTROY_CQ waiting for the unit", || {
            dev.read().fences_waiting() == 1
        });
        let early = late_rx.recv_timeout(Duration::from_millis(300));
        let still_inside = gate.delivered.load(Ordering::SeqCst);
        gate.released.store(true, Ordering::SeqCst);
        let (made, busy) = answer.expect("a create command waited for the worker's unit");
        for (what, (status, h)) in ["PD", "XRCD", "CQ", "SRQ", "XRC SRQ", "CQ"]
            .iter()
            .zip(made)
        {
            assert_eq!(status, Some(VRDMA_STATUS_OK), "{what}");
            assert_ne!(h, 0, "{what}: no handle in the response");
        }
        assert_eq!(
            busy,
            (Some(VRDMA_STATUS_BUSY), Some(VRDMA_STATUS_BUSY)),
            "a CQ an XRC SRQ completes into, a PD with SRQs"
        );
        assert_eq!(
            inside, 1,
            "the worker had left its unit before the creates answered"
        );
        assert!(
            early.is_err() && still_inside == 1,
            "DESTROY_CQ answered while the worker was inside its unit: {early:?}"
        );
        let late = late_rx
            .recv_timeout(LONG)
            .expect("DESTROY_CQ never answered after the unit");
        assert_eq!(late, Some(VRDMA_STATUS_OK));
        // The rest in dependency order (the CQ only after the XRC SRQ that completes into it).
        let [pd, xrcd, cq, srq, xsrq, _] = made.map(|m| m.1);
        for (op, h) in [
            (VRDMA_CMD_DESTROY_SRQ, xsrq),
            (VRDMA_CMD_DESTROY_SRQ, srq),
            (VRDMA_CMD_DESTROY_CQ, cq),
            (VRDMA_CMD_DEALLOC_XRCD, xrcd),
            (VRDMA_CMD_DESTROY_PD, pd),
        ] {
            assert_eq!(shared(op, handle(h)).0, Some(VRDMA_STATUS_OK), "{op} {h}");
        }
        assert_eq!(
            shared(VRDMA_CMD_DESTROY_CQ, handle(cq)).0,
            Some(VRDMA_STATUS_NOT_FOUND)
        );
    });
    let d = dev.read();
    assert!(d.cqs().is_empty() && d.srqs().is_empty() && d.pds().is_empty());
    drop(d);
    engine.stop();
}

#[test]
fn qps_are_created_and_destroyed_beside_a_worker_inside_a_unit() {
    // CREATE_QP inserts through a shared borrow (`qp/table.rs`) and answers while a worker is
    // busy with a unit; DESTROY_QP takes the QP out beside it and answers only after the unit
    // in flight (which may have the QP's state out) ended. ATTACH_MCAST answers beside it too.
    // A destroy while a flush is queued (here: the held worker's, after a MODIFY_QP to ERR)
    // needs the exclusive device, which flushes first: `handle_shared` declines it.
    let mut n = common::Node::new(8, 16, 1500);
    let pd = n.create_pd();
    let (cq, _) = n.create_cq(64);
    let old = n.create_qp(common::QpSpec::rc(pd, cq));
    let ud = n.create_qp(common::QpSpec::of_type(VRDMA_QPT_UD, pd, cq));
    let mut group = [0u8; 16];
    group[0] = 0xff;
    group[15] = 7;
    let attach = VrdmaCmdMcast {
        qpn: ud.qpn,
        reserved: 0,
        gid: group,
    };
    n.cmd(VRDMA_CMD_ATTACH_MCAST, attach.as_bytes())
        .expect("attach");
    // Out of RESET, so that a MODIFY_QP to ERR flushes it.
    common::ud_rts(&mut n, &ud, 0x1111);
    let (sq, rq) = (n.ring(64, 8), n.ring(64, 7));
    let create = common::QpSpec {
        sq_depth: 64,
        rq_depth: 64,
        sq_shift: 8,
        rq_shift: 7,
        max_sge: 4,
        max_inline: 0,
        ..common::QpSpec::rc(pd, cq)
    }
    .request(&sq, Some(&rq));
    let (dev, gate, engine) = start_node_held(&mut n);
    let shared = |op: u16, req: &[u8]| {
        let mut resp = Vec::new();
        let status = dev.read().handle_shared(op, req, &mut resp);
        (status, resp)
    };
    let handle = |h: u32| {
        VrdmaHandle {
            handle: h,
            ..Default::default()
        }
        .as_bytes()
        .to_vec()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (late_tx, late_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let (created, resp) = shared(VRDMA_CMD_CREATE_QP, &create);
            let qpn = VrdmaRespCreateQp::read_from(&resp).map_or(0, |r| r.qpn);
            // QPN 2 is below the first QPN handed out: never a QP's.
            let missing = shared(VRDMA_CMD_DESTROY_QP, &handle(2)).0;
            let mut second = attach;
            second.gid[15] = 8;
            let attached = shared(VRDMA_CMD_ATTACH_MCAST, second.as_bytes()).0;
            let to_err = VrdmaCmdModifyQp {
                qpn: ud.qpn,
                attr_mask: VRDMA_QP_STATE,
                attr: VrdmaQpAttr {
                    qp_state: VRDMA_QPS_ERR,
                    ..Default::default()
                },
            };
            let modified = shared(VRDMA_CMD_MODIFY_QP, to_err.as_bytes()).0;
            let queued = shared(VRDMA_CMD_DESTROY_QP, &handle(ud.qpn)).0;
            let _ = tx.send((created, qpn, missing, [attached, modified], queued));
            let _ = late_tx.send(shared(VRDMA_CMD_DESTROY_QP, &handle(old.qpn)).0);
        });
        let answer = rx.recv_timeout(LONG);
        let inside = gate.delivered.load(Ordering::SeqCst);
        wait_for("DESTROY_QP waiting for the unit", || {
            dev.read().fences_waiting() == 1
        });
        let early = late_rx.recv_timeout(Duration::from_millis(300));
        let still_inside = gate.delivered.load(Ordering::SeqCst);
        // The destroyed QP is gone from lookups before the command answers.
        let gone_early = !dev.read().qps.contains(old.qpn);
        gate.released.store(true, Ordering::SeqCst);
        let (created, qpn, missing, beside, queued) =
            answer.expect("CREATE_QP waited for the worker's unit");
        assert_eq!(
            inside, 1,
            "the worker left its unit before CREATE_QP answered"
        );
        assert_eq!(created, Some(VRDMA_STATUS_OK));
        assert!(qpn >= VRDMA_FIRST_QPN, "no QPN in the response: {qpn:#x}");
        assert_eq!(missing, Some(VRDMA_STATUS_NOT_FOUND));
        assert_eq!(
            beside,
            [Some(VRDMA_STATUS_OK); 2],
            "ATTACH_MCAST, MODIFY_QP to ERR"
        );
        assert_eq!(queued, None, "destroyed beside a queued flush");
        assert!(
            early.is_err() && still_inside == 1,
            "DESTROY_QP answered while the worker was inside its unit: {early:?}"
        );
        assert!(gone_early, "lookups still found the QP being destroyed");
        let late = late_rx
            .recv_timeout(LONG)
            .expect("DESTROY_QP never answered after the unit");
        assert_eq!(late, Some(VRDMA_STATUS_OK));
        let (query, _) = shared(VRDMA_CMD_QUERY_QP, &handle(old.qpn));
        assert_eq!(query, Some(VRDMA_STATUS_NOT_FOUND));
        let (query, resp) = shared(VRDMA_CMD_QUERY_QP, &handle(qpn));
        assert_eq!(query, Some(VRDMA_STATUS_OK));
        assert_eq!(
            VrdmaQpAttr::read_from(&resp).map(|a| a.qp_state),
            Some(VRDMA_QPS_RESET)
        );
        assert_eq!(
            shared(VRDMA_CMD_DESTROY_QP, &handle(qpn)).0,
            Some(VRDMA_STATUS_OK)
        );
    });
    // The group member with its flush queued, on the exclusive device: flushed, detached from
    // both groups and destroyed.
    let mut resp = Vec::new();
    let done = dev
        .lock()
        .handle_command(VRDMA_CMD_DESTROY_QP, &handle(ud.qpn), &mut resp);
    assert_eq!(
        done,
        vrdma_backend::device::CmdOutcome::Done(VRDMA_STATUS_OK)
    );
    let d = dev.read();
    assert!(d.qps.is_empty() && !d.mcast().is_attached(ud.qpn));
    drop(d);
    engine.stop();
}

#[test]
fn a_multicast_detach_waits_for_the_unit_in_flight() {
    // ATTACH_MCAST and DETACH_MCAST run beside the workers under the groups' lock; a detach
    // answers only after the unit in flight, which may be delivering one of the group's
    // datagrams to the QP, ended.
    let mut n = common::Node::new(8, 16, 1500);
    let pd = n.create_pd();
    let (cq, _) = n.create_cq(64);
    let ud = n.create_qp(common::QpSpec::of_type(VRDMA_QPT_UD, pd, cq));
    let mut gid = [0u8; 16];
    gid[0] = 0xff;
    gid[15] = 9;
    let group = VrdmaCmdMcast {
        qpn: ud.qpn,
        reserved: 0,
        gid,
    };
    let (dev, gate, engine) = start_node_held(&mut n);
    let shared = |op: u16| {
        let mut resp = Vec::new();
        dev.read().handle_shared(op, group.as_bytes(), &mut resp)
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (late_tx, late_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = tx.send(shared(VRDMA_CMD_ATTACH_MCAST));
            let _ = late_tx.send(shared(VRDMA_CMD_DETACH_MCAST));
        });
        let attached = rx.recv_timeout(LONG);
        wait_for("DETACH_MCAST waiting for the unit", || {
            dev.read().fences_waiting() == 1
        });
        let early = late_rx.recv_timeout(Duration::from_millis(300));
        let still_inside = gate.delivered.load(Ordering::SeqCst);
        let detached_early = !dev.read().mcast().is_attached(ud.qpn);
        gate.released.store(true, Ordering::SeqCst);
        assert_eq!(
            attached,
            Ok(Some(VRDMA_STATUS_OK)),
            "ATTACH_MCAST beside the unit"
        );
        assert!(
            early.is_err() && still_inside == 1,
            "DETACH_MCAST answered while the worker was inside its unit: {early:?}"
        );
        assert!(
            detached_early,
            "the group still had the QP while the detach waited"
        );
        assert_eq!(late_rx.recv_timeout(LONG), Ok(Some(VRDMA_STATUS_OK)));
    });
    assert_eq!(shared(VRDMA_CMD_DETACH_MCAST), Some(VRDMA_STATUS_NOT_FOUND));
    engine.stop();
}

#[test]
fn a_prefetch_advice_runs_beside_a_worker_inside_a_unit() {
    // ADVISE_MR without F_FLUSH sends its page requests under the MR table's write lock,
    // beside the workers; with F_FLUSH it may park its chain, so `handle_shared` declines it
    // and `handle_shared_parking` (the control queue's, which can park) parks it there.
    let mut n = common::Node::new_odp(8, 16);
    let pd = n.create_pd();
    let gpa = n.alloc(4 << 20);
    let key = n.reg_odp_mr(pd, gpa, 4 << 20, VRDMA_ACCESS_LOCAL_WRITE);
    let (dev, gate, engine) = start_node_held(&mut n);
    let advise = |flags: u32| VrdmaCmdAdviseMr {
        lkey: key,
        advice: VRDMA_ADVISE_PREFETCH_WRITE,
        flags,
        iova: gpa,
        length: 4 << 20,
        ..Default::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut resp = Vec::new();
            let d = dev.read();
            let plain = d.handle_shared(VRDMA_CMD_ADVISE_MR, advise(0).as_bytes(), &mut resp);
            let flush = d.handle_shared(
                VRDMA_CMD_ADVISE_MR,
                advise(VRDMA_ADVISE_F_FLUSH).as_bytes(),
                &mut resp,
            );
            let parking = d.handle_shared_parking(
                VRDMA_CMD_ADVISE_MR,
                advise(VRDMA_ADVISE_F_FLUSH).as_bytes(),
                &mut resp,
            );
            let _ = tx.send((plain, flush, parking));
        });
        let answer = rx.recv_timeout(LONG);
        let inside = gate.delivered.load(Ordering::SeqCst);
        gate.released.store(true, Ordering::SeqCst);
        let (plain, flush, parking) = answer.expect("ADVISE_MR waited for the worker's unit");
        assert_eq!(
            inside, 1,
            "the worker left its unit before ADVISE_MR answered"
        );
        assert_eq!(plain, Some(VRDMA_STATUS_OK));
        assert_eq!(
            flush, None,
            "an advise that may park needs a caller that can park its chain"
        );
        assert!(
            matches!(parking, Some(vrdma_backend::guest::CmdOutcome::Parked(_))),
            "F_FLUSH behind the pending prefetch parks beside the worker: {parking:?}"
        );
    });
    // The prefetch asked for the MR's chunks.
    assert!(
        gate.page_requests.load(Ordering::SeqCst) > 0,
        "the prefetch sent no page request"
    );
    engine.stop();
}

#[test]
fn an_srq_resize_runs_beside_a_worker_inside_a_unit() {
    // MODIFY_SRQ with a new depth copies the posted WQEs into the new ring and swaps it under
    // the SRQ's lock (a worker pops under the same lock): it waits for no worker's unit.
    let mut n = common::Node::new(8, 16, 1500);
    let pd = n.create_pd();
    let (srq, mut ring) = n.create_srq(pd, 16, 2, 0);
    let buf = n.alloc(4096);
    for i in 0..3 {
        n.post_recv(&mut ring, i, &[(buf, 64, 0)]);
    }
    let bigger = n.ring(64, ring.shift);
    let mut req = VrdmaCmdModifySrq {
        srqn: srq,
        attr_mask: VRDMA_SRQ_MAX_WR,
        max_wr: 64,
        npages: bigger.pages.len() as u32,
        ..Default::default()
    }
    .as_bytes()
    .to_vec();
    bigger
        .pages
        .iter()
        .for_each(|p| req.extend_from_slice(&p.to_le_bytes()));
    let (dev, gate, engine) = start_node_held(&mut n);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut resp = Vec::new();
            let d = dev.read();
            let resized = d.handle_shared(VRDMA_CMD_MODIFY_SRQ, &req, &mut resp);
            let q = VrdmaHandle {
                handle: srq,
                ..Default::default()
            };
            let queried = d.handle_shared(VRDMA_CMD_QUERY_SRQ, q.as_bytes(), &mut resp);
            let depth = VrdmaRespQuerySrq::read_from(&resp).map(|r| r.max_wr);
            let _ = tx.send((resized, queried, depth));
        });
        let answer = rx.recv_timeout(LONG);
        let inside = gate.delivered.load(Ordering::SeqCst);
        gate.released.store(true, Ordering::SeqCst);
        let (resized, queried, depth) = answer.expect("MODIFY_SRQ waited for the worker's unit");
        assert_eq!(
            inside, 1,
            "the worker left its unit before MODIFY_SRQ answered"
        );
        assert_eq!(
            (resized, queried),
            (Some(VRDMA_STATUS_OK), Some(VRDMA_STATUS_OK))
        );
        assert_eq!(depth, Some(64));
    });
    // The three WQEs moved with the ring: the new producer index is 3.
    let producer = bigger.ctrl() + vrdma_backend::guest::ring::CTRL_PRODUCER;
    assert_eq!(n.mem.load_u32_acquire(producer).unwrap(), 3);
    engine.stop();
}

/// The answer to page request `r` mapping its range at the same guest-physical addresses.
fn page_resp_for(r: &VrdmaPageReq) -> Vec<u8> {
    let npages = (r.length / 4096) as u32;
    let mut req = VrdmaCmdOdpPageResp {
        req_id: r.req_id,
        mr_key: r.mr_key,
        status: VRDMA_STATUS_OK,
        flags: VRDMA_ODP_RESP_F_WRITABLE,
        iova: r.iova,
        npages,
        ..Default::default()
    }
    .as_bytes()
    .to_vec();
    (0..u64::from(npages)).for_each(|i| req.extend_from_slice(&(r.iova + i * 4096).to_le_bytes()));
    req
}

#[test]
fn page_responses_run_beside_a_worker_inside_a_unit_until_one_must_reclaim() {
    // ODP_PAGE_RESP installs its chunk under the MR table's write lock, beside the workers.
    // With the MR's residency budget full, the install reclaims the least recently used chunk
    // and sends a RECLAIM notice: that answer needs the exclusive device (`None` here) and is
    // answered there once the worker has left its unit.
    let mut n = common::Node::new_odp(8, 16);
    n.dev.config.odp.max_resident_per_mr = 2;
    *n.dev.mrs.get_mut() = vrdma_backend::memory::MrTable::new(
        n.dev.config.max_mr,
        n.mem.clone(),
        n.out.clone(),
        n.dev.config.odp.clone(),
    )
    .with_budget(n.dev.budget.clone());
    let pd = n.create_pd();
    let gpa = n.alloc(8 << 20);
    let key = n.reg_odp_mr(pd, gpa, 6 << 20, VRDMA_ACCESS_LOCAL_WRITE);
    let (dev, gate, engine) = start_node_held(&mut n);
    let advise = VrdmaCmdAdviseMr {
        lkey: key,
        advice: VRDMA_ADVISE_PREFETCH_WRITE,
        flags: 0,
        iova: gpa,
        length: 6 << 20,
        ..Default::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut resp = Vec::new();
            let d = dev.read();
            let advised = d.handle_shared(VRDMA_CMD_ADVISE_MR, advise.as_bytes(), &mut resp);
            let faults: Vec<VrdmaPageReq> = gate.sent_requests.lock().unwrap().clone();
            let answers: Vec<Option<u32>> = faults
                .iter()
                .map(|r| d.handle_shared(VRDMA_CMD_ODP_PAGE_RESP, &page_resp_for(r), &mut resp))
                .collect();
            let notices = gate.sent_requests.lock().unwrap().len() - faults.len();
            let _ = tx.send((advised, faults, answers, notices));
        });
        let answer = rx.recv_timeout(LONG);
        let inside = gate.delivered.load(Ordering::SeqCst);
        gate.released.store(true, Ordering::SeqCst);
        let (advised, faults, answers, notices) =
            answer.expect("ODP_PAGE_RESP waited for the worker's unit");
        assert_eq!(
            inside, 1,
            "the worker left its unit before ODP_PAGE_RESP answered"
        );
        assert_eq!(advised, Some(VRDMA_STATUS_OK));
        assert_eq!(faults.len(), 3, "one page request per chunk: {faults:?}");
        assert!(faults.iter().all(|r| r.type_ == VRDMA_PAGEREQ_FAULT));
        assert_eq!(
            answers,
            [Some(VRDMA_STATUS_OK), Some(VRDMA_STATUS_OK), None],
            "the third install reclaims: the exclusive device answers it"
        );
        assert_eq!(notices, 0, "no RECLAIM notice beside the worker");
        // The declined answer changed nothing: on the exclusive device it installs the chunk
        // and reclaims the oldest.
        let mut resp = Vec::new();
        let third = dev.lock().handle_command(
            VRDMA_CMD_ODP_PAGE_RESP,
            &page_resp_for(&faults[2]),
            &mut resp,
        );
        assert_eq!(
            third,
            vrdma_backend::guest::CmdOutcome::Done(VRDMA_STATUS_OK)
        );
        let sent = gate.sent_requests.lock().unwrap().clone();
        assert_eq!(sent.len(), 4, "one RECLAIM notice: {sent:?}");
        assert_eq!(sent[3].type_, VRDMA_PAGEREQ_RECLAIM);
        assert_eq!((sent[3].mr_key, sent[3].iova), (key, faults[0].iova));
    });
    engine.stop();
}

#[test]
fn a_cq_resize_runs_beside_the_workers_after_the_units_in_flight() {
    // RESIZE_CQ counts the send WQEs owed a completion, waits for the units in flight (one
    // may have retired a WQE and not yet written its CQE), then moves the CQEs under the CQ's
    // lock: it answers once the held worker leaves its unit, without the exclusive device. A
    // shrink its count refuses goes to the exclusive device, which refuses it too.
    let mut n = common::Node::new(8, 16, 1500);
    let pd = n.create_pd();
    let (cq, _) = n.create_cq(64);
    let mut qp = n.create_qp(common::QpSpec::rc(pd, cq));
    let buf = n.alloc(4096);
    for i in 0..3 {
        let w = common::Wqe {
            wr_id: i,
            opcode: VRDMA_WR_SEND,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(buf, 64, 0)],
            ..Default::default()
        };
        n.post_send_nodb(&mut qp, &w);
    }
    let rings = [n.ring(128, 6), n.ring(4, 6), n.ring(2, 6)];
    let resize = |ring: &common::RingH| {
        let mut b = VrdmaCmdCreateCq {
            cqn: cq,
            depth: ring.depth,
            npages: ring.pages.len() as u32,
            ..Default::default()
        }
        .as_bytes()
        .to_vec();
        ring.pages
            .iter()
            .for_each(|p| b.extend_from_slice(&p.to_le_bytes()));
        b
    };
    let (dev, gate, engine) = start_node_held(&mut n);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut resp = Vec::new();
            let grown =
                dev.read()
                    .handle_shared(VRDMA_CMD_RESIZE_CQ, &resize(&rings[0]), &mut resp);
            let _ = tx.send(grown);
        });
        wait_for("RESIZE_CQ waiting for the unit", || {
            dev.read().fences_waiting() == 1
        });
        let early = rx.recv_timeout(Duration::from_millis(300));
        let still_inside = gate.delivered.load(Ordering::SeqCst);
        gate.released.store(true, Ordering::SeqCst);
        assert!(
            early.is_err() && still_inside == 1,
            "RESIZE_CQ answered while the worker was inside its unit: {early:?}"
        );
        let grown = rx.recv_timeout(LONG).expect("RESIZE_CQ never answered");
        assert_eq!(
            grown,
            Some(VRDMA_STATUS_OK),
            "the grow ran beside the workers"
        );
    });
    let mut resp = Vec::new();
    // Three sends are owed a completion: a CQ of 4 holds them, one of 2 does not.
    assert_eq!(
        dev.read()
            .handle_shared(VRDMA_CMD_RESIZE_CQ, &resize(&rings[1]), &mut resp),
        Some(VRDMA_STATUS_OK)
    );
    assert_eq!(
        dev.read()
            .handle_shared(VRDMA_CMD_RESIZE_CQ, &resize(&rings[2]), &mut resp),
        None,
        "a refused shrink is decided on the exclusive device"
    );
    assert_eq!(
        dev.lock()
            .handle_command(VRDMA_CMD_RESIZE_CQ, &resize(&rings[2]), &mut resp),
        vrdma_backend::guest::CmdOutcome::Done(VRDMA_STATUS_INVALID)
    );
    engine.stop();
}

#[test]
fn gids_are_added_and_deleted_beside_a_worker_inside_a_unit() {
    // ADD_GID changes the GID table under its sequence lock, which frames read without a
    // lock: it answers while the worker is inside its unit. DEL_GID then waits for the unit
    // in flight (it may have taken in a frame for the GID).
    let mut n = common::Node::new(8, 16, 1500);
    let gid = |index: u32, g: [u8; 16]| {
        VrdmaCmdGid {
            index,
            type_: VRDMA_GID_TYPE_ROCE_V2,
            gid: g,
        }
        .as_bytes()
        .to_vec()
    };
    let v4 = |last: u8| {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 9, 0, last]);
        g
    };
    let (dev, gate, engine) = start_node_held(&mut n);
    let (tx, rx) = std::sync::mpsc::channel();
    let (late_tx, late_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut resp = Vec::new();
            let added = dev
                .read()
                .handle_shared(VRDMA_CMD_ADD_GID, &gid(5, v4(5)), &mut resp);
            let found = dev.read().gids().find_v2(&v4(5));
            let missing = dev
                .read()
                .handle_shared(VRDMA_CMD_DEL_GID, &gid(6, v4(6)), &mut resp);
            let _ = tx.send((added, found, missing));
            let deleted = dev
                .read()
                .handle_shared(VRDMA_CMD_DEL_GID, &gid(5, v4(5)), &mut resp);
            let _ = late_tx.send(deleted);
        });
        let answer = rx.recv_timeout(LONG);
        let inside = gate.delivered.load(Ordering::SeqCst);
        wait_for("DEL_GID waiting for the unit", || {
            dev.read().fences_waiting() == 1
        });
        let early = late_rx.recv_timeout(Duration::from_millis(300));
        let still_inside = gate.delivered.load(Ordering::SeqCst);
        gate.released.store(true, Ordering::SeqCst);
        let (added, found, missing) = answer.expect("ADD_GID waited for the worker's unit");
        assert_eq!(
            inside, 1,
            "the worker left its unit before ADD_GID answered"
        );
        assert_eq!(added, Some(VRDMA_STATUS_OK));
        assert_eq!(found, Some(5), "the new GID is one of the port's");
        assert_eq!(
            missing,
            Some(VRDMA_STATUS_NOT_FOUND),
            "a refused DEL_GID answers at once"
        );
        assert!(
            early.is_err() && still_inside == 1,
            "DEL_GID answered while the worker was inside its unit: {early:?}"
        );
        let deleted = late_rx.recv_timeout(LONG).expect("DEL_GID never answered");
        assert_eq!(deleted, Some(VRDMA_STATUS_OK));
    });
    assert_eq!(dev.read().gids().find_v2(&v4(5)), None);
    engine.stop();
}
