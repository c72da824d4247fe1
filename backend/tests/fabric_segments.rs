//! Fabric segments (spec §16.2 rule 6, ARCHITECTURE.md "Segments"): engines on one fabric send
//! the request packets of one QP, and the packets of multi-packet READ responses, as segments;
//! the results (data, CQEs, the PSN / opcode / length of every request or READ response packet
//! the peer sees) equal those of the same traffic as single frames, also with a packet lost
//! inside a segment, an RNR in the middle of one, a receive overflow at its last packet, a
//! capture (standard frames with a correct ICRC) and an uplink (standard frames). No bytes make
//! a segment: a guest's frames of any EtherType pass as frames.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::engine::wait_cqes;
use common::fabric_rc::{wait_both_cqes, Cqes, FabricRc};
use common::fabric_tap::{Seen, Tap};
use common::*;
use vrdma_backend::fabric::FabricBuilder;
use vrdma_backend::transport::engine::Engine;
use vrdma_backend::uplink::Uplink;
use vrdma_backend::wire::segment::{Segment, SegmentWriter};
use vrdma_backend::wire::{IcrcCheck, RocePacket};
use vrdma_spec::*;

/// A pair of nodes on one fabric, RC connected (path MTU 4096), engines running.
struct Pair {
    a: Node,
    b: Node,
    qa: QpH,
    cqa: RingH,
    cqb: RingH,
    rqb: RingH,
    ea: Engine,
    eb: Engine,
    /// b's device, as its engine runs it.
    db: Arc<vrdma_backend::handoff::HandoffLock<vrdma_backend::device::Device>>,
    src: u64,
    dst: u64,
    ka: u32,
    kb: u32,
    seen_a: Arc<Mutex<Seen>>,
    seen_b: Arc<Mutex<Seen>>,
}

const LEN: u64 = 1 << 20;

fn pair(segments: bool, drop_in_first: Option<usize>, capture: Option<&std::path::Path>) -> Pair {
    pair_of(VRDMA_QPT_RC, segments, drop_in_first, capture)
}

fn pair_of(
    qp_type: u32,
    segments: bool,
    drop_in_first: Option<usize>,
    capture: Option<&std::path::Path>,
) -> Pair {
    // timeout 14 (67 ms), retry 7, rnr_retry 7 (infinite).
    let FabricRc {
        mut a,
        mut b,
        qa,
        cqa,
        cqb,
        rqb,
        src,
        dst,
        ka,
        kb,
        fabric,
        pa,
        pb,
        ..
    } = FabricRc::new(qp_type, 5, 14, 256, LEN, capture);
    let port = |p| {
        let d = fabric.device_port(p).unwrap();
        if segments {
            d.with_segments()
        } else {
            d
        }
    };
    let seen_a = Arc::new(Mutex::new(Seen::default()));
    let seen_b = Arc::new(Mutex::new(Seen {
        drop_in_first,
        ..Seen::default()
    }));
    let ta = Tap {
        inner: port(pa),
        seen: seen_a.clone(),
    };
    let tb = Tap {
        inner: port(pb),
        seen: seen_b.clone(),
    };
    let ea = Engine::start(detach(&mut a), Arc::new(ta)).unwrap();
    let db = detach(&mut b);
    let eb = Engine::start(db.clone(), Arc::new(tb)).unwrap();
    Pair {
        a,
        b,
        qa,
        cqa,
        cqb,
        rqb,
        ea,
        eb,
        db,
        src,
        dst,
        ka,
        kb,
        seen_a,
        seen_b,
    }
}

impl Pair {
    fn post(&mut self, w: Wqe) {
        post_send_mem(&self.a.mem, &mut self.qa, &w);
    }
    fn ring(&self) {
        self.ea.sender().push(VrdmaDoorbell {
            type_: VRDMA_DB_SQ,
            id: self.qa.qpn,
        });
    }
    fn recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let (dst, kb) = (self.dst, self.kb);
        self.b
            .post_recv(&mut self.rqb, wr_id, &[(dst + off, len, kb)]);
    }
    fn write(&mut self, wr_id: u64, off: u64, len: u32) {
        let sge = (self.src + off, len, self.ka);
        self.post(rdma(
            wr_id,
            VRDMA_WR_RDMA_WRITE,
            sge,
            self.dst + off,
            self.kb,
        ));
    }
    fn send(&mut self, wr_id: u64, off: u64, len: u32) {
        self.post(send(wr_id, (self.src + off, len, self.ka)));
    }
    fn read(&mut self, wr_id: u64, off: u64, len: u32) {
        let sge = (self.src + off, len, self.ka);
        self.post(rdma(
            wr_id,
            VRDMA_WR_RDMA_READ,
            sge,
            self.dst + off,
            self.kb,
        ));
    }
    /// Wait until a has received an RNR NAK.
    fn wait_for_rnr_nak(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.seen_a.lock().unwrap().rnr_naks == 0 {
            assert!(
                Instant::now() < deadline,
                "no RNR NAK reached the requester"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    /// Wait for `n` send CQEs at a and `m` receive CQEs at b.
    fn wait(&mut self, n: usize, m: usize) -> Cqes {
        wait_both_cqes(&mut self.a, &mut self.cqa, &mut self.b, &mut self.cqb, n, m)
    }
    fn finish(self) -> Outcome {
        let data_b = self.b.read(self.dst, LEN as usize);
        let data_a = self.a.read(self.src, LEN as usize);
        let rx_b = self.db.read().qps.iter().fold((0, 0), |(p, b), q| {
            (p + q.stats.rx_packets, b + q.stats.rx_bytes)
        });
        self.ea.stop();
        self.eb.stop();
        let seen_b = std::mem::take(&mut *self.seen_b.lock().unwrap());
        let seen_a = std::mem::take(&mut *self.seen_a.lock().unwrap());
        Outcome {
            data_a,
            data_b,
            seen_a,
            seen_b,
            rx_b,
            cqes: Default::default(),
        }
    }
}

#[derive(Debug)]
struct Outcome {
    data_a: Vec<u8>,
    data_b: Vec<u8>,
    seen_a: Seen,
    seen_b: Seen,
    /// b's QPs' receive counters: packets, bytes.
    rx_b: (u64, u64),
    cqes: Cqes,
}

/// The request packets without AckReq (which follows the window, i.e. timing) and with the
/// first transmission of each PSN only.
fn check_same(seg: &Outcome, plain: &Outcome) {
    assert!(seg.seen_a.segments_out > 0, "segments were sent");
    assert!(seg.seen_b.segments_in > 0, "segments arrived");
    assert_eq!(
        plain.seen_a.segments_out, 0,
        "no segments without the offload"
    );
    assert_eq!(plain.seen_b.segments_in, 0);
    assert_eq!(seg.cqes, plain.cqes, "the same completions");
    assert!(seg.data_a == plain.data_a, "the same data at a");
    assert!(seg.data_b == plain.data_b, "the same data at b");
    assert_eq!(
        seg.seen_b.first_sends(),
        plain.seen_b.first_sends(),
        "the same request packets (opcode, PSN, length)"
    );
    // AckReq on the last packet of every message, either way (spec §15, IBTA 9.2.3).
    for o in [seg, plain] {
        for r in &o.seen_b.requests {
            let last = matches!(r.0, 0x04 | 0x05 | 0x02 | 0x03 | 0x08 | 0x09 | 0x0a | 0x0b);
            assert!(!last || r.3, "AckReq on a last/only packet {r:?}");
        }
    }
}

/// WRITEs, SENDs and a READ, posted at once.
fn mixed(segments: bool, drop_in_first: Option<usize>) -> Outcome {
    let mut p = pair(segments, drop_in_first, None);
    for i in 0..3 {
        p.recv(100 + i, 512 << 10 | i << 14, 16 << 10);
    }
    for i in 0..4 {
        p.write(i, i << 16, 64 << 10);
    }
    for i in 0..3 {
        p.send(10 + i, 256 << 10 | i << 14, 10 << 10);
    }
    p.read(20, 768 << 10, 64 << 10);
    p.ring();
    let cqes = p.wait(8, 3);
    let mut o = p.finish();
    o.cqes = cqes;
    o
}

#[test]
fn a_segment_stream_gives_what_single_frames_give() {
    let seg = mixed(true, None);
    let plain = mixed(false, None);
    check_same(&seg, &plain);
    assert!(seg.cqes.0.iter().all(|c| c.1 == VRDMA_WC_SUCCESS));
    // The data did move: the WRITE range at b is a's pattern, the READ range at a is b's.
    let pa = pattern(7, LEN as usize);
    let pb = pattern(8, LEN as usize);
    assert!(seg.data_b[..256 << 10] == pa[..256 << 10]);
    assert!(seg.data_a[768 << 10..832 << 10] == pb[768 << 10..832 << 10]);
    // Fewer buffers than packets: 4 x 16 WRITE packets went in far fewer segments.
    assert!(
        seg.seen_b.segments_in * 4 <= seg.seen_b.requests.len(),
        "{} segments for {} packets",
        seg.seen_b.segments_in,
        seg.seen_b.requests.len()
    );
}

/// The receiver counts every request packet a segment carries, as it counts single frames:
/// the frames after a segment's first run on the QP's responder state held across the buffer
/// (`transport::ReceiveRun`), and their counts are added when it is put back.
#[test]
fn a_segment_counts_every_packet_it_carries() {
    let seg = mixed(true, None);
    let plain = mixed(false, None);
    assert!(seg.seen_b.segments_in > 0, "segments arrived");
    assert_eq!(
        seg.rx_b.0,
        seg.seen_b.requests.len() as u64,
        "{:?}",
        seg.rx_b
    );
    assert_eq!(seg.rx_b, plain.rx_b);
}

/// UC (IBTA 9.8): WRITEs and SENDs, completed once handed to the wire.
fn uc(segments: bool) -> Outcome {
    let mut p = pair_of(VRDMA_QPT_UC, segments, None, None);
    for i in 0..3 {
        p.recv(100 + i, 512 << 10 | i << 14, 16 << 10);
    }
    for i in 0..4 {
        p.write(i, i << 16, 64 << 10);
    }
    for i in 0..3 {
        p.send(10 + i, 256 << 10 | i << 14, 10 << 10);
    }
    p.ring();
    let cqes = p.wait(7, 3);
    // The last SEND's CQE at b means every packet before it landed (one path, in order).
    let mut o = p.finish();
    o.cqes = cqes;
    o
}

#[test]
fn uc_over_segments_gives_what_single_frames_give() {
    let seg = uc(true);
    let plain = uc(false);
    check_same(&seg, &plain);
    assert!(seg.cqes.1.iter().all(|c| c.1 == VRDMA_WC_SUCCESS));
    assert!(seg.data_b[..256 << 10] == pattern(7, LEN as usize)[..256 << 10]);
}

#[test]
fn a_packet_lost_inside_a_segment_is_retransmitted_per_packet() {
    let seg = mixed(true, Some(3));
    let plain = mixed(false, None);
    assert_eq!(
        seg.seen_b.dropped, 1,
        "one packet was taken out of a segment"
    );
    // The responder saw a PSN twice: go-back-N resent from the lost packet (IBTA 9.7.5.1).
    assert!(
        seg.seen_b.first_sends().len() < seg.seen_b.requests.len(),
        "a retransmission"
    );
    assert_eq!(seg.cqes, plain.cqes);
    assert!(seg.data_a == plain.data_a && seg.data_b == plain.data_b);
}

/// Three 8 KiB SENDs (two packets each) in one doorbell with one receive posted: the second
/// message meets RNR in the middle of the segment; the receives posted later let it finish.
fn rnr(segments: bool) -> Outcome {
    let mut p = pair(segments, None, None);
    p.recv(100, 512 << 10, 8 << 10);
    for i in 0..3 {
        p.send(i, i << 13, 8 << 10);
    }
    p.ring();
    // Post the other receives only once the responder has refused the second message: on a
    // loaded host the engines may not run at all for tens of milliseconds, and a receive posted
    // before the second message arrives would leave no RNR to test.
    p.wait_for_rnr_nak();
    p.recv(101, (512 << 10) + (8 << 10), 8 << 10);
    p.recv(102, (512 << 10) + (16 << 10), 8 << 10);
    let cqes = p.wait(3, 3);
    let mut o = p.finish();
    o.cqes = cqes;
    o
}

#[test]
fn rnr_in_the_middle_of_a_segment() {
    let seg = rnr(true);
    let plain = rnr(false);
    assert!(seg.seen_a.segments_out > 0 && seg.seen_b.segments_in > 0);
    assert_eq!(seg.cqes, plain.cqes);
    assert!(seg.cqes.0.iter().all(|c| c.1 == VRDMA_WC_SUCCESS));
    assert!(seg.data_b == plain.data_b);
    assert!(seg.data_b[512 << 10..536 << 10] == pattern(7, LEN as usize)[..24 << 10]);
    // The RNR'd message was sent again.
    assert!(seg.seen_a.rnr_naks > 0 && plain.seen_a.rnr_naks > 0);
    assert!(seg.seen_b.first_sends().len() < seg.seen_b.requests.len());
}

/// A 64 KiB SEND into a 60 KiB receive: the 16th packet (the last of the segment) overflows.
fn overflow(segments: bool) -> Outcome {
    let mut p = pair(segments, None, None);
    p.recv(100, 512 << 10, 60 << 10);
    p.send(1, 0, 64 << 10);
    p.ring();
    let cqes = p.wait(1, 1);
    let mut o = p.finish();
    o.cqes = cqes;
    o
}

#[test]
fn a_receive_overflow_at_the_last_packet_of_a_segment() {
    let seg = overflow(true);
    let plain = overflow(false);
    assert!(seg.seen_a.segments_out > 0);
    assert_eq!(seg.cqes, plain.cqes);
    assert_eq!(seg.cqes.0[0].1, VRDMA_WC_REM_INV_REQ_ERR, "{:?}", seg.cqes);
    assert_eq!(seg.cqes.1[0].1, VRDMA_WC_LOC_LEN_ERR, "{:?}", seg.cqes);
    // The first 15 packets landed, in both runs alike.
    assert!(seg.data_b == plain.data_b);
    assert!(
        seg.data_b[512 << 10..(512 << 10) + (60 << 10)] == pattern(7, LEN as usize)[..60 << 10]
    );
}

#[test]
fn a_capture_sees_standard_frames_with_a_correct_icrc() {
    let path = std::env::temp_dir().join(format!("vrdma-seg-{}.pcap", std::process::id()));
    let mut p = pair(true, None, Some(&path));
    for i in 0..4 {
        p.write(i, i << 16, 64 << 10);
    }
    p.ring();
    let cqes = p.wait(4, 0);
    assert!(cqes.0.iter().all(|c| c.1 == VRDMA_WC_SUCCESS));
    let o = p.finish();
    assert!(o.seen_a.segments_out > 0, "the engine sent segments");
    assert_eq!(
        o.seen_b.segments_in, 0,
        "with a capture the fabric splits them"
    );
    let b = std::fs::read(&path).expect("pcap");
    let _ = std::fs::remove_file(&path);
    let mut off = 24;
    let (mut data, mut all) = (0, 0);
    while off + 16 <= b.len() {
        let incl = u32::from_ne_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        let f = &b[off + 16..off + 16 + incl];
        off += 16 + incl;
        // Every record is one standard frame (a segment would not parse as one).
        let pkt = RocePacket::parse_with(f, IcrcCheck::Verify).expect("a standard RoCEv2 frame");
        all += 1;
        if pkt.payload.len() == 4096 {
            data += 1;
        }
    }
    assert_eq!(off, b.len());
    assert!(data >= 64, "{data} full data packets of {all} frames");
    assert_eq!(o.data_b[..256 << 10], pattern(7, LEN as usize)[..256 << 10]);
}

#[test]
fn an_uplink_gets_standard_frames() {
    // a on the fabric (segments on), c behind the fabric's UDP uplink with a plain engine,
    // which verifies every ICRC and knows nothing of segments.
    let mut a = Node::new(1, 32, 9000);
    let mut c = Node::new(3, 32, 9000);
    let pda = a.create_pd();
    let pdc = c.create_pd();
    let (ca, mut cqa) = a.create_cq(256);
    let (cc, _) = c.create_cq(256);
    let mut qa = a.create_qp(QpSpec::rc(pda, ca));
    let qc = c.create_qp(QpSpec::rc(pdc, cc));
    connect(&mut a, &qa, &mut c, &qc, RtsAttrs::mtu(5));
    let MrPair {
        src,
        ka,
        dst,
        kb: kc,
    } = MrPair::new(&mut a, &mut c, pda, pdc, LEN);
    let data = pattern(9, LEN as usize);
    a.write(src, &data);
    let (ua, uc) = udp_pair();
    let mut fb = FabricBuilder::new();
    fb.add_uplink(Arc::new(ua));
    let pa = fb.add_device(a.mac).unwrap();
    let fabric = fb.build();
    let bridges = fabric.start_bridges().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let ta = Tap {
        inner: fabric.device_port(pa).unwrap().with_segments(),
        seen: seen.clone(),
    };
    let ea = Engine::start(detach(&mut a), Arc::new(ta)).unwrap();
    let ec = Engine::start(detach(&mut c), Arc::new(uc)).unwrap();
    for i in 0..16 {
        post_send_mem(
            &a.mem,
            &mut qa,
            &Wqe {
                wr_id: i,
                opcode: VRDMA_WR_RDMA_WRITE,
                flags: if i == 15 { VRDMA_SEND_SIGNALED } else { 0 },
                sges: vec![(src + (i << 16), 64 << 10, ka)],
                remote_addr: dst + (i << 16),
                rkey: kc,
                ..Default::default()
            },
        );
    }
    ea.sender().push(VrdmaDoorbell {
        type_: VRDMA_DB_SQ,
        id: qa.qpn,
    });
    let limit = Duration::from_secs(30);
    let got = wait_cqes(&mut a, &mut cqa, 1, limit, "WRITE over the uplink");
    assert_eq!(got[0].status, VRDMA_WC_SUCCESS);
    assert!(c.read(dst, LEN as usize) == data, "the data crossed intact");
    assert!(
        seen.lock().unwrap().segments_out > 0,
        "a's engine sent segments"
    );
    let up = fabric.port_stats(0).unwrap();
    assert!(up.out_frames.load(std::sync::atomic::Ordering::Relaxed) >= 256);
    drop(bridges);
    ea.stop();
    ec.stop();
}

/// READs of several packets (16, 16, 16, 16 and 4) and one of a single packet, posted at once;
/// `drop_in_first`: a's tap takes that frame out of the first response segment it receives.
fn reads(segments: bool, drop_in_first: Option<usize>) -> Outcome {
    let mut p = pair(segments, None, None);
    p.seen_a.lock().unwrap().drop_in_first = drop_in_first;
    for i in 0..4 {
        p.read(i, i << 16, 64 << 10);
    }
    p.read(4, 4 << 16, 1000);
    p.read(5, 5 << 16, 3 * 4096 + 5);
    p.ring();
    let cqes = p.wait(6, 0);
    let mut o = p.finish();
    o.cqes = cqes;
    o
}

/// The READ responses (opcodes 0x0d..=0x10) a requester received, first copy of each PSN.
fn first_read_responses(s: &Seen) -> Vec<(u8, u32, usize)> {
    let mut seen = std::collections::HashSet::new();
    s.responses
        .iter()
        .filter(|r| (0x0d..=0x10).contains(&r.0) && seen.insert(r.1))
        .copied()
        .collect()
}

/// Spec §16.2 rule 6 for the responder: the packets of multi-packet READ responses travel in
/// segments, and the requester sees what it sees with single frames (data, CQEs, the opcode /
/// PSN / length of every response packet).
#[test]
fn read_responses_in_segments_give_what_single_frames_give() {
    let seg = reads(true, None);
    let plain = reads(false, None);
    assert!(seg.seen_b.segments_out > 0, "the responder sent segments");
    assert!(seg.seen_a.segments_in > 0, "segments reached the requester");
    assert_eq!(plain.seen_b.segments_out + plain.seen_a.segments_in, 0);
    assert_eq!(seg.cqes, plain.cqes, "the same completions");
    assert!(seg.cqes.0.iter().all(|c| c.1 == VRDMA_WC_SUCCESS));
    assert!(seg.data_a == plain.data_a, "the same data at a");
    let pb = pattern(8, LEN as usize);
    assert!(
        seg.data_a[..256 << 10] == pb[..256 << 10],
        "b's data was read"
    );
    let (rs, rp) = (
        first_read_responses(&seg.seen_a),
        first_read_responses(&plain.seen_a),
    );
    assert_eq!(
        rs, rp,
        "the same READ response packets (opcode, PSN, length)"
    );
    assert_eq!(rs.len(), 4 * 16 + 1 + 4);
    // Fewer buffers than packets; the one-packet response (ONLY, 0x10) went alone.
    assert!(
        seg.seen_a.segments_in * 4 <= rs.len(),
        "{} segments for {} packets",
        seg.seen_a.segments_in,
        rs.len()
    );
    assert!(rs.iter().any(|r| r.0 == 0x10 && r.2 == 1000));
}

/// A READ response packet lost inside a segment: the requester asks again from the gap
/// (IBTA 9.7.5.1.4), the responder answers the duplicate READ, and the result is the same.
#[test]
fn a_read_response_lost_inside_a_segment() {
    let seg = reads(true, Some(3));
    let plain = reads(false, None);
    assert_eq!(seg.seen_a.dropped, 1, "one response packet was taken out");
    assert!(
        first_read_responses(&seg.seen_a).len()
            < seg
                .seen_a
                .responses
                .iter()
                .filter(|r| (0x0d..=0x10).contains(&r.0))
                .count(),
        "a response PSN arrived twice (resent)"
    );
    assert_eq!(seg.cqes, plain.cqes);
    assert!(seg.cqes.0.iter().all(|c| c.1 == VRDMA_WC_SUCCESS));
    assert!(seg.data_a == plain.data_a && seg.data_b == plain.data_b);
}

/// Spec §16.2 rule 6: a segment is marked out of band, so no EtherType is taken from the
/// guests. A frame of EtherType 0x88b5 laid out as the first segment format was (and a buffer
/// that is a valid segment today), sent by a guest's netdev or arriving from the network,
/// reaches the other device's netdev unchanged, as one frame.
#[test]
fn a_guest_may_send_any_ethertype() {
    let mut b = Node::new(2, 32, 9000);
    let a_mac = [0x52, 0x54, 0x00, 0x00, 0x00, 0x01];
    let remote = [0x52, 0x54, 0x00, 0x00, 0x00, 0x77];
    let (ua, uc) = udp_pair();
    let mut fb = FabricBuilder::new();
    fb.add_uplink(Arc::new(ua));
    let pa = fb.add_device(a_mac).unwrap();
    let pb = fb.add_device(b.mac).unwrap();
    let fabric = fb.build();
    let bridges = fabric.start_bridges().unwrap();
    let netdev_a = fabric.device_port(pa).unwrap().with_segments();
    let eb = Engine::start(
        detach(&mut b),
        Arc::new(fabric.device_port(pb).unwrap().with_segments()),
    )
    .unwrap();
    let frame = |dst: [u8; 6], src: [u8; 6], tag: u8| {
        let mut f = Vec::new();
        f.extend_from_slice(&dst);
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x08, 0x00, tag]);
        f.resize(64, tag);
        f
    };
    // The first format: [macs][0x88b5][count 2] then length-prefixed frames.
    let old_style = |src: [u8; 6]| {
        let mut s = Vec::new();
        s.extend_from_slice(&b.mac);
        s.extend_from_slice(&src);
        s.extend_from_slice(&[0x88, 0xb5, 0, 2]);
        for tag in [1, 2] {
            let f = frame(b.mac, src, tag);
            s.extend_from_slice(&(f.len() as u16).to_be_bytes());
            s.extend_from_slice(&f);
        }
        s
    };
    let new_style = |src: [u8; 6]| {
        let mut w = SegmentWriter::default();
        for tag in [3, 4] {
            let f = frame(b.mac, src, tag);
            let r = w.push_with(f.len(), |room: &mut [u8]| {
                room[..f.len()].copy_from_slice(&f);
                Ok::<usize, ()>(f.len())
            });
            assert!(r.unwrap().is_some());
        }
        let s = w.take().unwrap();
        assert_eq!(Segment::parse(&s).map(|s| s.count()), Some(2));
        s
    };
    let sent = vec![
        old_style(a_mac),
        new_style(a_mac),
        old_style(remote),
        new_style(remote),
    ];
    netdev_a.send(&sent[0]).unwrap();
    netdev_a.send_batch(&[&sent[1]]).unwrap();
    uc.send(&sent[2]).unwrap();
    uc.send(&sent[3]).unwrap();
    let t0 = Instant::now();
    loop {
        let got = b.out.frames.lock().unwrap().clone();
        if got.len() >= sent.len() || t0.elapsed() > Duration::from_secs(10) {
            let mut got = got;
            let mut want = sent.clone();
            got.sort();
            want.sort();
            assert_eq!(got, want, "each arrived once, unchanged, as one frame");
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(bridges);
    eb.stop();
}
