//! Where a received buffer goes (the route step of the run-units phase): to another worker (a
//! QP's frames are all received by its own worker: its responder state is taken there, its
//! ACKs queued there; a multicast datagram goes to the worker of each attached QP), to the
//! transport (RoCEv2 for one of our GIDs), or to the guest's netdev (`DeviceOutput::eth_rx`,
//! what the port demux `port.rs` gives the guest).
//!
//! A fabric segment (spec §16.2 rule 6) is its frames, one after the other; only the port's
//! mark makes a buffer one. A by-reference segment goes to the transport with its references,
//! unless its frames are not for the engine: then they become bytes first (a guest's netdev
//! must never see a payload area unfilled).

use std::ops::Range;

use super::units::Batch;
use super::worker::Shared;
use crate::port::{classify_located, classify_with, Destination};
use crate::stats::{add, bump, PortStats};
use crate::sync::lock;
use crate::transport::packet::PayloadSrc;
use crate::transport::workers::{each_bit, owners, received_by, Inbox, Routed};
use crate::transport::{frames_of, Device, ReceiveRun};
use crate::uplink::RxFrame;
use crate::wire::frame::Gid;
use crate::wire::segment::SegRefs;

use super::receive::received;

/// Is `gid` one of the device's: a RoCEv2 GID of its table, or a multicast group a QP of it
/// joined? What the port's classification asks of every frame.
pub(super) fn is_ours(dev: &Device, gid: &Gid) -> bool {
    dev.gids.find_v2(gid).is_some() || dev.is_mcast_group(gid)
}

/// The workers (bit per worker, of `workers`) of the QPs attached to a multicast group.
pub(super) fn members(dev: &Device, workers: usize) -> impl Fn(&Gid) -> u32 + '_ {
    move |gid| dev.with_mcast_members(gid, |qpns| owners(qpns, workers))
}

/// Frame `k` of a segment as a by-reference payload source, if `refs` hold its payload; the
/// other frames of the segment carry their bytes.
pub(super) fn frame_refs(refs: &Option<SegRefs>, k: usize) -> Option<PayloadSrc<'_>> {
    refs.as_deref()
        .filter(|r| r.place(k).is_some())
        .map(|refs| PayloadSrc { refs, frame: k })
}

/// A by-reference payload no longer holds what it named (the sender's memory changed): the
/// buffer is dropped, counted as `drop_stale_ref`.
pub(super) struct StaleRef;

/// How one worker reaches the others.
pub(super) struct Router<'w> {
    inboxes: &'w [Inbox],
    /// This worker.
    pub(super) me: usize,
    /// How many workers the device has.
    pub(super) workers: usize,
    pub(super) port: &'w PortStats,
    /// The uplink is an in-memory queue whose `recv_batch` swaps whole buffers in (a fabric
    /// device port): a frame for another worker moves to it without a copy.
    swaps_buffers: bool,
}

impl<'w> Router<'w> {
    pub(super) fn new(shared: &'w Shared, swaps_buffers: bool) -> Router<'w> {
        Router {
            inboxes: &shared.sender.inboxes,
            me: shared.index,
            workers: shared.sender.inboxes.len(),
            port: &shared.port,
            swaps_buffers,
        }
    }

    /// This worker's bit.
    pub(super) fn my_bit(&self) -> u32 {
        1 << self.me
    }

    /// Ask every other worker to sweep its QPs (a device-wide resume sweep); returns them (to
    /// kick).
    pub(super) fn request_sweeps(&self) -> u32 {
        let mut asked = 0;
        for (i, other) in self
            .inboxes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.me)
        {
            lock(&other.queue).request_sweep();
            asked |= 1 << i;
        }
        asked
    }

    /// Hand `frame` (holding `count` frames) to worker `to`'s inbox; a full inbox drops it,
    /// counted as `drop_worker_busy`. True if routed (the caller kicks the worker).
    pub(super) fn route_to(&self, to: usize, frame: Routed, count: usize) -> bool {
        match self.inboxes.get(to).map(|i| i.push(frame)) {
            Some(Ok(())) => {
                add(&self.port.routed_to_worker, count);
                true
            }
            Some(Err(f)) => {
                f.recycle();
                add(&self.port.drop_worker_busy, count);
                false
            }
            None => false,
        }
    }

    /// Hand the received buffer `slot[at]` to each worker of `to` but this one
    /// (`received_by`); returns the workers routed to (to kick). A queue's buffer that the
    /// frame fills (`recv_batch` swapped it in) moves as it is to its only taker; a socket's
    /// receive buffer keeps its size for the next receive, and a multicast datagram for
    /// several workers is copied for each. References (`refs`) go with a buffer that has one
    /// taker only (multicast never has any).
    fn route_received(
        &self,
        to: u32,
        slot: &mut Vec<u8>,
        at: Range<usize>,
        segment: bool,
        refs: &mut Option<SegRefs>,
    ) -> u32 {
        let here = to & self.my_bit() != 0;
        let Some(buf) = slot.get(at.clone()) else {
            return 0;
        };
        let count = frames_of(buf, segment).count();
        let whole = self.swaps_buffers && at.start == 0 && at.end == slot.len();
        let mut routed = 0;
        // The buffer's frames count once in `rx_to_engine`: here when this worker takes it too
        // (its own delivery counts them), else with the first copy routed.
        let mut counted = here;
        let mut others = each_bit(to & !self.my_bit()).peekable();
        while let Some(o) = others.next() {
            let only = !here && others.peek().is_none();
            let buf = if only && whole {
                std::mem::replace(slot, crate::transport::packet::segment_buf())
            } else {
                let mut copy = crate::transport::packet::frame_buf();
                copy.clear();
                copy.extend_from_slice(slot.get(at.clone()).unwrap_or_default());
                copy
            };
            let refs = if only { refs.take() } else { None };
            if self.route_to(o, Routed { buf, segment, refs }, count) {
                if !counted {
                    add(&self.port.rx_to_engine, count);
                    counted = true;
                }
                routed |= 1 << o;
            }
        }
        routed
    }

    /// Give a frame the engine sent to its own device to the workers of `to` (`looped_to`):
    /// the others through their inboxes (returned, to kick), this one through `looped` (run in
    /// its next round). The last taker gets the frame itself, the others a copy.
    pub(super) fn loop_back(
        &self,
        frame: Vec<u8>,
        segment: bool,
        to: u32,
        looped: &mut Vec<Routed>,
    ) -> u32 {
        let here = to & self.my_bit() != 0;
        let count = frames_of(&frame, segment).count();
        let mut frame = Some(frame);
        let mut kicks = 0;
        let mut others = each_bit(to & !self.my_bit()).peekable();
        while let Some(o) = others.next() {
            let last = !here && others.peek().is_none();
            let buf = if last { frame.take() } else { frame.clone() };
            let Some(buf) = buf else { break };
            if self.route_to(o, Routed::plain(buf, segment), count) {
                kicks |= 1 << o;
            }
        }
        if let Some(frame) = frame.filter(|_| here) {
            looped.push(Routed::plain(frame, segment));
        }
        kicks
    }
}

impl Batch<'_> {
    /// Route one received buffer: its references kept or turned into bytes, the buffer
    /// routed to the workers of its QPs, and what is this worker's delivered.
    pub(super) fn route_received(&mut self, rx: &mut RxFrame, bufs: &mut [Vec<u8>]) {
        let Ok(mut refs) = self.keep_refs(rx, bufs) else {
            bump(&self.router.port.drop_stale_ref);
            return;
        };
        if self.router.workers > 1 && !self.hand_to_workers(rx, bufs, &mut refs) {
            if let Some(r) = refs {
                r.recycle();
            }
            return;
        }
        if let Some(buf) = received(bufs, rx) {
            self.deliver(buf, rx.segment, &refs, rx.source);
        }
        if let Some(r) = refs {
            r.recycle();
        }
    }

    /// The references of a by-reference segment whose frames are for the engine; those of any
    /// other buffer are materialized into its bytes (and given back).
    fn keep_refs(
        &self,
        rx: &mut RxFrame,
        bufs: &mut [Vec<u8>],
    ) -> Result<Option<SegRefs>, StaleRef> {
        let Some(refs) = rx.refs.take() else {
            return Ok(None);
        };
        let mac = self.dev.config.mac;
        let for_engine = received(bufs, rx)
            .and_then(|b| frames_of(b, rx.segment).next())
            .is_some_and(|f| {
                classify_with(f, &[mac], false, |g| is_ours(&self.dev, g)) == Destination::Engine
            });
        if rx.segment && for_engine {
            return Ok(Some(refs));
        }
        let filled = bufs
            .get_mut(rx.slot)
            .and_then(|b| b.get_mut(rx.off..rx.off + rx.len))
            .is_some_and(|b| crate::wire::segment::materialize(b, &*refs));
        refs.recycle();
        if filled {
            Ok(None)
        } else {
            Err(StaleRef)
        }
    }

    /// Hand the buffer to the other workers it is for (`received_by`), by-reference segments
    /// with their references; true if it is this worker's too.
    fn hand_to_workers(
        &mut self,
        rx: &RxFrame,
        bufs: &mut [Vec<u8>],
        refs: &mut Option<SegRefs>,
    ) -> bool {
        let (me, workers) = (self.router.me, self.router.workers);
        let mac = self.dev.config.mac;
        let to = received(bufs, rx).map_or(1 << me, |buf| {
            let ours = |g: &Gid| is_ours(&self.dev, g);
            received_by(
                buf,
                rx.segment,
                mac,
                ours,
                members(&self.dev, workers),
                me,
                workers,
            )
        });
        if let Some(slot) = bufs.get_mut(rx.slot).filter(|_| to != 1 << me) {
            let at = rx.off..rx.off + rx.len;
            self.kicks |= self.router.route_received(to, slot, at, rx.segment, refs);
        }
        to & self.router.my_bit() != 0
    }

    /// Deliver the frames of a received buffer: RoCEv2 for one of our GIDs to the transport,
    /// what the port gives the guest to its netdev (never the unfilled payload area of a
    /// by-reference frame; with `source`, the fabric port that sent it), the rest dropped.
    fn deliver(&self, buf: &[u8], segment: bool, refs: &Option<SegRefs>, source: Option<usize>) {
        let port = self.router.port;
        let mac = self.dev.config.mac;
        let mut run = ReceiveRun::default();
        for (k, frame) in frames_of(buf, segment).enumerate() {
            let (dest, located) = classify_located(frame, &[mac], false, |g| is_ours(&self.dev, g));
            match dest {
                Destination::Engine => {
                    bump(&port.rx_to_engine);
                    let src = frame_refs(refs, k);
                    match located {
                        Some(l) => crate::transport::on_located_in_run(
                            &self.dev, l, self.now, src, &mut run,
                        ),
                        None => {
                            run.finish(&self.dev);
                            crate::transport::on_frame_ref_at(&self.dev, frame, self.now, src)
                        }
                    }
                }
                Destination::Guest if frame_refs(refs, k).is_some() => bump(&port.drop_filtered),
                Destination::Guest => {
                    bump(&port.rx_to_guest);
                    self.dev.out.eth_rx(frame, source)
                }
                Destination::Drop => bump(&port.drop_filtered),
            }
        }
        run.finish(&self.dev);
    }
}
