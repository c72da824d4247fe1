//! The daemon as `start_backend` wires it (real `device::Device`, engine thread, no uplink),
//! driven by the `vhost` crate's Frontend playing QEMU: config space from the CLI, control
//! commands executed by the device, and a clean device after a reconnect.

mod vhost_user_support;

use std::thread;
use std::time::Duration;

use vrdma_backend::cli::{Config, Limits};
use vrdma_backend::vhost_user::{prepare, CONFIG_SIZE};
use vrdma_spec::*;

use vhost_user_support::*;

const T: Duration = Duration::from_secs(5);
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x0d, 0x0e, 0x0f];

struct Daemon {
    path: std::path::PathBuf,
    thread: thread::JoinHandle<()>,
}

fn start(tag: &str, connections: usize, config: impl FnOnce(&mut Config)) -> Daemon {
    let _ = env_logger::builder().is_test(true).try_init();
    let path = socket_path(tag);
    let mut cfg = Config::new(path.clone(), MAC);
    config(&mut cfg);
    let thread = serve_on_thread(prepare(&cfg).expect("prepare"), connections);
    Daemon { path, thread }
}

fn session(d: &Daemon) -> (vhost::vhost_user::Frontend, Guest, DriverRing) {
    control_session(&d.path, true, 0x4000_0000, 8 << 20, 128)
}

#[test]
fn config_space_carries_the_cli_settings() {
    let d = start("dev-config", 1, |c| {
        c.limits = Limits {
            max_qp: 1000,
            max_cq: 2000,
            max_mr: 3000,
            max_pd: 4000,
            max_srq: 500,
            max_ah: 600,
        };
        c.mtu = 4200;
        c.odp.chunk_shift = 16;
    });
    let (mut fe, mut guest, mut ctrl) = session(&d);
    let bytes = get_config(&mut fe, 0, CONFIG_SIZE).unwrap();
    let cfg = VrdmaConfig::read_from(&bytes).unwrap();
    assert_eq!(cfg.mac, MAC);
    assert_eq!(cfg.mtu, 4200);
    assert_eq!(
        (
            cfg.max_qp,
            cfg.max_cq,
            cfg.max_mr,
            cfg.max_pd,
            cfg.max_srq,
            cfg.max_ah
        ),
        (1000, 2000, 3000, 4000, 500, 600)
    );
    assert_eq!(cfg.odp_chunk_shift, 16);
    assert_ne!(cfg.odp_general_caps & VRDMA_ODP_SUPPORT, 0);
    assert_eq!(cfg.port_state, VRDMA_PORT_ACTIVE);
    let features = vhost::VhostBackend::get_features(&fe).unwrap();
    assert_ne!(features & (1 << VIRTIO_RDMA_F_ODP), 0);

    // QUERY_DEVICE answers the same structure.
    let (len, resp) = run_command(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_QUERY_DEVICE, &[]),
        8 + CONFIG_SIZE,
    );
    assert_eq!(len as usize, 8 + CONFIG_SIZE);
    assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
    assert_eq!(&resp[8..], &bytes[..]);
    drop(fe);
    d.thread.join().unwrap();
}

#[test]
fn no_odp_device() {
    let d = start("dev-noodp", 1, |c| c.odp.enabled = false);
    let (mut fe, _, _) = session(&d);
    let cfg = VrdmaConfig::read_from(&get_config(&mut fe, 0, CONFIG_SIZE).unwrap()).unwrap();
    assert_eq!(cfg.odp_general_caps, 0);
    let features = vhost::VhostBackend::get_features(&fe).unwrap();
    assert_eq!(features & (1 << VIRTIO_RDMA_F_ODP), 0);
    assert_eq!(features & (1 << VIRTIO_RDMA_F_ODP_IMPLICIT), 0);
    drop(fe);
    d.thread.join().unwrap();
}

#[test]
fn pd_round_trip_and_errors() {
    let d = start("dev-pd", 1, |_| {});
    let (fe, mut guest, mut ctrl) = session(&d);
    let (len, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!((len, status_of(&resp)), (16, VRDMA_STATUS_OK));
    let pdn = VrdmaHandle::read_from(&resp[8..]).unwrap().handle;
    assert_ne!(pdn, 0);
    let (len, resp) = run_command(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_OK));
    let (_, resp) = run_command(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!(status_of(&resp), VRDMA_STATUS_NOT_FOUND);
    // Request shorter than vrdma_handle.
    let (_, resp) = run_command(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &[1, 0]),
        8,
    );
    assert_eq!(status_of(&resp), VRDMA_STATUS_INVALID);
    // Unknown opcode.
    let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(200, &[]), 8);
    assert_eq!(status_of(&resp), VRDMA_STATUS_INVALID);
    // QUERY_PORT with a response buffer too small for vrdma_resp_query_port.
    let (len, resp) = run_command(
        &mut ctrl,
        &mut guest,
        &cmd(
            VRDMA_CMD_QUERY_PORT,
            VrdmaCmdQueryPort {
                port: 1,
                reserved: 0,
            }
            .as_bytes(),
        ),
        16,
    );
    assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_INVALID));
    drop(fe);
    d.thread.join().unwrap();
}

#[test]
fn reconnect_finds_a_clean_device() {
    let d = start("dev-reconnect", 2, |_| {});
    let pdn = {
        let (fe, mut guest, mut ctrl) = session(&d);
        let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
        assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
        drop(fe);
        VrdmaHandle::read_from(&resp[8..]).unwrap().handle
    };
    // QEMU reconnects (e.g. restarted): the PD created before is gone.
    let (fe, mut guest, mut ctrl) = session(&d);
    let (_, resp) = run_command(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!(status_of(&resp), VRDMA_STATUS_NOT_FOUND);
    let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
    drop(fe);
    d.thread.join().unwrap();
}

#[test]
fn eth_frames_flow_between_the_guest_and_a_udp_uplink() {
    // The "remote" end of the uplink is a plain UDP socket of this test.
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    peer.set_read_timeout(Some(T)).unwrap();
    let local = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let local_addr = local.local_addr().unwrap();
    drop(local);
    let spec = format!(
        "udp:local={local_addr},remote={}",
        peer.local_addr().unwrap()
    );
    let d = start("dev-eth", 1, |c| c.uplink = Some(spec.parse().unwrap()));
    let (mut fe, _) = connect(&d.path, true);
    let mut guest = Guest::new(0x4000_0000, 8 << 20);
    let [mut rxq, mut txq] =
        start_queues(&mut fe, &mut guest, [VRDMA_VQ_ETH_RX, VRDMA_VQ_ETH_TX], 16);

    // Guest -> wire.
    let mut frame = vec![0xffu8; 6];
    frame.extend_from_slice(&MAC);
    frame.extend_from_slice(&[0x08, 0x06]);
    frame.resize(60, 0x11);
    let f = guest.alloc(frame.len(), 8);
    guest.write(f, &frame);
    txq.add(&guest, &[(f, frame.len() as u32, false)]);
    txq.notify();
    let mut buf = [0u8; 2048];
    let (n, _) = peer.recv_from(&mut buf).expect("frame on the uplink");
    assert_eq!(&buf[..n], &frame[..]);

    // Wire -> guest (a broadcast ARP-like frame is not RoCE: it goes to the eth rx queue).
    let b = guest.alloc(2048, 8);
    rxq.add(&guest, &[(b, 2048, true)]);
    rxq.notify();
    let mut incoming = vec![0xffu8; 6];
    incoming.extend_from_slice(&[0x52, 0x54, 0, 9, 9, 9, 0x08, 0x06]);
    incoming.resize(64, 0x22);
    peer.send_to(&incoming, local_addr).unwrap();
    let (_, len) = rxq.wait_used(&guest, T).expect("frame delivered to eth rx");
    assert_eq!(len as usize, incoming.len());
    assert_eq!(guest.read(b, incoming.len()), incoming);
    drop(fe);
    d.thread.join().unwrap();
}

/// Spec §17: QEMU's migration as the vhost-user messages it sends. The source logs (LOG_ALL),
/// is stopped (GET_VRING_BASE of the control queue suspends instead of resetting), its state
/// leaves through SET_DEVICE_STATE_FD(SAVE) and enters a second daemon through
/// SET_DEVICE_STATE_FD(LOAD); CHECK_DEVICE_STATE reports both ends. The destination, started
/// with its memory table, has the source's PD.
#[test]
fn device_state_moves_between_two_daemons() {
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    use vhost::vhost_user::message::{
        VhostTransferStateDirection as Dir, VhostTransferStatePhase as Phase,
        VhostUserProtocolFeatures as Pf, VhostUserVirtioFeatures,
    };
    use vhost::vhost_user::VhostUserFrontend;
    use vhost::VhostBackend;

    let pipe = || {
        let (r, w) = std::io::pipe().expect("pipe");
        (r, w)
    };
    let src = start("mig-src", 1, |_| {});
    let dst = start("mig-dst", 1, |_| {});
    let extra = Pf::DEVICE_STATE | Pf::LOG_SHMFD;

    let (mut fe, acked, _) = connect_with(&src.path, true, extra);
    let mut guest = Guest::new(0x4000_0000, 8 << 20);
    let [mut ctrl] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_CONTROL], 128);
    let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
    let pdn = VrdmaHandle::read_from(&resp[8..]).unwrap().handle;

    // Migration starts: logging on, then the VM stops.
    let log_all = VhostUserVirtioFeatures::LOG_ALL.bits();
    let offered = VhostBackend::get_features(&fe).unwrap();
    assert_ne!(offered & log_all, 0, "LOG_ALL offered");
    fe.set_features(acked | log_all).unwrap();
    let next_avail = fe.get_vring_base(VRDMA_VQ_CONTROL as usize).unwrap();
    let (mut r, w) = pipe();
    let reply = fe
        .set_device_state_fd(Dir::SAVE, Phase::STOPPED, OwnedFd::from(w))
        .unwrap();
    assert!(reply.is_none());
    let mut state = Vec::new();
    r.read_to_end(&mut state).unwrap();
    fe.check_device_state().expect("source saved");
    assert!(state.starts_with(b"VRDMAST\0"), "{} bytes", state.len());

    let (mut fe2, acked2, _) = connect_with(&dst.path, true, extra);
    // A damaged stream is refused and leaves a power-on device.
    let (r, mut w) = pipe();
    fe2.set_device_state_fd(Dir::LOAD, Phase::STOPPED, OwnedFd::from(r))
        .unwrap();
    w.write_all(&state[..state.len() - 1]).unwrap();
    drop(w);
    assert!(fe2.check_device_state().is_err());
    let (r, mut w) = pipe();
    fe2.set_device_state_fd(Dir::LOAD, Phase::STOPPED, OwnedFd::from(r))
        .unwrap();
    w.write_all(&state).unwrap();
    drop(w);
    fe2.check_device_state().expect("destination loaded");
    // QEMU's vhost_dev_start on the destination: features, memory table, rings at the base
    // the source reported.
    fe2.set_features(acked2).unwrap();
    let mut guest2 = Guest::new(0x4000_0000, 8 << 20);
    let mut ctrl2 = DriverRing::new(&mut guest2, VRDMA_VQ_CONTROL as usize, 128);
    // (A new guest memory and ring here: only the device state is under test.)
    assert_eq!(next_avail, 1, "one command ran on the source");
    start_rings(&mut fe2, &guest2, &[&ctrl2]);
    let (_, resp) = run_command(
        &mut ctrl2,
        &mut guest2,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!(status_of(&resp), VRDMA_STATUS_OK, "the PD moved");
    drop(fe);
    drop(fe2);
    src.thread.join().unwrap();
    dst.thread.join().unwrap();
}

/// QEMU's end of a migration on the source: stop the control queue (the VM stopped), save
/// the device state through a pipe (SET_DEVICE_STATE_FD SAVE) and ask whether it worked
/// (CHECK_DEVICE_STATE). Returns the bytes and that answer.
fn stop_and_save(fe: &mut vhost::vhost_user::Frontend) -> (Vec<u8>, bool) {
    use std::io::Read;
    use std::os::fd::OwnedFd;
    use vhost::vhost_user::message::{
        VhostTransferStateDirection as Dir, VhostTransferStatePhase as Phase,
    };
    use vhost::vhost_user::VhostUserFrontend;
    use vhost::VhostBackend;
    fe.get_vring_base(VRDMA_VQ_CONTROL as usize).unwrap();
    let (mut r, w) = std::io::pipe().unwrap();
    fe.set_device_state_fd(Dir::SAVE, Phase::STOPPED, OwnedFd::from(w))
        .unwrap();
    let mut state = Vec::new();
    r.read_to_end(&mut state).unwrap();
    (state, fe.check_device_state().is_ok())
}

/// Without LOG_ALL, stopping the control queue is a virtio reset (spec §2.4): nothing to save,
/// and CHECK_DEVICE_STATE says so.
#[test]
fn device_state_save_of_a_reset_device_fails() {
    use vhost::vhost_user::message::VhostUserProtocolFeatures as Pf;

    let src = start("mig-nolog", 1, |_| {});
    let (mut fe, acked, _) = connect_with(&src.path, true, Pf::DEVICE_STATE);
    // `connect_with` acks no LOG_ALL, as QEMU outside a migration.
    let _ = acked;
    let mut guest = Guest::new(0x4000_0000, 8 << 20);
    let [_ctrl] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_CONTROL], 128);
    let (state, checked) = stop_and_save(&mut fe);
    assert!(state.is_empty());
    assert!(!checked);
    drop(fe);
    src.thread.join().unwrap();
}

/// QEMU's dirty log as SET_LOG_BASE hands it over (LOG_SHMFD): a memfd with one bit per 4 KiB
/// page of guest-physical space.
struct DirtyLog {
    fd: std::os::fd::OwnedFd,
}

impl DirtyLog {
    /// Create a log covering GPAs below `gpa_end` and install it in the daemon.
    fn install(fe: &mut vhost::vhost_user::Frontend, gpa_end: u64) -> DirtyLog {
        Self::install_with_file(fe, gpa_end, (gpa_end / 4096).div_ceil(8))
    }

    /// The same log, but its file holds only `file_len` bytes of it (a hostile frontend).
    fn install_with_file(
        fe: &mut vhost::vhost_user::Frontend,
        gpa_end: u64,
        file_len: u64,
    ) -> DirtyLog {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use vhost::{VhostBackend, VhostUserDirtyLogRegion};
        let log_len = (gpa_end / 4096).div_ceil(8);
        // SAFETY: memfd_create with a NUL-terminated name; the fd is owned below.
        let fd = unsafe { libc::memfd_create(c"vrdma-log".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our own memfd.
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), file_len as i64) };
        assert_eq!(r, 0);
        fe.set_log_base(
            0,
            Some(VhostUserDirtyLogRegion {
                mmap_size: log_len,
                mmap_offset: 0,
                mmap_handle: fd.as_raw_fd(),
            }),
        )
        .unwrap();
        DirtyLog { fd }
    }

    /// Is the page of `gpa` marked?
    fn dirty(&self, gpa: u64) -> bool {
        use std::os::fd::AsRawFd;
        let page = gpa / 4096;
        let mut b = [0u8; 1];
        // SAFETY: pread into a 1-byte buffer from our own memfd.
        let n = unsafe {
            libc::pread(
                self.fd.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                (page / 8) as i64,
            )
        };
        assert_eq!(n, 1);
        b[0] & (1 << (page % 8)) != 0
    }
}

/// Spec §16.5, §17.1: the frontend maps the dirty log for the daemon without the daemon seeing
/// its file. A log file with none of the log's bytes makes the first dirty-bit store fault:
/// without the guard the daemon (here the test process) dies of SIGBUS, taking every device
/// with it. With it the device keeps serving, and saving its state fails, so the migration
/// cannot finish on a log that missed pages.
#[test]
fn a_dirty_log_beyond_its_file_costs_the_migration_not_the_daemon() {
    let mut m = Migrating::start("mig-shortlog");
    let _log = m.short_log();
    // Each answer is a write into guest memory the device must log.
    m.create_pd();
    m.create_pd();
    m.save_is_refused("no state is saved from a log that missed pages");
}

/// A log that missed pages, then a larger log set during the same migration (a frontend grows
/// its log that way, after reading the old one): the pages the first log missed are still
/// missing, so the device state is still not saved (spec §16.5).
#[test]
fn a_lost_dirty_log_is_not_forgotten_when_the_log_grows() {
    let mut m = Migrating::start("mig-regrown");
    let _short = m.short_log();
    m.create_pd();
    let _whole = m.whole_log();
    m.create_pd();
    m.save_is_refused("no state is saved after a log that missed pages");
}

/// A migration whose log missed pages ends (the frontend acks features without LOG_ALL); the
/// next migration brings a whole log and saves the device state (spec §16.5).
#[test]
fn the_next_migration_after_a_lost_dirty_log_saves() {
    use vhost::VhostBackend;

    let mut m = Migrating::start("mig-after-lost");
    let _short = m.short_log();
    m.create_pd();
    // The first migration is cancelled; the second sets its log, then acks LOG_ALL.
    m.fe.set_features(m.acked).unwrap();
    let _whole = m.whole_log();
    m.fe.set_features(m.log_all()).unwrap();
    m.create_pd();
    let (state, checked) = stop_and_save(&mut m.fe);
    assert!(!state.is_empty(), "the second migration's state is saved");
    assert!(checked, "CHECK_DEVICE_STATE succeeds");
    m.finish();
}

/// A device with its control queue running and LOG_ALL acked: a migration under way.
struct Migrating {
    src: Daemon,
    fe: vhost::vhost_user::Frontend,
    acked: u64,
    guest: Guest,
    ctrl: DriverRing,
}

impl Migrating {
    const GPA: u64 = 0x4000_0000;
    const LEN: u64 = 8 << 20;

    fn start(tag: &str) -> Self {
        use vhost::vhost_user::message::VhostUserProtocolFeatures as Pf;
        use vhost::VhostBackend;

        let src = start(tag, 1, |_| {});
        let (mut fe, acked, _) = connect_with(&src.path, true, Pf::DEVICE_STATE | Pf::LOG_SHMFD);
        let mut guest = Guest::new(Self::GPA, Self::LEN as usize);
        let [ctrl] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_CONTROL], 128);
        let m = Migrating {
            src,
            fe,
            acked,
            guest,
            ctrl,
        };
        m.fe.set_features(m.log_all()).unwrap();
        m
    }

    fn log_all(&self) -> u64 {
        self.acked | vhost::vhost_user::message::VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    /// A log whose file holds none of its bytes: the first dirty-bit store faults.
    fn short_log(&mut self) -> DirtyLog {
        DirtyLog::install_with_file(&mut self.fe, Self::GPA + Self::LEN, 0)
    }

    fn whole_log(&mut self) -> DirtyLog {
        DirtyLog::install(&mut self.fe, Self::GPA + Self::LEN)
    }

    /// A command whose answer the device writes into guest memory, and so logs.
    fn create_pd(&mut self) {
        let c = cmd(VRDMA_CMD_CREATE_PD, &[]);
        let (_, resp) = run_command(&mut self.ctrl, &mut self.guest, &c, 16);
        assert_eq!(status_of(&resp), VRDMA_STATUS_OK, "the device still serves");
    }

    fn save_is_refused(mut self, why: &str) {
        let (state, checked) = stop_and_save(&mut self.fe);
        assert!(state.is_empty(), "{why}");
        assert!(!checked, "CHECK_DEVICE_STATE fails");
        self.finish();
    }

    fn finish(self) {
        drop(self.fe);
        self.src.thread.join().unwrap();
    }
}

/// Spec §17.1: every way the device writes guest memory (`GuestMem::write`, `zero`, the release
/// store and swap of ring indices, the IB atomics, ATOMIC WRITE) marks the page it wrote once a
/// log is set, the reads mark nothing, and before SET_LOG_BASE the regions report no log (the
/// writes take the fast path without the log's lock).
#[test]
fn every_guest_memory_write_marks_its_page_while_logging() {
    use vhost::vhost_user::message::VhostUserProtocolFeatures as Pf;

    let _ = env_logger::builder().is_test(true).try_init();
    let path = socket_path("dirtypaths");
    let prepared = prepare(&Config::new(path.clone(), MAC)).expect("prepare");
    let device = prepared.parts.device.clone();
    let thread = serve_on_thread(prepared, 1);
    let (mut fe, _, _) = connect_with(&path, true, Pf::LOG_SHMFD);
    let mut guest = Guest::new(0x4000_0000, 8 << 20);
    let [_ctrl] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_CONTROL], 128);
    // SET_MEM_TABLE reaches the device through the daemon's thread: wait for the table.
    let t0 = std::time::Instant::now();
    let mem = loop {
        let mem = device.lock().mem.clone();
        if mem.check_range(0x4010_0000, 1 << 20) {
            break mem;
        }
        assert!(t0.elapsed() < T, "the device never got the memory table");
        thread::sleep(Duration::from_millis(5));
    };

    // One page per access, so each mark is seen on its own.
    let page = |i: u64| 0x4010_0000 + i * 4096;
    let writes: [(&str, &dyn Fn(u64)); 8] = [
        ("write", &|g| mem.write(g + 100, &[1; 64]).unwrap()),
        ("zero", &|g| mem.zero(g + 8, 16).unwrap()),
        ("store_u32_release", &|g| {
            mem.store_u32_release(g, 7).unwrap()
        }),
        ("swap_u32", &|g| {
            mem.swap_u32(g + 4, 7).unwrap();
        }),
        ("compare_swap_u64", &|g| {
            mem.compare_swap_u64(g + 8, 0, 1).unwrap();
        }),
        ("fetch_add_u64", &|g| {
            mem.fetch_add_u64(g + 16, 1).unwrap();
        }),
        ("store_bytes8_atomic", &|g| {
            mem.store_bytes8_atomic(g + 24, [9; 8]).unwrap()
        }),
        ("read", &|g| {
            let mut b = [0u8; 64];
            mem.read(g, &mut b).unwrap();
            mem.load_u32_acquire(g).unwrap();
            mem.read_u64(g + 8).unwrap();
        }),
    ];
    // Before the log: no region is logging, so every write returns before the log's lock.
    assert!(!mem.logging(), "no dirty log before SET_LOG_BASE");
    for (i, (_, w)) in writes.iter().enumerate() {
        w(page(i as u64));
    }
    let log = DirtyLog::install(&mut fe, 0x4000_0000 + (8 << 20));
    assert!(mem.logging(), "SET_LOG_BASE turned logging on");
    for (i, _) in writes.iter().enumerate() {
        assert!(!log.dirty(page(i as u64)), "page {i} clean in a fresh log");
    }
    for (i, (name, w)) in writes.iter().enumerate() {
        w(page(i as u64));
        let is_read = *name == "read";
        assert_eq!(log.dirty(page(i as u64)), !is_read, "{name} and the log");
    }
    // A write across a page boundary marks both pages.
    let edge = page(20) + 4096 - 8;
    mem.write(edge, &[2; 16]).unwrap();
    assert!(
        log.dirty(page(20)) && log.dirty(page(21)),
        "both pages of a split write"
    );
    drop(fe);
    thread.join().unwrap();
}

/// Spec §17.1: with a log installed (SET_LOG_BASE, LOG_SHMFD), the pages the device writes are
/// marked — through vm-memory (a command response) and through the atomics of guest/memory.rs
/// (CREATE_CQ clears the ring's control words with release stores) — and others are not.
#[test]
fn dirty_log_marks_the_pages_the_device_writes() {
    use vhost::vhost_user::message::VhostUserProtocolFeatures as Pf;

    let d = start("dirtylog", 1, |_| {});
    let (mut fe, _, _) = connect_with(&d.path, true, Pf::LOG_SHMFD);
    let mut guest = Guest::new(0x4000_0000, 8 << 20);
    let [mut ctrl] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_CONTROL], 128);

    let log = DirtyLog::install(&mut fe, 0x4000_0000 + (8 << 20));
    let dirty = |gpa: u64| log.dirty(gpa);

    let ring = guest.alloc(2 * 4096, 4096);
    let untouched = guest.alloc(4096, 4096);
    guest.write(ring, &[0xff; 4]); // a stale producer index the device must clear
    let mut req = VrdmaCmdCreateCq {
        cqn: 0,
        depth: 16,
        npages: 2,
        reserved: 0,
    }
    .as_bytes()
    .to_vec();
    req.extend_from_slice(&ring.to_le_bytes());
    req.extend_from_slice(&(ring + 4096).to_le_bytes());
    let before = (dirty(ring), dirty(untouched));
    let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_CQ, &req), 16);
    assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
    assert_eq!(before, (false, false));
    assert_eq!(guest.read(ring, 4), vec![0; 4], "producer index cleared");
    assert!(dirty(ring), "the atomics marked the ring's control page");
    assert!(dirty(ctrl.used), "the used ring is marked");
    assert!(
        !dirty(untouched),
        "a page the device did not write is clean"
    );
    drop(fe);
    d.thread.join().unwrap();
}

/// Spec §17.1: a migration that fails after the source stopped (the destination refused the
/// state, the network broke) leaves the source with every object: QEMU starts the device again
/// (SET_MEM_TABLE, rings) and the driver carries on.
#[test]
fn a_failed_migration_resumes_the_source_with_its_objects() {
    use vhost::vhost_user::message::VhostUserVirtioFeatures;
    use vhost::VhostBackend;

    let d = start("mig-resume", 1, |_| {});
    let none = vhost::vhost_user::message::VhostUserProtocolFeatures::empty();
    let (mut fe, acked, _) = connect_with(&d.path, true, none);
    let mut guest = Guest::new(0x4000_0000, 8 << 20);
    let [mut ctrl] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_CONTROL], 128);
    let (_, resp) = run_command(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    let pdn = VrdmaHandle::read_from(&resp[8..]).unwrap().handle;
    let log_all = VhostUserVirtioFeatures::LOG_ALL.bits();
    fe.set_features(acked | log_all).unwrap();
    fe.get_vring_base(VRDMA_VQ_CONTROL as usize).unwrap();
    // vm_start on the source: vhost_dev_start again (logging may already be off).
    fe.set_features(acked).unwrap();
    let [mut ctrl2] = start_queues(&mut fe, &mut guest, [VRDMA_VQ_CONTROL], 128);
    let (_, resp) = run_command(
        &mut ctrl2,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!(
        status_of(&resp),
        VRDMA_STATUS_OK,
        "the PD survived the stop"
    );
    drop(fe);
    d.thread.join().unwrap();
}
