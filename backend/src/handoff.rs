//! A reader-writer lock whose long-running readers hand it to a waiting writer at points they
//! choose (ARCHITECTURE.md "Threads" and "Locks").
//!
//! The device's state sits behind one [`HandoffLock`]. Its engine workers hold it *shared* for
//! a whole batch (doorbells, up to `RX_BATCH` received frames, timers) and run at the same
//! time: what they change is behind per-object locks (a QP, a CQ, the MR table, their own
//! timer shard and outbox). A control command that needs every object quiet (a CREATE_QP that
//! grows the QPN index, SET_MEM_TABLE, a reset) holds it *exclusively* for microseconds and
//! needs no other lock. With a plain reader-writer lock the command would wait for the rest of
//! every worker's batch: for other QPs' data path. Here the command announces itself before it
//! blocks ([`HandoffLock::lock`]); each worker, between two units of work (one doorbell record,
//! one received buffer), calls [`LongGuard::hand_off`], which costs one atomic load when nobody
//! waits and otherwise releases its share until the writer has had the lock. A command
//! therefore waits for at most one unit of each worker's work, not for a batch.
//!
//! The standard library's lock prefers writers (a reader does not get in while a writer
//! waits), so a worker that gave its share up cannot take it straight back; it still waits
//! for the writer to have had the lock (or the limit), so that it does not spin on the lock
//! word while the writer waits for the other workers.

use std::ops::Deref;
use std::time::{Duration, Instant};

use crate::sync::modeled::{
    read, write, yield_now, AtomicU32, AtomicU64, Ordering, RwLock, RwLockReadGuard,
    RwLockWriteGuard,
};
use crate::sync::unpoisoned;

/// The longest a holder stays out of the lock for one hand-off. A waiter that announced itself
/// is normally given the lock within a scheduler slice; this only bounds the case where it is
/// descheduled for long on an overloaded host (the holder then carries on and hands off at its
/// next point).
const HANDOFF_LIMIT: Duration = Duration::from_millis(2);

/// See the module documentation. Poisoning is ignored, as everywhere in the daemon: a panic
/// in one thread leaves the device state as consistent as the code between two statements.
#[derive(Debug)]
pub struct HandoffLock<T> {
    inner: RwLock<T>,
    /// Threads inside [`HandoffLock::lock`] that have not got the lock yet.
    waiting: AtomicU32,
    /// Incremented by every [`HandoffLock::lock`] once it holds the lock.
    granted: AtomicU64,
    /// The longest a holder stays out of the lock for one hand-off ([`HANDOFF_LIMIT`]).
    limit: Duration,
}

/// Un-counts a waiter even if the lock call unwinds.
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<T> HandoffLock<T> {
    pub fn new(value: T) -> Self {
        Self::with_limit(value, HANDOFF_LIMIT)
    }

    /// A lock whose holders wait up to `limit` per hand-off for a waiter to take it (tests that
    /// must see the hand-off on an overloaded machine give a long one).
    pub fn with_limit(value: T, limit: Duration) -> Self {
        HandoffLock {
            inner: RwLock::new(value),
            waiting: AtomicU32::new(0),
            granted: AtomicU64::new(0),
            limit,
        }
    }

    /// Lock exclusively for a short critical section: every holder that calls
    /// [`LongGuard::hand_off`] gives the lock up at its next hand-off point.
    pub fn lock(&self) -> RwLockWriteGuard<'_, T> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let counted = Waiting(&self.waiting);
        let g = write(&self.inner);
        self.granted.fetch_add(1, Ordering::SeqCst);
        drop(counted);
        g
    }

    /// Lock shared for a long holder (an engine worker's batch), which hands the lock off to
    /// [`HandoffLock::lock`] callers at its own points ([`LongGuard::hand_off`]). Several long
    /// holders hold it at once. It does not count as a waiter itself.
    pub fn lock_long(&self) -> LongGuard<'_, T> {
        LongGuard {
            guard: read(&self.inner),
            lock: self,
        }
    }

    /// Lock shared for a short section that only reads (a query command): it runs beside the
    /// long holders and does not wait for their hand-off; it waits only while a
    /// [`HandoffLock::lock`] caller holds or waits for the lock.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        read(&self.inner)
    }

    /// Did a thread panic while holding the lock exclusively? (The lock stays usable; tests
    /// ask. Loom's lock has no poisoning: a panic ends the model.)
    #[cfg(not(loom))]
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// The value, once nobody else can lock it.
    pub fn into_inner(self) -> T {
        unpoisoned(self.inner.into_inner())
    }

    /// Does a [`HandoffLock::lock`] caller wait for the lock?
    pub fn contended(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) != 0
    }
}

/// The shared guard of a long holder ([`HandoffLock::lock_long`]). It remembers its lock, so a
/// hand-off can only ever release the lock this guard holds.
#[derive(Debug)]
pub struct LongGuard<'a, T> {
    guard: RwLockReadGuard<'a, T>,
    lock: &'a HandoffLock<T>,
}

impl<'a, T> LongGuard<'a, T> {
    /// A hand-off point: if a [`HandoffLock::lock`] caller waits, release the lock until one
    /// of them has had it (or the lock's limit passed, [`HANDOFF_LIMIT`] by default), then take
    /// it again. Returns the guard and whether the lock was released: if it was, whatever the
    /// holder derived from the state before may be stale (the waiter may have reset or
    /// suspended the device).
    pub fn hand_off(self) -> (Self, bool) {
        let lock = self.lock;
        if !lock.contended() {
            return (self, false);
        }
        let before = lock.granted.load(Ordering::SeqCst);
        drop(self);
        let t0 = Instant::now();
        while lock.contended()
            && lock.granted.load(Ordering::SeqCst) == before
            && t0.elapsed() < lock.limit
        {
            // The waiter needs a CPU to run on; on a host with few cores it is this one.
            yield_now();
        }
        (lock.lock_long(), true)
    }
}

impl<T> Deref for LongGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn uncontended_hand_off_keeps_the_lock() {
        let m = HandoffLock::new(5u32);
        let g = m.lock_long();
        let (g, released) = g.hand_off();
        assert!(!released);
        assert_eq!(*g, 5);
    }

    /// What the tests' holders and waiters record, in order (the lock's value; shared holders
    /// change it through its own mutex, as workers change the device's objects).
    type Log = std::sync::Mutex<Vec<&'static str>>;

    fn log(l: &Log, what: &'static str) {
        l.lock().unwrap().push(what);
    }

    #[test]
    fn a_waiter_gets_the_lock_at_the_next_hand_off_point() {
        // The holder keeps the lock except at hand-off points and records the units of work it
        // did while the waiter was blocked; the waiter must get in after at most one of them.
        // A limit no scheduler delay on a loaded test machine reaches.
        let m = Arc::new(HandoffLock::with_limit(
            Log::default(),
            Duration::from_secs(60),
        ));
        let started = Arc::new(AtomicBool::new(false));
        let g = m.lock_long();
        let waiter = {
            let (m, started) = (m.clone(), started.clone());
            std::thread::spawn(move || {
                started.store(true, Ordering::SeqCst);
                m.lock().get_mut().unwrap().push("waiter");
            })
        };
        while !started.load(Ordering::SeqCst) || !m.contended() {
            std::thread::yield_now();
        }
        log(&g, "unit before");
        let (g, released) = g.hand_off();
        assert!(released);
        log(&g, "unit after");
        drop(g);
        waiter.join().unwrap();
        let order = m.lock().get_mut().unwrap().clone();
        assert_eq!(order, ["unit before", "waiter", "unit after"]);
        assert!(!m.contended());
    }

    #[test]
    fn long_holders_share_the_lock_and_a_writer_waits_for_each_hand_off() {
        let m = Arc::new(HandoffLock::with_limit(
            Log::default(),
            Duration::from_secs(60),
        ));
        // Two long holders at once (a lock that did not share would block here).
        let a = m.lock_long();
        let b = m.lock_long();
        log(&a, "a");
        log(&b, "b");
        let waiter = {
            let m = m.clone();
            std::thread::spawn(move || m.lock().get_mut().unwrap().push("writer"))
        };
        while !m.contended() {
            std::thread::yield_now();
        }
        // `a` gives its share up; the writer still waits for `b`, so `a` cannot get back in
        // before the writer either.
        let a_back = {
            let m = m.clone();
            std::thread::spawn(move || {
                let (a, released) = a_hand_off(&m);
                log(&a, "a after");
                released
            })
        };
        drop(a);
        std::thread::sleep(Duration::from_millis(20));
        log(&b, "b before its hand-off");
        let (b, released) = b.hand_off();
        assert!(released);
        log(&b, "b after");
        drop(b);
        waiter.join().unwrap();
        assert!(a_back.join().unwrap());
        let order = m.lock().get_mut().unwrap().clone();
        let at = |w: &str| order.iter().position(|o| *o == w).unwrap();
        assert!(at("b before its hand-off") < at("writer"), "{order:?}");
        assert!(
            at("writer") < at("a after") && at("writer") < at("b after"),
            "{order:?}"
        );
    }

    /// A long holder that arrives while a writer waits and hands off at once.
    fn a_hand_off(m: &HandoffLock<Log>) -> (LongGuard<'_, Log>, bool) {
        // The writer is waiting: the read below waits for it (writers are preferred).
        let g = m.lock_long();
        let contended = m.contended();
        let (g, _) = g.hand_off();
        (g, !contended)
    }

    #[test]
    fn a_panicking_waiter_is_uncounted() {
        let m = Arc::new(HandoffLock::new(0u32));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("poison it");
        })
        .join();
        assert!(!m.contended());
        // Poisoned, but still usable.
        *m.lock() += 1;
        assert_eq!(*m.lock_long(), 1);
    }
}

/// The loom model (issue 38 item 1): `RUSTFLAGS="--cfg loom" cargo test --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::Arc;

    /// Units each long holder runs in one batch, with a hand-off point between two of them.
    const UNITS: usize = 2;

    /// A hand-off limit no model execution reaches: the model checks the hand-off itself, not
    /// the bound on an overloaded host (loom's executions take microseconds of real time).
    const NEVER: Duration = Duration::from_secs(3600);

    /// One engine worker's batch: `units` units with a hand-off point between two of them.
    /// The lock's value counts the writer's critical sections.
    fn batch(lock: &HandoffLock<u32>, units: usize) {
        let mut g = lock.lock_long();
        // A writer seen waiting at the start of the previous unit.
        let mut saw_waiter = false;
        for unit in 0..units {
            if unit > 0 {
                let before = *g;
                let (after, released) = g.hand_off();
                g = after;
                if released {
                    assert_eq!(
                        *g, 1,
                        "the holder took its share back before the writer had the lock"
                    );
                } else {
                    assert_eq!(
                        *g, before,
                        "the writer got in at a hand-off that kept the lock"
                    );
                }
                assert!(
                    !saw_waiter || released,
                    "a writer that waited during a unit was not let in at the next hand-off point"
                );
            }
            // While this holder has its share the writer cannot be in, so a waiter seen here
            // waits for this holder's next hand-off point (a unit of work follows).
            saw_waiter = lock.contended();
        }
    }

    /// An engine worker's batch (a long holder) beside a control command that takes the lock
    /// exclusively: a writer seen waiting during a unit is let in at the holder's next
    /// hand-off point, a hand-off that says it released the lock returns only after the
    /// writer has had it, one that says it kept the lock let nobody in, the writer always
    /// gets the lock (a lost hand-off is a deadlock loom reports, a holder left spinning in
    /// its hand-off exceeds loom's branch limit), and no waiter stays counted once it has the
    /// lock.
    #[test]
    fn loom_a_waiting_writer_gets_the_lock_at_the_next_hand_off_point() {
        crate::sync::modeled::model(|| {
            let lock = Arc::new(HandoffLock::with_limit(0u32, NEVER));
            let worker = {
                let lock = lock.clone();
                loom::thread::spawn(move || batch(&lock, UNITS))
            };
            *lock.lock() += 1;
            worker.join().expect("worker");
            assert!(
                !lock.contended(),
                "a waiter stayed counted after it had the lock"
            );
            assert_eq!(*lock.read(), 1);
        });
    }

    /// Two workers' batches beside the command: one hands off between two units while the
    /// other runs a one-unit batch, so the writer waits for both, and the worker that gave its
    /// share up must not take it back before the writer had the lock. Loom's lock lets a
    /// reader in beside a waiting writer (std's promises no policy either), so only the
    /// hand-off's own wait keeps that worker out.
    #[test]
    fn loom_a_hand_off_beside_another_holder_waits_for_the_writer() {
        crate::sync::modeled::model(|| {
            let lock = Arc::new(HandoffLock::with_limit(0u32, NEVER));
            let workers: Vec<_> = [UNITS, 1]
                .into_iter()
                .map(|units| {
                    let lock = lock.clone();
                    loom::thread::spawn(move || batch(&lock, units))
                })
                .collect();
            *lock.lock() += 1;
            for w in workers {
                w.join().expect("worker");
            }
            assert!(
                !lock.contended(),
                "a waiter stayed counted after it had the lock"
            );
            assert_eq!(*lock.read(), 1);
        });
    }
}
