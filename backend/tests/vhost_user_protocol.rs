//! The vhost-user plumbing against a mock device: the `vhost` crate's Frontend plays QEMU
//! (features, protocol features, memfd memory table, vrings) against an in-process daemon.
//!
//! Long because it walks the vhost-user message set one message at a time against one mock
//! device and one Frontend; one binary.

mod vhost_user_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use vrdma_backend::cli::delay::DelaySpec;
use vrdma_backend::handoff::HandoffLock;
use vrdma_backend::vhost_user::daemon::listen;
use vrdma_backend::vhost_user::delay::CommandDelays;
use vrdma_backend::vhost_user::{
    serve, CmdOutcome, DoorbellSink, FrameSink, GuestMemoryAtomic, RdmaDevice, ServeParts,
    VirtqOutput, CONFIG_SIZE,
};
use vrdma_spec::*;

use vhost_user_support::*;

const T: Duration = Duration::from_secs(5);

#[derive(Default)]
struct MockDevice {
    pds: BTreeSet<u32>,
    next: u32,
    calls: Vec<(u16, Vec<u8>)>,
    resets: u32,
    mem_updates: u32,
    /// Where commands are logged beside the doorbells and fences, in one order.
    order: Option<Arc<Recorder>>,
}

impl RdmaDevice for MockDevice {
    fn handle_command(&mut self, opcode: u16, req: &[u8], resp: &mut Vec<u8>) -> CmdOutcome {
        self.calls.push((opcode, req.to_vec()));
        if let Some(r) = &self.order {
            r.order.lock().unwrap().push(format!("command {opcode}"));
        }
        CmdOutcome::Done(match opcode {
            VRDMA_CMD_CREATE_PD => {
                self.next += 1;
                self.pds.insert(self.next);
                resp.extend_from_slice(
                    VrdmaHandle {
                        handle: self.next,
                        reserved: 0,
                    }
                    .as_bytes(),
                );
                VRDMA_STATUS_OK
            }
            VRDMA_CMD_DESTROY_PD => match VrdmaHandle::read_from(req) {
                Some(h) if self.pds.remove(&h.handle) => VRDMA_STATUS_OK,
                Some(_) => VRDMA_STATUS_NOT_FOUND,
                None => VRDMA_STATUS_INVALID,
            },
            _ => VRDMA_STATUS_INVALID,
        })
    }
    fn reset(&mut self) {
        self.pds.clear();
        self.resets += 1;
    }
    fn set_guest_memory(&mut self, _mem: GuestMemoryAtomic) {
        self.mem_updates += 1;
    }
}

#[derive(Default)]
struct Recorder {
    doorbells: Mutex<Vec<(u32, u32)>>,
    frames: Mutex<Vec<Vec<u8>>>,
    /// Doorbells, fences and commands as they happened.
    order: Mutex<Vec<String>>,
}

impl DoorbellSink for Recorder {
    fn doorbell(&self, db: VrdmaDoorbell) {
        self.doorbells.lock().unwrap().push((db.type_, db.id));
        self.order
            .lock()
            .unwrap()
            .push(format!("doorbell {} {}", db.type_, db.id));
    }

    fn fence(&self) {
        self.order.lock().unwrap().push("fence".into());
    }
}

impl FrameSink for Recorder {
    fn send_frame(&self, frame: &[u8]) -> std::io::Result<()> {
        self.frames.lock().unwrap().push(frame.to_vec());
        Ok(())
    }
}

struct Harness {
    path: std::path::PathBuf,
    device: Arc<HandoffLock<MockDevice>>,
    out: Arc<VirtqOutput>,
    rec: Arc<Recorder>,
    config: [u8; CONFIG_SIZE],
    thread: thread::JoinHandle<()>,
}

impl Harness {
    /// Hang up `fe` and wait until the daemon thread ends (it serves a fixed number of
    /// connections).
    fn finish(self, fe: vhost::vhost_user::Frontend) {
        drop(fe);
        self.thread.join().unwrap();
    }
}

fn test_config() -> [u8; CONFIG_SIZE] {
    let c = VrdmaConfig {
        mac: [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef],
        mtu: 1500,
        max_qp: 16384,
        max_pd: 77,
        odp_chunk_shift: 21,
        ..VrdmaConfig::ZERO
    };
    let mut out = [0u8; CONFIG_SIZE];
    out.copy_from_slice(c.as_bytes());
    out
}

fn start(tag: &str, connections: usize, odp: bool) -> Harness {
    let _ = env_logger::builder().is_test(true).try_init();
    let path = socket_path(tag);
    let rec = Arc::new(Recorder::default());
    let device = Arc::new(HandoffLock::new(MockDevice {
        order: Some(rec.clone()),
        ..MockDevice::default()
    }));
    let out = Arc::new(VirtqOutput::new(64));
    let config = test_config();
    let parts = ServeParts {
        device: device.clone(),
        out: out.clone(),
        doorbells: rec.clone(),
        eth_tx: rec.clone(),
        config,
        device_features: if odp {
            (1 << VIRTIO_RDMA_F_ODP) | (1 << VIRTIO_RDMA_F_ODP_IMPLICIT)
        } else {
            0
        },
        mtu: 1500,
        accept_failures: Default::default(),
    };
    let mut listener = listen(&path).expect("listen");
    let thread = thread::spawn(move || {
        serve(&mut listener, &parts, Some(connections)).expect("serve");
    });
    Harness {
        path,
        device,
        out,
        rec,
        config,
        thread,
    }
}

/// Send one control chain made of `bufs` and return (used len, response bytes).
fn control(
    ring: &mut DriverRing,
    guest: &Guest,
    bufs: &[Buf],
    resp_at: Option<(u64, usize)>,
) -> (u32, Vec<u8>) {
    let head = ring.add(guest, bufs);
    ring.notify();
    let (id, len) = ring.wait_used(guest, T).expect("control chain returned");
    assert_eq!(id, u32::from(head));
    let resp = resp_at.map_or(Vec::new(), |(a, l)| guest.read(a, l));
    (len, resp)
}

#[test]
fn features_protocol_features_and_queue_count() {
    let h = start("features", 1, true);
    let (mut fe, acked) = connect(&h.path, true);
    let f = fe.get_features().unwrap();
    for bit in [
        VIRTIO_F_VERSION_1,
        VIRTIO_RING_F_INDIRECT_DESC,
        VIRTIO_RING_F_EVENT_IDX,
        VHOST_USER_F_PROTOCOL_FEATURES,
        1 << VIRTIO_RDMA_F_ETH,
        1 << VIRTIO_RDMA_F_ODP,
        1 << VIRTIO_RDMA_F_ODP_IMPLICIT,
    ] {
        assert_ne!(f & bit, 0, "feature {bit:#x} missing from {f:#x}");
    }
    assert_eq!(acked & VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_EVENT_IDX);
    assert_eq!(fe.get_queue_num().unwrap(), 6);
    h.finish(fe);
}

/// Spec §2.5: exactly the protocol features the daemon implements. QEMU uses every feature both
/// sides offer, e.g. an offered STATUS makes it send SET_STATUS, which vhost 0.18 does not handle.
#[test]
fn protocol_features_are_the_spec_table() {
    let h = start("protofeat", 1, true);
    let (mut fe, _) = connect(&h.path, true);
    let pf = fe.get_protocol_features().unwrap();
    let spec = VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::RESET_DEVICE
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
        | VhostUserProtocolFeatures::LOG_SHMFD
        | VhostUserProtocolFeatures::DEVICE_STATE;
    assert_eq!(pf, spec, "offered {pf:?}, spec §2.5 says {spec:?}");
    for not_offered in [
        VhostUserProtocolFeatures::STATUS,
        VhostUserProtocolFeatures::INFLIGHT_SHMFD,
        VhostUserProtocolFeatures::BACKEND_REQ,
    ] {
        assert!(!pf.contains(not_offered), "{not_offered:?} offered");
    }
    h.finish(fe);
}

#[test]
fn no_odp_hides_odp_features() {
    let h = start("noodp", 1, false);
    let (fe, _) = connect(&h.path, true);
    let f = fe.get_features().unwrap();
    assert_eq!(f & (1 << VIRTIO_RDMA_F_ODP), 0);
    assert_eq!(f & (1 << VIRTIO_RDMA_F_ODP_IMPLICIT), 0);
    assert_ne!(f & (1 << VIRTIO_RDMA_F_ETH), 0);
    h.finish(fe);
}

#[test]
fn config_space_reads_and_bounds() {
    let h = start("config", 1, true);
    let (mut fe, _, mut raw) = connect_raw(&h.path, true);
    let all = get_config(&mut fe, 0, CONFIG_SIZE).expect("whole config");
    assert_eq!(all, h.config.to_vec());
    let cfg = VrdmaConfig::read_from(&all).unwrap();
    assert_eq!(cfg.mac, [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
    assert_eq!(cfg.max_qp, 16384);
    assert_eq!(cfg.max_pd, 77);
    // A partial read at an offset, e.g. the driver reading max_qp alone.
    let max_qp_off = 12;
    let part = get_config(&mut fe, max_qp_off, 4).expect("partial");
    assert_eq!(u32::from_le_bytes(part.try_into().unwrap()), 16384);
    // Reads beyond the 256 bytes get the vhost-user error reply (size 0); the connection
    // survives them.
    assert_eq!(raw_get_config(&mut raw, 250, 16), (0, vec![]));
    assert_eq!(raw_get_config(&mut raw, 256, 4), (0, vec![]));
    assert_eq!(raw_get_config(&mut raw, 0, 6), (6, cfg.mac.to_vec()));
    // The config space is read-only: a write is ignored and the connection survives it.
    fe.set_config(0, VhostUserConfigFlags::WRITABLE, &[0u8; 6])
        .expect("SET_CONFIG acked");
    assert_eq!(get_config(&mut fe, 0, 6).unwrap(), cfg.mac.to_vec());
    drop(fe);
    drop(raw);
    h.thread.join().unwrap();
}

fn control_setup(h: &Harness, event_idx: bool) -> (vhost::vhost_user::Frontend, Guest, DriverRing) {
    control_session(&h.path, event_idx, 0x10_0000, 4 << 20, 64)
}

#[test]
fn control_round_trip_and_split_chains() {
    for event_idx in [true, false] {
        let h = start("control", 1, true);
        let (fe, mut guest, mut ctrl) = control_setup(&h, event_idx);

        let (len, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
        assert_eq!(len, 16);
        assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
        let pdn = VrdmaHandle::read_from(&resp[8..]).unwrap().handle;
        assert_ne!(pdn, 0);

        // DESTROY_PD with the request split at odd places over three descriptors, the
        // response over two.
        let c = cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn));
        let a = guest.alloc(3, 1);
        let b = guest.alloc(7, 1);
        let d = guest.alloc(c.len() - 10, 1);
        guest.write(a, &c[..3]);
        guest.write(b, &c[3..10]);
        guest.write(d, &c[10..]);
        let r1 = guest.alloc(3, 1);
        let r2 = guest.alloc(13, 1);
        let (len, _) = control(
            &mut ctrl,
            &guest,
            &[
                (a, 3, false),
                (b, 7, false),
                (d, (c.len() - 10) as u32, false),
                (r1, 3, true),
                (r2, 13, true),
            ],
            None,
        );
        assert_eq!(len, 8);
        let mut st = guest.read(r1, 3);
        st.extend(guest.read(r2, 5));
        assert_eq!(status_of(&st), VRDMA_STATUS_OK);
        {
            let dev = h.device.lock();
            let (op, req) = dev.calls.last().unwrap();
            assert_eq!(*op, VRDMA_CMD_DESTROY_PD);
            assert_eq!(
                req,
                &handle(pdn),
                "device saw the request without the header"
            );
        }

        // Same handle again: the device's NOT_FOUND reaches the driver.
        let (len, resp) = run_command(
            &mut ctrl,
            &mut guest,
            &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
            8,
        );
        assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_NOT_FOUND));

        // An indirect chain works too.
        let c = cmd(VRDMA_CMD_CREATE_PD, &[]);
        let req = guest.alloc(c.len(), 8);
        guest.write(req, &c);
        let resp = guest.alloc(16, 8);
        let head = ctrl.add_indirect(
            &mut guest,
            &[(req, c.len() as u32, false), (resp, 16, true)],
        );
        ctrl.notify();
        assert_eq!(ctrl.wait_used(&guest, T), Some((u32::from(head), 16)));
        assert_eq!(status_of(&guest.read(resp, 8)), VRDMA_STATUS_OK);

        h.finish(fe);
    }
}

#[test]
fn malformed_control_chains_get_the_defined_outcome() {
    let h = start("malformed", 1, true);
    let (fe, mut guest, mut ctrl) = control_setup(&h, true);
    let calls = |h: &Harness| h.device.lock().calls.len();

    // Nonzero flags -> INVALID, not executed.
    let mut c = cmd(VRDMA_CMD_CREATE_PD, &[]);
    c[2] = 1;
    let (len, resp) = run_command(&mut ctrl, &mut guest, &c, 16);
    assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_INVALID));
    assert_eq!(calls(&h), 0);

    // Readable part shorter than the command header -> INVALID.
    let (len, resp) = run_command(&mut ctrl, &mut guest, &[5, 0, 0], 16);
    assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_INVALID));

    // Writable part fits the header but not CREATE_PD's response -> INVALID, not executed.
    let (len, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 12);
    assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_INVALID));
    assert_eq!(calls(&h), 0);
    assert!(h.device.lock().pds.is_empty());

    // Writable part smaller than the response header -> returned with len 0.
    let (len, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 4);
    assert_eq!(len, 0);
    assert_eq!(resp, vec![0u8; 4]);

    // No writable part at all -> len 0.
    let c = cmd(VRDMA_CMD_CREATE_PD, &[]);
    let req = guest.alloc(c.len(), 8);
    guest.write(req, &c);
    let (len, _) = control(&mut ctrl, &guest, &[(req, c.len() as u32, false)], None);
    assert_eq!(len, 0);
    assert_eq!(calls(&h), 0);

    // Readable descriptor outside guest memory -> INVALID.
    let resp = guest.alloc(16, 8);
    let (len, r) = control(
        &mut ctrl,
        &guest,
        &[(0x7000_0000, 16, false), (resp, 16, true)],
        Some((resp, 16)),
    );
    assert_eq!((len, status_of(&r)), (8, VRDMA_STATUS_INVALID));

    // Writable descriptor outside guest memory -> len 0, not executed, no panic.
    let (len, _) = control(
        &mut ctrl,
        &guest,
        &[(req, c.len() as u32, false), (0x7000_0000, 16, true)],
        None,
    );
    assert_eq!(len, 0);
    assert_eq!(calls(&h), 0);

    // Readable part larger than the 64 MiB bound -> INVALID without reading it.
    let resp = guest.alloc(16, 8);
    let (len, r) = control(
        &mut ctrl,
        &guest,
        &[(req, (64 << 20) + 1, false), (resp, 16, true)],
        Some((resp, 16)),
    );
    assert_eq!((len, status_of(&r)), (8, VRDMA_STATUS_INVALID));
    assert_eq!(calls(&h), 0);

    // Unknown opcode: handed to the device, whose INVALID comes back.
    let (len, resp) = run_command(&mut ctrl, &mut guest, &cmd(999, &[1, 2, 3]), 64);
    assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_INVALID));

    // The queue still works.
    let (len, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!((len, status_of(&resp)), (16, VRDMA_STATUS_OK));
    h.finish(fe);
}

#[test]
fn reconnect_starts_from_a_reset_device() {
    let h = start("reconnect", 2, true);
    let pdn = {
        let (fe, mut guest, mut ctrl) = control_setup(&h, true);
        let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
        assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
        drop(fe);
        VrdmaHandle::read_from(&resp[8..]).unwrap().handle
    };
    let (fe, mut guest, mut ctrl) = control_setup(&h, true);
    let (len, resp) = run_command(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_NOT_FOUND));
    assert!(h.device.lock().resets >= 1);
    h.finish(fe);
}

#[test]
fn stopping_the_control_queue_resets_the_device() {
    let h = start("stopreset", 1, true);
    let (fe, mut guest, mut ctrl) = control_setup(&h, true);
    let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
    assert_eq!(h.device.lock().pds.len(), 1);
    // QEMU's vhost_dev_stop on a guest virtio reset: GET_VRING_BASE on every ring.
    fe.get_vring_base(VRDMA_VQ_CONTROL as usize).unwrap();
    assert!(h.device.lock().pds.is_empty());
    h.finish(fe);
}

#[test]
fn events_wait_for_buffers_then_flush_in_order() {
    let h = start("events", 1, true);
    let (mut fe, _) = connect(&h.path, true);
    let mut guest = Guest::new(0x10_0000, 4 << 20);
    let [mut evq] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_EVENT], 16);
    let ev = |id| VrdmaEvent {
        type_: VRDMA_EV_CQ_COMP,
        id,
        info: 0,
        reserved: 0,
    };
    // No buffer yet: kept inside.
    h.out.push_event(&ev(7));
    h.out.push_event(&ev(8));
    assert_eq!(evq.used_count(&guest), 0);
    // The driver posts three buffers and kicks: two events arrive, in order.
    let bufs: Vec<u64> = (0..3).map(|_| guest.alloc(16, 16)).collect();
    for b in &bufs {
        evq.add(&guest, &[(*b, 16, true)]);
    }
    evq.notify();
    assert_eq!(evq.wait_used(&guest, T).map(|u| u.1), Some(16));
    assert_eq!(evq.wait_used(&guest, T).map(|u| u.1), Some(16));
    assert_eq!(
        VrdmaEvent::read_from(&guest.read(bufs[0], 16)).unwrap(),
        ev(7)
    );
    assert_eq!(
        VrdmaEvent::read_from(&guest.read(bufs[1], 16)).unwrap(),
        ev(8)
    );
    // The third buffer is used as soon as the next event is posted (e.g. from the engine).
    h.out.push_event(&ev(9));
    assert_eq!(evq.wait_used(&guest, T).map(|u| u.1), Some(16));
    assert_eq!(
        VrdmaEvent::read_from(&guest.read(bufs[2], 16)).unwrap(),
        ev(9)
    );
    assert!(evq.call.read().is_ok(), "the driver was interrupted");
    h.finish(fe);
}

#[test]
fn doorbells_and_eth_tx_reach_their_sinks() {
    let h = start("doorbell", 1, true);
    let (mut fe, _) = connect(&h.path, true);
    let mut guest = Guest::new(0x10_0000, 4 << 20);
    let [mut dbq, mut txq] = start_queues(
        &mut fe,
        &mut guest,
        [VRDMA_VQ_DOORBELL, VRDMA_VQ_ETH_TX],
        16,
    );

    let mut recs = Vec::new();
    for (t, id) in [
        (VRDMA_DB_SQ, 16u32),
        (VRDMA_DB_CQ_ARM, 3),
        (VRDMA_DB_SRQ, 5),
    ] {
        recs.extend_from_slice(VrdmaDoorbell { type_: t, id }.as_bytes());
    }
    let buf = guest.alloc(recs.len(), 8);
    guest.write(buf, &recs);
    dbq.add(&guest, &[(buf, recs.len() as u32, false)]);
    dbq.notify();
    assert_eq!(dbq.wait_used(&guest, T).map(|u| u.1), Some(0));
    assert_eq!(
        *h.rec.doorbells.lock().unwrap(),
        vec![(VRDMA_DB_SQ, 16), (VRDMA_DB_CQ_ARM, 3), (VRDMA_DB_SRQ, 5)]
    );

    let frame: Vec<u8> = (0..60u8).collect();
    let big = vec![0xaau8; 1500 + 18 + 1];
    let f1 = guest.alloc(frame.len(), 8);
    guest.write(f1, &frame);
    let f2 = guest.alloc(big.len(), 8);
    guest.write(f2, &big);
    txq.add(&guest, &[(f1, 20, false), (f1 + 20, 40, false)]);
    txq.add(&guest, &[(f2, big.len() as u32, false)]);
    txq.notify();
    assert!(txq.wait_used(&guest, T).is_some());
    assert!(txq.wait_used(&guest, T).is_some());
    assert_eq!(
        *h.rec.frames.lock().unwrap(),
        vec![frame],
        "oversized frame dropped"
    );
    h.finish(fe);
}

#[test]
fn commands_that_end_posted_work_run_after_the_doorbells_before_them() {
    // Spec §8: the driver rings an SQ doorbell, then destroys the QP. The daemon's one thread
    // may see the control queue's kick first: it takes the doorbell queue's buffers before any
    // command, and waits for the engine (the sink's fence) before a command that ends or
    // changes what posted WQEs name, not before others.
    let h = start("db-order", 1, true);
    let (mut fe, _) = connect(&h.path, true);
    let mut guest = Guest::new(0x10_0000, 4 << 20);
    // The doorbell queue first, and a command answered before the test starts: the control
    // queue then runs only once both rings are set up (the setup messages get no reply).
    let [mut dbq, mut ctrl] = start_queues(
        &mut fe,
        &mut guest,
        [VRDMA_VQ_DOORBELL, VRDMA_VQ_CONTROL],
        16,
    );
    run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    let rec = VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: 77,
    };
    let buf = guest.alloc(8, 8);
    guest.write(buf, rec.as_bytes());
    dbq.add(&guest, &[(buf, 8, false)]);
    // Not notified: only the control queue's kick arrives.
    let qp = VrdmaHandle {
        handle: 77,
        reserved: 0,
    };
    let (_, resp) = run_command(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_QP, qp.as_bytes()),
        16,
    );
    assert_eq!(
        status_of(&resp),
        VRDMA_STATUS_INVALID,
        "the mock knows no QPs"
    );
    run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!(
        *h.rec.order.lock().unwrap(),
        vec![
            format!("command {VRDMA_CMD_CREATE_PD}"),
            format!("doorbell {VRDMA_DB_SQ} 77"),
            "fence".to_string(),
            format!("command {VRDMA_CMD_DESTROY_QP}"),
            format!("command {VRDMA_CMD_CREATE_PD}"),
        ]
    );
    assert_eq!(
        dbq.wait_used(&guest, T).map(|u| u.1),
        Some(0),
        "buffer returned"
    );
    h.finish(fe);
}

#[test]
fn memory_regions_added_and_removed_one_by_one() {
    use vhost::vhost_user::message::VhostUserProtocolFeatures as Pf;
    let h = start("memslots", 1, true);
    let (mut fe, _, raw) = connect_with(&h.path, true, Pf::CONFIGURE_MEM_SLOTS);
    assert!(fe.get_max_mem_slots().unwrap() >= 2);
    // Like QEMU with REPLY_ACK negotiated, ask for an ack on every message: without NEED_REPLY
    // the vhost crate's Frontend returns from ADD/REM_MEM_REG as soon as the message is sent,
    // and the control chain kicked next (handled on the vring worker thread) could run before
    // the daemon's frontend-message thread has applied REM_MEM_REG.
    fe.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
    // Two separate "DIMMs": rings and requests in the first, a response buffer in the second.
    let mut g1 = Guest::new(0x10_0000, 1 << 20);
    let mut g2 = Guest::new(0x8000_0000, 1 << 20);
    fe.add_mem_region(&g1.region_info()).expect("ADD_MEM_REG 1");
    fe.add_mem_region(&g2.region_info()).expect("ADD_MEM_REG 2");
    let mut ctrl = DriverRing::new(&mut g1, VRDMA_VQ_CONTROL as usize, 16);
    ctrl.setup(&fe, &g1);
    fe.set_vring_enable(ctrl.index, true).unwrap();

    let c = cmd(VRDMA_CMD_CREATE_PD, &[]);
    let req = g1.alloc(c.len(), 8);
    g1.write(req, &c);
    let resp = g2.alloc(16, 8);
    let (len, _) = control(
        &mut ctrl,
        &g1,
        &[(req, c.len() as u32, false), (resp, 16, true)],
        None,
    );
    assert_eq!(len, 16);
    assert_eq!(status_of(&g2.read(resp, 8)), VRDMA_STATUS_OK);
    assert!(h.device.lock().mem_updates >= 2);

    // After REM_MEM_REG the second region is no longer guest memory: the response cannot be
    // written and the chain comes back with len 0.
    fe.remove_mem_region(&g2.region_info())
        .expect("REM_MEM_REG");
    let (len, _) = control(
        &mut ctrl,
        &g1,
        &[(req, c.len() as u32, false), (resp, 16, true)],
        None,
    );
    assert_eq!(len, 0);
    drop(fe);
    drop(raw);
    h.thread.join().unwrap();
}

#[test]
fn eth_rx_backlog_is_bounded_and_small_buffers_drop_frames() {
    let h = start("ethrx", 1, true);
    let (mut fe, _) = connect(&h.path, true);
    let mut guest = Guest::new(0x10_0000, 4 << 20);
    let [mut rxq, mut prq] =
        start_queues(&mut fe, &mut guest, [VRDMA_VQ_ETH_RX, VRDMA_VQ_PAGEREQ], 16);
    let q = h.out.queue(VRDMA_VQ_ETH_RX).unwrap();
    for i in 0..300u32 {
        let mut f = vec![0u8; 60];
        f[..4].copy_from_slice(&i.to_le_bytes());
        h.out.push_eth_rx(&f, None);
    }
    assert_eq!(
        q.pending(),
        vrdma_backend::vhost_user::output::ETH_RX_BACKLOG
    );
    assert_eq!(q.dropped(), 300 - q.pending() as u64);
    // A 32-byte buffer cannot hold a 60-byte frame: returned empty, that frame dropped; the
    // next buffer gets the next frame.
    let small = guest.alloc(32, 8);
    let big = guest.alloc(2048, 8);
    rxq.add(&guest, &[(small, 32, true)]);
    rxq.add(&guest, &[(big, 2048, true)]);
    rxq.notify();
    assert_eq!(rxq.wait_used(&guest, T).map(|u| u.1), Some(0));
    assert_eq!(rxq.wait_used(&guest, T).map(|u| u.1), Some(60));
    assert_eq!(guest.read(big, 4), 1u32.to_le_bytes().to_vec());

    // Page requests: one 32-byte record per buffer.
    let req = VrdmaPageReq {
        type_: VRDMA_PAGEREQ_FAULT,
        req_id: 5,
        mr_key: 0x100,
        flags: VRDMA_PAGEREQ_F_WRITE,
        iova: 0x20_0000,
        length: 0x20_0000,
    };
    let b = guest.alloc(32, 8);
    prq.add(&guest, &[(b, 32, true)]);
    prq.notify();
    h.out.push_page_req(&req);
    assert_eq!(prq.wait_used(&guest, T).map(|u| u.1), Some(32));
    assert_eq!(VrdmaPageReq::read_from(&guest.read(b, 32)).unwrap(), req);
    h.finish(fe);
}

/// A frontend connected to `h` whose guest runs the eth rx queue (16 entries) and posts no
/// buffer yet.
fn eth_rx_driver(h: &Harness) -> (Frontend, Guest, DriverRing) {
    let (mut fe, _) = connect(&h.path, true);
    let mut guest = Guest::new(0x10_0000, 4 << 20);
    let [rxq] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_ETH_RX], 16);
    (fe, guest, rxq)
}

/// A 60-byte frame for the guest's netdev from `src`, numbered `seq` (its byte 12).
fn netdev_frame(src: [u8; 6], seq: u8) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[6..12].copy_from_slice(&src);
    f[12] = seq;
    f
}

/// A neighbour flooding the netdev of a guest that posts no buffers fills the backlog; a frame
/// of another sender (a TCP handshake to that guest) still gets in, in the place of the
/// flooder's newest, and reaches the guest once it posts buffers (spec §16.4).
#[test]
fn a_flooded_eth_rx_backlog_still_takes_another_senders_frame() {
    let h = start("ethrx-fair", 1, true);
    let (fe, mut guest, mut rxq) = eth_rx_driver(&h);
    let q = h.out.queue(VRDMA_VQ_ETH_RX).unwrap();
    let frame = |src: u8, seq: u8| netdev_frame([2, 0, 0, 0, 0, src], seq);
    let backlog = vrdma_backend::vhost_user::output::ETH_RX_BACKLOG;
    for i in 0..(backlog + 50) {
        h.out.push_eth_rx(&frame(1, i as u8), None);
    }
    assert_eq!(q.pending(), backlog);
    h.out.push_eth_rx(&frame(2, 0xee), None);
    assert_eq!(q.pending(), backlog);
    assert_eq!(
        q.dropped(),
        51,
        "50 of the flood's frames and one more for the peer's"
    );
    let mut seen = Vec::new();
    for _ in 0..16 {
        let b = guest.alloc(2048, 8);
        rxq.add(&guest, &[(b, 2048, true)]);
        seen.push(b);
    }
    rxq.notify();
    for _ in 0..16 {
        assert_eq!(rxq.wait_used(&guest, T).map(|u| u.1), Some(60));
    }
    // The flood's oldest frames come first, in order: the backlog dropped its newest.
    for (i, b) in seen.iter().enumerate() {
        assert_eq!(guest.read(*b + 6, 7), frame(1, i as u8)[6..13].to_vec());
    }
    // The peer's frame is the last in the backlog; drain until it arrives.
    let mut found = false;
    for _ in 0..(backlog / 16 - 1) {
        let bufs: Vec<u64> = (0..16).map(|_| guest.alloc(2048, 8)).collect();
        for &b in &bufs {
            rxq.add(&guest, &[(b, 2048, true)]);
        }
        rxq.notify();
        for &b in &bufs {
            if rxq.wait_used(&guest, T).is_none() {
                break;
            }
            found |= guest.read(b + 6, 7) == frame(2, 0xee)[6..13].to_vec();
        }
    }
    assert!(found, "the peer's frame reached the guest");
    h.finish(fe);
}

/// On a fabric the backlog's sender is the port a frame came from (spec §16.4 rule 4): a
/// remote host behind the uplink port that floods under ever new source MACs holds one share,
/// so a device port's frames keep getting in beside the flood. (Keyed by source MAC, each new
/// MAC of the flood held less than the device's MAC as soon as that had two frames queued, and
/// the device's frames were the ones dropped.)
#[test]
fn an_uplink_flooding_under_many_source_macs_holds_one_share_of_the_eth_rx_backlog() {
    let h = start("ethrx-port", 1, true);
    let (fe, mut guest, mut rxq) = eth_rx_driver(&h);
    let q = h.out.queue(VRDMA_VQ_ETH_RX).unwrap();
    let frame = netdev_frame;
    let (uplink, device) = (Some(7), Some(3));
    let peer = [2, 0, 0, 0, 0, 3];
    let backlog = vrdma_backend::vhost_user::output::ETH_RX_BACKLOG;
    let mut n = 0u32;
    let mut flood = |count: usize| {
        for _ in 0..count {
            let mac = [2, 0, 1, (n >> 16) as u8, (n >> 8) as u8, n as u8];
            h.out.push_eth_rx(&frame(mac, n as u8), uplink);
            n += 1;
        }
    };
    flood(backlog + 50);
    for seq in 0..20u8 {
        h.out.push_eth_rx(&frame(peer, seq), device);
        flood(10);
    }
    assert_eq!(q.pending(), backlog);
    // Drain the whole backlog: every one of the device's 20 frames is there, in order.
    let mut got = Vec::new();
    for _ in 0..backlog / 16 {
        let bufs: Vec<u64> = (0..16).map(|_| guest.alloc(2048, 8)).collect();
        for &b in &bufs {
            rxq.add(&guest, &[(b, 2048, true)]);
        }
        rxq.notify();
        for &b in &bufs {
            assert!(rxq.wait_used(&guest, T).is_some());
            let f = guest.read(b, 13);
            if f[6..12] == peer {
                got.push(f[12]);
            }
        }
    }
    assert_eq!(
        got,
        (0..20).collect::<Vec<u8>>(),
        "the device's frames beside the flood"
    );
    h.finish(fe);
}

#[test]
fn queue_size_limit_is_1024() {
    let h = start("qsize", 1, true);
    let (fe, _) = connect(&h.path, true);
    fe.set_vring_num(VRDMA_VQ_CONTROL as usize, 1024)
        .expect("1024 accepted");
    h.finish(fe);
    // A larger size is refused (the vhost crate then ends that connection).
    let h = start("qsize2", 1, true);
    let (fe, _) = connect(&h.path, true);
    fe.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
    assert!(fe.set_vring_num(VRDMA_VQ_CONTROL as usize, 2048).is_err());
    h.finish(fe);
}

/// Garbage chains on every driver -> device queue: random addresses (in and out of guest
/// memory), lengths, flags (WRITE, NEXT, INDIRECT), next indices and contents. The daemon must
/// return every chain it can parse, never panic, and keep serving.
#[test]
fn random_chains_never_break_the_daemon() {
    let h = start("fuzz", 1, true);
    let (mut fe, _) = connect(&h.path, true);
    let mut guest = Guest::new(0x10_0000, 4 << 20);
    let [mut ctrl, mut dbq, mut txq, mut evq] = start_queues(
        &mut fe,
        &mut guest,
        [
            VRDMA_VQ_CONTROL,
            VRDMA_VQ_DOORBELL,
            VRDMA_VQ_ETH_TX,
            VRDMA_VQ_EVENT,
        ],
        64,
    );
    let scratch = guest.alloc(64 << 10, 4096);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Random bytes everywhere in the scratch area (commands, doorbells, indirect tables).
    let junk: Vec<u8> = (0..64 << 10).map(|_| rnd() as u8).collect();
    guest.write(scratch, &junk);
    for round in 0..40 {
        for ring in [&mut ctrl, &mut dbq, &mut txq, &mut evq] {
            let n = 1 + (rnd() % 4) as usize;
            let descs: Vec<(u64, u32, u16, u16)> = (0..n)
                .map(|k| {
                    let addr = match rnd() % 4 {
                        0 => 0x7000_0000 + (rnd() % 0x1000),
                        1 => rnd(),
                        _ => scratch + (rnd() % (60 << 10)),
                    };
                    let len = match rnd() % 4 {
                        0 => 0,
                        1 => rnd() as u32,
                        _ => (rnd() % 4096) as u32,
                    };
                    let mut flags = (rnd() % 8) as u16;
                    if k + 1 < n {
                        flags |= VRING_DESC_F_NEXT;
                    }
                    (addr, len, flags, (rnd() % 80) as u16)
                })
                .collect();
            ring.add_raw(&guest, &descs);
            ring.notify();
        }
        if round % 10 == 9 {
            // Give the worker a moment, then check the daemon still answers on the socket.
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(fe.get_queue_num().unwrap(), 6);
        }
    }
    // Events go into whatever buffers the event queue got.
    for id in 0..8 {
        h.out.push_event(&VrdmaEvent {
            type_: VRDMA_EV_CQ_COMP,
            id,
            info: 0,
            reserved: 0,
        });
    }
    // Every chain of the input queues came back: the worker thread survived all of them.
    for ring in [&ctrl, &dbq, &txq] {
        let deadline = std::time::Instant::now() + T;
        while ring.used_count(&guest) != 40 {
            assert!(
                std::time::Instant::now() < deadline,
                "queue {} stalled",
                ring.index
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
    // And well-formed work still succeeds on the same queue.
    let mut ctrl = ctrl;
    for _ in 0..40 {
        ctrl.wait_used(&guest, T).unwrap();
    }
    let (len, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!((len, status_of(&resp)), (16, VRDMA_STATUS_OK));
    h.finish(fe);
}

/// TEST ONLY `--delay-commands`: a delayed command is executed when it arrives, a later one is
/// answered first, and the delayed response (header and body) comes after its delay.
#[test]
fn delayed_commands_run_at_once_and_are_answered_late() {
    let h = start("delay", 1, true);
    let spec: DelaySpec = "create_pd=400:0".parse().unwrap();
    h.out.parked().set_delays(CommandDelays::new(&spec));
    let (fe, mut guest, mut ctrl) = control_setup(&h, true);
    let c = cmd(VRDMA_CMD_CREATE_PD, &[]);
    let chain = |guest: &mut Guest| {
        let req = guest.alloc(c.len(), 8);
        guest.write(req, &c);
        let resp = guest.alloc(16, 8);
        ([(req, c.len() as u32, false), (resp, 16u32, true)], resp)
    };

    let (bufs, first_resp) = chain(&mut guest);
    let t0 = std::time::Instant::now();
    let first = ctrl.add(&guest, &bufs);
    ctrl.notify();
    // Executed at once although not answered.
    let executed = |h: &Harness| h.device.lock().calls.len();
    while executed(&h) < 1 {
        assert!(t0.elapsed() < T, "the delayed command was not executed");
        thread::sleep(Duration::from_millis(5));
    }
    let (bufs, second_resp) = chain(&mut guest);
    let second = ctrl.add(&guest, &bufs);
    ctrl.notify();
    assert_eq!(ctrl.wait_used(&guest, T), Some((u32::from(second), 16)));
    assert_eq!(ctrl.wait_used(&guest, T), Some((u32::from(first), 16)));
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "answered after {:?}",
        t0.elapsed()
    );
    let pd = |resp| {
        let r = guest.read(resp, 16);
        assert_eq!(status_of(&r), VRDMA_STATUS_OK);
        VrdmaHandle::read_from(&r[8..]).unwrap().handle
    };
    let (p1, p2) = (pd(first_resp), pd(second_resp));
    assert_eq!((p1, p2), (1, 2), "the delayed command ran first");

    h.finish(fe);
}

// ---- Spec §16.5: frontend memory regions are checked against their file. ----

/// One CREATE_PD round trip on a fresh connection to `h`: the device is served.
fn served(h: &Harness) -> vhost::vhost_user::Frontend {
    let (fe, mut guest, mut ctrl) = control_setup(h, true);
    let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
    fe
}

/// A region twice as long as its (sealed) memfd, with the control ring in the half beyond the
/// end of the file: without the check, the daemon's ring worker would read the ring there and
/// the whole test process (the daemon) would die of SIGBUS. With it, SET_MEM_TABLE is refused,
/// the connection ends, and the same device and another device of the process serve on.
#[test]
fn memory_region_beyond_its_file_is_refused_and_no_device_dies() {
    let neighbour = start("region-neighbour", 1, true);
    let h = start("region-short", 2, true);
    let (mut fe, _) = connect(&h.path, true);
    let file_len = 1u64 << 20;
    let file = sealed_memfd(file_len);
    let (gpa, uva) = (0x10_0000u64, 0x7f00_0000_0000u64);
    let _ = fe.set_mem_table(&[region_of(&file, gpa, 2 * file_len, uva)]);
    // What an attacker does next: a ring beyond the end of the file, kicked. The connection
    // is gone, so these fail; were the table installed, the kick would fault in the daemon.
    let ring_gpa = gpa + file_len + 4096;
    let kick = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let _ = fe.set_vring_num(0, 64);
    let _ = fe.set_vring_addr(
        0,
        &vhost::VringConfigData {
            queue_max_size: 64,
            queue_size: 64,
            flags: 0,
            desc_table_addr: uva + (ring_gpa - gpa),
            used_ring_addr: uva + (ring_gpa - gpa) + 2048,
            avail_ring_addr: uva + (ring_gpa - gpa) + 1024,
            log_addr: None,
        },
    );
    let _ = fe.set_vring_base(0, 0);
    let _ = fe.set_vring_kick(0, &kick);
    let _ = fe.set_vring_enable(0, true);
    let _ = kick.write(1);
    // Were the table installed, the device's worker would be walking that ring now: confirm
    // that the daemon has ended the connection instead (the next request gets no answer).
    assert!(
        fe.get_features().is_err(),
        "a region beyond its file was accepted: the connection is still open"
    );
    drop(fe);
    // The neighbour device of this process is served, and so is the refused one's next
    // frontend (after a device reset).
    let n = served(&neighbour);
    neighbour.finish(n);
    let fe = served(&h);
    assert!(
        h.device.lock().resets >= 1,
        "the refused connection reset its device"
    );
    h.finish(fe);
}

/// Spec §16.5: a memfd without F_SEAL_SHRINK (the frontend could truncate it under the
/// daemon later) is refused even when it is long enough today; sealed, the same table works.
#[test]
fn unsealed_memfd_is_refused() {
    let h = start("region-unsealed", 2, true);
    let (fe, _) = connect(&h.path, true);
    let guest = Guest::with_file(0x10_0000, 1 << 20, unsealed_memfd(1 << 20));
    let _ = fe.set_mem_table(&[guest.region_info()]);
    assert!(
        fe.get_features().is_err(),
        "an unsealed memfd was accepted: the connection is still open"
    );
    drop(fe);
    let fe = served(&h);
    h.finish(fe);
}

/// Spec §16.5: the device's outputs (events, page requests, eth rx frames, written from the
/// engine's threads) reach guest memory only through a table whose regions passed the check.
/// Here the vrings' memory holds a region twice as long as its memfd with the event ring in
/// the half beyond the end of the file (as between the frontend's swap and the check):
/// without the check the delivery would fault (SIGBUS, the test process dies); with it the
/// event waits in the backlog.
#[test]
fn outputs_never_touch_a_table_that_failed_the_check() {
    use vhost_user_backend::{VringRwLock, VringT};
    use vm_memory::{FileOffset, GuestAddress};
    let file_len = 1u64 << 20;
    let gpa = 0x10_0000u64;
    let mem = vrdma_backend::vhost_user::GuestMemoryMmap::from_ranges_with_files([(
        GuestAddress(gpa),
        2 * file_len as usize,
        Some(FileOffset::new(sealed_memfd(file_len), 0)),
    )])
    .unwrap();
    let atomic = GuestMemoryAtomic::new(mem);
    let vring = VringRwLock::new(atomic.clone(), 64).unwrap();
    let ring = gpa + file_len + 4096;
    vring.set_queue_size(64);
    vring
        .set_queue_info(ring, ring + 1024, ring + 2048)
        .unwrap();
    vring.set_queue_ready(true);
    vring.set_enabled(true);
    let out = VirtqOutput::new(8);
    let vrings = vec![vring; 6];
    out.attach(&vrings, &atomic);
    out.push_event(&VrdmaEvent::read_from(&[0u8; VrdmaEvent::SIZE]).unwrap());
    assert_eq!(out.queue(VRDMA_VQ_EVENT).unwrap().pending(), 1);
}

/// Spec §16.5: one device state transfer at a time. A frontend that starts a LOAD, keeps its
/// pipe open and silent, and starts another gets a failure for the second instead of leaving
/// one more thread, pipe and state buffer behind per request; the connection goes on.
#[test]
fn a_second_state_transfer_while_one_runs_is_refused() {
    use std::os::fd::OwnedFd;
    use vhost::vhost_user::message::{
        VhostTransferStateDirection as Dir, VhostTransferStatePhase as Phase,
    };
    let h = start("state-twice", 2, true);
    let (fe, _, _) = connect_with(&h.path, true, VhostUserProtocolFeatures::DEVICE_STATE);
    let (r1, _w1) = std::io::pipe().unwrap();
    fe.set_device_state_fd(Dir::LOAD, Phase::STOPPED, OwnedFd::from(r1))
        .expect("the first transfer starts");
    let (r2, _w2) = std::io::pipe().unwrap();
    let second = fe.set_device_state_fd(Dir::LOAD, Phase::STOPPED, OwnedFd::from(r2));
    assert!(
        second.is_err(),
        "a second transfer was started beside the first"
    );
    assert!(fe.get_features().is_ok(), "the connection goes on");
    drop(fe);
    let fe = served(&h);
    h.finish(fe);
}
