//! The synchronisation primitives of the structures that have a loom model (issue 38 item 1):
//! std's in every normal build, loom's when the crate is built with `--cfg loom` (then the
//! model tests, `loom_*` in those modules, drive the real code through every interleaving loom
//! explores). Only the modules that use this are switched; the rest of the daemon keeps std's
//! types under `--cfg loom` too, since the vhost and vm-memory crates know nothing of loom.

#[cfg(not(loom))]
pub use std::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

#[cfg(loom)]
pub use loom::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// `std::thread::yield_now`, or loom's (a spinning loop must yield to loom, or the model
/// never lets the thread it waits for run).
pub fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// `std::hint::spin_loop`, or under loom a yield (as [`yield_now`]).
pub fn spin_loop() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

#[cfg(not(loom))]
pub use super::{lock, read, unlocked, write};

/// Lock `m`, ignoring poisoning (as [`super::lock`], for loom's `Mutex`).
#[cfg(loom)]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    super::unpoisoned(m.lock())
}

/// Lock `l` shared, ignoring poisoning (as [`super::read`], for loom's `RwLock`).
#[cfg(loom)]
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    super::unpoisoned(l.read())
}

/// Lock `l` exclusively, ignoring poisoning (as [`super::write`], for loom's `RwLock`).
#[cfg(loom)]
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    super::unpoisoned(l.write())
}

/// The value of an exclusively borrowed mutex (as [`super::unlocked`], for loom's `Mutex`).
#[cfg(loom)]
pub fn unlocked<T>(m: &mut Mutex<T>) -> &mut T {
    super::unpoisoned(m.get_mut())
}

/// Preemptions a model explores when `LOOM_MAX_PREEMPTIONS` does not say: enough for the
/// bugs the models were shown to catch, small enough for `make test`.
#[cfg(all(test, loom))]
const DEFAULT_PREEMPTIONS: usize = 3;

/// Branches of one execution (loom's default is 1000).
#[cfg(all(test, loom))]
const MAX_BRANCHES: usize = 100_000;

/// Run loom model `f`, bounded by `LOOM_MAX_PREEMPTIONS` (default [`DEFAULT_PREEMPTIONS`]).
#[cfg(all(test, loom))]
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = b.preemption_bound.or(Some(DEFAULT_PREEMPTIONS));
    // A sequence-lock reader that retries is a branch per retry.
    b.max_branches = b.max_branches.max(MAX_BRANCHES);
    b.check(f);
}
