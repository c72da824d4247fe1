//! What a device's QPs queued for the uplink, one outbox per engine worker (ARCHITECTURE.md
//! "Engine workers"): the transport pushes a QP's frames into the outbox of the QP's worker
//! (`qp::worker_of`), and that worker alone takes them after its batch. One outbox per worker,
//! not one per device, is what lets workers build and send frames at the same time without
//! looking at each other's (ARCHITECTURE.md "Locks"). Each outbox has a lock all the same,
//! taken per push: a frame is queued wherever it is built, and tests read outbox 0.

use crate::uplink::{Uplink, UplinkError};
use crate::wire::segment::SegRefs;

/// Frames in the order the transport built them, with the marks that travel beside the bytes.
#[derive(Default)]
pub struct Outbox {
    /// Buffers to send: each one frame, or a fabric segment if listed in `segments`.
    pub frames: Vec<Vec<u8>>,
    /// The indices in `frames` (ascending) of the buffers that are fabric segments
    /// (`wire::segment`, spec §16.2 rule 6): the mark travels beside the buffer, never in its
    /// bytes.
    pub segments: Vec<usize>,
    /// The by-reference payloads of segments in `frames` (their index, ascending; spec §16.2
    /// rule 6): a segment listed here left its payloads in guest memory.
    pub refs: Vec<(usize, SegRefs)>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("frames", &self.frames.len())
            .field("segments", &self.segments)
            .field("refs", &self.refs.len())
            .finish()
    }
}

impl Outbox {
    /// Queue one frame.
    pub fn push(&mut self, frame: Vec<u8>) {
        self.frames.push(frame);
    }

    /// Queue a fabric segment, in order with the frames.
    pub fn push_segment(&mut self, seg: Vec<u8>) {
        self.segments.push(self.frames.len());
        self.frames.push(seg);
    }

    /// [`Outbox::push_segment`] for a segment whose payloads `refs` holds by reference.
    pub fn push_segment_refs(&mut self, seg: Vec<u8>, refs: SegRefs) {
        self.refs.push((self.frames.len(), refs));
        self.push_segment(seg);
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Forget everything queued (a reset or a suspension: nothing may leave).
    pub fn clear(&mut self) {
        self.frames.clear();
        self.segments.clear();
        self.refs.clear();
    }

    /// Send everything in order: runs of frames through [`Uplink::send_frames`] (batched), each
    /// segment through [`Uplink::send_segment`], or [`Uplink::send_segment_refs`] for those
    /// listed in `refs`. The references are gone afterwards; the buffers stay for recycling. A
    /// full socket buffer is packet loss (RC retransmits, IBTA 9.7.6), not an error.
    pub fn send(&mut self, uplink: &dyn Uplink) {
        let Outbox {
            frames: out,
            segments,
            refs,
        } = self;
        let mut held = refs.drain(..).peekable();
        let sent = |r: Result<usize, UplinkError>| match r {
            Ok(_) | Err(UplinkError::WouldBlock) => {}
            Err(e) => guest_warn!("engine: uplink send: {e}"),
        };
        let mut start = 0;
        for &i in segments.iter() {
            if i >= out.len() {
                break;
            }
            if start < i {
                sent(uplink.send_frames(&mut out[start..i]));
            }
            match held.next_if(|(j, _)| *j == i) {
                Some((_, r)) => sent(uplink.send_segment_refs(&mut out[i], r)),
                None => sent(uplink.send_segment(&mut out[i])),
            }
            start = i + 1;
        }
        if start < out.len() {
            sent(uplink.send_frames(&mut out[start..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_marks_follow_their_buffers() {
        let mut o = Outbox::default();
        o.push(vec![1]);
        o.push_segment(vec![2]);
        o.push(vec![3]);
        o.push_segment(vec![4]);
        assert_eq!(o.frames, vec![vec![1], vec![2], vec![3], vec![4]]);
        assert_eq!(o.segments, vec![1, 3]);
        assert!(o.refs.is_empty());
        o.clear();
        assert!(o.is_empty() && o.segments.is_empty());
    }
}
