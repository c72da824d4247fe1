//! Optional figures: ICRC cost per frame size, and whole-frame build / parse (+ ICRC) per packet.

use std::hint::black_box;
use std::time::{Duration, Instant};

use vrdma_backend::wire::*;

use crate::util::{median, Table};

/// Per-call time of `f`: median over batches of about 20 µs each (short enough that most batches
/// are not preempted on this shared machine), for about `budget`.
fn per_call(budget: Duration, mut f: impl FnMut()) -> f64 {
    let t0 = Instant::now();
    for _ in 0..16 {
        f();
    }
    let one = t0.elapsed().as_secs_f64() / 16.0;
    let batch = ((20e-6 / one.max(1e-9)) as u32).clamp(1, 4096);
    let start = Instant::now();
    let mut v = Vec::new();
    while v.len() < 5 || start.elapsed() < budget {
        let t0 = Instant::now();
        for _ in 0..batch {
            f();
        }
        v.push(t0.elapsed().as_secs_f64() / batch as f64);
    }
    median(&mut v)
}

fn addressing() -> Addressing {
    Addressing::new(
        [2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 2],
        gid_from_ipv4([10, 0, 0, 1]),
        gid_from_ipv4([10, 0, 0, 2]),
        udp_src_port(17, 18),
    )
}

pub fn run(quick: bool) {
    let budget = Duration::from_millis(if quick { 30 } else { 120 });
    let mut t = Table::new(
        "Wire: per packet (RC RDMA WRITE ONLY over IPv4), median of ~20 µs batches",
        &[
            "payload",
            "frame bytes",
            "ICRC",
            "ICRC GB/s",
            "build frame (+ICRC)",
            "parse frame (+ICRC check)",
        ],
    );
    for len in [0usize, 64, 256, 1024, 4096, 8192] {
        let mut b = PacketBuilder::new(addressing(), Bth::new(Opcode::RcWriteOnly, 18, 1));
        b.ext.reth = Some(Reth {
            va: 0x1000,
            rkey: 0x100,
            dma_len: len as u32,
        });
        let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut frame = Vec::new();
        b.build(&[&payload], &mut frame).expect("build");
        assert!(RocePacket::parse(&frame).is_ok(), "round trip");
        // Ethernet 14 + IPv4 20 + UDP 8; the ICRC covers BTH .. pad.
        let (ip, udp, body) = (&frame[14..34], &frame[34..42], &frame[42..frame.len() - 4]);
        let icrc = per_call(budget, || {
            black_box(icrc::compute(black_box(ip), black_box(udp), black_box(body)).unwrap());
        });
        let mut out = Vec::with_capacity(frame.len());
        let build = per_call(budget, || {
            out.clear();
            black_box(&b)
                .build(&[black_box(&payload)], &mut out)
                .unwrap();
        });
        let parse = per_call(budget, || {
            black_box(RocePacket::parse(black_box(&frame)).unwrap());
        });
        let ns = |s: f64| format!("{:.0} ns", s * 1e9);
        t.row(vec![
            format!("{len} B"),
            frame.len().to_string(),
            ns(icrc),
            format!("{:.2}", (body.len() + 48) as f64 / icrc / 1e9),
            ns(build),
            ns(parse),
        ]);
    }
    t.print();
    learning(budget);
}

/// The fabric's MAC learning with a full table (issue 39 finding 9): a new source MAC per
/// call, so every call replaces an entry; and a refresh of a known MAC.
fn learning(budget: Duration) {
    use vrdma_backend::fabric::learning::{MacTable, MAX_LEARNED};
    let now = Instant::now();
    let mac = |i: u64| {
        let b = i.to_be_bytes();
        [0x02, b[3], b[4], b[5], b[6], b[7]]
    };
    let mut t = MacTable::new();
    for i in 0..MAX_LEARNED as u64 {
        t.learn(mac(i), 1, now);
    }
    let mut next = MAX_LEARNED as u64;
    let new = per_call(budget, || {
        t.learn(black_box(mac(next)), 1, now);
        next += 1;
    });
    let known = mac(next - 1);
    let refresh = per_call(budget, || t.learn(black_box(known), 2, now));
    println!(
        "fabric learning, table full ({MAX_LEARNED} MACs): {:.0} ns per new source MAC, {:.0} ns \
         per refresh",
        new * 1e9,
        refresh * 1e9
    );
}
