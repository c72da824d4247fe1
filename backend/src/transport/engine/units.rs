//! The run-units phase of a worker's round: a [`Batch`] holds the device lock shared and runs
//! the round's units of work through the transport: a doorbell record, a buffer another worker
//! routed or the engine looped back, a received buffer (routed by `route.rs`). After each unit
//! is a hand-off point (`LongGuard::hand_off`): a control command that waits for the device
//! gets it there, so it waits for one unit of each worker, not for a batch of up to a receive
//! batch's buffers plus the timers. Then the timers run and the outbox is drained
//! (`outbox.rs`) while the lock is still held.
//!
//! A command may suspend the device at a hand-off point (spec §17.1): from then on the batch
//! touches neither guest memory nor the wire ([`Batch::live`] is false, the remaining units are
//! skipped and [`Batch::suspended`] drops what the round took).

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::receive::Receiver;
use super::route::Router;
use super::worker::Shared;
use crate::handoff::LongGuard;
use crate::tables::units;
use crate::transport::doorbells::DoorbellBatch;
use crate::transport::workers::Routed;
use crate::transport::Device;

/// Received frames handled per clock read: deadlines armed from the clock are at most that
/// many frames' work early.
const FRAMES_PER_CLOCK: usize = 16;

/// One worker's batch: its share of the device lock and what it owes the other workers.
pub(super) struct Batch<'w> {
    /// From here to the end of the batch this worker may copy through translations
    /// (`tables/units.rs`); a hand-off point ends a unit.
    unit: units::Batch<'w>,
    pub(super) dev: LongGuard<'w, Device>,
    /// The time for deadlines, read once per [`FRAMES_PER_CLOCK`] received frames and after
    /// a hand-off that released the lock, not per frame.
    pub(super) now: Instant,
    /// False once the device is suspended: at the start of the batch, or by a control command
    /// at a hand-off point.
    pub(super) live: bool,
    /// Where frames for other workers go.
    pub(super) router: Router<'w>,
    /// The other workers this batch routed frames or a sweep to (kicked after it).
    pub(super) kicks: u32,
}

impl<'w> Batch<'w> {
    /// Take the device lock shared for `shared`'s worker.
    pub(super) fn start(shared: &'w Shared, swaps_buffers: bool) -> Batch<'w> {
        let dev = shared.dev.lock_long();
        let unit = shared.units.batch(shared.index);
        let now = Instant::now();
        let live = !dev.suspended;
        Batch {
            unit,
            dev,
            now,
            live,
            router: Router::new(shared, swaps_buffers),
            kicks: 0,
        }
    }

    /// Release the device lock, the unit first (as at a hand-off point).
    pub(super) fn end(self) {
        let Batch { unit, dev, .. } = self;
        drop(unit);
        drop(dev);
    }

    /// A hand-off point (`LongGuard::hand_off`): a control command that waits for the device
    /// gets it here. After it the clock is read again if the lock was released, and
    /// [`Batch::live`] says whether the batch may go on: not when the command suspended the
    /// device.
    fn hand_off(mut self) -> Batch<'w> {
        // Between units while the share may be given up: a command fencing local copies beside
        // the workers (`tables/units.rs`) must not wait for a worker that waits for a writer
        // queued behind it.
        self.unit.pause();
        let (dev, released) = self.dev.hand_off();
        self.dev = dev;
        self.unit.resume();
        if released {
            self.now = Instant::now();
        }
        self.live = !self.dev.suspended;
        self
    }

    /// The work that is not a unit: this worker's QPs that another worker moved to ERR (a
    /// shared CQ overflowed, a shared SRQ broke) are flushed here, on their own worker
    /// (`tables/flush.rs`), and a device-wide resume sweep is split among the workers.
    pub(super) fn run_device_work(&mut self) {
        if !self.live {
            return;
        }
        self.dev.run_flushes();
        // A load first: the swap writes a line every worker reads each batch.
        if self.dev.resume_sweep.load(Ordering::Acquire)
            && self.dev.resume_sweep.swap(false, Ordering::SeqCst)
        {
            // Each worker sweeps its own QPs: the others get the request.
            self.kicks |= self.router.request_sweeps();
            self.sweep();
        }
    }

    /// Ring the SQ and RQ doorbells of every QP of this worker.
    fn sweep(&self) {
        let (me, workers) = (self.router.me, self.router.workers);
        crate::transport::on_worker_doorbells(&self.dev, &DoorbellBatch::sweep_only(), me, workers);
    }

    /// The doorbell records of the round, one unit each, then the sweep of an overflowed
    /// queue (`doorbells.rs`).
    pub(super) fn run_doorbells(mut self, dbs: &DoorbellBatch) -> Batch<'w> {
        if !self.live {
            return self;
        }
        for db in &dbs.records {
            crate::transport::on_doorbell(&self.dev, *db);
            self = self.hand_off();
            if !self.live {
                return self;
            }
        }
        if dbs.sweep {
            self.sweep();
        }
        self
    }

    /// The buffers the engine looped back last round, then those other workers routed this
    /// one: one unit each. Their frames are for the engine (the sender classified them).
    pub(super) fn run_routed(
        mut self,
        looped: &mut Vec<Routed>,
        routed: &mut Vec<Routed>,
    ) -> Batch<'w> {
        if !self.live {
            return self;
        }
        for buffer in looped.drain(..).chain(routed.drain(..)) {
            for (k, frame) in crate::transport::frames_of(&buffer.buf, buffer.segment).enumerate() {
                let src = super::route::frame_refs(&buffer.refs, k);
                crate::transport::on_frame_ref_at(&self.dev, frame, self.now, src);
            }
            buffer.recycle();
            self = self.hand_off();
            if !self.live {
                return self;
            }
        }
        self
    }

    /// The buffers received this round: one unit each, routed by `route.rs`.
    pub(super) fn run_received(mut self, rx: &mut Receiver) -> Batch<'w> {
        if !self.live {
            return self;
        }
        let Receiver { bufs, frames, .. } = rx;
        for (i, frame) in frames.iter_mut().enumerate() {
            if i > 0 {
                self = self.hand_off();
                if !self.live {
                    return self;
                }
            }
            if i % FRAMES_PER_CLOCK == FRAMES_PER_CLOCK - 1 {
                self.now = Instant::now();
            }
            self.route_received(frame, bufs);
        }
        self
    }

    /// Run the timers of this worker's QPs and the device's ODP timers; returns the next
    /// deadline. Wakes the workers with ODP resumptions of their QPs pending, and those whose
    /// QPs this batch moved to ERR (their workers flush them).
    pub(super) fn tick(&mut self) -> Option<Instant> {
        let (me, workers) = (self.router.me, self.router.workers);
        let transport = crate::transport::on_worker_tick(&self.dev, self.now, me);
        let odp = self.dev.odp_tick(self.now);
        if workers > 1 && self.dev.mrs.read().resumed_pending() {
            // ODP resumptions of other workers' QPs: each takes its own.
            self.kicks |= !(1u32 << me) & ((1u32 << workers) - 1);
        }
        let next = match (transport, odp) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.kicks |= self.dev.take_flush_kicks();
        next
    }

    /// Spec §17.1: a suspended device touches neither guest memory nor the wire. The round's
    /// received frames are lost (RC peers retransmit); its doorbells are handled by the sweep
    /// when the device resumes (also those of this batch not run yet).
    pub(super) fn suspended(
        &self,
        dbs: &DoorbellBatch,
        looped: &mut Vec<Routed>,
        routed: &mut Vec<Routed>,
        rx: &mut Receiver,
    ) {
        if !dbs.records.is_empty() || dbs.sweep {
            self.dev.resume_sweep.store(true, Ordering::SeqCst);
        }
        looped.clear();
        routed.clear();
        rx.frames.clear();
        self.dev.outbox(self.router.me).clear();
    }
}
