//! The local-copy fence ([`UnitFence`]): which engine workers are inside a unit of work, so
//! that a command that takes memory access away (DEREG_MR, REREG_MR, DEALLOC_MW,
//! ODP_INVALIDATE) or destroys a CQ or an SRQ can run beside the workers instead of holding
//! the device exclusively (ARCHITECTURE.md "Invariants").
//!
//! A worker translates a key into guest ranges and copies through them within one unit (one
//! doorbell record, one received buffer) and keeps no range past its next hand-off point or
//! the end of its batch (the rule ODP invalidation already relies on). Each worker publishes a
//! sequence number, odd while it is inside a unit: it turns odd once the batch has the
//! device's shared lock, even at each hand-off point until the worker has its share back, and
//! even at the end of the batch. A command first changes the MR table under its write lock, so
//! no unit that starts later finds the old translation, releases that lock, then calls
//! [`UnitFence::wait`]: it waits for every worker whose number was odd to move it on. The
//! copies of the units that were in flight are then done; the other workers' copies never
//! started.
//!
//! The wait is for at most one unit per worker: each is one packet's or one WQE's work and
//! takes no lock the command holds (the command holds only the device's shared lock while it
//! waits). A worker waiting at a hand-off point for a writer queued behind the command is
//! between units, so the command does not wait for it, and on the exclusive device (where
//! every worker is at a hand-off point or outside its batch) the wait returns at once.

use std::time::Duration;

// Loom's types under `--cfg loom` (the model at the end of this file).
use crate::sync::modeled::{fence, lock, AtomicU32, AtomicU64, Condvar, Mutex, Ordering};

/// One worker's number, on a cache line of its own (each worker writes its own per unit).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Seq(AtomicU64);

/// How long a fence sleeps at most before it looks again by itself (a wake-up is never lost,
/// see [`UnitFence::wait`]; this only bounds the cost of a bug).
const RECHECK: Duration = Duration::from_millis(1);

/// See the module documentation. Without an engine (unit tests driving the device directly)
/// it has no workers and [`UnitFence::wait`] returns at once.
#[derive(Debug, Default)]
pub struct UnitFence {
    seqs: Box<[Seq]>,
    /// [`RECHECK`]; a test sets it long, so that only a wake-up can end a wait.
    recheck: Duration,
    /// Commands sleeping in [`UnitFence::wait`]: a worker that ends a unit wakes them. A fence
    /// sleeps instead of spinning because on a host with few cores its spinning would take
    /// the CPU from the very worker it waits for (measured: a DEREG_MR that had to wait took
    /// 34 µs at the 75th percentile spinning with `yield_now`, against 11 µs for the
    /// exclusive hand-off, `make bench` section `control-churn`).
    fencing: AtomicU32,
    sleep: Mutex<()>,
    wake: Condvar,
}

impl UnitFence {
    /// A fence for `workers` engine workers.
    pub fn new(workers: usize) -> Self {
        UnitFence {
            seqs: (0..workers).map(|_| Seq::default()).collect(),
            recheck: RECHECK,
            ..Default::default()
        }
    }

    /// Worker `w` starts a batch; it ends when the guard drops. A worker index without a slot
    /// is not tracked (the engine sizes the fence for its workers before they start).
    pub fn batch(&self, w: usize) -> Batch<'_> {
        let seq = self.seqs.get(w).map(|s| &s.0);
        if let Some(s) = seq {
            // Only this worker writes its number; SeqCst so that a command that removes a
            // translation after this store and then reads the number sees it odd.
            s.store(s.load(Ordering::Relaxed) | 1, Ordering::SeqCst);
        }
        Batch { fence: self, seq }
    }

    /// Wait until every worker that is inside a unit now has left it (see the module
    /// documentation). Call with no MR table, object or QP lock held.
    ///
    /// No wake-up is lost: the worker stores its number, fences and then reads `fencing`; the
    /// fence counts itself in `fencing`, fences and then reads the number under `sleep` (all
    /// SeqCst), so either the fence sees the new number or the worker sees `fencing` and
    /// notifies under `sleep`, which it cannot do between the fence's look and its sleep.
    pub fn wait(&self) {
        fence(Ordering::SeqCst);
        let busy: Vec<(&AtomicU64, u64)> = self
            .seqs
            .iter()
            .map(|s| (&s.0, s.0.load(Ordering::Acquire)))
            .filter(|(_, at)| at & 1 == 1)
            .collect();
        if busy.is_empty() {
            return;
        }
        self.fencing.fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `wake_fence` (see there).
        fence(Ordering::SeqCst);
        let mut g = lock(&self.sleep);
        while busy.iter().any(|(s, at)| s.load(Ordering::SeqCst) == *at) {
            g = crate::sync::unpoisoned(self.wake.wait_timeout(g, self.recheck)).0;
        }
        drop(g);
        self.fencing.fetch_sub(1, Ordering::SeqCst);
    }

    /// How many commands wait in [`UnitFence::wait`] now (tests ask).
    pub fn waiting(&self) -> u32 {
        self.fencing.load(Ordering::SeqCst)
    }

    /// Wake a fence that waits (called by a worker right after it moved its number on).
    fn wake_fence(&self) {
        // The worker's store of its number, then this fence, then the read of `fencing`; the
        // fence's count, its fence, then its read of the number: whichever fence comes first,
        // the other side sees the store before it. SeqCst accesses alone give the same in the
        // C++ model, but loom models them as AcqRel and only the fences as SeqCst, and its
        // model (`loom_model` below) is what shows that no wake-up is lost. On x86 it is one
        // `mfence` per unit, after the `xchg` of the store.
        fence(Ordering::SeqCst);
        if self.fencing.load(Ordering::SeqCst) != 0 {
            let _g = lock(&self.sleep);
            self.wake.notify_all();
        }
    }
}

/// A worker's batch (see [`UnitFence::batch`]).
#[derive(Debug)]
pub struct Batch<'a> {
    fence: &'a UnitFence,
    seq: Option<&'a AtomicU64>,
}

impl Batch<'_> {
    /// A hand-off point: the unit before it is over (its copies are done) until
    /// [`Batch::resume`].
    pub fn pause(&self) {
        self.step();
        self.fence.wake_fence();
    }

    /// The worker has its share of the device back: the next unit starts.
    pub fn resume(&self) {
        self.step();
    }

    /// Odd to even or even to odd (only this worker writes the number).
    fn step(&self) {
        if let Some(s) = self.seq {
            s.store(s.load(Ordering::Relaxed).wrapping_add(1), Ordering::SeqCst);
        }
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.step();
        self.fence.wake_fence();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    /// Wait until `flag` is set; false if `PATIENCE` passed first.
    fn wait_for(flag: &AtomicBool) -> bool {
        let t0 = Instant::now();
        while !flag.load(Ordering::SeqCst) {
            if t0.elapsed() > PATIENCE {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// How long the worker below keeps a unit (or a hand-off point) that the fence must not
    /// wait for, before it gives up and lets a wrong fence return: far beyond any scheduler
    /// delay; a correct fence ends the wait at once.
    const PATIENCE: Duration = Duration::from_secs(60);

    #[test]
    fn a_fence_waits_for_the_unit_in_flight_and_not_for_idle_workers() {
        // A fence that never looks again by itself: only the worker's wake-up ends its wait.
        let f = UnitFence {
            recheck: Duration::from_secs(600),
            ..UnitFence::new(2)
        };
        f.wait(); // nobody in a batch
        let (in_unit, done, paused) = (
            AtomicBool::new(false),
            AtomicBool::new(false),
            AtomicBool::new(false),
        );
        let (first_wait_over, second_wait_over) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|s| {
            let worker = s.spawn(|| {
                let b = f.batch(1);
                in_unit.store(true, Ordering::SeqCst);
                // The unit ends only once the fence waits for it; the moment lets the fence
                // reach its sleep, so that only the wake-up ends it (the loom model in this
                // module covers every interleaving of the two).
                while f.fencing.load(Ordering::SeqCst) == 0 {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_millis(50));
                // The unit's copy, then the hand-off point.
                done.store(true, Ordering::SeqCst);
                b.pause();
                b.resume();
                // The next unit lasts until the fence has returned: it must not wait for it.
                let next_unit_not_waited_for = wait_for(&first_wait_over);
                // A worker waiting at a hand-off point is between units.
                b.pause();
                paused.store(true, Ordering::SeqCst);
                let hand_off_not_waited_for = wait_for(&second_wait_over);
                b.resume();
                (next_unit_not_waited_for, hand_off_not_waited_for)
            });
            assert!(wait_for(&in_unit));
            f.wait();
            first_wait_over.store(true, Ordering::SeqCst);
            assert!(
                done.load(Ordering::SeqCst),
                "the fence returned inside the unit"
            );
            assert!(wait_for(&paused));
            f.wait();
            second_wait_over.store(true, Ordering::SeqCst);
            let (next_unit, hand_off) = worker.join().expect("worker");
            assert!(
                next_unit,
                "the wake-up was lost or the fence waited for the next unit"
            );
            assert!(
                hand_off,
                "the fence waited for a worker at a hand-off point"
            );
        });
        // The batch ended: nothing to wait for.
        f.wait();
        drop(f.batch(0));
        f.wait();
        // A worker index the fence was not sized for is not tracked.
        let _untracked = f.batch(7);
        f.wait();
    }
}

/// The loom model (issue 38 item 1): `RUSTFLAGS="--cfg loom" cargo test --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::Arc;

    /// Units each worker runs in one batch, with a hand-off point between them.
    const UNITS: usize = 2;

    /// Two workers, each in a batch of [`UNITS`] units that read a translation and copy
    /// through it, beside a command that removes the translation and then fences: when the
    /// fence returns, no unit still copies through the removed translation (the fence waited
    /// for every unit in flight), and the fence always returns (no wake-up is lost: loom's
    /// condvar never times out, so a lost one is a deadlock loom reports).
    #[test]
    fn loom_a_fence_waits_for_every_unit_in_flight_and_is_always_woken() {
        crate::sync::modeled::model(|| {
            let fence = Arc::new(UnitFence::new(2));
            // The MR table of the model: whether the translation was removed.
            let removed = Arc::new(Mutex::new(false));
            // Units copying through the old translation now.
            let copying = Arc::new(AtomicU32::new(0));
            let workers: Vec<_> = (0..2)
                .map(|w| {
                    let (fence, removed, copying) =
                        (fence.clone(), removed.clone(), copying.clone());
                    loom::thread::spawn(move || {
                        let b = fence.batch(w);
                        for unit in 0..UNITS {
                            if unit > 0 {
                                b.pause();
                                b.resume();
                            }
                            if !*lock(&removed) {
                                copying.fetch_add(1, Ordering::Relaxed);
                                // The copy.
                                copying.fetch_sub(1, Ordering::Release);
                            }
                        }
                    })
                })
                .collect();
            *lock(&removed) = true;
            fence.wait();
            assert_eq!(
                copying.load(Ordering::Acquire),
                0,
                "the fence returned while a unit copied through the removed translation"
            );
            for w in workers {
                w.join().expect("worker");
            }
        });
    }
}
