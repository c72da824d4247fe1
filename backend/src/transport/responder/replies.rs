//! The responder's queued replies (IBTA 9.7.4.1.4, spec §14): READ response packets, one per
//! path MTU (or written into fabric segments), and atomic ACKs, sent in PSN order under a
//! per-batch budget.

use super::*;
use crate::guest::GuestMem;

/// Send up to `budget` READ response packets (IBTA 9.7.4.1.4: one per MTU, FIRST/MIDDLE/LAST or
/// ONLY, AETH on FIRST/LAST/ONLY). Returns true when the budget ran out with replies still
/// queued (call again soon); false when the queue is empty or waits for an ODP fault, whose end
/// resumes the QP (`transport::resume_odp`), so a waiting READ costs no timer spin.
///
/// On a fabric port that takes segments (spec §16.2 rule 6) the packets of multi-packet READ
/// responses are written back to back into fabric segments, as the requester does for its
/// requests; every packet is still a complete standard frame with its own PSN, and ONLY
/// responses, ACKs and atomic ACKs stay single frames, sent after the segment so far (PSN order).
pub(crate) fn pump_replies(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut ResponderState,
    budget: u32,
) -> bool {
    // Opened at the first packet that goes into one (an ONLY response or an ACK needs none).
    let segments = dev.icrc_offload.segments && !ctx.is_ud();
    let mut seg = None;
    let more = pump(dev, ctx, st, budget, segments, &mut seg);
    close_segment(dev, ctx.qpn, &mut seg);
    more
}

/// Queue what `seg` holds (if anything; it is closed) before a single frame or a new segment,
/// so PSN order holds on the wire.
fn close_segment(dev: &Device, qpn: u32, seg: &mut Option<SegmentWriter>) {
    if let Some(mut w) = seg.take() {
        ctx::flush_segment(dev, qpn, &mut w);
        crate::transport::packet::recycle_frame(w.into_buf());
    }
}

/// What handling the front reply did, for [`pump`]'s budget.
enum PacketStep {
    /// A packet went out (or `wire` refused it, which counts as a loss): one unit of budget.
    Sent,
    /// Nothing went out and no budget is used: the reply was dropped, or the queue emptied.
    Skipped,
    /// The payload is not resident; the ODP fault's end resumes the QP (spec §12.4).
    AwaitFault,
}

/// Where READ response packets go: the QP's device, context and path, and whether the port
/// takes fabric segments (spec §16.2 rule 6).
struct ReplyOut<'a> {
    dev: &'a Device,
    ctx: &'a QpCtx,
    path: &'a Path,
    segments: bool,
}

/// A READ response packet built: written into the open segment (its length), or a frame of
/// its own.
enum BuiltPacket {
    InSegment(usize),
    Frame(Vec<u8>),
}

/// See [`pump_replies`]; `segments`: the port takes them; `seg`: the open segment.
fn pump(
    dev: &Device,
    ctx: &QpCtx,
    st: &mut ResponderState,
    mut budget: u32,
    segments: bool,
    seg: &mut Option<SegmentWriter>,
) -> bool {
    let Some(path) = ctx.path else {
        st.replies.clear();
        return false;
    };
    let out = ReplyOut {
        dev,
        ctx,
        path: &path,
        segments,
    };
    let mut ranges: Vec<GuestRange> = Vec::new();
    while budget > 0 {
        let Some(&r) = st.replies.front() else {
            break;
        };
        let step = match r.kind {
            ReplyKind::Read => send_read_packet(&out, st, r, seg, &mut ranges),
            ReplyKind::Ack(aeth) => {
                take_queued_ack(&out, st, seg);
                send_ack(dev, ctx, aeth, r.psn);
                PacketStep::Sent
            }
            ReplyKind::AtomicAck { orig } => {
                take_queued_ack(&out, st, seg);
                send_atomic_ack(dev, ctx, r.msn, r.psn, orig);
                PacketStep::Sent
            }
        };
        match step {
            PacketStep::Sent => budget -= 1,
            PacketStep::Skipped => {}
            PacketStep::AwaitFault => return false,
        }
    }
    budget == 0 && !st.replies.is_empty()
}

/// An ACK or atomic ACK queued behind READ responses (IBTA 9.7.5.1.1: responses in PSN
/// order) is at the front: those are all sent, so it leaves the queue and goes now, after the
/// segment so far.
fn take_queued_ack(out: &ReplyOut<'_>, st: &mut ResponderState, seg: &mut Option<SegmentWriter>) {
    st.replies.pop_front();
    close_segment(out.dev, out.ctx.qpn, seg);
}

/// The next READ response packet of `r`, the front reply (IBTA 9.7.4.1.4): its payload
/// translated again and read straight from guest memory into the frame or segment, then the
/// reply advanced past it.
fn send_read_packet(
    out: &ReplyOut<'_>,
    st: &mut ResponderState,
    r: ReadReply,
    seg: &mut Option<SegmentWriter>,
    ranges: &mut Vec<GuestRange>,
) -> PacketStep {
    let (dev, ctx) = (out.dev, out.ctx);
    let mtu = ctx.mtu as u64;
    let n = r.remaining.min(mtu);
    let last = r.remaining <= mtu;
    let pos = packet_position(r.first, last);
    ranges.clear();
    if n > 0 {
        match translate_payload(dev, ctx, &r, n, ranges) {
            Ok(()) => {}
            // Not resident (yet, or any more): the fault is in flight and its end resumes
            // this QP; the responses continue from here, in PSN order (spec §12.4).
            Err(MrError::Fault { .. }) => return PacketStep::AwaitFault,
            Err(_) => {
                // The requester times out and retries; a retry fails the R_Key check and
                // gets the remote access NAK.
                st.replies.pop_front();
                return PacketStep::Skipped;
            }
        }
    }
    let ext = ExtHeaders {
        aeth: matches!(pos, Position::First | Position::Last | Position::Only)
            .then(|| Aeth::ack(r.msn)),
        ..Default::default()
    };
    let Some(op) = opcode_for(ctx.transport(), Operation::ReadResponse, pos, false, false) else {
        st.replies.pop_front();
        return PacketStep::Skipped;
    };
    let multi = out.segments && !matches!(pos, Position::Only);
    prepare_segment(dev, ctx.qpn, seg, multi, n as usize);
    let meta = response_meta(ctx, out.path, op, r.psn, ext);
    let into = seg.as_mut().filter(|_| multi);
    let Ok(built) = build_read_packet(&meta, n as usize, into, &dev.mem, ranges) else {
        // Guest memory could not be read: as an unreadable MR above.
        st.replies.pop_front();
        return PacketStep::Skipped;
    };
    if !advance_reply(st, n, last) {
        return PacketStep::Skipped;
    }
    match built {
        Some(BuiltPacket::Frame(f)) => ctx::send_frame(dev, ctx.qpn, f, false),
        Some(BuiltPacket::InSegment(len)) => ctx::count_tx(dev, ctx.qpn, len, false),
        // `wire` refused the frame (logged): seen as a lost packet, which the requester
        // asks for again.
        None => {}
    }
    PacketStep::Sent
}

/// Where a packet sits in its READ response (IBTA 9.7.4.1.4: FIRST/MIDDLE/LAST or ONLY).
fn packet_position(first: bool, last: bool) -> Position {
    match (first, last) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, false) => Position::Middle,
        (false, true) => Position::Last,
    }
}

/// The guest ranges of the next `n` payload bytes of `r`. Translated again per packet: the MR
/// may have been invalidated or deregistered since the request was checked, and ODP chunks
/// may have been invalidated (spec §12.5) or reclaimed (§12.6).
fn translate_payload(
    dev: &Device,
    ctx: &QpCtx,
    r: &ReadReply,
    n: u64,
    ranges: &mut Vec<GuestRange>,
) -> Result<(), MrError> {
    let a = Access {
        key: r.rkey,
        pd: r.pdn,
        iova: r.va,
        len: n,
        rights: ACCESS_REMOTE_READ,
    };
    ctx::resolve_remote(dev, Some(ctx.qpn), a, ctx.qpn, ranges)
}

/// Close the open segment before a single frame (`multi` false) or when `len` more payload
/// bytes do not fit; open one for a multi-packet response if none is (spec §16.2 rule 6).
fn prepare_segment(
    dev: &Device,
    qpn: u32,
    seg: &mut Option<SegmentWriter>,
    multi: bool,
    len: usize,
) {
    if !multi || seg.as_ref().is_some_and(|w| !w.fits(len)) {
        close_segment(dev, qpn, seg);
    }
    if multi && seg.is_none() {
        *seg = Some(SegmentWriter::new(crate::transport::packet::segment_buf()));
    }
}

/// Build one READ response packet into `into` (the open segment) or a frame of its own, its
/// payload read straight from guest memory (no intermediate buffer). `Ok(None)`: `wire`
/// refused the frame; `Err`: guest memory could not be read.
fn build_read_packet(
    meta: &TxMeta<'_>,
    len: usize,
    into: Option<&mut SegmentWriter>,
    mem: &GuestMem,
    ranges: &[GuestRange],
) -> Result<Option<BuiltPacket>, ()> {
    let fill = |buf: &mut [u8]| fill_from_guest(mem, ranges, buf);
    match into {
        Some(w) => crate::transport::packet::build_into_segment(meta, len, w, fill)
            .map(|l| l.map(BuiltPacket::InSegment)),
        None => {
            crate::transport::packet::build_with(meta, len, fill).map(|f| f.map(BuiltPacket::Frame))
        }
    }
}

/// Copy `ranges` of guest memory into `buf`, which they must fill exactly.
fn fill_from_guest(mem: &GuestMem, ranges: &[GuestRange], buf: &mut [u8]) -> Result<(), ()> {
    let mut p = 0usize;
    for g in ranges {
        let chunk = p
            .checked_add(g.len as usize)
            .and_then(|e| buf.get_mut(p..e))
            .ok_or(())?;
        mem.read(g.gpa, chunk).map_err(|_| ())?;
        p += g.len as usize;
    }
    if p == buf.len() {
        Ok(())
    } else {
        Err(())
    }
}

/// Move the front reply past a packet of `n` bytes: next PSN and address, no longer the
/// first; the last packet ends it. False if the queue is empty (nothing to advance).
fn advance_reply(st: &mut ResponderState, n: u64, last: bool) -> bool {
    let Some(r) = st.replies.front_mut() else {
        return false;
    };
    r.psn = psn_add(r.psn, 1);
    r.va = r.va.wrapping_add(n);
    r.remaining -= n;
    r.first = false;
    if last {
        st.replies.pop_front();
    }
    true
}
