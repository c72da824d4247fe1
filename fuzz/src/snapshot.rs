//! Target `snapshot`: the device state stream a migration destination loads (spec §17.3,
//! `device::snapshot::restore`). The stream is untrusted: whatever it holds, the destination
//! must refuse it or come out a device that works.
//!
//! Input: a state stream as `snapshot::save` writes it. The harness fixes the body length and
//! the trailing CRC-32 (as a mutation of the bytes behind them would otherwise never get past
//! the checksum), takes the destination's MAC from the stream (the destination is the device
//! of the node whose last MAC byte the stream names), restores, and then:
//! - on success, the restored device must save again, that stream must restore into a second
//!   destination, and saving that one must give the same bytes (nothing lost or invented);
//!   then every QP's doorbells are rung and the transport's timers fired, so the restored
//!   transport state (fetched WQEs, PSNs, responder contexts) is run;
//! - on failure, the destination must be back at power-on state (no object left).
//!
//! A panic anywhere is a finding.

use std::time::{Duration, Instant};

use vrdma_backend::device::snapshot;
use vrdma_backend::transport;
use vrdma_spec::*;

use crate::common::Node;

/// Guest RAM of the destination, in MiB (as the bed's nodes).
pub const MEM_MIB: u64 = 8;

/// Recompute the body length and CRC-32 of a stream of at least 20 bytes.
pub fn reseal(s: &mut [u8]) {
    if s.len() < 20 {
        return;
    }
    let body = (s.len() - 20) as u32;
    s[12..16].copy_from_slice(&body.to_le_bytes());
    let n = s.len() - 4;
    let crc = crc32(&s[..n]);
    s[n..].copy_from_slice(&crc.to_le_bytes());
}

/// IEEE CRC-32 (the stream's checksum), bitwise: the fuzz crate keeps its dependencies few.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The destination for a stream: the node whose id is the stream's last MAC byte.
fn destination(stream: &[u8]) -> Node {
    let id = stream.get(21).copied().filter(|&b| b != 0).unwrap_or(1);
    Node::new(id, MEM_MIB, 1500)
}

pub fn run(data: &[u8]) {
    let mut stream = data.to_vec();
    reseal(&mut stream);
    let mut dst = destination(&stream);
    let r = snapshot::restore(&mut dst.dev, &stream);
    if crate::trace() {
        eprintln!("snapshot: {} bytes -> {r:?}", stream.len());
    }
    if r.is_err() {
        assert!(
            dst.dev.qps.is_empty() && dst.dev.pds().is_empty() && dst.dev.cqs().is_empty(),
            "a refused stream left objects behind"
        );
        return;
    }
    let again = snapshot::save(&dst.dev).expect("a restored device saves");
    let mut second = destination(&stream);
    snapshot::restore(&mut second.dev, &again).expect("its own stream restores");
    assert_eq!(
        snapshot::save(&second.dev).expect("saves again"),
        again,
        "save(restore(s)) changed the state"
    );
    // Run what was restored: every QP's doorbells, then the timers (retransmission from the
    // unacknowledged PSN, spec §17.3) in virtual time.
    let qpns: Vec<u32> = dst.dev.qps.iter().map(|q| q.qpn).collect();
    for qpn in qpns {
        dst.ring_doorbell(VRDMA_DB_SQ, qpn);
        dst.ring_doorbell(VRDMA_DB_RQ, qpn);
    }
    let mut now = Instant::now();
    for _ in 0..4 {
        dst.dev.outbox(0).frames.clear();
        match transport::on_tick(&dst.dev, now) {
            Some(next) => now = next.max(now + Duration::from_millis(1)),
            None => break,
        }
    }
}

/// Seeds: the streams of real devices (the bed's two nodes, idle and with transport state in
/// flight, and a node holding an SRQ and an AH besides), as `snapshot::save` writes them.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut add = |name: &str, dev: &vrdma_backend::device::Device| {
        if let Ok(s) = snapshot::save(dev) {
            out.push((name.to_string(), s));
        }
    };
    let bed = crate::bed::Bed::new();
    add("bed_a", &bed.a.dev);
    add("bed_b", &bed.b.dev);
    let (busy, _, _) = crate::packets::bed_with_traffic();
    add("in_flight_a", &busy.a.dev);
    add("in_flight_b", &busy.b.dev);
    let mut n = Node::new(1, MEM_MIB, 1500);
    let pd = n.create_pd();
    let (_srq, _) = n.create_srq(pd, 16, 2, 4);
    let peer = Node::new(2, MEM_MIB, 1500);
    let av = n.av_to(&peer);
    n.create_ah(pd, av);
    let buf = n.alloc(8192);
    n.reg_mr(
        pd,
        buf,
        8192,
        VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_READ,
    );
    add("srq_ah_mr", &n.dev);
    out
}
