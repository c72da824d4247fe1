//! The daemon as `start_backend` wires it (real `device::Device`, engine thread, no uplink),
//! driven by the `vhost` crate's Frontend playing QEMU: config space from the CLI, control
//! commands executed by the device, and a clean device after a reconnect.

mod vhost_user_support;

use std::thread;
use std::time::Duration;

use vrdma_backend::cli::{Config, Limits};
use vrdma_backend::vhost_user::{prepare, serve, Prepared, CONFIG_SIZE};
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
    let Prepared {
        mut listener,
        parts,
        engine,
    } = prepare(&cfg).expect("prepare");
    let thread = thread::spawn(move || {
        serve(&mut listener, &parts, Some(connections)).expect("serve");
        engine.stop();
    });
    Daemon { path, thread }
}

fn run(
    ring: &mut DriverRing,
    guest: &mut Guest,
    command: &[u8],
    resp_len: usize,
) -> (u32, Vec<u8>) {
    let req = guest.alloc(command.len(), 8);
    guest.write(req, command);
    let resp = guest.alloc(resp_len, 8);
    ring.add(
        guest,
        &[
            (req, command.len() as u32, false),
            (resp, resp_len as u32, true),
        ],
    );
    ring.notify();
    let (_, len) = ring.wait_used(guest, T).expect("command completed");
    (len, guest.read(resp, resp_len))
}

fn handle(h: u32) -> Vec<u8> {
    VrdmaHandle {
        handle: h,
        reserved: 0,
    }
    .as_bytes()
    .to_vec()
}

fn session(d: &Daemon) -> (vhost::vhost_user::Frontend, Guest, DriverRing) {
    let (mut fe, _) = connect(&d.path, true);
    let mut guest = Guest::new(0x4000_0000, 8 << 20);
    let ctrl = DriverRing::new(&mut guest, VRDMA_VQ_CONTROL as usize, 128);
    start_rings(&mut fe, &guest, &[&ctrl]);
    (fe, guest, ctrl)
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
    let (len, resp) = run(
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
    let (len, resp) = run(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
    assert_eq!((len, status_of(&resp)), (16, VRDMA_STATUS_OK));
    let pdn = VrdmaHandle::read_from(&resp[8..]).unwrap().handle;
    assert_ne!(pdn, 0);
    let (len, resp) = run(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!((len, status_of(&resp)), (8, VRDMA_STATUS_OK));
    let (_, resp) = run(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!(status_of(&resp), VRDMA_STATUS_NOT_FOUND);
    // Request shorter than vrdma_handle.
    let (_, resp) = run(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &[1, 0]),
        8,
    );
    assert_eq!(status_of(&resp), VRDMA_STATUS_INVALID);
    // Unknown opcode.
    let (_, resp) = run(&mut ctrl, &mut guest, &cmd(200, &[]), 8);
    assert_eq!(status_of(&resp), VRDMA_STATUS_INVALID);
    // QUERY_PORT with a response buffer too small for vrdma_resp_query_port.
    let (len, resp) = run(
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
        let (_, resp) = run(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
        assert_eq!(status_of(&resp), VRDMA_STATUS_OK);
        drop(fe);
        VrdmaHandle::read_from(&resp[8..]).unwrap().handle
    };
    // QEMU reconnects (e.g. restarted): the PD created before is gone.
    let (fe, mut guest, mut ctrl) = session(&d);
    let (_, resp) = run(
        &mut ctrl,
        &mut guest,
        &cmd(VRDMA_CMD_DESTROY_PD, &handle(pdn)),
        8,
    );
    assert_eq!(status_of(&resp), VRDMA_STATUS_NOT_FOUND);
    let (_, resp) = run(&mut ctrl, &mut guest, &cmd(VRDMA_CMD_CREATE_PD, &[]), 16);
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
    let mut rxq = DriverRing::new(&mut guest, VRDMA_VQ_ETH_RX as usize, 16);
    let mut txq = DriverRing::new(&mut guest, VRDMA_VQ_ETH_TX as usize, 16);
    start_rings(&mut fe, &guest, &[&rxq, &txq]);

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
