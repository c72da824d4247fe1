//! [`DevicePort`]: a device's attachment to the fabric, seen by its engine and eth tx path as an
//! ordinary [`Uplink`].

use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::Arc;

use super::{Fabric, PortId};
use crate::uplink::{IcrcOffload, RxFrame, Uplink, UplinkError};

/// See the module documentation. Sending switches the frames on the caller's thread
/// ([`Fabric::forward`]); receiving pops the port's queue.
pub struct DevicePort {
    fabric: Arc<Fabric>,
    id: PortId,
}

impl std::fmt::Debug for DevicePort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePort").field("id", &self.id).finish()
    }
}

impl DevicePort {
    pub(super) fn new(fabric: Arc<Fabric>, id: PortId) -> DevicePort {
        DevicePort { fabric, id }
    }

    pub fn id(&self) -> PortId {
        self.id
    }

    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    /// This port's engine sends and takes fabric segments (`wire::segment`, spec §16.2 rule
    /// 6): for a port handed straight to an engine (or through wrappers that forward
    /// `icrc_offload` and every buffer as it is, like `stats::Metered`). Without it the port
    /// carries standard frames only (the fabric splits segments for it), which is what a wrapper
    /// that looks at single frames (`Impaired`, `PcapTee`) needs.
    pub fn with_segments(self) -> DevicePort {
        self.fabric.set_takes_segments(self.id, true);
        self
    }

    /// This port's engine leaves the RC WRITE payloads of its segments in guest memory (one
    /// copy, spec §16.2 rule 6; `IcrcOffload::payload_refs`), with [`DevicePort::with_segments`],
    /// for every device that takes segments (daemon: `--payload-refs`): between engines on
    /// threads of their own, one copy was slower than two on the 2-core machine it was
    /// measured on, the whole copy then landing on the receiver (ARCHITECTURE.md "Segments").
    pub fn with_payload_refs(self) -> DevicePort {
        self.fabric.set_refs(self.id, super::RefsScope::Everywhere);
        self
    }

    /// This port's engine runs on the threads of engine group slot `slot`, and its payloads
    /// go by reference to the devices of that slot only (spec §16.2 rule 6): one copy where
    /// the same threads did both copies before; for any other destination the switch copies
    /// them into the segment on the sender's thread, as a copying engine would. A fabric
    /// daemon's default (its devices in an engine group); [`DevicePort::with_payload_refs`]
    /// after it widens the scope to every device.
    pub fn with_payload_refs_on_slot(self, slot: usize) -> DevicePort {
        self.fabric.set_engine_slot(self.id, slot);
        self.fabric.set_refs(self.id, super::RefsScope::SameSlot);
        self
    }
}

impl Uplink for DevicePort {
    fn send(&self, frame: &[u8]) -> Result<(), UplinkError> {
        self.fabric.forward(self.id, &[frame]);
        Ok(())
    }

    /// Every frame is taken: the fabric counts what it could not deliver (full queue, busy
    /// uplink) on the destination port.
    fn send_batch(&self, frames: &[&[u8]]) -> Result<usize, UplinkError> {
        self.fabric.forward(self.id, frames);
        Ok(frames.len())
    }

    /// The engine's frames: those for one local device move into its queue without a copy;
    /// RoCEv2 frames come without an ICRC (`icrc_offload`), which the fabric adds to those that
    /// leave the process. (`send` / `send_batch` carry the guest's own netdev frames, which the
    /// fabric forwards as they are.)
    fn send_frames(&self, frames: &mut [Vec<u8>]) -> Result<usize, UplinkError> {
        self.fabric.forward_owned(self.id, frames);
        Ok(frames.len())
    }

    /// The engine's segment, switched whole (spec §16.2 rule 6); counted as its frames.
    fn send_segment(&self, seg: &mut Vec<u8>) -> Result<usize, UplinkError> {
        let n = crate::wire::segment::frame_count(seg, true);
        self.fabric.forward_segment(self.id, seg);
        Ok(n)
    }

    /// The engine's by-reference segment (spec §16.2 rule 6): whole, with its references, to
    /// an engine that takes segments; materialized anywhere else (`Fabric::forward_segment_refs`).
    fn send_segment_refs(
        &self,
        seg: &mut Vec<u8>,
        refs: Box<dyn crate::wire::segment::PayloadRefs>,
    ) -> Result<usize, UplinkError> {
        let n = crate::wire::segment::frame_count(seg, true);
        self.fabric.forward_segment_refs(self.id, seg, refs);
        Ok(n)
    }

    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, UplinkError> {
        let Some(rx) = self.fabric.rx_queue(self.id) else {
            return Ok(None);
        };
        // One frame per call: a segment (only queued for an engine that takes them, which
        // receives through `recv_batch`) is not one, and is skipped.
        let mut slot = [Vec::new()];
        loop {
            let mut segment = false;
            if rx.pop_into(&mut slot, |_, s| segment = s) == 0 {
                return Ok(None);
            }
            if !segment {
                break;
            }
        }
        let f = &slot[0];
        match buf.get_mut(..f.len()) {
            Some(dst) => {
                dst.copy_from_slice(f);
                Ok(Some(f.len()))
            }
            None => Err(UplinkError::Truncated {
                len: f.len(),
                buf: buf.len(),
            }),
        }
    }

    /// Zero-copy: the queued buffers are swapped into `bufs` (their old contents become the
    /// queue's spares), one frame or one segment (`RxFrame::segment`) per buffer.
    fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        frames: &mut Vec<RxFrame>,
    ) -> Result<usize, UplinkError> {
        let Some(rx) = self.fabric.rx_queue(self.id) else {
            return Ok(0);
        };
        let start = frames.len();
        let n = rx.pop_into_refs(bufs, |slot, segment, refs, sender| {
            frames.push(RxFrame {
                slot,
                off: 0,
                len: 0,
                segment,
                refs,
                source: Some(sender),
            })
        });
        // Slots 0..n in order: the lengths of the buffers now in them.
        for (f, b) in frames[start..].iter_mut().zip(bufs.iter()) {
            f.len = b.len();
        }
        Ok(n)
    }

    fn as_raw_fd(&self) -> RawFd {
        self.fabric.rx_queue(self.id).map_or(-1, |q| q.as_raw_fd())
    }

    /// The engine busy-polls the port's queue (an uncontended mutex, no system call).
    fn rx_pending(&self) -> Option<bool> {
        self.fabric.rx_queue(self.id).map(|q| !q.is_empty())
    }

    /// Pushes to the port's queue skip the eventfd while the engine polls it.
    fn set_rx_polling(&self, polling: bool) {
        if let Some(q) = self.fabric.rx_queue(self.id) {
            q.set_polling(polling);
        }
    }

    /// Frames between devices never leave the process; the fabric seals and checks at its edge.
    fn icrc_offload(&self) -> IcrcOffload {
        IcrcOffload {
            seals_tx: true,
            checked_rx: true,
            segments: self.fabric.takes_segments(self.id),
            payload_refs: self.fabric.sends_refs(self.id),
            refs_min_payload: self.fabric.refs_min_payload(self.id),
        }
    }
}
