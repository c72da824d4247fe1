//! Devices of one daemon on the in-process fabric (ARCHITECTURE.md "One daemon, many devices"):
//! engine threads on `DevicePort`s, RC traffic with data verified between 2 and 4 devices, and a
//! fabric that also has a UDP uplink to a device of another daemon.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::engine::wait_cqes;
use common::write_conn::WriteConn;
use common::*;
use vrdma_backend::fabric::{Fabric, FabricBuilder};
use vrdma_backend::transport::engine::Engine;
use vrdma_spec::*;

/// Post the connection's WRITE (one signaled WQE per MiB) and ring through `engine`.
fn start_write(a: &Node, c: &mut WriteConn, engine: &Engine) {
    let chunk: u64 = 1 << 20;
    let n = c.len / chunk;
    for i in 0..n {
        post_send_mem(
            &a.mem,
            &mut c.qa,
            &Wqe {
                wr_id: i,
                opcode: VRDMA_WR_RDMA_WRITE,
                flags: if i == n - 1 { VRDMA_SEND_SIGNALED } else { 0 },
                sges: vec![(c.src + i * chunk, chunk as u32, c.ka)],
                remote_addr: c.dst + i * chunk,
                rkey: c.kb,
                ..Default::default()
            },
        );
    }
    engine.sender().push(VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: c.qa.qpn,
    });
}

fn wait_write(a: &mut Node, b: &Node, c: &mut WriteConn) {
    let limit = Duration::from_secs(60);
    let got = wait_cqes(a, &mut c.cqa, 1, limit, "WRITE did not complete");
    assert_eq!(got[0].status, VRDMA_WC_SUCCESS);
    assert!(
        b.read(c.dst, c.len as usize) == c.data,
        "WRITE data differs"
    );
}

/// A fabric with one port per node (and `uplinks`), each node's engine on its port.
fn engines_on_fabric(
    nodes: &mut [&mut Node],
    uplinks: Vec<Arc<dyn vrdma_backend::uplink::Uplink>>,
) -> (Arc<Fabric>, Vec<Engine>, Vec<usize>) {
    let mut b = FabricBuilder::new();
    for u in uplinks {
        b.add_uplink(u);
    }
    let ids: Vec<usize> = nodes
        .iter()
        .map(|n| b.add_device(n.mac).expect("device port"))
        .collect();
    let fabric = b.build();
    let engines = nodes
        .iter_mut()
        .zip(&ids)
        .map(|(n, &id)| {
            let port = fabric.device_port(id).expect("port").with_segments();
            Engine::start(detach(n), Arc::new(port)).expect("engine")
        })
        .collect();
    (fabric, engines, ids)
}

#[test]
fn rc_between_four_devices_on_one_fabric() {
    let mut n: Vec<Node> = (1..=4).map(|i| Node::new(i, 32, 9000)).collect();
    let (left, right) = n.split_at_mut(2);
    let (n1, n2) = left.split_at_mut(1);
    let (n3, n4) = right.split_at_mut(1);
    let (n1, n2, n3, n4) = (&mut n1[0], &mut n2[0], &mut n3[0], &mut n4[0]);
    let mut c12 = WriteConn::new(n1, n2, 4 << 20, 12);
    let mut c34 = WriteConn::new(n3, n4, 4 << 20, 34);
    let mut c41 = WriteConn::new(n4, n1, 2 << 20, 41);
    let (fabric, engines, ids) = engines_on_fabric(&mut [n1, n2, n3, n4], Vec::new());

    // 1 -> 2 alone first: the other ports must see none of it (unicast is not flooded).
    start_write(n1, &mut c12, &engines[0]);
    wait_write(n1, n2, &mut c12);
    for &p in &ids[2..] {
        let s = fabric.port_stats(p).unwrap();
        assert_eq!(
            s.out_frames.load(Ordering::Relaxed),
            0,
            "port {p} saw another pair's frames"
        );
    }
    // Then 3 -> 4 and 4 -> 1 at the same time.
    start_write(n3, &mut c34, &engines[2]);
    start_write(n4, &mut c41, &engines[3]);
    wait_write(n3, n4, &mut c34);
    wait_write(n4, n1, &mut c41);
    for &p in &ids {
        let s = fabric.port_stats(p).unwrap();
        assert_eq!(s.drop_spoofed.load(Ordering::Relaxed), 0);
        assert!(s.in_frames.load(Ordering::Relaxed) > 0);
    }
    for e in engines {
        e.stop();
    }
}

#[test]
fn fabric_devices_and_a_remote_device_over_a_udp_uplink() {
    // a and b on one fabric, c behind the fabric's UDP uplink (another daemon).
    let mut a = Node::new(1, 32, 9000);
    let mut b = Node::new(2, 32, 9000);
    let mut c = Node::new(3, 32, 9000);
    let mut ab = WriteConn::new(&mut a, &mut b, 4 << 20, 1);
    let mut ac = WriteConn::new(&mut a, &mut c, 4 << 20, 2);
    let mut cb = WriteConn::new(&mut c, &mut b, 2 << 20, 3);
    let (ua, uc) = udp_pair();
    let (fabric, engines, ids) = engines_on_fabric(&mut [&mut a, &mut b], vec![Arc::new(ua)]);
    let bridges = fabric.start_bridges().expect("bridge");
    assert_eq!(bridges.len(), 1);
    let ec = Engine::start(detach(&mut c), Arc::new(uc)).expect("engine c");

    start_write(&a, &mut ab, &engines[0]);
    start_write(&a, &mut ac, &engines[0]);
    start_write(&c, &mut cb, &ec);
    wait_write(&mut a, &b, &mut ab);
    wait_write(&mut a, &c, &mut ac);
    wait_write(&mut c, &b, &mut cb);
    let uplink = fabric.port_stats(0).unwrap();
    assert!(
        uplink.in_frames.load(Ordering::Relaxed) > 0,
        "c's frames came in"
    );
    assert!(
        uplink.out_frames.load(Ordering::Relaxed) > 0,
        "a's frames went out"
    );
    assert_eq!(
        fabric
            .port_stats(ids[1])
            .unwrap()
            .drop_full
            .load(Ordering::Relaxed),
        0
    );
    drop(bridges);
    ec.stop();
    for e in engines {
        e.stop();
    }
}

/// A device port that records the RoCEv2 frames its engine sends (and forwards everything,
/// the ICRC offload included).
struct Peek {
    inner: vrdma_backend::fabric::DevicePort,
    roce: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl Peek {
    /// Keep the RoCEv2 frames of `buf` (a segment, spec §16.2 rule 6, stands for its frames).
    fn record(&self, buf: &[u8], segment: bool) {
        let mut r = self.roce.lock().unwrap();
        for f in vrdma_backend::transport::frames_of(buf, segment) {
            if r.len() < 64
                && vrdma_backend::wire::RocePacket::parse_with(
                    f,
                    vrdma_backend::wire::IcrcCheck::Trusted,
                )
                .is_ok()
            {
                r.push(f.to_vec());
            }
        }
    }
}

impl vrdma_backend::uplink::Uplink for Peek {
    fn send(&self, frame: &[u8]) -> Result<(), vrdma_backend::uplink::UplinkError> {
        self.inner.send(frame)
    }
    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, vrdma_backend::uplink::UplinkError> {
        self.inner.recv(buf)
    }
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        self.inner.as_raw_fd()
    }
    fn send_frames(
        &self,
        frames: &mut [Vec<u8>],
    ) -> Result<usize, vrdma_backend::uplink::UplinkError> {
        for buf in frames.iter() {
            self.record(buf, false);
        }
        self.inner.send_frames(frames)
    }
    fn send_segment(&self, seg: &mut Vec<u8>) -> Result<usize, vrdma_backend::uplink::UplinkError> {
        self.record(seg, true);
        self.inner.send_segment(seg)
    }
    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<vrdma_backend::uplink::RxFrame>,
    ) -> Result<usize, vrdma_backend::uplink::UplinkError> {
        self.inner.recv_batch(bufs, frames)
    }
    fn icrc_offload(&self) -> vrdma_backend::uplink::IcrcOffload {
        self.inner.icrc_offload()
    }
}

/// Spec §16.2: engines on one fabric neither compute nor check the ICRC (the frames between
/// them never leave the process); the data still arrives intact.
#[test]
fn engines_on_a_fabric_leave_the_icrc_to_it() {
    use vrdma_backend::uplink::Uplink;
    use vrdma_backend::wire::{IcrcCheck, RocePacket, WireError};
    let mut a = Node::new(1, 32, 9000);
    let mut b = Node::new(2, 32, 9000);
    let mut ab = WriteConn::new(&mut a, &mut b, 2 << 20, 5);
    let mut fb = FabricBuilder::new();
    let pa = fb.add_device(a.mac).expect("a");
    let pb = fb.add_device(b.mac).expect("b");
    let fabric = fb.build();
    let peek = Arc::new(Peek {
        inner: fabric.device_port(pa).expect("port a").with_segments(),
        roce: Default::default(),
    });
    assert!(peek.icrc_offload().seals_tx && peek.icrc_offload().checked_rx);
    let ea = Engine::start(detach(&mut a), peek.clone()).expect("engine a");
    let eb = Engine::start(
        detach(&mut b),
        Arc::new(fabric.device_port(pb).expect("port b").with_segments()),
    )
    .expect("engine b");
    start_write(&a, &mut ab, &ea);
    wait_write(&mut a, &b, &mut ab);
    let seen = peek.roce.lock().unwrap().clone();
    assert!(!seen.is_empty(), "a's engine sent RoCEv2 frames");
    for f in &seen {
        assert_eq!(&f[f.len() - 4..], &[0, 0, 0, 0], "no ICRC computed");
        assert!(matches!(
            RocePacket::parse_with(f, IcrcCheck::Verify),
            Err(WireError::BadIcrc { .. })
        ));
    }
    ea.stop();
    eb.stop();
}

/// A device whose port is wrapped (fault injection sends through `send`, so its engine computes
/// the ICRC) still takes the other device's unsealed frames: the receive half of the offload
/// holds through the wrapper (spec §16.2).
#[test]
fn an_impaired_port_and_a_plain_one_on_one_fabric() {
    use vrdma_backend::uplink::{ImpairConfig, Impaired, Uplink};
    let mut a = Node::new(1, 32, 9000);
    let mut b = Node::new(2, 32, 9000);
    let mut ab = WriteConn::new(&mut a, &mut b, 2 << 20, 8);
    let mut ba = WriteConn::new(&mut b, &mut a, 2 << 20, 9);
    let mut fb = FabricBuilder::new();
    let pa = fb.add_device(a.mac).expect("a");
    let pb = fb.add_device(b.mac).expect("b");
    let fabric = fb.build();
    let ua = Impaired::new(
        fabric.device_port(pa).expect("port a"),
        ImpairConfig::default(),
    );
    let o = ua.icrc_offload();
    assert!(!o.seals_tx && o.checked_rx);
    let ea = Engine::start(detach(&mut a), Arc::new(ua)).expect("engine a");
    let eb = Engine::start(
        detach(&mut b),
        // b sends segments; a's port takes none, so the fabric splits them for it.
        Arc::new(fabric.device_port(pb).expect("port b").with_segments()),
    )
    .expect("engine b");
    start_write(&a, &mut ab, &ea);
    start_write(&b, &mut ba, &eb);
    wait_write(&mut a, &b, &mut ab);
    wait_write(&mut b, &a, &mut ba);
    ea.stop();
    eb.stop();
}

/// Spec §16.3: the engine's own RoCEv2 frames enter the switch through the same ingress as the
/// guest's netdev frames. A guest that entered a neighbour's address as its GID (ADD_GID is not
/// policed) gets none of its RC packets (single frames or segments) past its port: they are
/// counted as spoofed_gid, the target device receives nothing from it and its memory stays
/// as it was, while an honest device's WRITE to the same target lands.
#[test]
fn an_engine_cannot_send_from_another_devices_address() {
    use vrdma_backend::fabric::{DeviceOptions, PortSecurity, Violation};
    let mut n1 = Node::new(1, 32, 9000);
    let mut n2 = Node::new(2, 32, 9000);
    // Device 3's guest claims device 1's address 10.0.0.1.
    let mut n3 = Node::with_gid(3, 32, 9000, gid_v4([10, 0, 0, 1]));
    let mut c12 = WriteConn::new(&mut n1, &mut n2, 1 << 20, 12);
    let mut c32 = WriteConn::new(&mut n3, &mut n2, 1 << 20, 32);
    let mut b = FabricBuilder::new();
    let ids: Vec<usize> = [(n1.mac, 1u8), (n2.mac, 2), (n3.mac, 3)]
        .iter()
        .map(|&(mac, host)| {
            let ip = std::net::IpAddr::from([10, 0, 0, host]);
            let security = Some(PortSecurity::new(mac, &[ip]));
            b.add_device_with(mac, DeviceOptions { security, net: 0 })
                .expect("device port")
        })
        .collect();
    let fabric = b.build();
    let engines: Vec<Engine> = [&mut n1, &mut n2, &mut n3]
        .into_iter()
        .zip(&ids)
        .map(|(n, &id)| {
            let port = fabric.device_port(id).expect("port").with_segments();
            Engine::start(detach(n), Arc::new(port)).expect("engine")
        })
        .collect();
    let refused = |p: usize| {
        fabric.port_stats(p).unwrap().drop_security[Violation::Gid.index()].load(Ordering::Relaxed)
    };
    start_write(&n3, &mut c32, &engines[2]);
    let start = Instant::now();
    while refused(ids[2]) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "device 3's packets were not refused"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    start_write(&n1, &mut c12, &engines[0]);
    wait_write(&mut n1, &n2, &mut c12);
    let s3 = fabric.port_stats(ids[2]).unwrap();
    assert_eq!(
        s3.in_frames.load(Ordering::Relaxed),
        0,
        "nothing of device 3 got in"
    );
    assert_eq!(refused(ids[0]), 0, "the honest device's packets all passed");
    assert!(
        n2.read(c32.dst, c32.len as usize).iter().all(|&b| b == 0),
        "device 3's WRITE target is untouched"
    );
    for e in engines {
        e.stop();
    }
}
