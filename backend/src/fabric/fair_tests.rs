//! Fair share at the fabric's device queues and the group rate bound (spec §16.4; findings 3
//! and 4 of issue 39).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::group_rate::{GROUP_BURST, GROUP_RATE};
use super::rxqueue::{Class, RXQ_MAX_BYTES, RXQ_MAX_FRAMES};
use super::*;

const FLOODER: MacAddr = [0x02, 0, 0, 0, 0, 0xf];
const VICTIM: MacAddr = [0x02, 0, 0, 0, 0, 0xb];
const PEER: MacAddr = [0x02, 0, 0, 0, 0, 0xc];

/// An IPv4/UDP frame from `src` to `dst` and UDP port `port`, `len` bytes, tagged with `tag`.
fn udp(dst: MacAddr, src: MacAddr, port: u16, len: usize, tag: u16) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[14 + 9] = 17;
    f[14 + 22..14 + 24].copy_from_slice(&port.to_be_bytes());
    f[14 + 28..14 + 30].copy_from_slice(&tag.to_be_bytes());
    f
}

fn three_devices() -> (Arc<Fabric>, [PortId; 3]) {
    let mut b = FabricBuilder::new();
    let ids = [FLOODER, VICTIM, PEER].map(|m| b.add_device(m).unwrap());
    (b.build(), ids)
}

/// A port flooding a device with netdev unicast, broadcasts and RoCE frames, beside another
/// port's RoCE stream to the same device whose engine does not take frames meanwhile: the
/// stream loses no frame; the flood's excess drops and is counted as the flooder's.
#[test]
fn a_flooding_port_cannot_make_another_ports_roce_frames_drop() {
    let (fabric, [flooder, victim, peer]) = three_devices();
    let mut stream_sent = 0u16;
    for i in 0..3 * RXQ_MAX_FRAMES {
        let flood = match i % 3 {
            0 => udp(VICTIM, FLOODER, 53, 1500, 0),
            1 => udp([0xff; 6], FLOODER, 67, 342, 0),
            _ => udp(VICTIM, FLOODER, 4791, 1100, 0),
        };
        fabric.forward(flooder, &[&flood]);
        if i % 50 == 0 {
            stream_sent += 1;
            let mut f = udp(VICTIM, PEER, 4791, 1100, stream_sent);
            fabric.forward_owned(peer, std::slice::from_mut(&mut f));
        }
    }
    let st = |p: PortId| fabric.port_stats(p).unwrap();
    assert_eq!(st(peer).drop_over_share.load(Relaxed), 0);
    let flood_drops = st(flooder).drop_over_share.load(Relaxed);
    assert!(flood_drops > RXQ_MAX_FRAMES as u64, "{flood_drops}");
    assert_eq!(st(victim).drop_full.load(Relaxed), flood_drops);
    let rx = fabric.rx_queue(victim).unwrap();
    assert!(rx.held_bytes() <= RXQ_MAX_BYTES);
    let mut slots = vec![Vec::new(); RXQ_MAX_FRAMES];
    let n = rx.pop_into(&mut slots, |_, _| {});
    let stream: Vec<u16> = slots[..n]
        .iter()
        .filter(|f| f[6..12] == PEER && Class::of(f) == Class::Roce)
        .map(|f| u16::from_be_bytes([f[42], f[43]]))
        .collect();
    assert_eq!(stream, (1..=stream_sent).collect::<Vec<_>>());
}

/// Broadcasts beyond a port's burst are dropped and counted (`bcast_rate`); another port's
/// broadcasts still pass.
#[test]
fn broadcasts_beyond_the_rate_bound_drop() {
    let (fabric, [flooder, victim, peer]) = three_devices();
    let sent = 10 * GROUP_BURST as usize;
    let bc = udp([0xff; 6], FLOODER, 67, 342, 0);
    let t0 = Instant::now();
    for _ in 0..sent {
        fabric.forward(flooder, &[&bc]);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let st = |p: PortId| fabric.port_stats(p).unwrap();
    let dropped = st(flooder).drop_bcast_rate.load(Relaxed) as usize;
    let passed = sent - dropped;
    let allowed = GROUP_BURST as usize + (elapsed * f64::from(GROUP_RATE)).ceil() as usize;
    assert!(passed <= allowed, "{passed} passed, {allowed} allowed");
    assert!(passed >= GROUP_BURST as usize, "the burst passes: {passed}");
    assert_eq!(st(victim).out_frames.load(Relaxed) as usize, passed);
    fabric.forward(peer, &[&udp([0xff; 6], PEER, 67, 342, 1)]);
    assert_eq!(st(peer).drop_bcast_rate.load(Relaxed), 0);
    assert_eq!(st(victim).out_frames.load(Relaxed) as usize, passed + 1);
}
