//! Error paths of the RC transport (IBTA ch. 9/10, spec §6, §13, §14).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use vrdma_spec::*;

const T: Duration = Duration::from_secs(30);

/// An RC pair with a 4 ms ACK timeout and these retry counts.
fn pair(retry: u8, rnr_retry: u8) -> RcPair {
    RcPair::new()
        .timeout(10)
        .retry(retry)
        .rnr_retry(rnr_retry)
        .build()
}

fn write(p: &RcPair, wr_id: u64, rkey: u32, flags: u8) -> Wqe {
    Wqe {
        wr_id,
        opcode: VRDMA_WR_RDMA_WRITE,
        flags,
        sges: vec![(p.src, 100, p.ka)],
        remote_addr: p.dst,
        rkey,
        ..Default::default()
    }
}

/// A's WQE 1 completes with `status` and its WQE 2 behind it with WR_FLUSH_ERR; A's QP is in
/// ERROR.
fn first_fails_and_flushes_the_second(p: &mut RcPair, status: u8) {
    let (ca, _) = p.wait(2, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (1, status));
    assert_eq!((ca[1].wr_id, ca[1].status), (2, VRDMA_WC_WR_FLUSH_ERR));
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_ERR);
}

#[test]
fn bad_lkey_is_loc_prot_err_and_flushes_the_rest() {
    let mut p = pair(7, 7);
    let mut w = write(&p, 1, p.kb, VRDMA_SEND_SIGNALED);
    w.sges = vec![(p.src, 100, p.ka ^ 0x100)]; // another index: no such MR
    p.post(&w);
    let w2 = write(&p, 2, p.kb, 0);
    p.post(&w2);
    first_fails_and_flushes_the_second(&mut p, VRDMA_WC_LOC_PROT_ERR);
    // Nothing reached the peer.
    assert_eq!(p.link.frames_ab, 0);
    // A WQE posted in ERROR is flushed too.
    let w3 = write(&p, 3, p.kb, VRDMA_SEND_SIGNALED);
    p.post(&w3);
    let (ca, _) = p.wait(1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (3, VRDMA_WC_WR_FLUSH_ERR));
}

#[test]
fn bad_rkey_on_write_is_access_error_on_both_sides() {
    let mut p = pair(7, 7);
    p.recv_b(70, 0, 100);
    let w = write(&p, 1, p.kb + 1, VRDMA_SEND_SIGNALED); // wrong variant
    p.post(&w);
    let (ca, cb) = p.wait(1, 1);
    assert_eq!((ca[0].wr_id, ca[0].status), (1, VRDMA_WC_REM_ACCESS_ERR));
    assert_eq!(p.a.qp_state(p.qa.qpn), VRDMA_QPS_ERR);
    // Responder (C9-222.1.1): QP to ERROR, QP_ACCESS_ERR event, posted receive flushed.
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_ERR);
    let ev = p.b.events();
    assert!(
        ev.iter()
            .any(|e| e.type_ == VRDMA_EV_QP_ACCESS_ERR && e.id == p.qb.qpn),
        "events {ev:?}"
    );
    assert_eq!((cb[0].wr_id, cb[0].status), (70, VRDMA_WC_WR_FLUSH_ERR));
}

#[test]
fn bad_rkey_on_write_with_imm_completes_the_receive() {
    let mut p = pair(7, 7);
    p.recv_b(71, 0, 100);
    let mut w = write(&p, 1, 0x00ab_cd01, VRDMA_SEND_SIGNALED);
    w.opcode = VRDMA_WR_RDMA_WRITE_WITH_IMM;
    w.ex = 5;
    p.post(&w);
    let (ca, cb) = p.wait(1, 1);
    assert_eq!((ca[0].wr_id, ca[0].status), (1, VRDMA_WC_REM_ACCESS_ERR));
    assert_eq!((cb[0].wr_id, cb[0].status), (71, VRDMA_WC_LOC_ACCESS_ERR));
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_ERR);
    let ev = p.b.events();
    assert!(
        !ev.iter().any(|e| e.type_ == VRDMA_EV_QP_ACCESS_ERR),
        "no async event for WRITE_WITH_IMM: {ev:?}"
    );
}

#[test]
fn rnr_recovers_when_a_receive_is_posted() {
    let mut p = pair(7, 3);
    let data = pattern(5, 300);
    p.a.write(p.src, &data);
    let w = send(1, (p.src, 300, p.ka));
    p.post(&w);
    // Deliver until the first RNR NAK went back, then post the receive.
    let qpn = p.qa.qpn;
    pump_until(&mut p.a, &mut p.b, &mut p.link, T, |a, _| {
        // The requester got the RNR NAK once it is backing off.
        a.dev
            .qps
            .get(qpn)
            .is_some_and(|q| q.req.rnr_deadline.is_some())
    });
    p.recv_b(9, 0, 1000);
    let (ca, cb) = p.wait(1, 1);
    assert_eq!((ca[0].wr_id, ca[0].status), (1, VRDMA_WC_SUCCESS));
    assert_eq!(
        (cb[0].wr_id, cb[0].status, cb[0].byte_len),
        (9, VRDMA_WC_SUCCESS, 300)
    );
    assert_eq!(p.b.read(p.dst, 300), data);
}

#[test]
fn rnr_retry_exceeded() {
    let mut p = pair(7, 2);
    let sends = Arc::new(AtomicUsize::new(0));
    let s2 = sends.clone();
    p.link.filter_ab = Some(Box::new(move |f| {
        // Untagged IPv4: the BTH opcode is at 14 + 20 + 8.
        if f.get(42) == Some(&0x04) {
            s2.fetch_add(1, Ordering::Relaxed);
        }
        true
    }));
    let w = send(1, (p.src, 10, p.ka));
    p.post(&w);
    let w = write(&p, 2, p.kb, 0);
    p.post(&w);
    first_fails_and_flushes_the_second(&mut p, VRDMA_WC_RNR_RETRY_EXC_ERR);
    // The first attempt + 2 RNR retries (IBTA 9.7.5.2.8).
    assert_eq!(sends.load(Ordering::Relaxed), 3, "SEND attempts");
}

#[test]
fn retry_exceeded_when_the_peer_is_gone() {
    let mut p = pair(3, 7);
    p.link.filter_ab = Some(Box::new(|_| false));
    let w = write(&p, 1, p.kb, VRDMA_SEND_SIGNALED);
    p.post(&w);
    let w = write(&p, 2, p.kb, VRDMA_SEND_SIGNALED);
    p.post(&w);
    first_fails_and_flushes_the_second(&mut p, VRDMA_WC_RETRY_EXC_ERR);
}

#[test]
fn modify_to_error_flushes_both_queues() {
    let mut p = pair(7, 7);
    p.recv_b(80, 0, 10);
    p.recv_b(81, 0, 10);
    let qb = p.qb.qpn;
    p.b.qp_to_err(qb);
    let (_, cb) = p.wait(0, 2);
    assert_eq!(
        cb.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(80, VRDMA_WC_WR_FLUSH_ERR), (81, VRDMA_WC_WR_FLUSH_ERR)]
    );
}

#[test]
fn hostile_frames_do_not_disturb_other_qps() {
    let mut p = pair(7, 7);
    // Capture one good frame to mutate.
    let w = write(&p, 1, p.kb, VRDMA_SEND_SIGNALED);
    p.post(&w);
    let good = p.a.dev.outbox(0).frames[0].clone();
    let (ca, _) = p.wait(1, 0);
    assert_eq!(ca[0].status, VRDMA_WC_SUCCESS);
    let mut hostile: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 13],
        good[..good.len() / 2].to_vec(),
        pattern(9, 1500),
    ];
    // Garbage after the UDP header, bit flips everywhere (ICRC must catch them).
    for i in (0..good.len()).step_by(7) {
        let mut f = good.clone();
        f[i] ^= 0x5a;
        hostile.push(f);
    }
    // Well-formed frames (valid ICRC) that are wrong: unknown QPN, a PSN far ahead, a READ
    // response nobody asked for, an opcode of the wrong transport.
    {
        use vrdma_backend::wire::{Aeth, Bth, ExtHeaders, Opcode, PacketBuilder, Reth, RocePacket};
        let parsed = RocePacket::parse(&good).expect("good frame parses");
        let craft = |op: Opcode, qpn: u32, psn: u32, ext: ExtHeaders, payload: &[u8]| {
            let mut b = PacketBuilder::new(parsed.addr, Bth::new(op, qpn, psn));
            b.ext = ext;
            let mut f = Vec::new();
            b.build(&[payload], &mut f).expect("build");
            f
        };
        let reth = ExtHeaders {
            reth: Some(Reth {
                va: p.dst,
                rkey: p.kb,
                dma_len: 4,
            }),
            ..Default::default()
        };
        let aeth = ExtHeaders {
            aeth: Some(Aeth::ack(0)),
            ..Default::default()
        };
        let qb = p.qb.qpn;
        hostile.push(craft(Opcode::RcWriteOnly, 0xabcdef, 5000, reth, b"evil"));
        hostile.push(craft(
            Opcode::RcWriteOnly,
            qb,
            5000 + 100_000,
            reth,
            b"evil",
        ));
        hostile.push(craft(Opcode::RcReadResponseOnly, qb, 77, aeth, b"junk"));
        hostile.push(craft(
            Opcode::UcSendOnly,
            qb,
            5001,
            ExtHeaders::default(),
            b"x",
        ));
    }
    for f in &hostile {
        vrdma_backend::transport::on_frame(&p.b.dev, f);
    }
    // Replies are acknowledgements only: re-ACKs of the duplicates (bit flips in the MACs are
    // not covered by the ICRC) and one PSN sequence NAK for the far-ahead PSN.
    for f in std::mem::take(&mut p.b.dev.outbox(0).frames) {
        let r = vrdma_backend::wire::RocePacket::parse(&f).expect("reply parses");
        assert_eq!(r.bth.opcode, vrdma_backend::wire::Opcode::RcAck);
    }
    assert!(p.b.read(p.dst, 4) != b"evil", "nothing written");
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_RTS);
    assert!(p.b.events().is_empty());
    // Replaying the old (valid) frame is a duplicate: re-acknowledged, nothing breaks.
    vrdma_backend::transport::on_frame(&p.b.dev, &good);
    p.b.dev.outbox(0).frames.clear();
    // The QP still works.
    let data = pattern(77, 100);
    p.a.write(p.src, &data);
    let w = write(&p, 2, p.kb, VRDMA_SEND_SIGNALED);
    p.post(&w);
    let (ca, _) = p.wait(1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (2, VRDMA_WC_SUCCESS));
    assert_eq!(p.b.read(p.dst, 100), data);
    assert_eq!(p.b.qp_state(p.qb.qpn), VRDMA_QPS_RTS);
}

#[test]
fn sqd_drains_and_reports_then_resumes_in_rts() {
    let mut p = pair(7, 7);
    let w = write(&p, 1, p.kb, VRDMA_SEND_SIGNALED);
    p.post(&w);
    // RTS → SQD with the drain notification while WRITE 1 is in flight.
    let attr = VrdmaQpAttr {
        qp_state: VRDMA_QPS_SQD,
        en_sqd_async_notify: 1,
        ..Default::default()
    };
    let qa = p.qa.qpn;
    p.a.modify_qp(qa, VRDMA_QP_STATE | VRDMA_QP_EN_SQD_ASYNC_NOTIFY, attr)
        .expect("SQD");
    // Posted in SQD: not started until the QP is back in RTS.
    let w2 = write(&p, 2, p.kb, VRDMA_SEND_SIGNALED);
    p.post(&w2);
    let (ca, _) = p.wait(1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (1, VRDMA_WC_SUCCESS));
    pump_idle(&mut p.a, &mut p.b, &mut p.link);
    assert!(p.a.poll_cq(&mut p.cqa).is_empty(), "WQE 2 must wait in SQD");
    let ev = p.a.events();
    assert_eq!(
        ev.iter()
            .filter(|e| e.type_ == VRDMA_EV_SQ_DRAINED && e.id == qa)
            .count(),
        1,
        "{ev:?}"
    );
    let attr = VrdmaQpAttr {
        qp_state: VRDMA_QPS_RTS,
        ..Default::default()
    };
    p.a.modify_qp(qa, VRDMA_QP_STATE, attr)
        .expect("back to RTS");
    // No new doorbell: the engine tick picks up the fetched WQE.
    let (ca, _) = p.wait(1, 0);
    assert_eq!((ca[0].wr_id, ca[0].status), (2, VRDMA_WC_SUCCESS));
}

/// A responder state held across the frames of one received buffer (`transport::ReceiveRun`,
/// a fabric segment's SENDs) is given up when the core moves the QP to ERR beside it (here
/// between two frames, as a CQ overflow or a failing SRQ on another worker does): the second
/// SEND is dropped as for any QP in ERR (IBTA 10.3) and its receive buffer stays untouched.
#[test]
fn a_qp_moved_to_error_beside_a_held_receive_run_takes_no_more_frames() {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Instant;
    use vrdma_backend::{transport, wire};

    let mut p = RcPair::new().build();
    p.a.write(p.src, &[0xab; 8192]);
    p.recv_b(100, 0, 1024);
    p.recv_b(101, 4096, 1024);
    for i in 0..2u64 {
        let w = send(i, (p.src + i * 4096, 1024, p.ka));
        p.post(&w);
    }
    let frames = std::mem::take(&mut p.a.dev.outbox(0).frames);
    assert_eq!(frames.len(), 2, "one frame per SEND");
    let dropped = p.b.dev.port_stats.drop_qp_state.load(Relaxed);
    let now = Instant::now();
    let mut run = transport::ReceiveRun::default();
    let first = wire::locate(&frames[0]).expect("a RoCE frame");
    transport::on_located_in_run(&p.b.dev, first, now, None, &mut run);
    p.b.dev.qp_to_error(p.qb.qpn, None, 0);
    let second = wire::locate(&frames[1]).expect("a RoCE frame");
    transport::on_located_in_run(&p.b.dev, second, now, None, &mut run);
    run.finish(&p.b.dev);
    assert_eq!(
        p.b.read(p.dst, 1024),
        vec![0xab; 1024],
        "the first SEND landed"
    );
    assert_eq!(
        p.b.dev.port_stats.drop_qp_state.load(Relaxed),
        dropped + 1,
        "the second SEND found the QP in ERR"
    );
    assert_eq!(
        p.b.read(p.dst + 4096, 1024),
        vec![0u8; 1024],
        "the second receive buffer is untouched"
    );
}
