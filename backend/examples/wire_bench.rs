//! Wire-layer throughput: ICRC, frame build (with payload copy) and frame parse (with ICRC check).
//! Run: `cargo run --release --example wire_bench`.

use std::time::Instant;

use vrdma_backend::wire::*;

fn main() {
    let addr = Addressing::new(
        [2, 0, 0, 0, 0, 1],
        [2, 0, 0, 0, 0, 2],
        gid_from_ipv4([10, 0, 0, 1]),
        gid_from_ipv4([10, 0, 0, 2]),
        udp_src_port(17, 18),
    );
    let payload = vec![0x5au8; 4096];
    let mut frame = Vec::with_capacity(5000);

    let n = 200_000u32;
    let t = Instant::now();
    let mut x = 0u32;
    for _ in 0..n / 10 {
        x ^= icrc::crc32(&payload);
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "crc32 4 KiB:   {:7.2} GB/s ({x:#x})",
        f64::from(n / 10) * 4096.0 / s / 1e9
    );

    for len in [0usize, 256, 1024, 4096] {
        let op = if len == 0 {
            Opcode::RcAck
        } else {
            Opcode::RcWriteMiddle
        };
        let mut b = PacketBuilder::new(addr, Bth::new(op, 18, 0));
        if len == 0 {
            b.ext.aeth = Some(Aeth::ack(1));
        }
        let t = Instant::now();
        for i in 0..n {
            b.bth.psn = i & 0xff_ffff;
            b.build(&[&payload[..len]], &mut frame).unwrap();
        }
        let build = t.elapsed().as_secs_f64() / f64::from(n);
        let t = Instant::now();
        let mut sum = 0usize;
        for _ in 0..n {
            let p = RocePacket::parse(&frame).unwrap();
            sum += p.payload.len();
        }
        let parse = t.elapsed().as_secs_f64() / f64::from(n);
        println!(
            "{len:5}-byte payload: build {:6.0} ns ({:5.2} Mpps), parse+verify {:6.0} ns ({:5.2} Mpps) [{sum}]",
            build * 1e9,
            1e-6 / build,
            parse * 1e9,
            1e-6 / parse
        );
    }
}
