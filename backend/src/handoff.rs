//! A mutex whose long-running holder hands it to waiting short critical sections at points
//! it chooses (ARCHITECTURE.md "Threads").
//!
//! The device's state sits behind one lock that the engine holds for a whole batch (doorbells,
//! up to `RX_BATCH` received frames, timers), while a control command (MODIFY_QP, REG_MR, a
//! counters read) needs it for microseconds. With a plain mutex the command waits for the rest
//! of the batch: for other QPs' data path. Here the command announces itself before it blocks
//! ([`HandoffMutex::lock`]); the engine, between two units of work (one doorbell record, one
//! received buffer), calls [`LongGuard::hand_off`], which costs one atomic load when nobody
//! waits and otherwise releases the lock until one waiter has had it. A command therefore waits
//! for at most one unit of someone else's work, not for a batch.
//!
//! A plain release and re-lock would not do: the futex mutex is not fair, and the releasing
//! thread, still running, takes it back before the woken waiter is scheduled.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest a holder stays out of the lock for one hand-off. A waiter that announced itself
/// is normally given the lock within a scheduler slice; this only bounds the case where it is
/// descheduled for long on an overloaded host (the holder then carries on and hands off at its
/// next point).
const HANDOFF_LIMIT: Duration = Duration::from_millis(2);

/// See the module documentation. Poisoning is ignored, as everywhere in the daemon: a panic
/// in one thread leaves the device state as consistent as the code between two statements.
#[derive(Debug)]
pub struct HandoffMutex<T> {
    inner: Mutex<T>,
    /// Threads inside [`HandoffMutex::lock`] that have not got the lock yet.
    waiting: AtomicU32,
    /// Incremented by every [`HandoffMutex::lock`] once it holds the lock.
    granted: AtomicU64,
    /// The longest a holder stays out of the lock for one hand-off ([`HANDOFF_LIMIT`]).
    limit: Duration,
}

/// Un-counts a waiter even if `Mutex::lock` unwinds.
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<T> HandoffMutex<T> {
    pub fn new(value: T) -> Self {
        Self::with_limit(value, HANDOFF_LIMIT)
    }

    /// A lock whose holder waits up to `limit` per hand-off for a waiter to take it (tests that
    /// must see the hand-off on an overloaded machine give a long one).
    pub fn with_limit(value: T, limit: Duration) -> Self {
        HandoffMutex {
            inner: Mutex::new(value),
            waiting: AtomicU32::new(0),
            granted: AtomicU64::new(0),
            limit,
        }
    }

    /// Lock for a short critical section: a holder that calls [`LongGuard::hand_off`] gives
    /// the lock to this thread at its next hand-off point.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let counted = Waiting(&self.waiting);
        let g = self.lock_inner();
        self.granted.fetch_add(1, Ordering::SeqCst);
        drop(counted);
        g
    }

    /// Lock for a long holder (the engine's batch), which hands the lock off to
    /// [`HandoffMutex::lock`] callers at its own points ([`LongGuard::hand_off`]). It does not
    /// count as a waiter itself.
    pub fn lock_long(&self) -> LongGuard<'_, T> {
        LongGuard {
            guard: self.lock_inner(),
            lock: self,
        }
    }

    fn lock_inner(&self) -> MutexGuard<'_, T> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Did a thread panic while holding the lock? (The lock stays usable; tests ask.)
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// The value, once nobody else can lock it.
    pub fn into_inner(self) -> T {
        self.inner.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// Does a [`HandoffMutex::lock`] caller wait for the lock?
    pub fn contended(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) != 0
    }
}

/// The guard of a long holder ([`HandoffMutex::lock_long`]). It remembers its lock, so a
/// hand-off can only ever release the mutex this guard holds.
#[derive(Debug)]
pub struct LongGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    lock: &'a HandoffMutex<T>,
}

impl<'a, T> LongGuard<'a, T> {
    /// A hand-off point: if a [`HandoffMutex::lock`] caller waits, release the lock until one
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

impl<T> DerefMut for LongGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn uncontended_hand_off_keeps_the_lock() {
        let m = HandoffMutex::new(5u32);
        let g = m.lock_long();
        let (g, released) = g.hand_off();
        assert!(!released);
        assert_eq!(*g, 5);
    }

    #[test]
    fn a_waiter_gets_the_lock_at_the_next_hand_off_point() {
        // The holder keeps the lock except at hand-off points and counts the units of work it
        // did while the waiter was blocked; the waiter must get in after at most one of them.
        // A limit no scheduler delay on a loaded test machine reaches.
        let m = Arc::new(HandoffMutex::with_limit(
            Vec::<&'static str>::new(),
            Duration::from_secs(60),
        ));
        let started = Arc::new(AtomicBool::new(false));
        let mut g = m.lock_long();
        let waiter = {
            let (m, started) = (m.clone(), started.clone());
            std::thread::spawn(move || {
                started.store(true, Ordering::SeqCst);
                m.lock().push("waiter");
            })
        };
        while !started.load(Ordering::SeqCst) || !m.contended() {
            std::thread::yield_now();
        }
        g.push("unit before");
        let (mut g, released) = g.hand_off();
        assert!(released);
        g.push("unit after");
        drop(g);
        waiter.join().unwrap();
        let order = m.lock().clone();
        assert_eq!(order, ["unit before", "waiter", "unit after"]);
        assert!(!m.contended());
    }

    #[test]
    fn a_panicking_waiter_is_uncounted() {
        let m = Arc::new(HandoffMutex::new(0u32));
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
