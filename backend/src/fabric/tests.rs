//! Switching rules of [`super::Fabric`] (module documentation, spec §16.2).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::test_support::{drain, frame, sent, Bed, Recorder};
use super::*;
use crate::uplink::{RxFrame, Uplink};

const A: MacAddr = [0x02, 0, 0, 0, 0, 0xa];
const B: MacAddr = [0x02, 0, 0, 0, 0, 0xb];
const C: MacAddr = [0x02, 0, 0, 0, 0, 0xc];
const REMOTE: MacAddr = [0x02, 0, 0, 0, 0, 0x77];
const REMOTE2: MacAddr = [0x02, 0, 0, 0, 0, 0x78];

fn bed(devices: &[MacAddr], uplinks: usize) -> Bed {
    let mut b = FabricBuilder::new();
    let ids: Vec<PortId> = devices.iter().map(|m| b.add_device(*m).unwrap()).collect();
    Bed::build(b, &ids, uplinks, |b, _, r| b.add_uplink(r))
}

#[test]
fn unicast_goes_to_its_device_only() {
    let t = bed(&[A, B, C], 1);
    let f = frame(B, A, 1);
    t.ports[0].send(&f).unwrap();
    assert_eq!(drain(&t.ports[1]), vec![f]);
    assert!(drain(&t.ports[2]).is_empty());
    assert!(drain(&t.ports[0]).is_empty());
    assert!(sent(&t.uplinks[0].1).is_empty());
}

#[test]
fn group_destinations_flood_to_every_other_port() {
    let t = bed(&[A, B, C], 1);
    let f = frame([0xff; 6], A, 2);
    t.ports[0].send_batch(&[&f]).unwrap();
    assert_eq!(drain(&t.ports[1]), vec![f.clone()]);
    assert_eq!(drain(&t.ports[2]), vec![f.clone()]);
    assert!(drain(&t.ports[0]).is_empty(), "never back to the sender");
    assert_eq!(sent(&t.uplinks[0].1), vec![f]);
}

#[test]
fn unknown_unicast_goes_to_the_uplinks_not_the_devices() {
    let t = bed(&[A, B], 1);
    let f = frame(REMOTE, A, 3);
    t.ports[0].send(&f).unwrap();
    assert!(drain(&t.ports[1]).is_empty());
    assert_eq!(sent(&t.uplinks[0].1), vec![f]);
}

#[test]
fn a_device_cannot_send_with_another_source_mac() {
    let t = bed(&[A, B], 1);
    t.ports[0].send(&frame(B, C, 4)).unwrap(); // C: not A's MAC
    t.ports[0].send(&frame(B, B, 5)).unwrap(); // B's own MAC, from A
    t.ports[0]
        .send(&frame(B, [0x03, 0, 0, 0, 0, 1], 6))
        .unwrap(); // group source
    t.ports[0].send(&[0u8; 13]).unwrap(); // runt
    assert!(drain(&t.ports[1]).is_empty());
    assert!(sent(&t.uplinks[0].1).is_empty());
    let s = t.fabric.port_stats(0).unwrap();
    assert_eq!(s.drop_spoofed.load(Ordering::Relaxed), 4);
    assert_eq!(s.in_frames.load(Ordering::Relaxed), 0);
}

#[test]
fn the_network_cannot_impersonate_a_local_device() {
    let t = bed(&[A, B], 1);
    let up = t.uplinks[0].0;
    // A remote host claiming to be A, talking to B: dropped at the uplink port.
    t.fabric.forward(up, &[&frame(B, A, 7)]);
    assert!(drain(&t.ports[1]).is_empty());
    // A genuine remote host reaches B.
    let ok = frame(B, REMOTE, 8);
    t.fabric.forward(up, &[&ok]);
    assert_eq!(drain(&t.ports[1]), vec![ok]);
    assert_eq!(
        t.fabric
            .port_stats(up)
            .unwrap()
            .drop_spoofed
            .load(Ordering::Relaxed),
        1
    );
}

/// Spec §16.4 rule 4: what a device's engine receives names the port that sent it (the netdev
/// backlog's sender), an uplink's frames that port whatever source MAC they carry.
#[test]
fn received_frames_name_their_sending_port() {
    let t = bed(&[A, B, C], 1);
    let up = t.uplinks[0].0;
    t.ports[0].send(&frame(B, A, 1)).unwrap();
    t.fabric
        .forward(up, &[&frame(B, REMOTE, 2), &frame(B, REMOTE2, 3)]);
    t.ports[2].send(&frame(B, C, 4)).unwrap();
    let mut bufs = vec![Vec::new(); 8];
    let mut frames: Vec<RxFrame> = Vec::new();
    assert_eq!(t.ports[1].recv_batch(&mut bufs, &mut frames).unwrap(), 4);
    let mut got: Vec<(u8, Option<usize>)> = frames
        .iter()
        .map(|f| (bufs[f.slot][14], f.source))
        .collect();
    got.sort();
    let (a, c) = (t.ports[0].id(), t.ports[2].id());
    assert_eq!(
        got,
        vec![(1, Some(a)), (2, Some(up)), (3, Some(up)), (4, Some(c))]
    );
}

#[test]
fn frames_to_the_own_mac_are_not_reflected() {
    let t = bed(&[A, B], 1);
    t.ports[0].send(&frame(A, A, 9)).unwrap();
    assert!(drain(&t.ports[0]).is_empty());
    assert!(sent(&t.uplinks[0].1).is_empty());
}

#[test]
fn two_uplinks_learn_where_remote_macs_are() {
    let t = bed(&[A], 2);
    let (u0, r0) = (t.uplinks[0].0, t.uplinks[0].1.clone());
    let (u1, r1) = (t.uplinks[1].0, t.uplinks[1].1.clone());
    // Unknown: both uplinks.
    let f = frame(REMOTE, A, 10);
    t.ports[0].send(&f).unwrap();
    assert_eq!(sent(&r0), vec![f.clone()]);
    assert_eq!(sent(&r1), vec![f.clone()]);
    // REMOTE speaks on uplink 1, REMOTE2 on uplink 0: learned.
    t.fabric.forward(u1, &[&frame(A, REMOTE, 11)]);
    t.fabric.forward(u0, &[&frame(A, REMOTE2, 12)]);
    assert_eq!(drain(&t.ports[0]).len(), 2);
    t.ports[0].send(&f).unwrap();
    assert!(sent(&r0).is_empty());
    assert_eq!(sent(&r1), vec![f]);
    // A frame from uplink 0 for a MAC learned on uplink 0 stays there (not sent back out).
    t.fabric.forward(u0, &[&frame(REMOTE2, REMOTE, 13)]);
    assert!(sent(&r0).is_empty());
    assert!(sent(&r1).is_empty());
    // Broadcast from one uplink: the device only (rule 6: no forwarding between uplinks
    // unless asked for; counted).
    let bc = frame([0xff; 6], REMOTE, 14);
    t.fabric.forward(u1, &[&bc]);
    assert_eq!(drain(&t.ports[0]), vec![bc.clone()]);
    assert!(sent(&r0).is_empty());
    assert!(sent(&r1).is_empty());
    let s = t.fabric.port_stats(u1).unwrap();
    assert_eq!(s.drop_uplink_to_uplink.load(Ordering::Relaxed), 1);
}

#[test]
fn a_full_queue_drops_and_counts() {
    let t = bed(&[A, B], 0);
    let f = frame(B, A, 15);
    let n = rxqueue::RXQ_MAX_FRAMES + 10;
    let slices: Vec<&[u8]> = (0..n).map(|_| f.as_slice()).collect();
    t.ports[0].send_batch(&slices).unwrap();
    let s = t.fabric.port_stats(1).unwrap();
    assert_eq!(s.drop_full.load(Ordering::Relaxed), 10);
    assert_eq!(
        s.out_frames.load(Ordering::Relaxed),
        rxqueue::RXQ_MAX_FRAMES as u64
    );
}

#[test]
fn duplicate_device_macs_are_refused() {
    let mut b = FabricBuilder::new();
    b.add_device(A).unwrap();
    assert!(matches!(b.add_device(A), Err(FabricError::DuplicateMac(_))));
}

#[test]
fn counters_render_per_port() {
    let mut b = FabricBuilder::new();
    let a = b.add_device(A).unwrap();
    let u = b.add_uplink(Arc::new(Recorder::default()));
    b.name_port(a, "vm0");
    b.name_port(u, "udp:local=1.2.3.4:5,remote=1.2.3.4:6");
    let f = b.build();
    let p = f.device_port(a).unwrap();
    p.send(&frame(REMOTE, A, 1)).unwrap();
    p.send(&frame(REMOTE, C, 2)).unwrap();
    let text = f.render_stats();
    for line in [
        "vrdma_fabric_frames_total{port=\"vm0\",kind=\"device\",dir=\"in\"} 1",
        "vrdma_fabric_drops_total{port=\"vm0\",kind=\"device\",reason=\"spoofed\"} 1",
        "vrdma_fabric_frames_total{port=\"udp:local=1.2.3.4:5,remote=1.2.3.4:6\",kind=\"uplink\",dir=\"out\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
}

/// A RoCEv2 SEND from `src` to `dst`, with or without its ICRC.
fn roce(dst: MacAddr, src: MacAddr, icrc: bool) -> Vec<u8> {
    use crate::wire::{gid_from_ipv4, Addressing, Bth, Opcode, PacketBuilder};
    let addr = Addressing::new(
        src,
        dst,
        gid_from_ipv4([10, 0, 0, src[5]]),
        gid_from_ipv4([10, 0, 0, dst[5]]),
        0xc000,
    );
    let mut b = PacketBuilder::new(addr, Bth::new(Opcode::RcSendOnly, 0x12, 9));
    b.icrc = icrc;
    let mut out = Vec::new();
    b.build(&[b"sixteen bytes!!!"], &mut out).unwrap();
    out
}

#[test]
fn engine_frames_get_their_icrc_only_when_they_leave() {
    let t = bed(&[A, B], 1);
    let o = t.ports[0].icrc_offload();
    assert!(
        o.seals_tx && o.checked_rx,
        "a device port offloads the ICRC"
    );
    let (_, r) = &t.uplinks[0];
    // A to B stays in the process: moved as it is, without an ICRC.
    let mut to_b = vec![roce(B, A, false)];
    t.ports[0].send_frames(&mut to_b).unwrap();
    let got = drain(&t.ports[1]);
    assert_eq!(got, vec![roce(B, A, false)]);
    // A to a remote MAC leaves through the uplink: a standard frame with the right ICRC.
    let mut out = vec![roce(REMOTE, A, false)];
    t.ports[0].send_frames(&mut out).unwrap();
    let s = sent(r);
    assert_eq!(s, vec![roce(REMOTE, A, true)]);
    assert!(crate::wire::RocePacket::parse(&s[0]).is_ok());
}

#[test]
fn frames_from_the_network_are_checked_once_at_the_edge() {
    let t = bed(&[A], 1);
    let (up, _) = t.uplinks[0];
    let good = roce(A, REMOTE, true);
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 10] ^= 0x40;
    t.fabric.forward(up, &[&bad, &good, &frame(A, REMOTE, 3)]);
    assert_eq!(drain(&t.ports[0]), vec![good, frame(A, REMOTE, 3)]);
    let st = t.fabric.port_stats(up).unwrap();
    assert_eq!(st.drop_bad_icrc.load(Ordering::Relaxed), 1);
    assert!(t.fabric.render_stats().contains("reason=\"bad_icrc\"} 1"));
}

#[test]
fn a_capture_sees_standard_frames() {
    let dir = std::env::temp_dir().join(format!("vrdma-fabric-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cap.pcap");
    let w = crate::uplink::PcapWriter::create(&path, None).unwrap();
    let mut b = FabricBuilder::new();
    let a = b.add_device(A).unwrap();
    let bb = b.add_device(B).unwrap();
    b.capture(w.clone());
    let fabric = b.build();
    let pa = fabric.device_port(a).unwrap();
    let pb = fabric.device_port(bb).unwrap();
    let mut to_b = vec![roce(B, A, false)];
    pa.send_frames(&mut to_b).unwrap();
    assert_eq!(drain(&pb), vec![roce(B, A, true)], "sealed for the capture");
    w.close();
    let bytes = std::fs::read(&path).unwrap();
    let want = roce(B, A, true);
    assert!(
        bytes.windows(want.len()).any(|w| w == want.as_slice()),
        "the capture holds the frame with its ICRC"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bytes of a segment in the layout of the first version (EtherType 0x88b5, a count, then
/// length-prefixed frames): what the fabric used to take for a segment by its bytes.
fn old_style_segment(dst: MacAddr, src: MacAddr) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&dst);
    s.extend_from_slice(&src);
    s.extend_from_slice(&[0x88, 0xb5, 0, 2]);
    for tag in [1, 2] {
        let f = frame(dst, src, tag);
        s.extend_from_slice(&(f.len() as u16).to_be_bytes());
        s.extend_from_slice(&f);
    }
    s
}

/// A valid segment (today's layout) of two frames from `src` to `dst`.
fn segment_of(dst: MacAddr, src: MacAddr) -> Vec<u8> {
    let mut w = crate::wire::segment::SegmentWriter::default();
    for tag in [1, 2] {
        let f = frame(dst, src, tag);
        let r = w.push_with(f.len(), |room: &mut [u8]| {
            room[..f.len()].copy_from_slice(&f);
            Ok::<usize, ()>(f.len())
        });
        assert!(r.unwrap().is_some());
    }
    w.take().unwrap()
}

/// What a device port's engine receives: each buffer with its segment mark.
fn drain_marked(p: &DevicePort) -> Vec<(Vec<u8>, bool)> {
    let mut bufs = vec![Vec::new(); 64];
    let mut frames: Vec<RxFrame> = Vec::new();
    let n = p.recv_batch(&mut bufs, &mut frames).unwrap();
    assert_eq!(n, frames.len());
    frames
        .iter()
        .map(|f| (bufs[f.slot][f.off..f.off + f.len].to_vec(), f.segment))
        .collect()
}

/// Spec §16.2 rule 6: segment-ness is out of band. Whatever a guest's netdev or the network
/// sends (EtherType 0x88b5, bytes that parse as a segment) is one ordinary frame, switched
/// and delivered unchanged and unmarked; only `forward_segment` delivers a marked segment.
#[test]
fn no_bytes_make_a_segment() {
    let t = bed(&[A, B], 1);
    let b = t.fabric.device_port(1).unwrap().with_segments();
    let (up, _) = t.uplinks[0];
    let old = old_style_segment(B, A);
    let new = segment_of(B, A);
    // The guest's netdev (send / send_batch) and the engine's owned frames.
    t.ports[0].send(&old).unwrap();
    t.ports[0].send_batch(&[&new]).unwrap();
    let mut owned = vec![old.clone(), new.clone()];
    t.ports[0].send_frames(&mut owned).unwrap();
    // The network.
    let remote_old = old_style_segment(B, REMOTE);
    let remote_new = segment_of(B, REMOTE);
    t.fabric.forward(up, &[&remote_old, &remote_new]);
    let got = drain_marked(&b);
    let want: Vec<(Vec<u8>, bool)> = [&old, &new, &old, &new, &remote_old, &remote_new]
        .iter()
        .map(|f| ((*f).clone(), false))
        .collect();
    assert_eq!(got, want);
    // Only the engine's segment call marks one.
    let mut seg = new.clone();
    assert_eq!(t.ports[0].send_segment(&mut seg).unwrap(), 2);
    assert_eq!(drain_marked(&b), vec![(new, true)]);
}
