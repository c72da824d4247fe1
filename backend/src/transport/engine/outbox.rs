//! The drain-the-outbox phase of a worker's round. Under the device lock the worker swaps its
//! outbox (`Device::outbox`; both keep their capacity) with an empty one and sorts the frames
//! the transport queued: a frame to one of the device's own GIDs (QP to QP on this device) is
//! looped back, received in the next round by the worker of its destination QP (a multicast
//! datagram by each member's worker) instead of going out on the uplink; the others are sent
//! to the uplink after the lock is released, batched (`sendmmsg` on UDP; on the fabric the
//! buffers move to the destination's queue).

use super::route::{is_ours, members};
use super::units::Batch;
use crate::port::{tx_destination, TxDestination};
use crate::stats::bump;
use crate::tables::Outbox;
use crate::transport::frames_of;
use crate::transport::packet::recycle_frame;
use crate::transport::workers::{looped_to, Routed};
use crate::uplink::Uplink;
use crate::wire::segment::SegRefs;

/// Where the frames a worker's transport made go.
#[derive(Default)]
pub(super) struct Outgoing {
    /// Frames that leave through the uplink, sent after the batch; swapped with the device's
    /// outbox in the next drain.
    to_uplink: Outbox,
    /// Where the next drain sorts the uplink's frames into.
    next_uplink: Outbox,
    /// Frames looped back to this worker (each with its segment mark, spec §16.2 rule 6): run
    /// as received in the next round.
    pub(super) looped: Vec<Routed>,
}

impl Outgoing {
    /// Take the frames the batch queued in the device's outbox for this worker and sort them.
    pub(super) fn drain(&mut self, batch: &mut Batch<'_>) {
        let mut queued = std::mem::take(&mut self.to_uplink);
        std::mem::swap(&mut queued, &mut *batch.dev.outbox(batch.router.me));
        let mut marks = queued.segments.iter().copied().peekable();
        let mut refs_by_frame = queued.refs.drain(..).peekable();
        for (i, frame) in queued.frames.drain(..).enumerate() {
            let segment = marks.next_if_eq(&i).is_some();
            let refs = refs_by_frame.next_if(|(j, _)| *j == i).map(|(_, r)| r);
            self.place(batch, frame, segment, refs);
        }
        drop(refs_by_frame);
        drop(marks);
        queued.clear();
        self.to_uplink = std::mem::replace(&mut self.next_uplink, queued);
    }

    /// Loop `frame` back, send it to the uplink, or both (a multicast datagram with members
    /// here and elsewhere); a segment's frames share their addresses, so the first one decides.
    fn place(
        &mut self,
        batch: &mut Batch<'_>,
        mut frame: Vec<u8>,
        segment: bool,
        refs: Option<SegRefs>,
    ) {
        let port = batch.router.port;
        let probe = frames_of(&frame, segment).next().unwrap_or(&frame);
        let dest = tx_destination(probe, |g| is_ours(&batch.dev, g));
        let refs = match (dest, refs) {
            // Looped back: as bytes (spec §16.2 rule 6).
            (TxDestination::Engine | TxDestination::EngineAndUplink, Some(r)) => {
                let filled = crate::wire::segment::materialize(&mut frame, &*r);
                r.recycle();
                if !filled {
                    bump(&port.drop_stale_ref);
                    recycle_frame(frame);
                    return;
                }
                None
            }
            (_, r) => r,
        };
        match dest {
            TxDestination::Engine => {
                bump(&port.loopback_frames);
                self.loop_back(batch, frame, segment);
            }
            TxDestination::EngineAndUplink => {
                bump(&port.loopback_frames);
                self.loop_back(batch, frame.clone(), segment);
                match segment {
                    true => self.next_uplink.push_segment(frame),
                    false => self.next_uplink.push(frame),
                }
            }
            TxDestination::Uplink => match (segment, refs) {
                (true, Some(r)) => self.next_uplink.push_segment_refs(frame, r),
                (true, None) => self.next_uplink.push_segment(frame),
                (false, _) => self.next_uplink.push(frame),
            },
        }
    }

    /// A looped frame is received by its destination QP's worker, a looped multicast datagram
    /// by each member's worker.
    fn loop_back(&mut self, batch: &mut Batch<'_>, frame: Vec<u8>, segment: bool) {
        let router = &batch.router;
        let members = members(&batch.dev, router.workers);
        let to = looped_to(&frame, segment, members, router.me, router.workers);
        batch.kicks |= router.loop_back(frame, segment, to, &mut self.looped);
    }

    /// After the batch, without the device lock: send the sorted frames. A full socket buffer
    /// is packet loss; RC retransmits (IBTA 9.7.6).
    pub(super) fn send(&mut self, uplink: &dyn Uplink) {
        self.to_uplink.send(uplink);
    }

    /// Give the sent buffers back to their pool (the outbox keeps its capacity).
    pub(super) fn recycle(&mut self) {
        self.to_uplink.segments.clear();
        for f in self.to_uplink.frames.drain(..) {
            recycle_frame(f);
        }
    }
}
