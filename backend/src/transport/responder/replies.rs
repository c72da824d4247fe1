//! The responder's queued replies (IBTA 9.7.4.1.4, spec §14): READ response packets, one per
//! path MTU (or written into fabric segments), and atomic ACKs, sent in PSN order under a
//! per-batch budget.

use super::*;

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
    let mtu = ctx.mtu as u64;
    let mut ranges: Vec<GuestRange> = Vec::new();
    while budget > 0 {
        let Some(r) = st.replies.front_mut() else {
            break;
        };
        // An ACK queued behind READ responses: they are all sent, so it may go now.
        match r.kind {
            ReplyKind::Read => {}
            ReplyKind::Ack(aeth) => {
                let psn = r.psn;
                st.replies.pop_front();
                close_segment(dev, ctx.qpn, seg);
                send_ack(dev, ctx, aeth, psn);
                budget -= 1;
                continue;
            }
            ReplyKind::AtomicAck { orig } => {
                let (psn, msn) = (r.psn, r.msn);
                st.replies.pop_front();
                close_segment(dev, ctx.qpn, seg);
                send_atomic_ack(dev, ctx, msn, psn, orig);
                budget -= 1;
                continue;
            }
        }
        let n = r.remaining.min(mtu);
        let last = r.remaining <= mtu;
        let pos = match (r.first, last) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, false) => Position::Middle,
            (false, true) => Position::Last,
        };
        ranges.clear();
        if n > 0 {
            // Re-translate per packet: the MR may have been invalidated or deregistered since the
            // request was checked, and ODP chunks may have been reclaimed.
            let a = Access {
                key: r.rkey,
                pd: r.pdn,
                iova: r.va,
                len: n,
                rights: ACCESS_REMOTE_READ,
            };
            let resolved = ctx::resolve_remote(dev, Some(ctx.qpn), a, ctx.qpn, &mut ranges);
            match resolved {
                Ok(()) => {}
                // Not resident (yet, or any more): the fault is in flight and its end resumes
                // this QP; the responses continue from here, in PSN order (spec §12.4).
                Err(MrError::Fault { .. }) => return false,
                Err(_) => {
                    // The requester times out and retries; a retry fails the R_Key check and
                    // gets the remote access NAK.
                    st.replies.pop_front();
                    continue;
                }
            }
        }
        let ext = ExtHeaders {
            aeth: matches!(pos, Position::First | Position::Last | Position::Only)
                .then(|| Aeth::ack(r.msn)),
            ..Default::default()
        };
        let psn = r.psn;
        let Some(op) = opcode_for(ctx.transport(), Operation::ReadResponse, pos, false, false)
        else {
            st.replies.pop_front();
            continue;
        };
        let multi = segments && !matches!(pos, Position::Only);
        if !multi || seg.as_ref().is_some_and(|w| !w.fits(n as usize)) {
            close_segment(dev, ctx.qpn, seg);
        }
        if multi && seg.is_none() {
            *seg = Some(SegmentWriter::new(crate::transport::packet::segment_buf()));
        }
        // The payload, straight from guest memory into the frame (no intermediate buffer).
        let mem = &dev.mem;
        let fill = |buf: &mut [u8]| -> Result<(), ()> {
            let mut p = 0usize;
            for g in &ranges {
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
        };
        let meta = response_meta(ctx, &path, op, psn, ext);
        let built = match seg.as_mut().filter(|_| multi) {
            Some(w) => crate::transport::packet::build_into_segment(&meta, n as usize, w, fill)
                .map(|len| len.map(|l| (l, None))),
            None => crate::transport::packet::build_with(&meta, n as usize, fill)
                .map(|f| f.map(|f| (f.len(), Some(f)))),
        };
        let Ok(built) = built else {
            // Guest memory could not be read: as an unreadable MR above.
            st.replies.pop_front();
            continue;
        };
        let Some(r) = st.replies.front_mut() else {
            break;
        };
        r.psn = psn_add(r.psn, 1);
        r.va = r.va.wrapping_add(n);
        r.remaining -= n;
        r.first = false;
        if last {
            st.replies.pop_front();
        }
        budget -= 1;
        match built {
            Some((_, Some(f))) => ctx::send_frame(dev, ctx.qpn, f, false),
            Some((len, None)) => ctx::count_tx(dev, ctx.qpn, len, false),
            // `wire` refused the frame (logged): seen as a lost packet, which the requester
            // asks for again.
            None => {}
        }
    }
    budget == 0 && !st.replies.is_empty()
}
