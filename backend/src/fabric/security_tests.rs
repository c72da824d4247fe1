//! Port security in the switch (spec §16.3): a device port with an address list sends only its
//! own addresses, on every path into the fabric (netdev frames, engine frames, segments), and
//! each refusal is counted by reason.

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::test_support::drain;
use super::*;
use crate::uplink::Uplink;
use crate::wire::segment::{Segment, SegmentWriter};
use crate::wire::{gid_from_ipv4, Addressing, Bth, Opcode, PacketBuilder};

const A: MacAddr = [0x52, 0x54, 0, 0, 0, 0x0a];
const B: MacAddr = [0x52, 0x54, 0, 0, 0, 0x0b];
const IP_A: [u8; 4] = [10, 0, 0, 1];
const IP_B: [u8; 4] = [10, 0, 0, 2];

/// A with the list [10.0.0.1], B without a list.
fn two_devices() -> (Arc<Fabric>, DevicePort, DevicePort) {
    let mut b = FabricBuilder::new();
    let security = Some(PortSecurity::new(A, &[IpAddr::from(IP_A)]));
    let a = b
        .add_device_with(A, DeviceOptions { security, net: 0 })
        .unwrap();
    let bb = b.add_device(B).unwrap();
    b.name_port(a, "vm-a");
    let f = b.build();
    let pa = f.device_port(a).unwrap();
    let pb = f.device_port(bb).unwrap();
    (f, pa, pb)
}

fn arp(src: MacAddr, sender_ip: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 2]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&sender_ip);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&sender_ip);
    f
}

fn roce(src: MacAddr, dst: MacAddr, src_ip: [u8; 4], psn: u32) -> Vec<u8> {
    let addr = Addressing::new(src, dst, gid_from_ipv4(src_ip), gid_from_ipv4(IP_B), 0xc000);
    let mut out = Vec::new();
    PacketBuilder::new(addr, Bth::new(Opcode::RcSendOnly, 0x11, psn))
        .build(&[b"payload"], &mut out)
        .unwrap();
    out
}

fn dropped(f: &Fabric, port: PortId, v: Violation) -> u64 {
    f.port_stats(port).unwrap().drop_security[v.index()].load(Relaxed)
}

#[test]
fn a_secured_port_sends_only_its_own_addresses() {
    let (f, pa, pb) = two_devices();
    // A gratuitous ARP taking over B's address: the attack.
    pa.send(&arp(A, IP_B)).unwrap();
    // An engine frame (RoCEv2) with B's address as its source GID.
    pa.send_frames(&mut [roce(A, B, IP_B, 1)]).unwrap();
    // A VLAN-tagged frame.
    let mut tagged = arp(A, IP_A);
    tagged.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    pa.send(&tagged).unwrap();
    assert!(
        drain(&pb).is_empty(),
        "no spoofed frame reaches the neighbour"
    );
    assert_eq!(dropped(&f, 0, Violation::Arp), 1);
    assert_eq!(dropped(&f, 0, Violation::Gid), 1);
    assert_eq!(dropped(&f, 0, Violation::Tagged), 1);
    assert_eq!(f.port_stats(0).unwrap().in_frames.load(Relaxed), 0);
    // Its own addresses pass, on both paths.
    let own_arp = arp(A, IP_A);
    let own_roce = roce(A, B, IP_A, 2);
    pa.send(&own_arp).unwrap();
    pa.send_frames(&mut [own_roce.clone()]).unwrap();
    // The receiving queue serves a sender's RoCE lane before its other frames (spec §16.4
    // rule 3), so the two arrive in either order.
    let mut got = drain(&pb);
    got.sort();
    let mut want = vec![own_arp, own_roce];
    want.sort();
    assert_eq!(got, want);
    let text = f.render_stats();
    assert!(
        text.contains(
            "vrdma_fabric_drops_total{port=\"vm-a\",kind=\"device\",reason=\"spoofed_arp\"} 1"
        ),
        "{text}"
    );
}

#[test]
fn a_port_without_a_list_is_checked_on_its_source_mac_only() {
    let (_f, pa, pb) = two_devices();
    let claim = arp(B, IP_A);
    pb.send(&claim).unwrap();
    assert_eq!(
        drain(&pa),
        vec![claim],
        "spec §16.3: no list, no address check"
    );
}

fn segment_of(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut w = SegmentWriter::default();
    for f in frames {
        let r = w.push_with(f.len(), |room: &mut [u8]| {
            room[..f.len()].copy_from_slice(f);
            Ok::<usize, ()>(f.len())
        });
        assert!(r.unwrap().is_some());
    }
    let s = w.take().unwrap();
    assert_eq!(Segment::parse(&s).map(|s| s.count()), Some(frames.len()));
    s
}

#[test]
fn segments_from_a_secured_port_are_checked_frame_by_frame() {
    let (f, pa, pb) = two_devices();
    // The second frame of the segment carries another source: the whole segment is refused.
    let mut seg = segment_of(&[roce(A, B, IP_A, 1), roce(A, B, IP_B, 2)]);
    pa.send_segment(&mut seg).unwrap();
    assert!(drain(&pb).is_empty());
    assert_eq!(dropped(&f, 0, Violation::Gid), 2, "counted as its frames");
    let good = [roce(A, B, IP_A, 3), roce(A, B, IP_A, 4)];
    let mut seg = segment_of(&good);
    pa.send_segment(&mut seg).unwrap();
    assert_eq!(
        drain(&pb),
        good.to_vec(),
        "split for a port without segments"
    );
}
