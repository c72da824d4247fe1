//! UD, GSI, SRQ and UC between two in-process devices (IBTA 9.8, 10.2, spec §6.2, §13).

mod common;

use std::time::Duration;

use common::*;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_backend::uplink::ImpairConfig;
use vrdma_spec::*;

const T: Duration = Duration::from_secs(30);

fn poll_until(
    a: &mut Node,
    b: &mut Node,
    link: &mut Link,
    cqa: &mut RingH,
    cqb: &mut RingH,
    na: usize,
    nb: usize,
) -> (Vec<Cqe>, Vec<Cqe>) {
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    pump_until(a, b, link, T, |a, b| {
        ga.extend(a.poll_cq(cqa));
        gb.extend(b.poll_cq(cqb));
        ga.len() >= na && gb.len() >= nb
    });
    (ga, gb)
}

struct Ud {
    a: Node,
    b: Node,
    qa: QpH,
    qb: QpH,
    cqa: RingH,
    cqb: RingH,
    pda: u32,
    ah: u32,
    src: u64,
    dst: u64,
    ka: u32,
    kb: u32,
}

/// [`ud_pair`] of two IPv4 nodes (16 MiB, MTU 1500).
fn ud_pair_v4(t: u32, qkey: u32) -> Ud {
    ud_pair(Node::new(1, 16, 1500), Node::new(2, 16, 1500), t, qkey)
}

fn ud_pair(a: Node, b: Node, t: u32, qkey: u32) -> Ud {
    let (mut a, mut b, pda, pdb) = Sides::of(a, b).parts();
    let spec = QpPairSpec::datagram(t, 256, qkey);
    let QpPair {
        qa, qb, cqa, cqb, ..
    } = QpPair::open(&mut a, &mut b, pda, pdb, spec);
    let av = a.av_to(&b);
    let ah = a.create_ah(pda, av);
    let MrPair { src, ka, dst, kb } = MrPair::new(&mut a, &mut b, pda, pdb, 8192);
    Ud {
        a,
        b,
        qa,
        qb,
        cqa,
        cqb,
        pda,
        ah,
        src,
        dst,
        ka,
        kb,
    }
}

fn ud_send(u: &mut Ud, wr_id: u64, len: u32, qkey: u32, ah: u32, imm: Option<u32>) {
    let mut q = u.qa.clone();
    let w = Wqe {
        wr_id,
        opcode: if imm.is_some() {
            VRDMA_WR_SEND_WITH_IMM
        } else {
            VRDMA_WR_SEND
        },
        flags: VRDMA_SEND_SIGNALED,
        ex: imm.unwrap_or(0),
        sges: vec![(u.src, len, u.ka)],
        ah,
        remote_qpn: u.qb.qpn,
        remote_qkey: qkey,
        ..Default::default()
    };
    u.a.post_send(&mut q, &w);
    u.qa = q;
}

fn ud_recv(u: &mut Ud, wr_id: u64) {
    let mut rq = u.qb.rq.clone().unwrap();
    let (dst, kb) = (u.dst, u.kb);
    u.b.post_recv(&mut rq, wr_id, &[(dst, 8192, kb)]);
    u.qb.rq = Some(rq);
}

#[test]
fn ud_ipv4_grh_and_cqe_fields() {
    let mut u = ud_pair_v4(VRDMA_QPT_UD, 0x1234);
    let mut link = Link::clean();
    let data = pattern(11, 1000);
    u.a.write(u.src, &data);
    ud_recv(&mut u, 5);
    let ah = u.ah;
    ud_send(&mut u, 1, 1000, 0x1234, ah, Some(0x0a0b_0c0d));
    let (ca, cb) = poll_until(&mut u.a, &mut u.b, &mut link, &mut u.cqa, &mut u.cqb, 1, 1);
    assert_eq!(
        (ca[0].wr_id, ca[0].status, ca[0].opcode),
        (1, VRDMA_WC_SUCCESS, VRDMA_WC_SEND)
    );
    let c = &cb[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (5, VRDMA_WC_SUCCESS, VRDMA_WC_RECV)
    );
    assert_eq!(c.byte_len, 1040);
    assert_eq!(c.src_qp, u.qa.qpn);
    assert_eq!(c.flags, VRDMA_WC_F_GRH | VRDMA_WC_F_IMM);
    assert_eq!(c.ex, 0x0a0b_0c0d);
    assert_eq!(c.network_hdr_type, VRDMA_NETWORK_IPV4);
    assert_eq!(c.smac, u.a.mac);
    assert_eq!(c.pkey_index, 0);
    assert_eq!(c.qpn, u.qb.qpn);
    let grh = u.b.read(u.dst, 40);
    assert_eq!(&grh[..20], &[0u8; 20], "bytes 0..19 are zero for IPv4");
    assert_eq!(grh[20] >> 4, 4, "IPv4 header in bytes 20..39");
    assert_eq!(&grh[32..36], &[10, 0, 0, 1], "source address");
    assert_eq!(&grh[36..40], &[10, 0, 0, 2], "destination address");
    assert!(u.b.read(u.dst + 40, 1000) == data, "UD payload");
}

#[test]
fn ud_ipv6_grh() {
    let a = Node::with_gid(1, 16, 1500, gid_v6(1));
    let b = Node::with_gid(2, 16, 1500, gid_v6(2));
    let mut u = ud_pair(a, b, VRDMA_QPT_UD, 7);
    let mut link = Link::clean();
    ud_recv(&mut u, 5);
    let ah = u.ah;
    ud_send(&mut u, 1, 64, 7, ah, None);
    let (_, cb) = poll_until(&mut u.a, &mut u.b, &mut link, &mut u.cqa, &mut u.cqb, 1, 1);
    assert_eq!(cb[0].status, VRDMA_WC_SUCCESS);
    assert_eq!(cb[0].network_hdr_type, VRDMA_NETWORK_IPV6);
    assert_eq!(cb[0].flags, VRDMA_WC_F_GRH);
    let grh = u.b.read(u.dst, 40);
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(&grh[8..24], &gid_v6(1));
    assert_eq!(&grh[24..40], &gid_v6(2));
}

#[test]
fn ud_qkey_mismatch_is_dropped_and_foreign_ah_fails_locally() {
    let mut u = ud_pair_v4(VRDMA_QPT_UD, 0x55);
    let mut link = Link::clean();
    ud_recv(&mut u, 5);
    let ah = u.ah;
    ud_send(&mut u, 1, 10, 0x66, ah, None); // wrong Q_Key: silently dropped at the receiver
                                            // An AH of another PD (spec §6.1): LOC_QP_OP_ERR, the UD QP stays in RTS.
    let pd2 = u.a.create_pd();
    let av = u.a.av_to(&u.b);
    let foreign = u.a.create_ah(pd2, av);
    ud_send(&mut u, 2, 10, 0x55, foreign, None);
    ud_send(&mut u, 3, 10, 0x55, ah, None);
    // High bit set: the QP's own Q_Key is used (IBTA 10.2.5).
    ud_recv(&mut u, 6);
    ud_send(&mut u, 4, 10, 0x8000_0000, ah, None);
    let (ca, cb) = poll_until(&mut u.a, &mut u.b, &mut link, &mut u.cqa, &mut u.cqb, 4, 2);
    let st: Vec<(u64, u8)> = ca.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        vec![
            (1, VRDMA_WC_SUCCESS),
            (2, VRDMA_WC_LOC_QP_OP_ERR),
            (3, VRDMA_WC_SUCCESS),
            (4, VRDMA_WC_SUCCESS)
        ]
    );
    // Receives 5 and 6 went to the two datagrams with the right Q_Key.
    assert_eq!(cb.len(), 2);
    assert!(cb
        .iter()
        .all(|c| c.status == VRDMA_WC_SUCCESS && c.byte_len == 50));
    assert_eq!(u.a.qp_state(u.qa.qpn), VRDMA_QPS_RTS);
    let _ = u.pda;
}

#[test]
fn gsi_uses_qp1_and_the_well_known_qkey() {
    let mut u = ud_pair_v4(VRDMA_QPT_GSI, 0);
    assert_eq!(u.qa.qpn, VRDMA_GSI_QPN);
    assert_eq!(u.qb.qpn, VRDMA_GSI_QPN);
    let mut link = Link::clean();
    let mad = pattern(3, 256);
    u.a.write(u.src, &mad);
    ud_recv(&mut u, 8);
    let ah = u.ah;
    // The WQE's Q_Key is irrelevant for QP1: 0x80010000 goes on the wire.
    ud_send(&mut u, 1, 256, 0, ah, None);
    let (ca, cb) = poll_until(&mut u.a, &mut u.b, &mut link, &mut u.cqa, &mut u.cqb, 1, 1);
    assert_eq!(ca[0].status, VRDMA_WC_SUCCESS);
    assert_eq!(
        (cb[0].wr_id, cb[0].status, cb[0].src_qp),
        (8, VRDMA_WC_SUCCESS, 1)
    );
    assert_eq!(cb[0].byte_len, 296);
    assert!(u.b.read(u.dst + 40, 256) == mad, "MAD payload");
    // What ib_init_ah_attr_from_wc needs to answer a CM REQ: GRH flag, network type, source
    // MAC, "untagged" (a VLAN ID makes ib_core look for a GID on that VLAN and drop the MAD),
    // and an IPv4 header in bytes 20..39 whose checksum verifies (ib_get_gids_from_rdma_hdr).
    let c = &cb[0];
    assert_eq!(c.flags, VRDMA_WC_F_GRH);
    assert_eq!(c.network_hdr_type, VRDMA_NETWORK_IPV4);
    assert_eq!(c.smac, u.a.mac);
    assert_eq!(
        c.vlan_id, 0xffff,
        "untagged frame: vlan_id 0xffff (spec §7)"
    );
    assert_eq!(
        ca[0].vlan_id, 0xffff,
        "send completion: vlan_id 0xffff (spec §7)"
    );
    let grh = u.b.read(u.dst, 40);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20], 0x45, "IPv4, IHL 5");
    let sum: u32 = grh[20..40]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let folded = (folded & 0xffff) + (folded >> 16);
    assert_eq!(folded, 0xffff, "IPv4 header checksum verifies");
}

#[test]
fn srq_shared_by_several_qps_with_limit_event() {
    let (mut a, mut b, pda, pdb) = Sides::new(32, 1500).parts();
    let (ca, mut cqa) = a.create_cq(256);
    let (cb, mut cqb) = b.create_cq(256);
    let (srqn, mut srq) = b.create_srq(pdb, 64, 4, 3);
    let dst = b.alloc(16 * 4096);
    let kb = b.reg_mr(pdb, dst, 16 * 4096, ACC_ALL);
    for i in 0..8u64 {
        b.post_recv(&mut srq, 100 + i, &[(dst + i * 4096, 4096, kb)]);
    }
    let src = a.alloc(4096);
    let ka = a.reg_mr(pda, src, 4096, ACC_ALL);
    let mut qas = Vec::new();
    let mut qbs = Vec::new();
    for _ in 0..3 {
        let qa = a.create_qp(QpSpec::rc(pda, ca));
        let qb = b.create_qp(QpSpec {
            srq: Some(srqn),
            ..QpSpec::rc(pdb, cb)
        });
        connect(&mut a, &qa, &mut b, &qb, RtsAttrs::mtu(3).timeout(12));
        qas.push(qa);
        qbs.push(qb);
    }
    let mut link = Link::clean();
    // 6 SENDs, two per QP.
    for k in 0..6u64 {
        let w = send(k, (src, 100 + k as u32, ka));
        let q = &mut qas[(k % 3) as usize];
        a.post_send(q, &w);
    }
    let (ga, gb) = poll_until(&mut a, &mut b, &mut link, &mut cqa, &mut cqb, 6, 6);
    assert!(ga.iter().all(|c| c.status == VRDMA_WC_SUCCESS));
    assert!(gb.iter().all(|c| c.status == VRDMA_WC_SUCCESS));
    let wr = sorted_wr_ids(&gb);
    assert_eq!(
        wr,
        (100..106).collect::<Vec<_>>(),
        "SRQ WQEs consumed in order"
    );
    let qpns: std::collections::BTreeSet<u32> = gb.iter().map(|c| c.qpn).collect();
    assert_eq!(qpns.len(), 3, "completions on all three QPs");
    // 2 left < limit 3 → SRQ_LIMIT_REACHED once.
    let ev = b.events();
    assert_eq!(
        ev.iter()
            .filter(|e| e.type_ == VRDMA_EV_SRQ_LIMIT_REACHED && e.id == srqn)
            .count(),
        1,
        "{ev:?}"
    );
    // A QP attached to an SRQ reports LAST_WQE_REACHED when it enters ERROR.
    let q0 = qbs[0].qpn;
    b.qp_to_err(q0);
    let ev = b.events();
    assert!(ev
        .iter()
        .any(|e| e.type_ == VRDMA_EV_QP_LAST_WQE_REACHED && e.id == q0));
}

#[test]
fn uc_write_send_and_silent_drop_of_a_damaged_message() {
    let (mut a, mut b, pda, pdb) = Sides::new(16, 1500).parts();
    let (ca, mut cqa) = a.create_cq(256);
    let (cb, mut cqb) = b.create_cq(256);
    let spec = |pd, cq| QpSpec::of_type(VRDMA_QPT_UC, pd, cq);
    let mut qa = a.create_qp(spec(pda, ca));
    let mut qb = b.create_qp(spec(pdb, cb));
    connect(
        &mut a,
        &qa,
        &mut b,
        &qb,
        RtsAttrs {
            mtu: 1,
            timeout: 0,
            retry: 0,
            rnr_retry: 0,
        },
    );
    let MrPair { src, ka, dst, kb } = MrPair::new(&mut a, &mut b, pda, pdb, 65536);
    let data = pattern(21, 65536);
    a.write(src, &data);
    let mut link = Link::clean();
    // WRITE of 3000 bytes (12 packets at MTU 256).
    let w = rdma(1, VRDMA_WR_RDMA_WRITE, (src, 3000, ka), dst, kb);
    a.post_send(&mut qa, &w);
    let (ga, _) = poll_until(&mut a, &mut b, &mut link, &mut cqa, &mut cqb, 1, 0);
    assert_eq!(ga[0].status, VRDMA_WC_SUCCESS);
    // UC completes when sent (no ACKs): let the packets arrive.
    pump_idle(&mut a, &mut b, &mut link);
    assert!(b.read(dst, 3000) == data[..3000], "UC WRITE data");
    // A SEND that loses its 3rd packet is dropped; the next SEND lands in the same receive WQE.
    let mut rq = qb.rq.clone().unwrap();
    b.post_recv(&mut rq, 50, &[(dst + 8192, 4096, kb)]);
    qb.rq = Some(rq);
    let mut n = 0;
    link.filter_ab = Some(Box::new(move |_| {
        n += 1;
        n != 3
    }));
    for (wr, len, off) in [(2u64, 1000u32, 0u64), (3, 700, 5000)] {
        let w = send(wr, (src + off, len, ka));
        a.post_send(&mut qa, &w);
    }
    let (ga, gb) = poll_until(&mut a, &mut b, &mut link, &mut cqa, &mut cqb, 2, 1);
    assert!(ga.iter().all(|c| c.status == VRDMA_WC_SUCCESS));
    assert_eq!(
        (gb[0].wr_id, gb[0].status, gb[0].byte_len),
        (50, VRDMA_WC_SUCCESS, 700)
    );
    assert!(b.read(dst + 8192, 700) == data[5000..5700], "UC SEND data");
    pump_idle(&mut a, &mut b, &mut link);
    assert!(
        b.poll_cq(&mut cqb).is_empty(),
        "the damaged message completed nothing"
    );
    assert_eq!(b.qp_state(qb.qpn), VRDMA_QPS_RTS);
    let _ = ImpairConfig::default();
}

#[test]
fn ud_oversized_datagram_is_dropped_without_consuming_the_receive() {
    let mut u = ud_pair_v4(VRDMA_QPT_UD, 9);
    let mut link = Link::clean();
    let mut rq = u.qb.rq.clone().unwrap();
    let (dst, kb) = (u.dst, u.kb);
    u.b.post_recv(&mut rq, 70, &[(dst, 100, kb)]); // room for GRH + 60 bytes
    u.qb.rq = Some(rq);
    let ah = u.ah;
    ud_send(&mut u, 1, 500, 9, ah, None); // too long: dropped (spec §14.6)
    ud_send(&mut u, 2, 50, 9, ah, None); // fits: takes receive 70
    let (ca, cb) = poll_until(&mut u.a, &mut u.b, &mut link, &mut u.cqa, &mut u.cqb, 2, 1);
    assert!(ca.iter().all(|c| c.status == VRDMA_WC_SUCCESS));
    assert_eq!(
        (cb[0].wr_id, cb[0].status, cb[0].byte_len),
        (70, VRDMA_WC_SUCCESS, 90)
    );
    pump_idle(&mut u.a, &mut u.b, &mut link);
    assert!(u.b.poll_cq(&mut u.cqb).is_empty());
}
