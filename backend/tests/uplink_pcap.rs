//! `--pcap`: two engine threads over the real UDP uplink on loopback, engine A's uplink behind a
//! `PcapTee`; an RC WRITE and a SEND with their ACKs must land in the capture file as whole,
//! well-formed pcap records in both directions. When `tshark` is installed (`make pcap-check`
//! installs it and sets VRDMA_REQUIRE_TSHARK=1 so it cannot silently skip), Wireshark's RoCEv2
//! dissector must read the same opcodes and report no malformed packet or expert warning.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::engine::*;
use common::*;
use vrdma_backend::transport::engine::Engine;
use vrdma_backend::uplink::pcap::{LINKTYPE_ETHERNET, PCAP_MAGIC_USEC, SNAPLEN};
use vrdma_backend::uplink::{PcapTee, PcapWriter};
use vrdma_spec::*;

/// BTH opcodes (IBTA table 38) the scenario produces.
const RC_SEND_ONLY: u8 = 0x04;
const RC_WRITE_ONLY: u8 = 0x0a;
const RC_ACK: u8 = 0x11;

struct Record {
    ts_sec: u32,
    ts_usec: u32,
    incl: u32,
    orig: u32,
    data: Vec<u8>,
}

fn read_pcap(path: &Path) -> Vec<Record> {
    let b = std::fs::read(path).expect("read pcap");
    assert!(b.len() >= 24, "no global header");
    let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(u32_at(0), PCAP_MAGIC_USEC, "magic (µs timestamps)");
    let u16_at = |o: usize| u16::from_ne_bytes([b[o], b[o + 1]]);
    assert_eq!((u16_at(4), u16_at(6)), (2, 4), "version 2.4");
    assert_eq!(u32_at(16), SNAPLEN);
    assert_eq!(u32_at(20), LINKTYPE_ETHERNET);
    let mut off = 24;
    let mut v = Vec::new();
    while off < b.len() {
        assert!(off + 16 <= b.len(), "partial record header at {off}");
        let incl = u32_at(off + 8);
        let rec = Record {
            ts_sec: u32_at(off),
            ts_usec: u32_at(off + 4),
            incl,
            orig: u32_at(off + 12),
            data: b[off + 16..off + 16 + incl as usize].to_vec(),
        };
        off += 16 + incl as usize;
        v.push(rec);
    }
    assert_eq!(off, b.len(), "trailing bytes");
    v
}

/// The BTH opcode of an IPv4 RoCEv2 frame (Ethernet 14 + IPv4 20 + UDP 8).
fn bth_opcode(f: &[u8]) -> Option<u8> {
    let is_v4 = f.get(12..14)? == [0x08, 0x00];
    let is_roce = f.get(36..38)? == 4791u16.to_be_bytes();
    (is_v4 && is_roce).then(|| f[42])
}

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vrdma-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Run an RC WRITE and a SEND from A to B with A's uplink captured into `path`.
fn capture_write_and_send(path: &Path) -> Arc<PcapWriter> {
    let mut p = RcPair::new().cq_depth(64).mrs(4096, 4096).build();
    p.a.write(p.src, &pattern(7, 256));
    let mut rq = p.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, 9, &[(p.dst + 1024, 1024, p.kb)]);

    let (ua, ub) = udp_pair();
    let pcap = PcapWriter::create(path, None).expect("create pcap");
    let da = detach(&mut p.a);
    let db = detach(&mut p.b);
    let ea = Engine::start(da, Arc::new(PcapTee::new(ua, pcap.clone()))).expect("engine a");
    let eb = Engine::start(db, Arc::new(ub)).expect("engine b");

    post_sq(
        &ea,
        &p.a.mem,
        &mut p.qa,
        &rdma(1, VRDMA_WR_RDMA_WRITE, (p.src, 256, p.ka), p.dst, p.kb),
    );
    let c = wait_cqes(&mut p.a, &mut p.cqa, 1, Duration::from_secs(20), "WRITE");
    assert_eq!((c[0].wr_id, c[0].status), (1, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(p.dst, 256), pattern(7, 256));

    post_sq(&ea, &p.a.mem, &mut p.qa, &send_inline(2, b"captured"));
    let c = wait_cqes(&mut p.b, &mut p.cqb, 1, Duration::from_secs(20), "SEND");
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].byte_len),
        (9, VRDMA_WC_SUCCESS, 8)
    );
    let c = wait_cqes(
        &mut p.a,
        &mut p.cqa,
        1,
        Duration::from_secs(20),
        "SEND completion",
    );
    assert_eq!((c[0].wr_id, c[0].status), (2, VRDMA_WC_SUCCESS));
    ea.stop();
    eb.stop();
    pcap.sync();
    pcap
}

#[test]
fn write_and_send_with_acks_are_captured() {
    let path = tmp("rc.pcap");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let pcap = capture_write_and_send(&path);
    let recs = read_pcap(&path);
    let ops: Vec<u8> = recs.iter().filter_map(|r| bth_opcode(&r.data)).collect();
    // A sent the WRITE and the SEND and received an ACK for each (ACKs are coalesced per
    // message with AckReq on the last packet, IBTA 9.7.5.1.1).
    assert_eq!(
        ops,
        vec![RC_WRITE_ONLY, RC_ACK, RC_SEND_ONLY, RC_ACK],
        "captured opcodes"
    );
    for r in &recs {
        assert_eq!(r.incl, r.orig, "frame truncated in the capture");
        assert_eq!(r.incl as usize, r.data.len());
        assert!(
            r.ts_sec as u64 >= before && r.ts_usec < 1_000_000,
            "timestamp"
        );
    }
    // The WRITE carries its 256 payload bytes: 14 + 20 + 8 + BTH 12 + RETH 16 + 256 + ICRC 4.
    assert_eq!(recs[0].data.len(), 14 + 20 + 8 + 12 + 16 + 256 + 4);
    assert_eq!(
        &recs[0].data[14 + 20 + 8 + 12 + 16..][..256],
        &pattern(7, 256)[..]
    );
    assert_eq!(pcap.stats().written, recs.len() as u64);
    assert_eq!(pcap.stats().dropped, 0);

    tshark_agrees(&path, &ops);
    pcap.close();
    let _ = std::fs::remove_file(&path);
}

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Wireshark's heuristic dissectors for protocols carried in InfiniBand payloads (names as in
/// Wireshark 4.0, Debian 12). Our SEND payload is arbitrary bytes, which e.g. the RPC-over-RDMA
/// heuristic claims and then reports as malformed; the check is about the RoCEv2 headers.
const PAYLOAD_HEURISTICS: &[&str] = &[
    "rpcrdma_infiniband",
    "smb_direct_infiniband",
    "smcr_infiniband",
    "iser_infiniband",
    "sdp_infiniband",
    "fc_infiniband",
    "eth_over_ib",
    "lnet_ib",
    "nvme_rdma",
];

/// Wireshark's dissector reads the same BTH opcodes and flags nothing.
fn tshark_agrees(path: &Path, ops: &[u8]) {
    if !tshark_available() {
        assert!(
            std::env::var_os("VRDMA_REQUIRE_TSHARK").is_none(),
            "VRDMA_REQUIRE_TSHARK is set but tshark is not installed"
        );
        eprintln!(
            "tshark not installed: skipping the dissector cross-check (make pcap-check runs it)"
        );
        return;
    }
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r"]).arg(path);
    for h in PAYLOAD_HEURISTICS {
        cmd.args(["--disable-heuristic", h]);
    }
    let out = cmd
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
        ])
        .output()
        .expect("run tshark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tshark failed: {stderr}");
    let mut got = Vec::new();
    for line in stdout.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        assert!(
            cols.get(1).is_none_or(|c| c.is_empty()),
            "tshark: malformed packet: {line}"
        );
        assert!(
            cols.get(2).is_none_or(|c| c.is_empty()),
            "tshark: expert info: {line}"
        );
        if let Some(op) = cols.first().filter(|c| !c.is_empty()) {
            got.push(op.parse::<u8>().unwrap_or_else(|_| panic!("opcode {op:?}")));
        }
    }
    assert_eq!(got, ops, "tshark's opcodes differ from the frames'");
}
