//! The receive phase of a worker's round: worker 0 takes a batch of buffers from the uplink
//! (`recvmmsg` on UDP; on the fabric, whole buffers swapped out of the port's queue), before
//! it takes the device lock. The buffers are reused every round and frames are parsed in place
//! (no copy per frame).

use crate::uplink::{RxFrame, Uplink, MAX_FRAME};

/// Frames taken from the uplink per batch (bounds the time the device lock is held, and the
/// receive buffers: RX_BATCH × MAX_FRAME bytes per engine).
const RX_BATCH: usize = 128;
/// On a port with fabric segments (spec §16.2 rule 6): buffers taken per receive call, and the
/// packets after which a round stops receiving so its ACKs leave. Without it one round took a
/// whole window of segments (128 packets) before acknowledging any: the two engines took turns
/// instead of overlapping (fabric 64 KiB WRITE 1560 vs 2250 MB/s of single frames); with it
/// 2900-4000 MB/s. Step 1 / budget 16 measured worse than 4 / 32.
const SEGMENT_RX_STEP: usize = 4;
const SEGMENT_RX_BUDGET: usize = 32;

/// A worker's receive buffers and what the last receive put in them.
pub(super) struct Receiver {
    /// The buffers `frames` point into (`RxFrame::slot`).
    pub(super) bufs: Vec<Vec<u8>>,
    /// The buffers received this round.
    pub(super) frames: Vec<RxFrame>,
    /// The last receive stopped before the uplink was empty (a full batch, or the segment
    /// budget): the worker does not sleep before the next round.
    pub(super) more: bool,
    /// The uplink hands fabric segments (`IcrcOffload::segments`): receive in steps, within
    /// the segment budget.
    segments: bool,
}

impl Receiver {
    /// `receives`: the worker receives from the uplink (it starts with `more` set: the uplink
    /// may hold frames already).
    pub(super) fn new(uplink: &dyn Uplink, receives: bool) -> Receiver {
        Receiver {
            bufs: (0..RX_BATCH).map(|_| vec![0u8; MAX_FRAME]).collect(),
            frames: Vec::with_capacity(RX_BATCH),
            more: receives,
            segments: uplink.icrc_offload().segments,
        }
    }

    /// Take what `uplink` (None: this worker does not receive) has, up to [`RX_BATCH`] buffers;
    /// on a port with segments in steps of [`SEGMENT_RX_STEP`] until [`SEGMENT_RX_BUDGET`]
    /// packets (a segment counts as the frames in it) so that the round's ACKs go back without
    /// waiting for a whole window's worth of segments (the peer's window keeps moving).
    pub(super) fn receive(&mut self, uplink: Option<&dyn Uplink>) {
        self.frames.clear();
        self.more = false;
        let Some(uplink) = uplink else {
            return;
        };
        let mut used = 0;
        let mut packets = 0;
        while used < RX_BATCH {
            let from = self.frames.len();
            let end = if self.segments {
                (used + SEGMENT_RX_STEP).min(RX_BATCH)
            } else {
                RX_BATCH
            };
            let Some(bufs) = self.bufs.get_mut(used..end) else {
                break;
            };
            match uplink.recv_batch(bufs, &mut self.frames) {
                Ok(0) => break,
                Ok(k) => {
                    for f in self.frames.iter_mut().skip(from) {
                        f.slot += used;
                    }
                    used += k;
                    if self.segments {
                        packets += self.packets_from(from);
                        if packets >= SEGMENT_RX_BUDGET {
                            self.more = true;
                            break;
                        }
                    }
                }
                Err(e) => {
                    guest_warn!("engine: uplink receive: {e}");
                    break;
                }
            }
        }
        if used == RX_BATCH {
            self.more = true;
        }
    }

    /// The packets in the buffers received from `frames[from]` on: a segment counts as the
    /// frames in it.
    fn packets_from(&self, from: usize) -> usize {
        self.frames
            .iter()
            .skip(from)
            .map(|f| {
                self.bytes(f)
                    .map_or(1, |b| crate::wire::segment::frame_count(b, f.segment))
            })
            .sum()
    }

    /// The received bytes of `frame`.
    pub(super) fn bytes(&self, frame: &RxFrame) -> Option<&[u8]> {
        received(&self.bufs, frame)
    }
}

/// The bytes of `frame` in `bufs` (a receive batch's buffers).
pub(super) fn received<'a>(bufs: &'a [Vec<u8>], frame: &RxFrame) -> Option<&'a [u8]> {
    bufs.get(frame.slot)
        .and_then(|b| b.get(frame.off..frame.off + frame.len))
}
