//! Live migration of the device state (spec §17): a device with connected RC QPs is saved,
//! its guest memory copied, the state restored into a new device, and traffic with the peer
//! continues — including a message the peer sent while the device was moving, which the peer
//! retransmits. The destination treats the stream as untrusted: every truncation and every
//! mutated byte is a defined error or a consistent device, never a panic.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use vrdma_backend::device::snapshot::{self, SnapshotError};
use vrdma_backend::device::{Device, RecordingOutput};
use vrdma_backend::guest::GuestMem;
use vrdma_backend::transport;
use vrdma_backend::transport::ctx::Cqe;
use vrdma_spec::*;

const T: Duration = Duration::from_secs(60);
const MEM_MIB: u64 = 8;

struct Pair {
    a: Node,
    b: Node,
    qa: QpH,
    qb: QpH,
    cqa: RingH,
    cqb: RingH,
    src_a: u64,
    dst_a: u64,
    src_b: u64,
    dst_b: u64,
    ka: u32,
    kb: u32,
}

const LEN: u64 = 64 << 10;

fn pair() -> Pair {
    // Short timeout (14: 67 ms): the peer's retransmission recovers what the move dropped.
    let mut p = RcPair::new().mem_mib(MEM_MIB).no_mrs().build();
    let (src_a, dst_a) = (p.a.alloc(LEN), p.a.alloc(LEN));
    let (src_b, dst_b) = (p.b.alloc(LEN), p.b.alloc(LEN));
    let ka = p.a.reg_mr(p.pda, src_a, 2 * LEN, ACC_ALL);
    let kb = p.b.reg_mr(p.pdb, src_b, 2 * LEN, ACC_ALL);
    Pair {
        a: p.a,
        b: p.b,
        qa: p.qa,
        qb: p.qb,
        cqa: p.cqa,
        cqb: p.cqb,
        src_a,
        dst_a,
        src_b,
        dst_b,
        ka,
        kb,
    }
}

fn wait(p: &mut Pair, link: &mut Link, na: usize, nb: usize) -> (Vec<Cqe>, Vec<Cqe>) {
    let (mut ga, mut gb) = (Vec::new(), Vec::new());
    let (cqa, cqb) = (&mut p.cqa, &mut p.cqb);
    pump_until(&mut p.a, &mut p.b, link, T, |a, b| {
        ga.extend(a.poll_cq(cqa));
        gb.extend(b.poll_cq(cqb));
        ga.len() >= na && gb.len() >= nb
    });
    (ga, gb)
}

/// SEND a → b and RDMA WRITE b → a, both verified byte for byte.
fn exchange(p: &mut Pair, link: &mut Link, seed: u64) {
    let send = pattern(seed, 10_000);
    let write = pattern(seed + 1, 20_000);
    p.a.write(p.src_a, &send);
    p.b.write(p.src_b, &write);
    let mut rq = p.qb.rq.clone().unwrap();
    p.b.post_recv(&mut rq, seed, &[(p.dst_b, LEN as u32, p.kb)]);
    p.qb.rq = Some(rq);
    let mut qa = p.qa.clone();
    p.a.post_send(
        &mut qa,
        &common::send(seed, (p.src_a, send.len() as u32, p.ka)),
    );
    p.qa = qa;
    let mut qb = p.qb.clone();
    p.b.post_send(
        &mut qb,
        &rdma(
            seed + 1,
            VRDMA_WR_RDMA_WRITE,
            (p.src_b, write.len() as u32, p.kb),
            p.dst_a,
            p.ka,
        ),
    );
    p.qb = qb;
    // a: its SEND; b: the RECV and its WRITE.
    let (ca, cb) = wait(p, link, 1, 2);
    assert!(ca.iter().all(|c| c.status == VRDMA_WC_SUCCESS), "{ca:?}");
    assert!(cb.iter().all(|c| c.status == VRDMA_WC_SUCCESS), "{cb:?}");
    assert_eq!(p.b.read(p.dst_b, send.len()), send);
    assert_eq!(p.a.read(p.dst_a, write.len()), write);
}

/// Move node `n` to a new device: save, copy guest RAM (what QEMU migrates), restore.
fn migrate(n: &mut Node) -> Vec<u8> {
    let state = snapshot::save(&n.dev).expect("save");
    let mem = GuestMem::from_ranges(&[(BASE, (MEM_MIB << 20) as usize)]).unwrap();
    let mut ram = vec![0u8; (MEM_MIB << 20) as usize];
    n.mem.read(BASE, &mut ram).unwrap();
    mem.write(BASE, &ram).unwrap();
    let out = Arc::new(RecordingOutput::new());
    let mut dev = Device::new(n.dev.config.clone(), mem.clone(), out.clone());
    dev.flush_hook = Some(transport::flush);
    snapshot::restore(&mut dev, &state).expect("restore");
    // The source's memory is gone with the source: scribble over it so a test that still
    // touched it would notice.
    n.mem
        .write(BASE, &vec![0xa5; (MEM_MIB << 20) as usize])
        .unwrap();
    n.dev = dev;
    n.mem = mem;
    n.out = out;
    state
}

#[test]
fn rc_traffic_continues_after_a_round_trip() {
    let mut p = pair();
    let mut link = Link::clean();
    exchange(&mut p, &mut link, 10);
    exchange(&mut p, &mut link, 20);
    pump_idle(&mut p.a, &mut p.b, &mut link);
    let before = p.a.dev.qps.get(p.qa.qpn).map(|q| (q.req.psn, q.resp.epsn));

    // The peer sends while `a` moves: its packets are lost (the source is stopped, the
    // destination not there yet) and come again when its retransmission timer fires.
    let msg = pattern(7, 3000);
    p.b.write(p.src_b, &msg);
    let mut rq = p.qa.rq.clone().unwrap();
    p.a.post_recv(&mut rq, 99, &[(p.dst_a, LEN as u32, p.ka)]);
    p.qa.rq = Some(rq);
    let mut qb = p.qb.clone();
    p.b.post_send(&mut qb, &send(98, (p.src_b, msg.len() as u32, p.kb)));
    p.qb = qb;
    let lost = std::mem::take(&mut p.b.dev.outbox(0).frames);
    assert!(!lost.is_empty(), "the peer sent its SEND");

    let state = migrate(&mut p.a);
    let qp = p.a.dev.qps.get(p.qa.qpn).expect("QP restored with its QPN");
    assert_eq!(
        Some((qp.req.psn, qp.resp.epsn)),
        before,
        "PSNs carried over"
    );
    assert_eq!(qp.state.as_u32(), VRDMA_QPS_RTS);
    drop(qp);
    // Saving the restored device gives the same stream (nothing lost or invented).
    assert_eq!(snapshot::save(&p.a.dev).unwrap(), state);

    // The retransmitted SEND lands in the RQ WQE posted before the move.
    let (ca, cb) = wait(&mut p, &mut link, 1, 1);
    assert_eq!((ca[0].wr_id, ca[0].status), (99, VRDMA_WC_SUCCESS));
    assert_eq!(ca[0].byte_len, msg.len() as u32);
    assert_eq!((cb[0].wr_id, cb[0].status), (98, VRDMA_WC_SUCCESS));
    assert_eq!(p.a.read(p.dst_a, msg.len()), msg);
    let retrans = p.b.dev.qps.get(p.qb.qpn).unwrap().stats.retransmits;
    assert!(retrans > 0, "the peer retransmitted");

    // And both directions keep working, keys and MRs included.
    exchange(&mut p, &mut link, 30);
    exchange(&mut p, &mut link, 40);
}

/// Post an RDMA WRITE of `len` bytes from a's source buffer to b's destination buffer.
fn post_write_a(p: &mut Pair, wr_id: u64, len: usize) {
    let mut qa = p.qa.clone();
    p.a.post_send(
        &mut qa,
        &rdma(
            wr_id,
            VRDMA_WR_RDMA_WRITE,
            (p.src_a, len as u32, p.ka),
            p.dst_b,
            p.kb,
        ),
    );
    p.qa = qa;
}

/// A requester that used up its retries on the source (its peer unreachable for `retry_cnt`
/// timeouts in a row, the next one would fail the WQE) moves: the destination resends what was
/// in flight at once, and that resend is not a timeout (what the source had sent was lost with
/// its port, not by the network). With the peer reachable again the WRITE completes. Counted
/// as a timeout, the resend failed it with RETRY_EXC_ERR at the destination's first tick (a
/// migration under load: `migrate_during_pingpong_and_write_bw`, once).
#[test]
fn a_moved_requester_resends_without_spending_a_retry() {
    let mut p = pair();
    let mut link = Link::clean();
    exchange(&mut p, &mut link, 10);
    let data = pattern(21, 5000);
    p.a.write(p.src_a, &data);
    link.filter_ab = Some(Box::new(|_| false));
    post_write_a(&mut p, 61, data.len());
    let qpn = p.qa.qpn;
    pump_until(&mut p.a, &mut p.b, &mut link, T, |a, _| {
        a.dev.qps.get(qpn).is_some_and(|q| q.req.retry_left == 0)
    });
    assert!(
        p.a.poll_cq(&mut p.cqa).is_empty(),
        "not failed on the source"
    );

    migrate(&mut p.a);
    link.filter_ab = None;
    let (ca, _) = wait(&mut p, &mut link, 1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (61, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(p.dst_b, data.len()), data);
    let qp = p.a.dev.qps.get(qpn).unwrap();
    assert_eq!(
        qp.stats.timeouts, 0,
        "the resend on the destination is not a timeout"
    );
}

/// Both directions mid-message: `a`'s 40 KiB RDMA WRITE half sent, the peer's 30 KiB SEND
/// half received into `a`'s receive WQE, and the ACKs of both halves lost in the move.
fn in_flight(p: &mut Pair) {
    let wdata = pattern(11, 40_000);
    let sdata = pattern(12, 30_000);
    p.a.write(p.src_a, &wdata);
    p.b.write(p.src_b, &sdata);
    let mut rq = p.qa.rq.clone().unwrap();
    p.a.post_recv(&mut rq, 50, &[(p.dst_a, LEN as u32, p.ka)]);
    p.qa.rq = Some(rq);
    post_write_a(p, 51, wdata.len());
    let mut qb = p.qb.clone();
    p.b.post_send(&mut qb, &send(52, (p.src_b, sdata.len() as u32, p.kb)));
    p.qb = qb;
    let fa = std::mem::take(&mut p.a.dev.outbox(0).frames);
    let fb = std::mem::take(&mut p.b.dev.outbox(0).frames);
    assert!(
        fa.len() >= 8 && fb.len() >= 8,
        "{} / {} frames",
        fa.len(),
        fb.len()
    );
    for f in &fa[..fa.len() / 2] {
        transport::on_frame(&p.b.dev, f);
    }
    for f in &fb[..fb.len() / 2] {
        transport::on_frame(&p.a.dev, f);
    }
    p.a.dev.outbox(0).frames.clear();
    p.b.dev.outbox(0).frames.clear();
    let qp = p.a.dev.qps.get(p.qa.qpn).unwrap();
    assert!(!qp.req.wqes.is_empty(), "the WRITE is in flight");
    assert!(qp.resp.recv.is_some(), "the SEND is half received");
}

#[test]
fn transport_state_in_flight_moves_and_completes() {
    let mut p = pair();
    let mut link = Link::clean();
    exchange(&mut p, &mut link, 1);
    in_flight(&mut p);
    let state = migrate(&mut p.a);
    let qp = p.a.dev.qps.get(p.qa.qpn).unwrap();
    assert_eq!(qp.req.wqes.len(), 1, "the fetched WQE moved");
    assert!(qp.resp.recv.is_some(), "the receive in progress moved");
    drop(qp);
    assert_eq!(snapshot::save(&p.a.dev).unwrap(), state);
    // a: the WRITE's and the RECV's completions; b: the SEND's.
    let (ca, cb) = wait(&mut p, &mut link, 2, 1);
    let mut ids: Vec<(u64, u8)> = ca.iter().map(|c| (c.wr_id, c.status)).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        vec![(50, VRDMA_WC_SUCCESS), (51, VRDMA_WC_SUCCESS)],
        "{ca:?}"
    );
    assert_eq!((cb[0].wr_id, cb[0].status), (52, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(p.dst_b, 40_000), pattern(11, 40_000));
    assert_eq!(p.a.read(p.dst_a, 30_000), pattern(12, 30_000));
    let recv = ca.iter().find(|c| c.wr_id == 50).unwrap();
    assert_eq!(recv.byte_len, 30_000);
    exchange(&mut p, &mut link, 60);
}

#[test]
fn a_device_waiting_for_read_responses_refuses_to_save() {
    let mut p = pair();
    let mut link = Link::clean();
    exchange(&mut p, &mut link, 1);
    // b READs 128 KiB from a: a's responder paces the responses (`READ_BURST` packets at a
    // time), which do not migrate (spec §17.2).
    let mut qb = p.qb.clone();
    p.b.post_send(
        &mut qb,
        &rdma(
            5,
            VRDMA_WR_RDMA_READ,
            (p.src_b, 2 * LEN as u32, p.kb),
            p.src_a,
            p.ka,
        ),
    );
    p.qb = qb;
    for f in std::mem::take(&mut p.b.dev.outbox(0).frames) {
        transport::on_frame(&p.a.dev, &f);
    }
    let busy = !p.a.dev.qps.get(p.qa.qpn).unwrap().resp.replies.is_empty();
    if busy {
        assert!(matches!(
            snapshot::save(&p.a.dev),
            Err(SnapshotError::Busy(_))
        ));
    }
    let (_, cb) = wait(&mut p, &mut link, 0, 1);
    assert_eq!(cb[0].status, VRDMA_WC_SUCCESS);
    pump_idle(&mut p.a, &mut p.b, &mut link);
    assert!(snapshot::save(&p.a.dev).is_ok(), "idle again: saves");
    assert!(
        busy,
        "a 128 KiB READ keeps responses queued after one burst"
    );
}

/// A fresh destination device for `src`'s configuration.
fn destination(src: &Node) -> Device {
    let mem = GuestMem::from_ranges(&[(BASE, (MEM_MIB << 20) as usize)]).unwrap();
    Device::new(
        src.dev.config.clone(),
        mem,
        Arc::new(RecordingOutput::new()),
    )
}

/// Recompute the trailing CRC, so a mutation reaches the parser behind the checksum.
fn reseal_state(s: &mut [u8]) {
    let n = s.len() - 4;
    let crc = crc32fast::hash(&s[..n]);
    s[n..].copy_from_slice(&crc.to_le_bytes());
}

/// A saved device with every kind of object and transport state in flight.
fn saved_pair() -> (Pair, Vec<u8>) {
    let mut p = pair();
    let mut link = Link::clean();
    exchange(&mut p, &mut link, 3);
    in_flight(&mut p);
    let s = snapshot::save(&p.a.dev).unwrap();
    (p, s)
}

#[test]
fn every_truncation_is_an_error_and_leaves_a_power_on_device() {
    let (p, s) = saved_pair();
    let mut dev = destination(&p.a);
    for n in 0..s.len() {
        let r = snapshot::restore(&mut dev, &s[..n]);
        assert!(r.is_err(), "a {n}-byte prefix restored");
        assert!(dev.qps.is_empty() && dev.cqs().is_empty() && dev.mrs.write().is_empty());
    }
    // A truncated stream with a valid checksum fails in the parser, not at the CRC.
    let mut t = s[..s.len() - 8].to_vec();
    let body = (t.len() - 20) as u32;
    t[12..16].copy_from_slice(&body.to_le_bytes());
    reseal_state(&mut t);
    assert!(matches!(
        snapshot::restore(&mut dev, &t),
        Err(SnapshotError::Truncated(_))
    ));
    snapshot::restore(&mut dev, &s).expect("the whole stream restores");
    assert_eq!(dev.qps.len(), 1);
}

#[test]
fn every_mutated_byte_is_an_error_or_a_consistent_device() {
    let (p, s) = saved_pair();
    let mut dev = destination(&p.a);
    // Without resealing, the checksum catches every change.
    let mut m = s.clone();
    m[40] ^= 1;
    assert_eq!(
        snapshot::restore(&mut dev, &m),
        Err(SnapshotError::Checksum)
    );
    let mut restored = 0;
    for i in 0..s.len() - 4 {
        for v in [0x00u8, 0xff, s[i].wrapping_add(1), 0x80] {
            let mut m = s.clone();
            m[i] = v;
            reseal_state(&mut m);
            match snapshot::restore(&mut dev, &m) {
                Ok(()) => {
                    restored += 1;
                    // Whatever was accepted is a device that saves again and whose QPs only
                    // reference objects that exist.
                    let again = snapshot::save(&dev).expect("a restored device saves");
                    let mut dev2 = destination(&p.a);
                    snapshot::restore(&mut dev2, &again).expect("and restores");
                    for qp in dev.qps.iter() {
                        assert!(dev.pds().contains(qp.pd));
                        assert!(dev.cqs().contains(qp.send_cqn) && dev.cqs().contains(qp.recv_cqn));
                    }
                }
                Err(_) => assert!(dev.qps.is_empty() && dev.pds().is_empty()),
            }
        }
    }
    // Some bytes are free (PSNs, keys' data, ring indices): the test did reach the end.
    assert!(restored > 0);
}

#[test]
fn header_and_configuration_errors_are_named() {
    let (p, s) = saved_pair();
    let mut dev = destination(&p.a);
    let mut m = s.clone();
    m[0] = b'X';
    assert_eq!(
        snapshot::restore(&mut dev, &m),
        Err(SnapshotError::BadMagic)
    );
    let mut m = s.clone();
    m[8..12].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(
        snapshot::restore(&mut dev, &m),
        Err(SnapshotError::Version(2))
    );
    let mut m = s.clone();
    m.push(0);
    assert!(snapshot::restore(&mut dev, &m).is_err());
    // A destination with another MAC is another port: refused.
    let mut cfg = p.a.dev.config.clone();
    cfg.mac[5] ^= 0x40;
    let mem = GuestMem::from_ranges(&[(BASE, (MEM_MIB << 20) as usize)]).unwrap();
    let mut other = Device::new(cfg, mem, Arc::new(RecordingOutput::new()));
    assert_eq!(
        snapshot::restore(&mut other, &s),
        Err(SnapshotError::ConfigMismatch("MAC address"))
    );
    // A count that claims more entries than bytes remain is refused before any allocation.
    let mut m = s.clone();
    let gid_count = 16 + 6 + 2 + 40 + 2 + 2;
    m[gid_count..gid_count + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal_state(&mut m);
    assert!(matches!(
        snapshot::restore(&mut dev, &m),
        Err(SnapshotError::Truncated(_))
    ));
}

#[test]
fn counts_beyond_the_destinations_limits_are_refused_before_reading_the_objects() {
    let mut n = Node::with_config(1, MEM_MIB, 1500, gid_v4([10, 0, 0, 1]), |c| c.max_pd = 2);
    n.create_pd();
    let s = snapshot::save(&n.dev).unwrap();
    // header 16, config 50, GID section: tag 2, count 4, one 24-byte entry; then PDs.
    let pd_count = 16 + 50 + 6 + 24 + 2;
    assert_eq!(
        &s[pd_count - 2..pd_count],
        &2u16.to_le_bytes(),
        "the PD section tag"
    );
    assert_eq!(&s[pd_count..pd_count + 4], &1u32.to_le_bytes());
    let mut m = s.clone();
    m[pd_count..pd_count + 4].copy_from_slice(&3u32.to_le_bytes());
    reseal_state(&mut m);
    let mut dev = Device::new(
        n.dev.config.clone(),
        n.mem.clone(),
        Arc::new(RecordingOutput::new()),
    );
    assert_eq!(
        snapshot::restore(&mut dev, &m),
        Err(SnapshotError::Invalid {
            what: "object count",
            value: 3
        })
    );
    snapshot::restore(&mut dev, &s).expect("the original restores");
    assert_eq!(dev.pds().len(), 1);
}

/// Spec §17.2: an ODP MR moves without its resident chunks; the first access on the
/// destination faults again, the driver answers, and the peer's WRITE lands.
#[test]
fn odp_chunks_are_dropped_and_fault_again_on_the_destination() {
    let mut p = RcPair::new()
        .nodes(Node::new_odp(1, MEM_MIB), Node::new(2, MEM_MIB, 1500))
        .cq_depth(64)
        .no_mrs()
        .build();
    let dst = p.a.alloc(LEN);
    let ka = p.a.reg_odp_mr(p.pda, dst, LEN, ACC_ALL);
    let src = p.b.alloc(LEN);
    let kb = p.b.reg_mr(p.pdb, src, LEN, ACC_ALL);
    let mut link = Link::clean();
    let mut write = |a: &mut Node, b: &mut Node, qb: &mut QpH, cqb: &mut RingH, seed: u64| {
        let data = pattern(seed, 8192);
        b.write(src, &data);
        b.post_send(
            qb,
            &rdma(seed, VRDMA_WR_RDMA_WRITE, (src, 8192, kb), dst, ka),
        );
        let mut got = Vec::new();
        let mut faults = 0;
        pump_until(a, b, &mut link, T, |a, b| {
            faults += a.answer_page_requests();
            got.extend(b.poll_cq(cqb));
            !got.is_empty()
        });
        assert_eq!(got[0].status, VRDMA_WC_SUCCESS);
        assert_eq!(a.read(dst, 8192), data);
        faults
    };
    assert!(
        write(&mut p.a, &mut p.b, &mut p.qb, &mut p.cqb, 1) > 0,
        "the first access faults"
    );
    assert!(p.a.dev.mrs.write().odp_resident_total() > 0);
    assert_eq!(
        write(&mut p.a, &mut p.b, &mut p.qb, &mut p.cqb, 2),
        0,
        "resident: no fault"
    );
    migrate(&mut p.a);
    assert_eq!(
        p.a.dev.mrs.write().odp_resident_total(),
        0,
        "no chunk moved"
    );
    assert!(
        write(&mut p.a, &mut p.b, &mut p.qb, &mut p.cqb, 3) > 0,
        "the destination faults again"
    );
    let _ = p.a.poll_cq(&mut p.cqa);
}

/// XRC objects are not in the state format (spec §17.2): a device with an XRC domain refuses to
/// save, and saves again once the domain is gone.
#[test]
fn a_device_with_an_xrc_domain_refuses_to_save() {
    let mut p = pair();
    let r = p.a.cmd(VRDMA_CMD_ALLOC_XRCD, &[]).expect("xrcd");
    let x = VrdmaHandle::read_from(&r).unwrap();
    assert!(matches!(
        snapshot::save(&p.a.dev),
        Err(SnapshotError::Busy(_))
    ));
    p.a.cmd(VRDMA_CMD_DEALLOC_XRCD, x.as_bytes())
        .expect("dealloc");
    assert!(snapshot::save(&p.a.dev).is_ok(), "no XRC domain: saves");
}

/// Spec §16.5 / §17.2: a fast-registration MR is restored only with a capacity the destination
/// could have allocated (at most its `max_fast_reg_page_list_len`): a larger one would let a
/// later FAST_REG WQE post a page list beyond the device's limit.
#[test]
fn fast_reg_mr_beyond_the_page_list_limit_is_refused() {
    let mut n = Node::new(1, MEM_MIB, 1500);
    let pd = n.create_pd();
    let limit = n.dev.config.max_fast_reg_page_list_len;
    let frmr = VrdmaCmdRegMr {
        pdn: pd,
        npages: limit - 1,
        ..Default::default()
    };
    n.cmd(VRDMA_CMD_ALLOC_FAST_REG_MR, frmr.as_bytes())
        .expect("ALLOC_FAST_REG_MR");
    let s = snapshot::save(&n.dev).unwrap();
    // The MR's saved capacity: max_pages, page_shift 12, not valid, no pages.
    let mut saved = (limit - 1).to_le_bytes().to_vec();
    saved.extend_from_slice(&12u32.to_le_bytes());
    saved.push(0);
    saved.extend_from_slice(&0u32.to_le_bytes());
    let at = s
        .windows(saved.len())
        .position(|w| w == saved)
        .expect("the fast-reg MR in the stream");
    let restore = |max_pages: u32| {
        let mut m = s.clone();
        m[at..at + 4].copy_from_slice(&max_pages.to_le_bytes());
        reseal_state(&mut m);
        let mut dev = Device::new(
            n.dev.config.clone(),
            n.mem.clone(),
            Arc::new(RecordingOutput::new()),
        );
        let r = snapshot::restore(&mut dev, &m);
        if r.is_err() {
            assert!(dev.mrs.write().is_empty() && dev.pds().is_empty());
        }
        r
    };
    assert_eq!(restore(limit), Ok(()), "the device's own limit restores");
    for too_many in [limit + 1, u32::MAX] {
        assert_eq!(
            restore(too_many),
            Err(SnapshotError::Invalid {
                what: "fast-reg MR max_pages",
                value: u64::from(too_many)
            })
        );
    }
}
