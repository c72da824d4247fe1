//! Network trust of the packet intake (spec §14.6, §16): connected QPs accept only their peer's
//! addresses, the P_Key rules of IBTA 10.9 hold for every QP type, and UC accepts only PSNs within
//! its window. Frames are crafted with `wire::PacketBuilder` and fed to `transport::on_frame`.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use vrdma_backend::transport::{self, ctx::Cqe, responder::UC_PSN_WINDOW};
use vrdma_backend::wire::frame::udp_src_port;
use vrdma_backend::wire::{Addressing, Aeth, Bth, Deth, ExtHeaders, Opcode, PacketBuilder};
use vrdma_spec::*;

const T: Duration = Duration::from_secs(30);
/// The PSN b's QP expects first (`connect`: a's sq_psn = b's rq_psn = 1000).
const EPSN: u32 = 1000;
const FOREIGN: [u8; 4] = [10, 0, 0, 66];

/// A connected pair of `qp_type` (RC or UC) with 64 KiB MRs.
fn conn(qp_type: u32) -> RcPair {
    RcPair::new().qp_type(qp_type).build()
}

/// Frame crafting and B-side waiting for the pair under attack.
impl RcPair {
    /// a → b addressing as a's QP sends it, with the source IP replaced by `src_ip` if given.
    fn addr_ab(&self, src_ip: Option<[u8; 4]>) -> Addressing {
        Addressing::new(
            self.a.mac,
            self.b.mac,
            src_ip.map_or(self.a.gid, gid_v4),
            self.b.gid,
            udp_src_port(self.qa.qpn, self.qb.qpn),
        )
    }

    /// A genuine SEND of `len` bytes from a (posted and pumped until b completes it).
    fn genuine_send(&mut self, wr_id: u64, seed: u64, len: u32) -> Vec<u8> {
        let data = pattern(seed, len as usize);
        self.a.write(self.src, &data);
        self.post(&send(wr_id, (self.src, len, self.ka)));
        data
    }

    /// UC packets b dropped as outside its PSN window.
    fn b_out_of_window_drops(&self) -> u64 {
        self.b
            .dev
            .port_stats
            .drop_uc_out_of_window
            .load(Ordering::Relaxed)
    }

    fn wait_b(&mut self, n: usize) -> Vec<Cqe> {
        let mut got = Vec::new();
        let cqb = &mut self.cqb;
        pump_until(&mut self.a, &mut self.b, &mut self.link, T, |_, b| {
            got.extend(b.poll_cq(cqb));
            got.len() >= n
        });
        got
    }
}

fn frame(addr: Addressing, bth: Bth, ext: ExtHeaders, payload: &[u8]) -> Vec<u8> {
    let mut b = PacketBuilder::new(addr, bth);
    b.ext = ext;
    let mut f = Vec::new();
    b.build(&[payload], &mut f).expect("build");
    f
}

fn send_only(c: &RcPair, op: Opcode, psn: u32, pkey: u16, src_ip: Option<[u8; 4]>) -> Vec<u8> {
    let mut bth = Bth::new(op, c.qb.qpn, psn);
    bth.pkey = pkey;
    frame(c.addr_ab(src_ip), bth, ExtHeaders::default(), b"EVIL-EVIL")
}

#[test]
fn connected_qps_drop_packets_from_a_foreign_address() {
    for qp_type in [VRDMA_QPT_RC, VRDMA_QPT_UC] {
        let mut c = conn(qp_type);
        let op = if qp_type == VRDMA_QPT_RC {
            Opcode::RcSendOnly
        } else {
            Opcode::UcSendOnly
        };
        c.recv_b(1, 0, 4096);
        // A SEND with the expected PSN from an IP that is not the QP's peer.
        let f = send_only(&c, op, EPSN, 0xffff, Some(FOREIGN));
        transport::on_frame(&c.b.dev, &f);
        // From the peer's IP to another GID of b (index 1) than the QP's source GID (index 0).
        let g = VrdmaCmdGid {
            index: 1,
            type_: VRDMA_GID_TYPE_ROCE_V2,
            gid: gid_v4([10, 0, 0, 22]),
        };
        c.b.cmd(VRDMA_CMD_ADD_GID, g.as_bytes()).expect("add gid");
        let mut addr = c.addr_ab(None);
        addr.dst_gid = g.gid;
        let f = frame(
            addr,
            Bth::new(op, c.qb.qpn, EPSN),
            ExtHeaders::default(),
            b"EVIL-EVIL",
        );
        transport::on_frame(&c.b.dev, &f);
        assert!(
            c.b.dev.outbox(0).frames.is_empty(),
            "no ACK/NAK for foreign packets"
        );
        assert!(c.b.poll_cq(&mut c.cqb).is_empty(), "qpt {qp_type}: no CQE");
        assert_ne!(c.b.read(c.dst, 9), b"EVIL-EVIL", "qpt {qp_type}: no data");
        assert_eq!(
            c.b.dev.port_stats.drop_bad_address.load(Ordering::Relaxed),
            2
        );
        // The genuine peer, whose first PSN is the one the forged packets carried, still works.
        let data = c.genuine_send(7, 5, 300);
        let got = c.wait_b(1);
        assert_eq!((got[0].wr_id, got[0].status), (1, VRDMA_WC_SUCCESS));
        assert_eq!(got[0].byte_len, 300);
        assert_eq!(c.b.read(c.dst, 300), data);
        assert_eq!(c.b.qp_state(c.qb.qpn), VRDMA_QPS_RTS);
    }
}

#[test]
fn rc_requester_ignores_acks_from_a_foreign_address() {
    let mut c = conn(VRDMA_QPT_RC);
    c.recv_b(1, 0, 4096);
    let _ = c.genuine_send(7, 5, 300);
    assert_eq!(c.a.dev.outbox(0).frames.len(), 1, "the SEND is on its way");
    let held = std::mem::take(&mut c.a.dev.outbox(0).frames);
    // A forged ACK for that PSN from a foreign IP, b → a.
    let addr = Addressing::new(
        c.b.mac,
        c.a.mac,
        gid_v4(FOREIGN),
        c.a.gid,
        udp_src_port(c.qb.qpn, c.qa.qpn),
    );
    let ack = ExtHeaders {
        aeth: Some(Aeth::ack(1)),
        ..Default::default()
    };
    let f = frame(addr, Bth::new(Opcode::RcAck, c.qa.qpn, EPSN), ack, &[]);
    transport::on_frame(&c.a.dev, &f);
    assert!(
        c.a.poll_cq(&mut c.cqa).is_empty(),
        "a forged ACK completes nothing"
    );
    assert_eq!(
        c.a.dev.port_stats.drop_bad_address.load(Ordering::Relaxed),
        1
    );
    // The real SEND goes through and its real ACK completes the WQE.
    c.a.dev.outbox(0).frames = held;
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    let (cqa, cqb) = (&mut c.cqa, &mut c.cqb);
    pump_until(&mut c.a, &mut c.b, &mut c.link, T, |a, b| {
        ga.extend(a.poll_cq(cqa));
        gb.extend(b.poll_cq(cqb));
        !ga.is_empty() && !gb.is_empty()
    });
    assert_eq!((ga[0].wr_id, ga[0].status), (7, VRDMA_WC_SUCCESS));
    assert_eq!(gb[0].status, VRDMA_WC_SUCCESS);
}

#[test]
fn rc_pkey_rules() {
    let mut c = conn(VRDMA_QPT_RC);
    c.recv_b(1, 0, 4096);
    c.recv_b(2, 4096, 4096);
    // Another partition: dropped (no NAK, the PSN stays expected).
    let f = send_only(&c, Opcode::RcSendOnly, EPSN, 0x1234, None);
    transport::on_frame(&c.b.dev, &f);
    // The invalid P_Key and the limited member of the default partition with its membership bit
    // flipped into another key: dropped too.
    for pkey in [0x0000, 0x8000, 0xfffe] {
        let f = send_only(&c, Opcode::RcSendOnly, EPSN, pkey, None);
        transport::on_frame(&c.b.dev, &f);
    }
    assert!(c.b.dev.outbox(0).frames.is_empty());
    assert!(c.b.poll_cq(&mut c.cqb).is_empty());
    assert_eq!(c.b.dev.port_stats.drop_bad_pkey.load(Ordering::Relaxed), 4);
    // Limited member (0x7fff) to the QP's full-member P_Key (0xffff): accepted (IBTA 10.9). The
    // limited/limited case needs a limited P_Key in the port's table, which has only 0xffff: it
    // is covered by the unit test of `intake::pkey_match`.
    let f = send_only(&c, Opcode::RcSendOnly, EPSN, 0x7fff, None);
    transport::on_frame(&c.b.dev, &f);
    let got = c.b.poll_cq(&mut c.cqb);
    assert_eq!(got.len(), 1, "limited/full is accepted");
    assert_eq!((got[0].wr_id, got[0].byte_len), (1, 9));
    assert_eq!(c.b.read(c.dst, 9), b"EVIL-EVIL");
    assert_eq!(c.b.dev.port_stats.drop_bad_pkey.load(Ordering::Relaxed), 4);
}

#[test]
fn ud_and_gsi_pkey_rules() {
    let mut a = Node::new(1, 16, 1500);
    let mut b = Node::new(2, 16, 1500);
    let pdb = b.create_pd();
    let (cb, mut cqb) = b.create_cq(256);
    let buf = b.alloc(65536);
    let kb = b.reg_mr(pdb, buf, 65536, ACC_ALL);
    let spec = |qp_type| QpSpec::of_type(qp_type, pdb, cb);
    let mut ud = b.create_qp(spec(VRDMA_QPT_UD));
    let mut gsi = b.create_qp(spec(VRDMA_QPT_GSI));
    assert_eq!(gsi.qpn, VRDMA_GSI_QPN);
    ud_rts(&mut b, &ud, 0x1111);
    ud_rts(&mut b, &gsi, 0x8001_0000);
    for (i, q) in [&mut ud, &mut gsi].into_iter().enumerate() {
        let mut rq = q.rq.clone().unwrap();
        for k in 0..4 {
            b.post_recv(&mut rq, k, &[(buf + (i as u64 * 4 + k) * 4096, 4096, kb)]);
        }
        q.rq = Some(rq);
    }
    let addr = Addressing::new(a.mac, b.mac, a.gid, b.gid, udp_src_port(77, 1));
    let dg = |qpn: u32, qkey: u32, pkey: u16| {
        let mut bth = Bth::new(Opcode::UdSendOnly, qpn, 3);
        bth.pkey = pkey;
        let ext = ExtHeaders {
            deth: Some(Deth { qkey, src_qp: 77 }),
            ..Default::default()
        };
        frame(addr, bth, ext, b"datagram")
    };
    for (qpn, qkey) in [(ud.qpn, 0x1111), (VRDMA_GSI_QPN, 0x8001_0000)] {
        for pkey in [0x1234, 0x0000] {
            transport::on_frame(&b.dev, &dg(qpn, qkey, pkey));
        }
    }
    assert!(b.poll_cq(&mut cqb).is_empty(), "other partitions: dropped");
    assert_eq!(b.dev.port_stats.drop_bad_pkey.load(Ordering::Relaxed), 4);
    for (qpn, qkey) in [(ud.qpn, 0x1111), (VRDMA_GSI_QPN, 0x8001_0000)] {
        for pkey in [0xffff, 0x7fff] {
            transport::on_frame(&b.dev, &dg(qpn, qkey, pkey));
        }
    }
    let got = b.poll_cq(&mut cqb);
    assert_eq!(
        got.len(),
        4,
        "full and limited members of the default partition"
    );
    assert!(got.iter().all(|c| c.status == VRDMA_WC_SUCCESS));
    let _ = &mut a;
}

#[test]
fn uc_accepts_only_psns_within_its_window() {
    let mut c = conn(VRDMA_QPT_UC);
    c.recv_b(1, 0, 4096);
    c.recv_b(2, 4096, 4096);
    // From the genuine peer address, but far ahead: dropped, the expected PSN does not move.
    for d in [UC_PSN_WINDOW, UC_PSN_WINDOW + 1, 0x7f_ffff] {
        let f = send_only(&c, Opcode::UcSendOnly, (EPSN + d) & 0xff_ffff, 0xffff, None);
        transport::on_frame(&c.b.dev, &f);
    }
    assert!(c.b.poll_cq(&mut c.cqb).is_empty(), "out of window: dropped");
    assert_ne!(c.b.read(c.dst, 9), b"EVIL-EVIL");
    assert_eq!(c.b_out_of_window_drops(), 3);
    // The peer's next message (PSN 1000) is still the expected one.
    let data = c.genuine_send(7, 9, 200);
    let got = c.wait_b(1);
    assert_eq!((got[0].wr_id, got[0].byte_len), (1, 200));
    assert_eq!(c.b.read(c.dst, 200), data);
    // A gap inside the window is loss: the receiver resynchronises on a SEND ONLY there.
    let f = send_only(
        &c,
        Opcode::UcSendOnly,
        EPSN + UC_PSN_WINDOW - 1,
        0xffff,
        None,
    );
    transport::on_frame(&c.b.dev, &f);
    let got = c.b.poll_cq(&mut c.cqb);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].wr_id, got[0].byte_len), (2, 9));
    assert_eq!(c.b_out_of_window_drops(), 3);
    // A long message whose FIRST was lost: its MIDDLE packets (dropped) keep the expected PSN
    // moving, so the next message is accepted although it is more than a window past the last
    // accepted PSN.
    c.recv_b(3, 8192, 4096);
    let base = EPSN + UC_PSN_WINDOW;
    let mut psn = base;
    for _ in 0..3 {
        psn += UC_PSN_WINDOW / 2;
        let f = frame(
            c.addr_ab(None),
            Bth::new(Opcode::UcSendMiddle, c.qb.qpn, psn),
            ExtHeaders::default(),
            &[0x5a; 1024],
        );
        transport::on_frame(&c.b.dev, &f);
    }
    assert!(
        c.b.poll_cq(&mut c.cqb).is_empty(),
        "MIDDLEs complete nothing"
    );
    let f = send_only(&c, Opcode::UcSendOnly, psn + 1, 0xffff, None);
    transport::on_frame(&c.b.dev, &f);
    let got = c.b.poll_cq(&mut c.cqb);
    assert_eq!(got.len(), 1, "the next message is in the window again");
    assert_eq!((got[0].wr_id, got[0].byte_len), (3, 9));
    assert_eq!(c.b_out_of_window_drops(), 3);
}

/// QPNs and MR keys of `n` fresh objects on a fresh device.
fn first_ids(id: u8, n: usize) -> (Vec<u32>, Vec<u32>) {
    let mut d = Node::new(id, 16, 1500);
    let pd = d.create_pd();
    let (cq, _) = d.create_cq(64);
    let qpns = (0..n)
        .map(|_| {
            let mut s = QpSpec::rc(pd, cq);
            (s.sq_depth, s.rq_depth) = (4, 4);
            d.create_qp(s).qpn
        })
        .collect();
    let buf = d.alloc(4096);
    let keys = (0..n).map(|_| d.reg_mr(pd, buf, 4096, ACC_ALL)).collect();
    (qpns, keys)
}

#[test]
fn qpns_and_key_variants_are_unpredictable() {
    // Spec §16: two devices do not hand out the same QPNs / keys (a shared sequence would
    // coincide with probability ~2^-190 for 8 QPNs, 2^-64 for 8 key variants).
    let (qa, ka) = first_ids(1, 8);
    let (qb, kb) = first_ids(2, 8);
    assert_ne!(qa, qb, "first QPNs of two devices");
    assert_ne!(ka, kb, "first MR keys of two devices");
    for q in qa.iter().chain(&qb) {
        assert!((VRDMA_FIRST_QPN..0xff_ffff).contains(q), "qpn {q:#x}");
    }
    for qs in [&qa, &qb] {
        let mut u = qs.clone();
        u.sort_unstable();
        u.dedup();
        assert_eq!(u.len(), qs.len(), "QPNs unique among live QPs");
    }
    // Keys keep index << 8 | variant with indices 1, 2, ... (lkey == rkey, never 0).
    for ks in [&ka, &kb] {
        let idx: Vec<u32> = ks.iter().map(|k| k >> 8).collect();
        assert_eq!(idx, (1..=8).collect::<Vec<u32>>());
    }
    // Re-registration into the same slot changes the variant, 255 times in a row.
    let mut d = Node::new(3, 16, 1500);
    let pd = d.create_pd();
    let buf = d.alloc(4096);
    let mut seen = std::collections::HashSet::new();
    let mut key = d.reg_mr(pd, buf, 4096, ACC_ALL);
    for _ in 0..255 {
        assert!(seen.insert(key), "key {key:#x} came back");
        let h = VrdmaHandle {
            handle: key,
            reserved: 0,
        };
        d.cmd(VRDMA_CMD_DEREG_MR, h.as_bytes()).expect("dereg");
        let next = d.reg_mr(pd, buf, 4096, ACC_ALL);
        assert_eq!(next >> 8, key >> 8, "same slot");
        assert_ne!(next, key);
        key = next;
    }
}
