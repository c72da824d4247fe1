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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use crate::sync::{read, unpoisoned, write};

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
    /// ask.)
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
            std::thread::yield_now();
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

#[cfg(test)]
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
