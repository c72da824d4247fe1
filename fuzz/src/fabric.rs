//! Target `fabric`: frames from several ports into one fabric (spec §16.2, §16.3): five device
//! ports on two tenant networks, three of them with port security (`ip=` lists), a trunk uplink
//! carrying both networks as VLANs and an untagged uplink of network 2. Each record sends one
//! buffer from one port on one path (a guest's netdev frame, engine frames, an engine segment,
//! or a frame an uplink received); every queue and uplink is drained after it and each frame
//! that came out is checked against the switch's promises:
//!
//! - it never leaves its network: a device receives only from its own network, a trunk uplink
//!   sends a network's frame with that network's tag, the untagged uplink only network 2's, and
//!   a frame from an uplink never leaves through another uplink;
//! - it never carries a spoofed source (rules of `port_security.rs`, checked here by an
//!   independent and deliberately lenient reading of the frame, so that a panic is a real
//!   bypass): a device's frame has its own source MAC, and a secured device's frame has no VLAN
//!   tag, its own ARP sender, IPv4 / IPv6 source and RoCE v1 source GID, no router
//!   advertisement or redirect, and a neighbour advertisement only for its own address with
//!   link-layer options naming its own MAC, behind any chain of extension headers;
//! - an uplink's frame never carries a local device's MAC as its source.
//!
//! A violated promise panics: the binary aborts and AFL records the input as a crash.
//!
//! Input: records of `port u8, path u8, len u16, bytes[len]`. `port % 7` is the sender (devices
//! 0..5, uplinks 5 and 6); `path & 3` picks the device path (netdev `send`, engine
//! `send_frames`, engine `send_segment` of the bytes as a segment, or two copies in one
//! `send_batch`); `path & 4` overwrites the frame's source MAC with the sender's own, so that a
//! mutated frame gets past the MAC check to the address checks.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use vrdma_backend::fabric::port_security::link_local_of;
use vrdma_backend::fabric::{
    DeviceOptions, DevicePort, Fabric, FabricBuilder, NetId, PortSecurity, UplinkNets,
};
use vrdma_backend::uplink::{RxFrame, Uplink, UplinkError};

use crate::Input;

/// Most records per input.
const MAX_FRAMES: usize = 48;
/// Largest buffer a record sends.
const MAX_LEN: usize = 4096;

/// One device of the bed: MAC, network, address list (`None`: no port security).
pub struct DeviceSpec {
    pub mac: [u8; 6],
    pub net: NetId,
    pub ips: Option<Vec<IpAddr>>,
}

/// The devices: 0, 1, 2 on network 1 (0 and 1 secured), 3, 4 on network 2 (3 secured).
pub fn devices() -> Vec<DeviceSpec> {
    let v4 = |a, b| IpAddr::V4(Ipv4Addr::new(10, 0, a, b));
    let v6 = |a: u16, b: u16| IpAddr::V6(Ipv6Addr::new(0xfd00, a, 0, 0, 0, 0, 0, b));
    vec![
        DeviceSpec {
            mac: [0x52, 0x54, 0, 0, 1, 1],
            net: 1,
            ips: Some(vec![v4(1, 1), v6(1, 1)]),
        },
        DeviceSpec {
            mac: [0x52, 0x54, 0, 0, 1, 2],
            net: 1,
            ips: Some(vec![v4(1, 2), v6(1, 2)]),
        },
        DeviceSpec {
            mac: [0x52, 0x54, 0, 0, 1, 3],
            net: 1,
            ips: None,
        },
        DeviceSpec {
            mac: [0x52, 0x54, 0, 0, 2, 1],
            net: 2,
            ips: Some(vec![v4(2, 1), v6(2, 1)]),
        },
        DeviceSpec {
            mac: [0x52, 0x54, 0, 0, 2, 2],
            net: 2,
            ips: None,
        },
    ]
}

/// Index of the trunk uplink (networks 1 and 2 as VLANs 1 and 2) among the ports.
pub const TRUNK: usize = 5;
/// Index of the untagged uplink of network 2.
pub const PLAIN: usize = 6;
const PORTS: usize = 7;

/// An uplink that records what the fabric sends it and never receives.
#[derive(Default)]
struct Recorder {
    sent: Mutex<Vec<Vec<u8>>>,
}

impl Uplink for Recorder {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        self.sent.lock().expect("recorder").push(frame.to_vec());
        Ok(())
    }
    fn recv(&self, _buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        Ok(None)
    }
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        -1
    }
}

struct FabricBed {
    fabric: Arc<Fabric>,
    specs: Vec<DeviceSpec>,
    devices: Vec<DevicePort>,
    /// Port ids of the devices, then of the trunk and the plain uplink.
    ids: Vec<usize>,
    trunk: Arc<Recorder>,
    plain: Arc<Recorder>,
}

impl FabricBed {
    fn new() -> FabricBed {
        let specs = devices();
        let mut b = FabricBuilder::new();
        let mut ids = Vec::new();
        for d in &specs {
            let security = d.ips.as_ref().map(|ips| PortSecurity::new(d.mac, ips));
            let opts = DeviceOptions {
                security,
                net: d.net,
            };
            ids.push(b.add_device_with(d.mac, opts).expect("device port"));
        }
        let trunk = Arc::new(Recorder::default());
        let plain = Arc::new(Recorder::default());
        ids.push(b.add_uplink_with(trunk.clone(), UplinkNets::Tagged(vec![1, 2])));
        ids.push(b.add_uplink_with(plain.clone(), UplinkNets::Untagged(2)));
        let fabric = b.build();
        // Devices 1 and 3 take segments whole (an engine's port); the others get them split.
        let devices = ids[..specs.len()]
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let p = fabric.device_port(id).expect("device port");
                if i % 2 == 1 {
                    p.with_segments()
                } else {
                    p
                }
            })
            .collect();
        FabricBed {
            fabric,
            specs,
            devices,
            ids,
            trunk,
            plain,
        }
    }

    /// Every frame each device's queue holds (segments as their frames).
    fn drain_device(&self, i: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let mut bufs = vec![Vec::new(); 64];
            let mut frames: Vec<RxFrame> = Vec::new();
            let n = self.devices[i]
                .recv_batch(&mut bufs, &mut frames)
                .expect("recv_batch");
            if n == 0 {
                return out;
            }
            for f in &frames {
                let buf = &bufs[f.slot][f.off..f.off + f.len];
                if f.segment {
                    let seg = vrdma_backend::wire::segment::Segment::parse(buf)
                        .expect("a segment the fabric delivered parses");
                    out.extend(seg.frames().map(|fr| fr.to_vec()));
                } else {
                    out.push(buf.to_vec());
                }
            }
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn v6_at(b: &[u8], at: usize) -> Option<Ipv6Addr> {
    let s: [u8; 16] = b.get(at..at + 16)?.try_into().ok()?;
    Some(Ipv6Addr::from(s))
}

/// The addresses a secured device may use as a source.
struct Own {
    mac: [u8; 6],
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
}

impl Own {
    fn of(d: &DeviceSpec, ips: &[IpAddr]) -> Own {
        let mut own = Own {
            mac: d.mac,
            v4: Vec::new(),
            v6: vec![link_local_of(&d.mac)],
        };
        for ip in ips {
            match ip {
                IpAddr::V4(a) => own.v4.push(*a),
                IpAddr::V6(a) => own.v6.push(*a),
            }
        }
        own
    }

    fn v4_ok(&self, a: Ipv4Addr) -> bool {
        a.is_unspecified() || self.v4.contains(&a)
    }

    fn v6_ok(&self, a: Ipv6Addr) -> bool {
        a.is_unspecified()
            || self.v6.contains(&a)
            || a.to_ipv4_mapped().is_some_and(|v4| self.v4.contains(&v4))
    }

    /// Panics if `f`, delivered from this secured device, carries an address not its own.
    fn check(&self, f: &[u8], path: &str) {
        let ethertype = be16(f, 12).unwrap_or(0);
        assert!(
            ![0x8100, 0x88a8, 0x9100].contains(&ethertype),
            "{path}: a tagged frame from a secured device was delivered"
        );
        match ethertype {
            0x0806 if f.len() >= 42 => {
                assert_eq!(f[22..28], self.mac, "{path}: ARP with another sender MAC");
                let ip = Ipv4Addr::new(f[28], f[29], f[30], f[31]);
                assert!(self.v4_ok(ip), "{path}: ARP with sender IP {ip}");
            }
            0x0800 if f.len() >= 34 => {
                let ip = Ipv4Addr::new(f[26], f[27], f[28], f[29]);
                assert!(self.v4_ok(ip), "{path}: IPv4 from {ip}");
            }
            0x86dd => {
                if let Some(src) = v6_at(f, 22) {
                    assert!(self.v6_ok(src), "{path}: IPv6 from {src}");
                }
                self.check_nd(f, path);
            }
            0x8915 => {
                if let Some(sgid) = v6_at(f, 14 + 8) {
                    assert!(self.v6_ok(sgid), "{path}: RoCE v1 from GID {sgid}");
                }
            }
            _ => {}
        }
    }

    /// Neighbour discovery behind the extension headers (hop-by-hop, routing, destination
    /// options; a fragment ends the walk: the rules refuse ND in one).
    fn check_nd(&self, f: &[u8], path: &str) {
        let (Some(&first), true) = (f.get(20), f.len() >= 54) else {
            return;
        };
        let (mut next, mut off) = (first, 54usize);
        for _ in 0..16 {
            if ![0, 43, 60].contains(&next) {
                break;
            }
            let (Some(&nh), Some(&len)) = (f.get(off), f.get(off + 1)) else {
                return;
            };
            next = nh;
            off += (usize::from(len) + 1) * 8;
        }
        if next != 58 {
            return;
        }
        let Some(&icmp_type) = f.get(off) else {
            return;
        };
        assert!(
            icmp_type != 134 && icmp_type != 137,
            "{path}: ICMPv6 type {icmp_type} (router advertisement / redirect) from a device"
        );
        if icmp_type != 135 && icmp_type != 136 {
            return;
        }
        if icmp_type == 136 {
            if let Some(target) = v6_at(f, off + 8) {
                assert!(
                    self.v6.contains(&target) && !target.is_unspecified(),
                    "{path}: neighbour advertisement for {target}"
                );
            }
        }
        // Options: type, length in units of 8 bytes; the link-layer ones carry a MAC.
        let mut o = off + 24;
        while let (Some(&t), Some(&l)) = (f.get(o), f.get(o + 1)) {
            if l == 0 {
                return;
            }
            if (t == 1 || t == 2) && o + 8 <= f.len() {
                assert_eq!(
                    f[o + 2..o + 8],
                    self.mac,
                    "{path}: ND link-layer option with another MAC"
                );
            }
            o += usize::from(l) * 8;
        }
    }
}

fn network_of_tagged(f: &[u8]) -> Option<NetId> {
    (be16(f, 12) == Some(0x8100) && f.len() >= 18).then(|| be16(f, 14).unwrap_or(0) & 0x0fff)
}

pub fn run(data: &[u8]) {
    let bed = FabricBed::new();
    let mut inp = Input::new(data);
    let owns: Vec<Option<Own>> = bed
        .specs
        .iter()
        .map(|d| d.ips.as_ref().map(|ips| Own::of(d, ips)))
        .collect();
    let device_macs: Vec<[u8; 6]> = bed.specs.iter().map(|d| d.mac).collect();
    for _ in 0..MAX_FRAMES {
        if inp.is_empty() {
            break;
        }
        let from = usize::from(inp.u8()) % PORTS;
        let path = inp.u8();
        let len = usize::from(inp.u16()) % MAX_LEN;
        let mut frame = inp.bytes(len).to_vec();
        if path & 4 != 0 && from < TRUNK && frame.len() >= 12 {
            frame[6..12].copy_from_slice(&bed.specs[from].mac);
        }
        // The networks the frame may reach, and its name in a finding.
        let nets: Vec<NetId> = match from {
            TRUNK => network_of_tagged(&frame).into_iter().collect(),
            PLAIN => vec![2],
            d => vec![bed.specs[d].net],
        };
        let how = match (from, path & 3) {
            (TRUNK | PLAIN, _) => "uplink rx",
            (_, 0) => "netdev",
            (_, 1) => "engine frames",
            (_, 2) => "engine segment",
            _ => "netdev batch",
        };
        if crate::trace() {
            eprintln!("fabric: {} bytes from port {from} ({how})", frame.len());
        }
        let id = bed.ids[from];
        match (from, path & 3) {
            (TRUNK | PLAIN, _) => bed.fabric.forward(id, &[&frame]),
            (_, 0) => {
                let _ = bed.devices[from].send(&frame);
            }
            (_, 1) => {
                let _ = bed.devices[from].send_frames(&mut [frame.clone()]);
            }
            (_, 2) => {
                let mut seg = frame.clone();
                let _ = bed.devices[from].send_segment(&mut seg);
            }
            _ => {
                let _ = bed.devices[from].send_batch(&[&frame, &frame]);
            }
        }
        for to in 0..bed.specs.len() {
            for f in bed.drain_device(to) {
                let path = format!("port {from} ({how}) -> device {to}");
                if crate::trace() {
                    eprintln!("fabric: {path}: {} bytes", f.len());
                }
                assert!(
                    nets.contains(&bed.specs[to].net),
                    "{path}: a frame crossed from network(s) {nets:?} to {}",
                    bed.specs[to].net
                );
                assert_ne!(from, to, "{path}: a frame went back to its sender");
                if from < TRUNK {
                    assert_eq!(f[6..12], bed.specs[from].mac, "{path}: spoofed source MAC");
                    if let Some(own) = &owns[from] {
                        own.check(&f, &path);
                    }
                } else {
                    assert!(
                        !device_macs.iter().any(|m| f[6..12] == *m),
                        "{path}: an uplink's frame with a local device's source MAC"
                    );
                }
            }
        }
        for (up, rec) in [(TRUNK, &bed.trunk), (PLAIN, &bed.plain)] {
            let sent = std::mem::take(&mut *rec.sent.lock().expect("recorder"));
            for f in sent {
                let path = format!("port {from} ({how}) -> uplink {up}");
                if crate::trace() {
                    eprintln!("fabric: {path}: {} bytes", f.len());
                }
                assert!(
                    from < TRUNK,
                    "{path}: a frame from an uplink left through another uplink"
                );
                let net = bed.specs[from].net;
                if up == TRUNK {
                    assert_eq!(
                        network_of_tagged(&f),
                        Some(net),
                        "{path}: a network {net} frame left the trunk with another tag"
                    );
                } else {
                    assert_eq!(
                        net, 2,
                        "{path}: a network {net} frame left network 2's uplink"
                    );
                }
                assert_eq!(f[6..12], bed.specs[from].mac, "{path}: spoofed source MAC");
                if let Some(own) = &owns[from] {
                    let mut untagged = f.clone();
                    if up == TRUNK && untagged.len() >= 16 {
                        untagged.drain(12..16);
                    }
                    own.check(&untagged, &path);
                }
            }
        }
    }
}

/// Seed frames, written as the records of [`run`].
pub mod seeds {
    use super::{devices, PLAIN, TRUNK};
    use vrdma_backend::fabric::port_security::link_local_of;
    use vrdma_backend::wire::segment::SegmentWriter;
    use vrdma_backend::wire::{gid_from_ipv4, Addressing, Bth, Opcode, PacketBuilder};

    const BCAST: [u8; 6] = [0xff; 6];

    /// One record: from `port` on `path` (see the module documentation).
    pub fn record(port: usize, path: u8, frame: &[u8]) -> Vec<u8> {
        let mut r = vec![port as u8, path];
        r.extend_from_slice(&(frame.len() as u16).to_le_bytes());
        r.extend_from_slice(frame);
        r
    }

    fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f
    }

    pub fn arp(src: [u8; 6], sender_ip: [u8; 4], target_ip: [u8; 4]) -> Vec<u8> {
        let mut f = eth(BCAST, src, 0x0806);
        f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&sender_ip);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target_ip);
        f
    }

    pub fn udp4(
        dst: [u8; 6],
        src: [u8; 6],
        from: [u8; 4],
        to: [u8; 4],
        ports: (u16, u16),
    ) -> Vec<u8> {
        let mut f = eth(dst, src, 0x0800);
        let total = 20u16 + 8 + 16;
        f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&from);
        f.extend_from_slice(&to);
        f.extend_from_slice(&ports.0.to_be_bytes());
        f.extend_from_slice(&ports.1.to_be_bytes());
        f.extend_from_slice(&24u16.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&[0x5a; 16]);
        f
    }

    /// An IPv6 ICMPv6 frame behind `ext` (extension headers as (type, bytes), each a multiple
    /// of 8 bytes with its next-header byte filled in here).
    pub fn icmp6(
        dst: [u8; 6],
        src: [u8; 6],
        from: [u8; 16],
        to: [u8; 16],
        ext: &[(u8, Vec<u8>)],
        icmp: &[u8],
    ) -> Vec<u8> {
        let mut f = eth(dst, src, 0x86dd);
        let mut payload = Vec::new();
        for (i, (_, bytes)) in ext.iter().enumerate() {
            let mut h = bytes.clone();
            h[0] = ext.get(i + 1).map_or(58, |e| e.0);
            payload.extend_from_slice(&h);
        }
        payload.extend_from_slice(icmp);
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        f.push(ext.first().map_or(58, |e| e.0));
        f.push(255);
        f.extend_from_slice(&from);
        f.extend_from_slice(&to);
        f.extend_from_slice(&payload);
        f
    }

    /// A neighbour solicitation (135) or advertisement (136) for `target` with a link-layer
    /// option (source 1, target 2) naming `ll`.
    pub fn nd(kind: u8, target: [u8; 16], ll: [u8; 6]) -> Vec<u8> {
        let mut m = vec![kind, 0, 0, 0, if kind == 136 { 0x60 } else { 0 }, 0, 0, 0];
        m.extend_from_slice(&target);
        m.extend_from_slice(&[if kind == 136 { 2 } else { 1 }, 1]);
        m.extend_from_slice(&ll);
        m
    }

    pub fn rocev2(src: [u8; 6], dst: [u8; 6], from: [u8; 4], to: [u8; 4], psn: u32) -> Vec<u8> {
        let addr = Addressing {
            src_mac: src,
            dst_mac: dst,
            vlan: None,
            src_gid: gid_from_ipv4(from),
            dst_gid: gid_from_ipv4(to),
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            udp_src_port: 0xc000,
        };
        let mut out = Vec::new();
        PacketBuilder::new(addr, Bth::new(Opcode::RcSendOnly, 0x11, psn))
            .build(&[b"payload"], &mut out)
            .expect("RoCEv2 frame");
        out
    }

    fn segment(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut w = SegmentWriter::default();
        for f in frames {
            let _ = w.push_with(f.len(), |room: &mut [u8]| {
                room[..f.len()].copy_from_slice(f);
                Ok::<usize, ()>(f.len())
            });
        }
        w.take().unwrap_or_default()
    }

    fn tagged(f: &[u8], vlan: u16) -> Vec<u8> {
        let mut t = f[..12].to_vec();
        t.extend_from_slice(&[0x81, 0x00]);
        t.extend_from_slice(&vlan.to_be_bytes());
        t.extend_from_slice(&f[12..]);
        t
    }

    fn ip6(net: u16, host: u16) -> [u8; 16] {
        std::net::Ipv6Addr::new(0xfd00, net, 0, 0, 0, 0, 0, host).octets()
    }

    pub fn all() -> Vec<(String, Vec<u8>)> {
        let d = devices();
        let mac = |i: usize| d[i].mac;
        let ll = |i: usize| link_local_of(&d[i].mac).octets();
        let all_nodes = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let mcast6 = [0x33, 0x33, 0, 0, 0, 1];
        let mut seeds = Vec::new();
        let mut seed = |name: &str, records: Vec<Vec<u8>>| {
            seeds.push((name.to_string(), records.concat()));
        };
        // ARP: a request, a probe, a gratuitous one, and a takeover of a neighbour's address.
        seed(
            "arp",
            vec![
                record(0, 0, &arp(mac(0), [10, 0, 1, 1], [10, 0, 1, 2])),
                record(1, 0, &arp(mac(1), [0, 0, 0, 0], [10, 0, 1, 2])),
                record(3, 0, &arp(mac(3), [10, 0, 2, 1], [10, 0, 2, 1])),
                record(0, 0, &arp(mac(0), [10, 0, 1, 2], [10, 0, 1, 2])),
                record(2, 0, &arp(mac(2), [10, 0, 1, 9], [10, 0, 1, 1])),
            ],
        );
        // IPv4 unicast, a DHCP discover, a spoofed source, multicast.
        seed(
            "ipv4",
            vec![
                record(
                    0,
                    0,
                    &udp4(mac(1), mac(0), [10, 0, 1, 1], [10, 0, 1, 2], (5000, 5001)),
                ),
                record(0, 0, &udp4(BCAST, mac(0), [0; 4], [255; 4], (68, 67))),
                record(
                    1,
                    0,
                    &udp4(mac(0), mac(1), [10, 0, 1, 7], [10, 0, 1, 1], (1, 2)),
                ),
                record(
                    3,
                    0,
                    &udp4(
                        [1, 0, 0x5e, 0, 0, 1],
                        mac(3),
                        [10, 0, 2, 1],
                        [224, 0, 0, 1],
                        (5, 6),
                    ),
                ),
                record(
                    4,
                    0,
                    &udp4(mac(0), mac(4), [10, 0, 2, 2], [10, 0, 1, 1], (7, 8)),
                ),
            ],
        );
        // IPv6 ND: solicitation and advertisement from the link-local address, one behind a
        // hop-by-hop header, a foreign advertisement behind a destination-options header, a
        // router advertisement, an MLDv2 report from ::.
        let hbh = (0u8, vec![0, 0, 5, 2, 0, 0, 1, 0]);
        let dstopts = (60u8, vec![0, 0, 1, 4, 0, 0, 0, 0]);
        let ra = [134u8, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mld = [
            143u8, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0x16,
        ];
        seed(
            "nd",
            vec![
                record(
                    0,
                    0,
                    &icmp6(
                        mcast6,
                        mac(0),
                        ll(0),
                        all_nodes,
                        &[],
                        &nd(135, ip6(1, 2), mac(0)),
                    ),
                ),
                record(
                    1,
                    0,
                    &icmp6(
                        mac(0),
                        mac(1),
                        ip6(1, 2),
                        ip6(1, 1),
                        &[],
                        &nd(136, ip6(1, 2), mac(1)),
                    ),
                ),
                record(
                    0,
                    0,
                    &icmp6(
                        mcast6,
                        mac(0),
                        ip6(1, 1),
                        all_nodes,
                        &[hbh.clone()],
                        &nd(136, ip6(1, 1), mac(0)),
                    ),
                ),
                record(
                    0,
                    0,
                    &icmp6(
                        mcast6,
                        mac(0),
                        ll(0),
                        all_nodes,
                        &[dstopts.clone()],
                        &nd(136, ip6(1, 2), mac(0)),
                    ),
                ),
                record(3, 0, &icmp6(mcast6, mac(3), ll(3), all_nodes, &[], &ra)),
                record(
                    3,
                    0,
                    &icmp6(mcast6, mac(3), [0; 16], all_nodes, &[hbh, dstopts], &mld),
                ),
            ],
        );
        // RoCEv2 on the engine paths: frames, a segment (to a port that takes segments and to
        // one that does not), a spoofed source GID, two copies in one netdev batch.
        let r = |i: usize, to: usize, from: [u8; 4], dst: [u8; 4], psn| {
            rocev2(mac(i), mac(to), from, dst, psn)
        };
        seed(
            "rocev2",
            vec![
                record(0, 1, &r(0, 1, [10, 0, 1, 1], [10, 0, 1, 2], 1)),
                record(
                    0,
                    2,
                    &segment(&[
                        r(0, 1, [10, 0, 1, 1], [10, 0, 1, 2], 2),
                        r(0, 1, [10, 0, 1, 1], [10, 0, 1, 2], 3),
                    ]),
                ),
                record(1, 2, &segment(&[r(1, 2, [10, 0, 1, 2], [10, 0, 1, 3], 4)])),
                record(0, 1, &r(0, 1, [10, 0, 1, 2], [10, 0, 1, 2], 5)),
                record(3, 3, &r(3, 4, [10, 0, 2, 1], [10, 0, 2, 2], 6)),
                record(4, 1, &r(4, 3, [10, 0, 2, 2], [10, 0, 2, 1], 7)),
            ],
        );
        // VLANs: a device's tagged frame, the trunk's frames of both networks, untagged and
        // foreign-tagged ones, a device MAC as source; the plain uplink's broadcast.
        let arp_in = arp([2, 0, 0, 0, 0, 9], [10, 0, 1, 9], [10, 0, 1, 1]);
        seed(
            "vlan",
            vec![
                record(0, 0, &tagged(&arp(mac(0), [10, 0, 1, 1], [10, 0, 1, 2]), 2)),
                record(TRUNK, 0, &tagged(&arp_in, 1)),
                record(
                    TRUNK,
                    0,
                    &tagged(
                        &udp4(
                            mac(3),
                            [2, 0, 0, 0, 0, 9],
                            [10, 0, 2, 9],
                            [10, 0, 2, 1],
                            (1, 2),
                        ),
                        2,
                    ),
                ),
                record(TRUNK, 0, &arp_in),
                record(TRUNK, 0, &tagged(&arp_in, 7)),
                record(
                    TRUNK,
                    0,
                    &tagged(&arp(mac(0), [10, 0, 1, 1], [10, 0, 1, 2]), 1),
                ),
                record(
                    PLAIN,
                    0,
                    &arp([2, 0, 0, 0, 0, 8], [10, 0, 2, 8], [10, 0, 2, 1]),
                ),
                record(2, 0, &udp4(BCAST, mac(2), [10, 0, 1, 3], [255; 4], (9, 9))),
                record(
                    4,
                    3,
                    &udp4(
                        [2, 0, 0, 0, 0, 8],
                        mac(4),
                        [10, 0, 2, 2],
                        [10, 0, 2, 8],
                        (1, 1),
                    ),
                ),
            ],
        );
        // A mutated frame's source MAC fixed up by the harness (path bit 2).
        seed(
            "own_mac",
            vec![
                record(0, 4, &arp([9; 6], [10, 0, 1, 1], [10, 0, 1, 2])),
                record(
                    3,
                    5,
                    &rocev2([9; 6], mac(4), [10, 0, 2, 1], [10, 0, 2, 2], 8),
                ),
            ],
        );
        seeds
    }
}
