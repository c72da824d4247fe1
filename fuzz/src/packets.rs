//! Target `packet`: RoCEv2 frames from the input delivered by `transport::on_frame` to both
//! roles of a connected pair in RTS (spec §14.6): to b's responder (requests) and to a's
//! requester/completer while a has RDMA WRITE, READ, SEND and atomic requests outstanding
//! (responses).
//!
//! Input: records of `ctl u8, len u16, bytes[len % 2048]`. `ctl` bit 0: 0 → to b, 1 → to a.
//! Bit 1 clear: `bytes` are the BTH and what follows it (payload, no ICRC); the Ethernet, IPv4
//! and UDP headers are those of a real frame (`ctl >> 2` picks which) and lengths, checksum and
//! ICRC are recomputed, so the frame reaches the transport. Bit 1 set: `bytes` are the whole
//! frame, unsealed (parser and ICRC checks).

use vrdma_backend::{port, transport};
use vrdma_spec::*;

use crate::bed::Bed;
use crate::common::{reseal, Wqe, BTH};
use crate::Input;

/// Most frames per input.
const MAX_FRAMES: usize = 32;

/// The bed with a's requests outstanding; the request frames a sent and b's responses to them
/// (neither delivered to a).
pub fn bed_with_traffic() -> (Bed, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut t = Bed::new();
    let (src, ka, dst, kb) = (t.src, t.ka, t.dst, t.kb);
    let rc = [
        Wqe {
            wr_id: 1,
            opcode: VRDMA_WR_RDMA_WRITE,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(src, 3000, ka)],
            remote_addr: dst,
            rkey: kb,
            ..Default::default()
        },
        Wqe {
            wr_id: 2,
            opcode: VRDMA_WR_RDMA_READ,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(src + 8192, 2500, ka)],
            remote_addr: dst + 4096,
            rkey: kb,
            ..Default::default()
        },
        Wqe {
            wr_id: 3,
            opcode: VRDMA_WR_SEND_WITH_IMM,
            flags: VRDMA_SEND_SIGNALED,
            ex: 0x0102_0304,
            sges: vec![(src, 1500, ka)],
            ..Default::default()
        },
        Wqe {
            wr_id: 4,
            opcode: VRDMA_WR_ATOMIC_FETCH_AND_ADD,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(src + 16384, 8, ka)],
            remote_addr: dst + 64,
            rkey: kb,
            compare_add: 5,
            ..Default::default()
        },
    ];
    let mut qa = t.qa.clone();
    for w in &rc {
        t.a.post_send(&mut qa[0], w);
    }
    t.a.post_send(
        &mut qa[1],
        &Wqe {
            wr_id: 5,
            opcode: VRDMA_WR_RDMA_WRITE_WITH_IMM,
            sges: vec![(src, 2000, ka)],
            remote_addr: dst + 8192,
            rkey: kb,
            ..Default::default()
        },
    );
    t.a.post_send(
        &mut qa[2],
        &Wqe {
            wr_id: 6,
            opcode: VRDMA_WR_SEND,
            flags: VRDMA_SEND_SIGNALED,
            sges: vec![(src, 500, ka)],
            ah: t.ah,
            remote_qpn: t.qb[2].qpn,
            remote_qkey: crate::bed::QKEY,
            ..Default::default()
        },
    );
    t.qa = qa;
    let reqs = std::mem::take(&mut t.a.dev.outbox(0).frames);
    for f in &reqs {
        transport::on_frame(&mut t.b.dev, f);
    }
    let resps = std::mem::take(&mut t.b.dev.outbox(0).frames);
    (t, reqs, resps)
}

pub fn run(data: &[u8]) {
    let (mut bed, reqs, resps) = bed_with_traffic();
    let mut inp = Input::new(data);
    for _ in 0..MAX_FRAMES {
        if inp.is_empty() {
            break;
        }
        let ctl = inp.u8();
        let len = usize::from(inp.u16() % 2048);
        let body = inp.bytes(len);
        let to_a = ctl & 1 != 0;
        let frame = if ctl & 2 != 0 {
            body.to_vec()
        } else {
            let tpls = if to_a { &resps } else { &reqs };
            let Some(tpl) = tpls.get(usize::from(ctl >> 2) % tpls.len().max(1)) else {
                continue;
            };
            let mut f = tpl[..BTH.min(tpl.len())].to_vec();
            f.extend_from_slice(body);
            f.extend_from_slice(&[0; 4]);
            reseal(&mut f);
            f
        };
        let dev = if to_a { &mut bed.a.dev } else { &mut bed.b.dev };
        // The engine's path: the port locates the headers once and the transport parses on
        // from them. Frames the port would not give the engine still go to the transport, whose
        // own checks must hold for any bytes.
        let mac = dev.config.mac;
        let (dest, located) = port::classify_located(&frame, &[mac], false, |g| {
            dev.gids().find_v2(g).is_some() || dev.mcast().has_group(g)
        });
        match (dest, located) {
            (port::Destination::Engine, Some(l)) => {
                transport::on_located_ref_at(dev, l, std::time::Instant::now(), None)
            }
            _ => transport::on_frame(dev, &frame),
        }
        bed.settle(0);
    }
    bed.settle(2);
    bed.check_canaries();
}
