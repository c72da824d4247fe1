//! Uplink trust (spec §16.3), with real UDP sockets on 127.0.0.1: a UDP uplink takes frames only
//! from its configured remote, and a frame from one uplink does not leave through another
//! unless the fabric was told to forward between uplinks. The repro: a daemon with one
//! device and two UDP uplinks; a broadcast ARP sent to the first uplink from another local
//! port must not come out of the second.

use std::net::UdpSocket;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrdma_backend::fabric::{Bridge, DevicePort, Fabric, FabricBuilder, PortId};
use vrdma_backend::uplink::{RxFrame, UdpUplink, Uplink};

const DEVICE: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];

fn broadcast_arp(src: [u8; 6], tag: u8) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[10, 0, 0, tag]);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&[10, 0, 0, 1]);
    f
}

struct Daemon {
    fabric: Arc<Fabric>,
    device: DevicePort,
    uplink_ports: [PortId; 2],
    /// The first uplink's local address (where its remote and the stranger send).
    first_local: std::net::SocketAddr,
    remotes: [UdpSocket; 2],
    bridges: Vec<Bridge>,
}

/// One device and two UDP uplinks, each with its own remote socket.
fn daemon(between_uplinks: bool) -> Daemon {
    let remotes = [
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
    ];
    let uplinks: Vec<Arc<UdpUplink>> = remotes
        .iter()
        .map(|r| {
            Arc::new(
                UdpUplink::new("127.0.0.1:0".parse().unwrap(), r.local_addr().unwrap()).unwrap(),
            )
        })
        .collect();
    let first_local = uplinks[0].local_addr().unwrap();
    let mut b = FabricBuilder::new();
    b.forward_between_uplinks(between_uplinks);
    let d = b.add_device(DEVICE).unwrap();
    let u0 = b.add_uplink(uplinks[0].clone());
    let u1 = b.add_uplink(uplinks[1].clone());
    let fabric = b.build();
    let device = fabric.device_port(d).unwrap();
    let bridges = fabric.start_bridges().unwrap();
    Daemon {
        fabric,
        device,
        uplink_ports: [u0, u1],
        first_local,
        remotes,
        bridges,
    }
}

/// The frames the device receives within a few seconds, until `want` have come.
fn device_frames(p: &DevicePort, want: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < want && Instant::now() < deadline {
        let mut bufs = vec![Vec::new(); 8];
        let mut frames: Vec<RxFrame> = Vec::new();
        let n = p.recv_batch(&mut bufs, &mut frames).unwrap();
        got.extend(bufs.into_iter().take(n));
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

fn pending(s: &UdpSocket) -> Option<Vec<u8>> {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
}

#[test]
fn a_stranger_cannot_inject_and_uplinks_are_not_bridged() {
    let mut t = daemon(false);
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let injected = broadcast_arp([0x02, 0, 0, 0, 0, 0x66], 66);
    stranger.send_to(&injected, t.first_local).unwrap();
    // Then the trusted remote's broadcast: once the device has it, the bridge has read (and
    // refused) the stranger's datagram, which was queued on the same socket before it.
    let trusted = broadcast_arp([0x02, 0, 0, 0, 0, 0x77], 77);
    t.remotes[0].send_to(&trusted, t.first_local).unwrap();
    assert_eq!(device_frames(&t.device, 1), vec![trusted]);
    // Stop (join) the bridge threads: whatever they were forwarding has been sent by now
    // (loopback sends are synchronous), so an empty socket means nothing was sent.
    drop(std::mem::take(&mut t.bridges));
    assert_eq!(
        t.device_pending(),
        0,
        "the stranger's frame never reached the device"
    );
    assert_eq!(
        pending(&t.remotes[1]),
        None,
        "nothing came out of the second uplink"
    );
    let up0 = t.fabric.port_stats(t.uplink_ports[0]).unwrap();
    assert_eq!(
        up0.drop_uplink_to_uplink.load(Relaxed),
        1,
        "the trusted broadcast"
    );
    assert_eq!(up0.in_frames.load(Relaxed), 1);
    let text = t.fabric.render_stats();
    assert!(text.contains("reason=\"foreign_source\"} 1"), "{text}");
    assert!(text.contains("reason=\"uplink_to_uplink\"} 1"), "{text}");
    // The device still reaches both uplinks.
    let own = broadcast_arp(DEVICE, 1);
    t.device.send(&own).unwrap();
    for r in &t.remotes {
        r.set_nonblocking(false).unwrap();
        r.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 2048];
        let n = r.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &own[..]);
    }
}

#[test]
fn forwarding_between_uplinks_when_asked() {
    let t = daemon(true);
    let trusted = broadcast_arp([0x02, 0, 0, 0, 0, 0x77], 77);
    t.remotes[0].send_to(&trusted, t.first_local).unwrap();
    let r = &t.remotes[1];
    r.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 2048];
    let n = r.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &trusted[..]);
    assert_eq!(device_frames(&t.device, 1), vec![trusted]);
    let up0 = t.fabric.port_stats(t.uplink_ports[0]).unwrap();
    assert_eq!(up0.drop_uplink_to_uplink.load(Relaxed), 0);
}

impl Daemon {
    fn device_pending(&self) -> usize {
        let mut bufs = vec![Vec::new(); 8];
        let mut frames: Vec<RxFrame> = Vec::new();
        self.device.recv_batch(&mut bufs, &mut frames).unwrap()
    }
}
