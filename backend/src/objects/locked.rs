//! A handle table whose objects each have their own lock ([`LockedTable`]): the CQs and SRQs,
//! which QPs of different engine workers post to and take from (ARCHITECTURE.md "Locks").
//! Through an exclusively borrowed table (control commands, which hold the device lock) nothing
//! is locked; through a shared one every access locks only the object it names.

use std::sync::{Mutex, MutexGuard};

use crate::sync::{lock, unlocked};

use super::HandleTable;

/// [`HandleTable`] with a `Mutex` per object (see the module documentation).
#[derive(Debug)]
pub struct LockedTable<T>(HandleTable<Mutex<T>>);

impl<T> LockedTable<T> {
    pub fn new(max: u32) -> Self {
        LockedTable(HandleTable::new(max))
    }

    /// Insert; `None` when the table is full.
    pub fn insert(&mut self, v: T) -> Option<u32> {
        self.0.insert(Mutex::new(v))
    }

    /// Insert the object `f` builds from its handle; `None` when the table is full.
    pub fn insert_with(&mut self, f: impl FnOnce(u32) -> T) -> Option<u32> {
        self.0.insert_with(|h| Mutex::new(f(h)))
    }

    /// Object `h`, locked until the guard drops. Never lock an object while holding its guard:
    /// the lock is not re-entrant.
    pub fn get(&self, h: u32) -> Option<MutexGuard<'_, T>> {
        self.0.get(h).map(lock)
    }

    /// Object `h` through the exclusively borrowed table: no lock taken.
    pub fn get_mut(&mut self, h: u32) -> Option<&mut T> {
        self.0.get_mut(h).map(unlocked)
    }

    pub fn contains(&self, h: u32) -> bool {
        self.0.contains(h)
    }

    pub fn remove(&mut self, h: u32) -> Option<T> {
        self.0
            .remove(h)
            .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn len(&self) -> u32 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn max(&self) -> u32 {
        self.0.max()
    }

    /// Every live object with its handle, each locked while the iteration is at it.
    pub fn iter(&self) -> impl Iterator<Item = (u32, MutexGuard<'_, T>)> {
        self.0.iter().map(|(h, m)| (h, lock(m)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.0.iter_mut().map(|(h, m)| (h, unlocked(m)))
    }

    /// See [`HandleTable::restore`].
    pub fn restore(&mut self, entries: Vec<(u32, T)>) -> Result<(), u32> {
        let entries = entries.into_iter().map(|(h, v)| (h, Mutex::new(v)));
        self.0.restore(entries.collect())
    }

    /// Remove everything (device reset); handle numbering starts over.
    pub fn clear(&mut self) {
        self.0.clear()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_reached_locked_or_through_the_exclusive_table() {
        let mut t: LockedTable<u32> = LockedTable::new(2);
        let a = t.insert(10).unwrap();
        let b = t.insert_with(|h| h * 100).unwrap();
        assert_eq!(t.insert(1), None, "limit");
        *t.get(a).unwrap() += 1;
        *t.get_mut(b).unwrap() += 1;
        let all: Vec<(u32, u32)> = t.iter().map(|(h, v)| (h, *v)).collect();
        assert_eq!(all, vec![(a, 11), (b, b * 100 + 1)]);
        assert_eq!(t.remove(a), Some(11));
        assert!(t.get(a).is_none() && !t.contains(a));
        t.restore(vec![(2, 7)]).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(*t.get(2).unwrap(), 7);
    }
}
