//! An engine group (a fabric daemon's default; `--own-engine-threads` turns it off): the
//! devices of one daemon share engine threads, one
//! per worker index, instead of each device having a set of its own. A group thread runs the
//! rounds of all its member workers, one round each per pass while any of them has work, so a
//! frame that one device sends to another device of the same thread is taken up by the next
//! pass: no eventfd write, no wake-up, no second thread spinning against the first on a small
//! host (run to completion, issue [cost]).
//!
//! While the thread is awake after a busy-poll began, its members count as polling (their
//! `WakeFlags::polling` and uplinks' `set_rx_polling`): doorbells and the fabric then set flags
//! instead of writing eventfds. Before it sleeps it clears those flags and looks once more (the
//! Dekker pairs of `transport/workers.rs` and `fabric/rxqueue.rs`), then waits in an epoll that
//! watches each member's own epoll fd (epoll fds are themselves pollable) and the group's
//! mailbox, by which engines join.
//!
//! Only workers whose uplink tells without a system call whether frames wait (fabric device
//! ports), or that do not receive, can be members (`Engine::start_in`): the pass checks that
//! flag instead of the fd. Others get a thread of their own as without a group.
//!
//! Placement: a group has `slots` sets of those threads (`--shared-engine-threads`, by default
//! the CPUs the daemon may run on). The devices of one placement key (the daemon's: a tenant
//! network, whose devices can only talk among themselves) share a slot, so the frames between
//! them stay on one thread; a key seen first goes to the slot with the fewest devices, so
//! tenants spread over the CPUs and one tenant's rounds delay the devices of another only
//! when there are more networks than slots. A daemon places all its devices at once
//! ([`EngineGroup::plan`]), a network's only up to a fair share of the slots in one run, so
//! that many guests of one network (the default `net=0`) still spread over the CPUs.

use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::wakeup::Waiter;
use super::worker::{Shared, Worker};
use super::EngineError;
use crate::devlog::DeviceLog;
use crate::sync::lock;
use crate::transport::wait::Poller;
use crate::transport::workers::MAX_WORKERS;

/// The epoll token of a group's mailbox; members get tokens from 1 on.
const TOKEN_MAILBOX: u64 = 0;

/// Engine threads shared by the devices of one daemon (see the module documentation). Cheap to
/// clone; the threads stop when the last clone and every member's engine are gone.
#[derive(Clone)]
pub struct EngineGroup {
    inner: Arc<GroupInner>,
}

impl std::fmt::Debug for EngineGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineGroup").finish_non_exhaustive()
    }
}

struct GroupInner {
    /// `--poll-us` of the group's threads.
    poll: Duration,
    /// How many sets of threads the group places devices over.
    slots: usize,
    /// The thread of each slot and worker index (at `slot * MAX_WORKERS + index`), started
    /// when its first member joins.
    threads: Mutex<Vec<Option<GroupThread>>>,
    placement: Mutex<Placement>,
}

/// Where the devices went (see the module documentation): the slot of each key, and how many
/// devices each slot was given.
#[derive(Default)]
struct Placement {
    keys: Vec<(u64, usize)>,
    devices: Vec<usize>,
}

impl Placement {
    /// The slot of `key`: the one it was given, or for a key not seen yet the slot with the
    /// fewest devices (the first of them), which the key keeps.
    fn slot_of(&mut self, key: u64) -> usize {
        if let Some(&(_, slot)) = self.keys.iter().find(|(k, _)| *k == key) {
            return slot;
        }
        let slot = self.emptiest();
        self.keys.push((key, slot));
        slot
    }

    /// The slot with the fewest devices (the first of equals).
    fn emptiest(&self) -> usize {
        (0..self.devices.len())
            .min_by_key(|&s| self.devices[s])
            .unwrap_or(0)
    }

    /// One more device in `slot`.
    fn count(&mut self, slot: usize) {
        if let Some(n) = self.devices.get_mut(slot) {
            *n += 1;
        }
    }
}

/// A set of a group's threads, one per worker index, that a device's workers join
/// ([`EngineGroup::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSlot(usize);

impl GroupSlot {
    /// The slot's number, from 0.
    pub fn index(self) -> usize {
        self.0
    }
}

struct GroupThread {
    mailbox: Arc<Mailbox>,
    handle: Option<JoinHandle<()>>,
}

/// How engines reach a running group thread.
struct Mailbox {
    /// Workers to adopt, with what they need on the group thread; `None` once the thread
    /// has ended (a worker handed over then would never leave, and its engine's shutdown
    /// would wait for it forever).
    joining: Mutex<Option<Vec<Joining>>>,
    /// `joining` is not empty (checked every pass without the lock).
    pending: AtomicBool,
    /// The group is dropped: the thread ends once it has no member left.
    stop: AtomicBool,
    kick: EventFd,
}

/// A worker on its way into a group thread (built there: what it allocates is that thread's).
pub(super) struct Joining {
    pub(super) shared: Shared,
    pub(super) waiter: Waiter,
    pub(super) log: Option<Arc<DeviceLog>>,
    /// Dropped when the worker leaves the group: what its engine's shutdown waits for.
    pub(super) left: SyncSender<()>,
}

/// A worker the group thread runs.
struct Member {
    worker: Worker,
    log: Option<Arc<DeviceLog>>,
    token: u64,
    /// Its round failed for good (its epoll): it leaves as if stopping.
    failed: bool,
    _left: SyncSender<()>,
}

impl EngineGroup {
    /// A group of `slots` sets of threads (at least one) that busy-poll for at most `poll`
    /// (`--poll-us`) before they sleep.
    pub fn new(poll: Duration, slots: usize) -> EngineGroup {
        let slots = slots.max(1);
        EngineGroup {
            inner: Arc::new(GroupInner {
                poll,
                slots,
                threads: Mutex::new((0..slots * MAX_WORKERS).map(|_| None).collect()),
                placement: Mutex::new(Placement {
                    keys: Vec::new(),
                    devices: vec![0; slots],
                }),
            }),
        }
    }

    /// The slot for one more device of placement key `key`: its key's, or for a key not seen
    /// yet the slot with the fewest devices (the first of them).
    pub fn place(&self, key: u64) -> GroupSlot {
        let mut p = lock(&self.inner.placement);
        let slot = p.slot_of(key);
        p.count(slot);
        GroupSlot(slot)
    }

    /// The slot of each device of a daemon, placed at start-up in the order given by their
    /// placement keys. A key's devices share a slot only up to a fair share of the slots
    /// (`max(2, ceil(devices / slots))`): the next device of that key starts a run of its own,
    /// placed as a key not seen yet. Without that bound every guest of the default network
    /// (`net=0`) would share one thread per worker index, however many CPUs the host has.
    pub fn plan(&self, keys: &[u64]) -> Vec<GroupSlot> {
        let share = keys.len().div_ceil(self.inner.slots).max(2);
        let mut p = lock(&self.inner.placement);
        // Each key's current run: its slot and how many devices it holds so far.
        let mut runs: Vec<(u64, usize, usize)> = Vec::new();
        keys.iter()
            .map(|&key| {
                let run = runs.iter_mut().find(|(k, _, _)| *k == key);
                let slot = match run {
                    Some((_, slot, n)) if *n < share => {
                        *n += 1;
                        *slot
                    }
                    Some((_, slot, n)) => {
                        *slot = p.emptiest();
                        *n = 1;
                        *slot
                    }
                    None => {
                        let slot = p.slot_of(key);
                        runs.push((key, slot, 1));
                        slot
                    }
                };
                p.count(slot);
                GroupSlot(slot)
            })
            .collect()
    }

    /// The CPUs this process may run on: the slots a daemon's group has unless told
    /// (`--shared-engine-threads`).
    pub fn default_slots() -> usize {
        std::thread::available_parallelism().map_or(1, usize::from)
    }

    /// How many slots the group places devices over.
    pub fn slots(&self) -> usize {
        self.inner.slots
    }

    /// Hand a worker to the group thread of its slot and index (started on first use).
    pub(super) fn join(&self, at: GroupSlot, index: usize, j: Joining) -> Result<(), EngineError> {
        let mut threads = lock(&self.inner.threads);
        let slot = (index < MAX_WORKERS)
            .then(|| threads.get_mut(at.0 * MAX_WORKERS + index))
            .flatten()
            .ok_or(EngineError::Spawn(std::io::Error::other(
                "worker index or group slot out of range",
            )))?;
        if slot.is_none() {
            *slot = Some(GroupThread::start(at.0, index, self.inner.poll)?);
        }
        let Some(t) = slot.as_ref() else {
            return Err(EngineError::Spawn(std::io::Error::other(
                "group thread missing",
            )));
        };
        lock(&t.mailbox.joining)
            .as_mut()
            .ok_or(EngineError::Spawn(std::io::Error::other(
                "the engine group thread has ended",
            )))?
            .push(j);
        t.mailbox.pending.store(true, Ordering::SeqCst);
        // An eventfd write fails only if the counter would overflow: the thread is kicked.
        let _ = t.mailbox.kick.write(1);
        Ok(())
    }
}

impl Drop for GroupInner {
    fn drop(&mut self) {
        let threads = std::mem::take(crate::sync::unpoisoned(self.threads.get_mut()));
        for mut t in threads.into_iter().flatten() {
            t.mailbox.stop.store(true, Ordering::SeqCst);
            let _ = t.mailbox.kick.write(1);
            if let Some(h) = t.handle.take() {
                if h.join().is_err() {
                    log::error!("engine group thread panicked");
                }
            }
        }
    }
}

impl GroupThread {
    fn start(slot: usize, index: usize, poll: Duration) -> Result<GroupThread, EngineError> {
        let setup = |what| move |source| EngineError::Setup { what, source };
        let kick = EventFd::new(EFD_NONBLOCK).map_err(setup("eventfd"))?;
        let epoll = Epoll::new().map_err(setup("epoll"))?;
        epoll
            .ctl(
                ControlOperation::Add,
                kick.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TOKEN_MAILBOX),
            )
            .map_err(setup("epoll add eventfd"))?;
        let mailbox = Arc::new(Mailbox {
            joining: Mutex::new(Some(Vec::new())),
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            kick,
        });
        let m = Arc::clone(&mailbox);
        // Named as a device's worker of that index (what measures the engines' CPU finds
        // it), with the slot after an "s" from the second slot on (the kernel keeps 15 bytes:
        // two-digit index and slot lose the last digit).
        let name = match (slot, index) {
            (0, 0) => "vrdma-engine".to_string(),
            (0, i) => format!("vrdma-engine{i}"),
            (s, i) => format!("vrdma-engine{i}s{s}"),
        };
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || GroupLoop::new(index, m, epoll, poll).run())
            .map_err(EngineError::Spawn)?;
        Ok(GroupThread {
            mailbox,
            handle: Some(handle),
        })
    }
}

/// A group thread's state.
struct GroupLoop {
    mailbox: Arc<Mailbox>,
    epoll: Epoll,
    members: Vec<Member>,
    next_token: u64,
    poller: Poller,
    events: Vec<EpollEvent>,
    /// The members' polling flags are set (see the module documentation).
    polling: bool,
}

impl GroupLoop {
    fn new(index: usize, mailbox: Arc<Mailbox>, epoll: Epoll, poll: Duration) -> GroupLoop {
        // Flushes of the members' QPs of this index run on this thread (`tables/flush.rs`).
        crate::tables::flush::enter_worker(index);
        GroupLoop {
            mailbox,
            epoll,
            members: Vec::new(),
            next_token: TOKEN_MAILBOX + 1,
            poller: Poller::new(poll),
            events: vec![EpollEvent::default(); 32],
            polling: false,
        }
    }

    fn run(mut self) {
        self.serve();
        // Workers handed over but not adopted leave with the thread (their engines wait for
        // that), and no more are taken.
        lock(&self.mailbox.joining).take();
    }

    fn serve(&mut self) {
        loop {
            if self.mailbox.pending.load(Ordering::SeqCst) {
                self.adopt();
            }
            self.retire();
            if self.mailbox.stop.load(Ordering::SeqCst) && self.members.is_empty() {
                return;
            }
            if self.pass() {
                continue;
            }
            if self.spin() {
                continue;
            }
            if self.polling {
                self.set_polling(false);
                // The other half of the Dekker pairs: work that saw the flags set skipped
                // the eventfd, so it is seen here.
                if self.any_ready() {
                    continue;
                }
            }
            if !self.sleep() {
                return;
            }
        }
    }

    /// Build the workers that joined and watch their epoll fds.
    fn adopt(&mut self) {
        self.mailbox.pending.store(false, Ordering::SeqCst);
        let joining = lock(&self.mailbox.joining)
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        for j in joining {
            let _device = j.log.as_ref().map(crate::devlog::enter);
            let worker = Worker::new(j.shared, j.waiter);
            let token = self.next_token;
            self.next_token += 1;
            let added = self.epoll.ctl(
                ControlOperation::Add,
                worker.epoll_fd(),
                EpollEvent::new(EventSet::IN, token),
            );
            if let Err(e) = added {
                // Its engine sees it leave (`left` dropped) and the device gets no rounds:
                // said loudly, as a worker whose epoll fails.
                guest_error!("engine group: cannot watch a worker: {e}");
                continue;
            }
            worker.set_polling(self.polling);
            self.members.push(Member {
                worker,
                log: j.log,
                token,
                failed: false,
                _left: j.left,
            });
        }
    }

    /// Let the members whose engine stops leave (their engine's shutdown waits for that).
    fn retire(&mut self) {
        let leaves = |m: &Member| m.failed || m.worker.stopping();
        if !self.members.iter().any(leaves) {
            return;
        }
        let epoll = &self.epoll;
        self.members.retain(|m| {
            if !leaves(m) {
                return true;
            }
            m.worker.set_polling(false);
            let _ = epoll.ctl(
                ControlOperation::Delete,
                m.worker.epoll_fd(),
                EpollEvent::default(),
            );
            false
        });
    }

    /// One round of each member that has work; true if any ran.
    fn pass(&mut self) -> bool {
        let now = Instant::now();
        let mut ran = false;
        for m in &mut self.members {
            if m.worker.ready(now) {
                ran = true;
                let _device = m.log.as_ref().map(crate::devlog::enter);
                m.failed |= !m.worker.step(false);
            }
        }
        ran
    }

    fn any_ready(&self) -> bool {
        work_waiting(&self.mailbox, &self.members)
    }

    fn set_polling(&mut self, on: bool) {
        for m in &self.members {
            m.worker.set_polling(on);
        }
        self.polling = on;
    }

    /// Busy-poll the members' flags for the window (`Poller`); true if work showed up. The
    /// flags stay set while the rounds it finds run.
    fn spin(&mut self) -> bool {
        if !self.poller.enabled() || !self.poller.spins() || self.members.is_empty() {
            return false;
        }
        if !self.polling {
            self.set_polling(true);
        }
        let (members, mailbox) = (&self.members, &self.mailbox);
        self.poller.spin_until(|| work_waiting(mailbox, members))
    }

    /// Sleep in the group's epoll, then run the members whose epoll was readable. False if
    /// epoll failed (the thread ends; its members' engines see them leave).
    fn sleep(&mut self) -> bool {
        let timeout = self
            .members
            .iter()
            .map(|m| m.worker.timeout_ms())
            .filter(|&t| t >= 0)
            .min()
            .unwrap_or(-1);
        let t0 = self.poller.enabled().then(Instant::now);
        let n = match self.epoll.wait(timeout, &mut self.events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return true,
            Err(e) => {
                log::error!("engine group: epoll_wait: {e}");
                return false;
            }
        };
        if let Some(t0) = t0 {
            self.poller.slept(t0.elapsed());
        }
        for ev in self.events.iter().take(n) {
            let token = ev.data();
            if token == TOKEN_MAILBOX {
                let _ = self.mailbox.kick.read();
                continue;
            }
            if let Some(m) = self.members.iter_mut().find(|m| m.token == token) {
                let _device = m.log.as_ref().map(crate::devlog::enter);
                m.failed |= !m.worker.step(true);
            }
        }
        true
    }
}

/// A worker waits to join, or a member has work (`Worker::ready`).
fn work_waiting(mailbox: &Mailbox, members: &[Member]) -> bool {
    let now = Instant::now();
    mailbox.pending.load(Ordering::SeqCst) || members.iter().any(|m| m.worker.ready(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys keep their slot; a new key goes to the slot with the fewest devices (the first of
    /// equals); one slot takes everything; slots are counted from 0.
    #[test]
    fn placement_follows_keys_and_spreads_new_ones() {
        let g = EngineGroup::new(Duration::ZERO, 3);
        let slots: Vec<usize> = [7, 7, 8, 9, 7, 10, 8, 11]
            .iter()
            .map(|&k| g.place(k).index())
            .collect();
        // devices per slot as it goes: 7 -> 0 (1,0,0), 7 -> 0 (2,0,0), 8 -> 1 (2,1,0),
        // 9 -> 2 (2,1,1), 7 -> 0 (3,1,1), 10 -> 1 (3,2,1), 8 -> 1 (3,3,1), 11 -> 2.
        assert_eq!(slots, [0, 0, 1, 2, 0, 1, 1, 2]);
        assert_eq!(g.slots(), 3);
        let one = EngineGroup::new(Duration::ZERO, 0);
        assert_eq!(one.slots(), 1, "at least one slot");
        assert!((0..5).all(|k| one.place(k).index() == 0));
    }

    /// A daemon's plan: a network's devices share a slot up to max(2, ceil(devices/slots)),
    /// the next ones of that network go on as a network of their own (to the emptiest slot),
    /// and other networks still keep their slot.
    #[test]
    fn a_plan_spreads_one_large_network_in_runs() {
        let idx = |g: &EngineGroup, keys: &[u64]| -> Vec<usize> {
            g.plan(keys).iter().map(|s| s.index()).collect()
        };
        // Eight guests of net 0 on 2 slots: runs of 4.
        let g = EngineGroup::new(Duration::ZERO, 2);
        assert_eq!(idx(&g, &[0; 8]), [0, 0, 0, 0, 1, 1, 1, 1]);
        // Two guests on two slots: together (a run is at least 2).
        let g = EngineGroup::new(Duration::ZERO, 2);
        assert_eq!(idx(&g, &[0, 0]), [0, 0]);
        // Three guests on two slots: a pair and one.
        let g = EngineGroup::new(Duration::ZERO, 2);
        assert_eq!(idx(&g, &[0, 0, 0]), [0, 0, 1]);
        // Two networks of two: a slot each, interleaved or not.
        let g = EngineGroup::new(Duration::ZERO, 2);
        assert_eq!(idx(&g, &[0, 5, 0, 5]), [0, 1, 0, 1]);
        // Six devices of net 0 and two of net 7 on 4 slots: runs of 2.
        let g = EngineGroup::new(Duration::ZERO, 4);
        assert_eq!(idx(&g, &[0, 0, 0, 0, 0, 0, 7, 7]), [0, 0, 1, 1, 2, 2, 3, 3]);
        // One slot: everything there.
        let g = EngineGroup::new(Duration::ZERO, 1);
        assert_eq!(idx(&g, &[0, 0, 0, 3]), [0, 0, 0, 0]);
    }
}
