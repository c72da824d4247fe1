//! Lock helpers shared by the whole daemon (ARCHITECTURE.md "Locks"). Poisoning is ignored
//! everywhere in the daemon: a panic in one thread leaves the state as consistent as the code
//! between two statements, and the device must keep serving its other QPs. Every lock is taken
//! through [`lock`], [`read`] or [`write`] (or [`unpoisoned`] for the rarer operations), so
//! that rule is written once.

use std::sync::{
    LockResult, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

pub mod asymmetric;
pub mod modeled;
#[cfg(test)]
pub(crate) mod overlap;

/// What a lock operation gives, whether or not a thread panicked holding the lock (a guard, the
/// value of `into_inner`, a condition variable's guard and timeout result).
pub fn unpoisoned<G>(r: LockResult<G>) -> G {
    r.unwrap_or_else(PoisonError::into_inner)
}

/// Lock `m`, ignoring poisoning.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    unpoisoned(m.lock())
}

/// Lock `l` shared, ignoring poisoning.
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    unpoisoned(l.read())
}

/// Lock `l` exclusively, ignoring poisoning.
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    unpoisoned(l.write())
}

/// The value of an exclusively borrowed mutex: no lock taken.
pub fn unlocked<T>(m: &mut Mutex<T>) -> &mut T {
    unpoisoned(m.get_mut())
}

/// A value that the engine workers reach through a shared device (each access locks it) and
/// control commands through the exclusively borrowed device (no lock).
#[derive(Debug, Default)]
pub struct Locked<T>(Mutex<T>);

impl<T> Locked<T> {
    pub fn new(v: T) -> Self {
        Locked(Mutex::new(v))
    }

    /// Lock for a short section. Never lock again while holding the guard (not re-entrant).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        lock(&self.0)
    }

    /// Through an exclusive borrow: no lock taken.
    pub fn get_mut(&mut self) -> &mut T {
        unlocked(&mut self.0)
    }

    pub fn into_inner(self) -> T {
        unpoisoned(self.0.into_inner())
    }
}

/// [`Locked`] for a value the engine workers mostly read: any number of readers at once
/// (`read`), a writer alone (`write`), no lock through an exclusive borrow (`get_mut`).
#[derive(Debug, Default)]
pub struct ReadMostly<T>(RwLock<T>);

impl<T> ReadMostly<T> {
    pub fn new(v: T) -> Self {
        ReadMostly(RwLock::new(v))
    }

    /// Shared, for a short section. Never lock again while holding the guard: a writer waiting
    /// in between would make the second read wait for it.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        read(&self.0)
    }

    /// Exclusive, for a short section.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        write(&self.0)
    }

    /// Through an exclusive borrow: no lock taken.
    pub fn get_mut(&mut self) -> &mut T {
        unpoisoned(self.0.get_mut())
    }

    pub fn into_inner(self) -> T {
        unpoisoned(self.0.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_access_locks_exclusive_access_does_not() {
        let mut l = Locked::new(1);
        *l.lock() += 1;
        *l.get_mut() += 1;
        assert_eq!(l.into_inner(), 3);
    }

    #[test]
    fn readers_share_a_read_mostly_value() {
        let mut l = ReadMostly::new(1);
        {
            let (a, b) = (l.read(), l.read());
            assert_eq!(*a + *b, 2);
        }
        *l.write() += 1;
        *l.get_mut() += 1;
        assert_eq!(l.into_inner(), 3);
    }

    #[test]
    fn a_poisoned_lock_still_serves() {
        let m = std::sync::Arc::new(Mutex::new(5));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 5);
    }
}
