//! Interoperability with Linux rxe: 189 frames captured on 2026-11-29 between two TCG guests
//! (QEMU 10.0.2, `-netdev dgram` through a recording relay) running Debian's 6.12.95 kernel rxe
//! with trixie's rdma-core 56.1 and perftest 25.01: ibv_{rc,uc,ud}_pingpong over IPv4 and IPv6
//! GIDs, ib_write_bw (plain, with immediate, UC), ib_read_bw, ib_atomic_bw (CMP_AND_SWAP,
//! FETCH_AND_ADD), ib_send_bw (RC, UD) and rping's CM MADs on QP1. Regenerate with `backend/tests/data/capture_rxe.py backend/tests/data/wire_rxe_frames.txt`
//! (needs the images/ kernel, initramfs and QEMU).
//!
//! Every frame must parse with a valid ICRC, and rebuilding it from the parsed fields with our
//! builder must reproduce rxe's bytes (IPv4 identification aside, which rxe fills per packet; the
//! IP checksum and ICRC are then recomputed with rxe's value to compare the rest). Facts seen:
//! IPv4 with DF, UDP checksum 0 for IPv4 and IPv6, TTL/hop limit 64, pad bytes 0.

use std::collections::BTreeMap;

use vrdma_backend::wire::*;

fn frames() -> Vec<(String, Vec<u8>)> {
    let text = include_str!("data/wire_rxe_frames.txt");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (dir, hex) = l.split_once(' ').expect("'<dir> <hex>' lines");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            (dir.to_owned(), bytes)
        })
        .collect()
}

#[test]
fn rxe_frames_parse_with_valid_icrc() {
    let fs = frames();
    assert!(fs.len() >= 150, "{} frames", fs.len());
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    let (mut v4, mut v6) = (0, 0);
    for (i, (_dir, f)) in fs.iter().enumerate() {
        let p = RocePacket::parse(f).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        *seen.entry(p.info.name).or_default() += 1;
        match p.ip_version {
            IpVersion::V4 => v4 += 1,
            IpVersion::V6 => v6 += 1,
        }
        // The port demux sends each of them to the engine of the receiving side.
        assert_eq!(
            vrdma_backend::port::classify(f, &[p.addr.dst_mac], &[p.addr.dst_gid], false),
            vrdma_backend::port::Destination::Engine
        );
    }
    eprintln!("rxe frames by opcode: {seen:?}; IPv4 {v4}, IPv6 {v6}");
    assert!(v4 > 0 && v6 > 0);
    for op in [
        "RC_SEND_FIRST",
        "RC_SEND_MIDDLE",
        "RC_SEND_LAST",
        "RC_SEND_ONLY",
        "RC_RDMA_WRITE_FIRST",
        "RC_RDMA_WRITE_MIDDLE",
        "RC_RDMA_WRITE_LAST",
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        "RC_RDMA_WRITE_ONLY",
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        "RC_RDMA_READ_REQUEST",
        "RC_RDMA_READ_RESPONSE_FIRST",
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        "RC_RDMA_READ_RESPONSE_LAST",
        "RC_RDMA_READ_RESPONSE_ONLY",
        "RC_ACKNOWLEDGE",
        "RC_ATOMIC_ACKNOWLEDGE",
        "RC_COMPARE_SWAP",
        "RC_FETCH_ADD",
        "UC_SEND_FIRST",
        "UC_SEND_MIDDLE",
        "UC_SEND_LAST",
        "UC_RDMA_WRITE_FIRST",
        "UC_RDMA_WRITE_MIDDLE",
        "UC_RDMA_WRITE_LAST",
        "UD_SEND_ONLY",
    ] {
        assert!(seen.contains_key(op), "no {op} in the capture");
    }
}

#[test]
fn rebuilding_rxe_frames_reproduces_their_bytes() {
    let mut out = Vec::new();
    for (i, (_dir, f)) in frames().iter().enumerate() {
        let p = RocePacket::parse(f).unwrap();
        let b = PacketBuilder {
            ext: p.ext,
            ..PacketBuilder::new(p.addr, p.bth)
        };
        b.build(&[p.payload], &mut out).unwrap();
        let l3 = if p.addr.vlan.is_some() { 18 } else { 14 };
        if p.ip_version == IpVersion::V4 {
            // rxe numbers its datagrams (IP ID); we send 0 (allowed with DF, RFC 6864). Take
            // rxe's ID, then re-seal the IP checksum and ICRC with our own code.
            out[l3 + 4..l3 + 6].copy_from_slice(&f[l3 + 4..l3 + 6]);
            let mut ip = Ipv4Header::parse(&out[l3..])
                .map(|(h, _)| h)
                .unwrap_or_else(|_| {
                    let (h, _) = Ipv4Header::parse(&f[l3..]).unwrap();
                    h
                });
            ip.id = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]);
            ip.write(&mut out[l3..]).unwrap();
            let n = out.len();
            let c = icrc::compute(
                &out[l3..l3 + 20],
                &out[l3 + 20..l3 + 28],
                &out[l3 + 28..n - 4],
            )
            .unwrap();
            out[n - 4..].copy_from_slice(&c.to_le_bytes());
        }
        assert_eq!(out.len(), f.len(), "frame {i} ({}): length", p.info.name);
        let diff: Vec<usize> = (0..f.len()).filter(|&k| out[k] != f[k]).collect();
        assert!(
            diff.is_empty(),
            "frame {i} ({}): bytes differ at {diff:?}",
            p.info.name
        );
    }
}
