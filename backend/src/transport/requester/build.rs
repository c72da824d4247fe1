//! The one builder of request packets (rxe's `finish_packet` and transmit): a [`Request`] goes
//! out as a single frame, into a fabric segment by copy, or into a fabric segment with its
//! payload left in guest memory (spec §16.2 rule 6, `onecopy`), whichever the port and the
//! packet allow. The payload is written straight into the frame (one copy).

use super::*;
use crate::transport::onecopy::{build_by_reference, by_reference, Built, PayloadSource};
use crate::transport::packet::{self, TxMeta};

/// The bytes of a request packet's payload.
#[derive(Clone, Copy)]
pub(super) enum Payload<'a> {
    Empty,
    /// ATOMIC WRITE's 8 bytes.
    Atomic([u8; 8]),
    /// The WQE's inline data (the packet's bytes start at [`Request::off`]).
    Inline(&'a [u8]),
    /// The WQE's SGEs, gathered from message offset [`Request::off`].
    Sges(&'a [Sge]),
}

/// One request packet to send: its headers and payload, and how the port may carry it.
pub(super) struct Request<'a> {
    pub meta: TxMeta<'a>,
    pub payload: Payload<'a>,
    /// Payload bytes.
    pub len: usize,
    /// Message offset of the payload.
    pub off: u64,
    /// An RDMA WRITE packet (the only payload that may stay in guest memory).
    pub write: bool,
    /// A packet of a message of several packets: only those go into segments. A one-packet
    /// message (64 B WRITEs, READ requests, atomics) gains nothing there and costs a segment
    /// buffer, so it leaves as a plain frame, after the segment so far (PSN order on the wire).
    pub multi: bool,
    /// Behind the highest PSN ever sent: go-back-N is sending this packet again.
    pub again: bool,
}

/// Send `r`: into the QP's open segment `seg` if the port takes segments and `r` is part of a
/// multi-packet message, else as a single frame (closing the segment first if `r` does not go
/// into it, so packets stay in PSN order). `Err`: the payload could not be gathered (an ODP
/// fault, or SGEs that no longer resolve); nothing was sent.
pub(super) fn build_request(
    dev: &Device,
    ctx: &QpCtx,
    r: &Request<'_>,
    seg: &mut Option<SegmentWriter>,
) -> Result<(), SgeError> {
    if let Some(w) = seg.as_mut() {
        if !w.is_empty() && (!r.multi || !w.fits(r.len)) {
            ctx::flush_segment(dev, ctx.qpn, w);
            *w = SegmentWriter::new(packet::segment_buf());
        }
    }
    let Some(w) = seg.as_mut().filter(|_| r.multi) else {
        return packet::build_with(&r.meta, r.len, |buf| fill(dev, ctx, r, buf)).map(|f| {
            if let Some(f) = f {
                ctx::send_frame(dev, ctx.qpn, f, r.again);
            }
        });
    };
    if let Some(sent) = add_by_reference(dev, ctx, r, w) {
        return sent;
    }
    packet::build_into_segment(&r.meta, r.len, w, |buf| fill(dev, ctx, r, buf)).map(|len| {
        if let Some(len) = len {
            ctx::count_tx(dev, ctx.qpn, len, r.again);
        }
    })
}

/// One copy (spec §16.2 rule 6, `onecopy`): an RC WRITE packet of a segment leaves its payload
/// in guest memory and the receiving engine copies it from there. `None`: not possible here
/// (another kind of packet, or the segment's references are full): copy the payload.
fn add_by_reference(
    dev: &Device,
    ctx: &QpCtx,
    r: &Request<'_>,
    w: &mut SegmentWriter,
) -> Option<Result<(), SgeError>> {
    let Payload::Sges(sges) = r.payload else {
        return None;
    };
    if !by_reference(dev, ctx.is_rc(), r.write, false, r.len) {
        return None;
    }
    let payload = PayloadSource {
        qpn: ctx.qpn,
        pdn: ctx.pdn,
        sges,
        off: r.off,
        len: r.len,
    };
    match build_by_reference(dev, &r.meta, payload, w) {
        Ok(Built::Added(len)) => {
            ctx::count_tx(dev, ctx.qpn, len, r.again);
            Some(Ok(()))
        }
        Ok(Built::Lost) => Some(Ok(())),
        Ok(Built::Copy) => None,
        Err(e) => Some(Err(e)),
    }
}

/// Write `r`'s payload into `buf` (exactly its length): the atomic operand, the inline data at
/// the packet's offset, or a gather from the SGEs (`sge_copy`, which resolves ODP pages).
fn fill(dev: &Device, ctx: &QpCtx, r: &Request<'_>, buf: &mut [u8]) -> Result<(), SgeError> {
    match r.payload {
        Payload::Empty => Ok(()),
        Payload::Atomic(d) => {
            buf.copy_from_slice(&d);
            Ok(())
        }
        Payload::Inline(data) => {
            let o = r.off as usize;
            let d = o
                .checked_add(buf.len())
                .and_then(|e| data.get(o..e))
                .ok_or(SgeError::Len)?;
            buf.copy_from_slice(d);
            Ok(())
        }
        Payload::Sges(_) if buf.is_empty() => Ok(()),
        Payload::Sges(sges) => {
            sge_copy(dev, Some(ctx.qpn), ctx.pdn, sges, r.off, SgeIo::Gather(buf))
        }
    }
}
