//! One engine worker: a thread that repeats a round of phases until the engine stops.
//!
//! 1. [`Worker::wait`]: until there is work (`wakeup.rs`);
//! 2. take the inbox: at most [`ROUND_DOORBELLS`] of the doorbell records queued for this
//!    worker (the rest wait for its next round) and the frames other workers routed it
//!    (`workers.rs`);
//! 3. receive (`receive.rs`, worker 0 only) and poll the link state (`link.rs`), before the
//!    device lock is taken;
//! 4. [`Worker::run_units`]: with the device lock shared, the units of work and the timers
//!    (`units.rs`, `route.rs`), then the outbox sorted (`outbox.rs`);
//! 5. after the lock is released: kick the workers this round gave work to, send to the
//!    uplink, publish the doorbell count the round covered (`Inbox::done`, what
//!    `EngineSender::fence` waits for), re-arm the timer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::link::LinkPoll;
use super::outbox::Outgoing;
use super::receive::Receiver;
use super::units::Batch;
use super::wakeup::{WaitFor, Waiter, Woken};
use super::EngineSender;
use crate::handoff::HandoffLock;
use crate::stats::PortStats;
use crate::sync::lock;
use crate::tables::UnitFence;
use crate::transport::doorbells::DoorbellBatch;
use crate::transport::workers::{Inbox, Routed};
use crate::transport::Device;
use crate::uplink::Uplink;

/// Doorbell records one round runs at most. A record makes its QP send up to a window of
/// packets (`requester::WINDOW`), so a device whose guest rang many QPs at once would
/// otherwise hold its thread for one long round, and an engine group thread's other devices
/// (`group.rs`) would wait for all of it: their rounds now come between its shares, as the
/// kernel's time slices come between threads of their own. Records left over wait in the
/// queue (still merging) for the worker's next round, which follows without a wake-up.
pub(super) const ROUND_DOORBELLS: usize = 32;

/// What a worker shares with the engine's other threads.
pub(super) struct Shared {
    /// The worker's index: worker 0 receives from the uplink.
    pub(super) index: usize,
    pub(super) dev: Arc<HandoffLock<Device>>,
    pub(super) uplink: Arc<dyn Uplink>,
    /// Every worker's inbox, this one's included, and the stop flag.
    pub(super) sender: EngineSender,
    pub(super) port: Arc<PortStats>,
    /// Where it publishes its units of work (`tables/units.rs`).
    pub(super) units: Arc<UnitFence>,
}

impl Shared {
    /// The worker's inbox (its index was checked in [`Worker::run`]).
    fn inbox(&self) -> &Inbox {
        &self.sender.inboxes[self.index]
    }
}

/// A worker thread's state, kept from round to round (the buffers keep their capacity).
pub(super) struct Worker {
    shared: Shared,
    waiter: Waiter,
    /// This is the worker that receives from the uplink (worker 0).
    receives: bool,
    /// Busy-polling is possible (`WaitFor::can_poll`): a worker that does not receive polls
    /// its inbox's flag only.
    can_poll: bool,
    /// The uplink swaps whole buffers in on receive (`Router::route_received`).
    swaps_buffers: bool,
    /// The uplink's link state, if it has one and this worker receives.
    link: Option<LinkPoll>,
    rx: Receiver,
    /// The last round left doorbell records queued ([`ROUND_DOORBELLS`]): the next round
    /// follows without a wait.
    doorbells_left: bool,
    /// Frames other workers routed to this one's QPs, swapped with the inbox's each round.
    routed: Vec<Routed>,
    outgoing: Outgoing,
}

impl Worker {
    /// Called on the worker's thread: what it allocates is the thread's.
    pub(super) fn new(shared: Shared, waiter: Waiter) -> Worker {
        let uplink = &*shared.uplink;
        let receives = shared.index == 0;
        let link = LinkPoll::of(uplink, receives);
        let rx = Receiver::new(uplink, receives);
        let swaps_buffers = uplink.rx_pending().is_some();
        let can_poll = waiter.polls() && (!receives || uplink.rx_pending().is_some());
        Worker {
            shared,
            waiter,
            receives,
            can_poll,
            swaps_buffers,
            link,
            rx,
            doorbells_left: false,
            routed: Vec::new(),
            outgoing: Outgoing::default(),
        }
    }

    /// The worker's life: rounds until the engine stops (or epoll fails).
    pub(super) fn run(mut self) {
        // Flushes of this worker's QPs run on this thread (`tables/flush.rs`).
        crate::tables::flush::enter_worker(self.shared.index);
        if self.shared.sender.inboxes.get(self.shared.index).is_none() {
            return;
        }
        loop {
            // Checked before every wait too, not only after one: the round that read the kick
            // eventfd may have consumed the kick of a stop stored after the last check, and the
            // next wait would then never end (seen once as a hung shutdown under strace).
            if self.stopping() {
                return;
            }
            let events = match self.wait() {
                Woken::Ready(n) => n,
                Woken::Interrupted => continue,
                Woken::Failed => return,
            };
            if self.stopping() {
                return;
            }
            self.round(events);
        }
    }

    pub(super) fn stopping(&self) -> bool {
        self.shared.sender.stop.load(Ordering::Acquire)
    }

    /// Is there work for a round, as far as it shows without a system call: a kick, frames
    /// left from the last round or waiting on the uplink, a timer or link poll that is due?
    /// (For a worker of an engine group; a kick's eventfd is read by the round.)
    pub(super) fn ready(&self, now: Instant) -> bool {
        let inbox = self.shared.inbox();
        self.rx.more
            || self.doorbells_left
            || !self.outgoing.looped.is_empty()
            || inbox.wake.work.load(Ordering::SeqCst)
            || (self.receives && self.shared.uplink.rx_pending() == Some(true))
            || self.waiter.due(now)
            || self.link.as_ref().is_some_and(|l| l.due(now))
    }

    /// Tell the wakers that a thread is about to look at this worker's flags without its
    /// eventfd (`true`), or that it no longer does (`false`; the Dekker pairs of `WakeFlags`
    /// and `fabric::rxqueue`: the caller checks [`Worker::ready`] once more after `false`).
    pub(super) fn set_polling(&self, polling: bool) {
        self.shared
            .inbox()
            .wake
            .polling
            .store(polling, Ordering::SeqCst);
        if self.receives {
            self.shared.uplink.set_rx_polling(polling);
        }
    }

    /// The worker's epoll fd (an engine group watches it).
    pub(super) fn epoll_fd(&self) -> std::os::unix::io::RawFd {
        self.waiter.epoll_fd()
    }

    /// How long an engine group may sleep for this worker (ms; -1: until an fd is readable).
    pub(super) fn timeout_ms(&self) -> i32 {
        match &self.link {
            Some(link) => link.timeout_ms(),
            None => -1,
        }
    }

    /// One round for an engine group: `from_epoll` if its epoll was readable (its events are
    /// taken first), else it was [`Worker::ready`]. False if the worker is to leave the group
    /// (stopping, or its epoll failed).
    pub(super) fn step(&mut self, from_epoll: bool) -> bool {
        if self.stopping() {
            return false;
        }
        let events = if from_epoll {
            match self.waiter.poll_now() {
                Woken::Ready(n) => n,
                Woken::Interrupted => return true,
                Woken::Failed => return false,
            }
        } else {
            self.waiter.clear_due(Instant::now());
            0
        };
        self.round(events);
        true
    }

    /// Wait unless the last round left frames on the uplink or looped back, or doorbell
    /// records queued; with a link state to poll, at most until the next poll.
    fn wait(&mut self) -> Woken {
        let busy = self.rx.more || self.doorbells_left || !self.outgoing.looped.is_empty();
        let timeout_ms = match &self.link {
            _ if busy => 0,
            Some(link) => link.timeout_ms(),
            None => -1,
        };
        let what = WaitFor {
            inbox: self.shared.inbox(),
            uplink: self.receives.then_some(&*self.shared.uplink),
            can_poll: self.can_poll,
            busy,
            timeout_ms,
        };
        self.waiter.wait(what)
    }

    /// One round after a wait that reported `events`: every phase but the wait.
    fn round(&mut self, events: usize) {
        self.waiter.take_events(events, self.shared.inbox());
        let dbs = {
            let mut queue = lock(&self.shared.inbox().queue);
            let dbs = queue.take_at_most(ROUND_DOORBELLS);
            self.doorbells_left = !queue.is_empty();
            dbs
        };
        self.shared.inbox().take_frames(&mut self.routed);
        let uplink = &*self.shared.uplink;
        self.rx.receive(self.receives.then_some(uplink));
        if let Some(link) = &mut self.link {
            link.poll(uplink, &self.shared.dev);
        }
        let (next, kicks) = self.run_units(&dbs);
        let me = self.shared.index;
        self.shared.sender.kick_workers(kicks & !(1 << me));
        self.outgoing.send(&*self.shared.uplink);
        // Its doorbells ran, their frames left (suspended: remembered for the resume sweep):
        // the records the batch covered, not those it left queued.
        self.shared
            .inbox()
            .done
            .store(dbs.received, Ordering::Release);
        self.outgoing.recycle();
        self.waiter.arm(next);
    }

    /// The round's work under the device lock: returns the next timer deadline and the other
    /// workers to kick.
    fn run_units(&mut self, dbs: &DoorbellBatch) -> (Option<Instant>, u32) {
        let Worker {
            shared,
            rx,
            routed,
            outgoing,
            swaps_buffers,
            ..
        } = self;
        let mut batch = Batch::start(shared, *swaps_buffers);
        batch.run_device_work();
        let mut batch = batch
            .run_doorbells(dbs)
            .run_routed(&mut outgoing.looped, routed)
            .run_received(rx);
        let next = if batch.live {
            let next = batch.tick();
            outgoing.drain(&mut batch);
            next
        } else {
            batch.suspended(dbs, &mut outgoing.looped, routed, rx);
            None
        };
        let kicks = batch.kicks;
        batch.end();
        (next, kicks)
    }
}
