//! Device objects other than QPs and MRs: PDs, XRC domains, CQs, SRQs, AHs, the GID table and
//! the multicast groups.

pub mod ah;
pub mod cq;
pub mod gid;
pub mod locked;
pub mod mcast;
pub mod pd;
pub mod srq;
pub mod xrcd;

pub use ah::{Ah, AhTable};
pub use cq::{Cq, CqError};
pub use gid::{GidEntry, GidTable};
pub use locked::{LockedTable, SlotGuard};
pub use mcast::{is_multicast_gid, McastError, McastTable};
pub use pd::{Pd, PdTable};
pub use srq::{Srq, SrqXrc};
pub use xrcd::{Xrcd, XrcdTable};

use std::collections::VecDeque;

/// A handle table: handles are 1..=max (0 is never a valid handle); freed handles are reused in
/// FIFO order so a just-destroyed handle is not handed out again immediately.
#[derive(Debug, Clone)]
pub struct HandleTable<T> {
    slots: Vec<Option<T>>,
    free: VecDeque<u32>,
    max: u32,
    count: u32,
}

impl<T> HandleTable<T> {
    pub fn new(max: u32) -> Self {
        HandleTable {
            slots: vec![None],
            free: VecDeque::new(),
            max,
            count: 0,
        }
    }

    /// Insert; `None` when the table is full.
    pub fn insert(&mut self, v: T) -> Option<u32> {
        self.insert_with(|_| v)
    }

    /// Insert with a handle chosen by `f(handle)` (to store the handle inside the object).
    pub fn insert_with(&mut self, f: impl FnOnce(u32) -> T) -> Option<u32> {
        if self.count >= self.max {
            return None;
        }
        let h = match self.free.pop_front() {
            Some(h) => h,
            None => {
                let h = u32::try_from(self.slots.len()).ok()?;
                self.slots.push(None);
                h
            }
        };
        self.slots[h as usize] = Some(f(h));
        self.count += 1;
        Some(h)
    }

    pub fn get(&self, h: u32) -> Option<&T> {
        self.slots.get(h as usize).and_then(|s| s.as_ref())
    }

    pub fn get_mut(&mut self, h: u32) -> Option<&mut T> {
        self.slots.get_mut(h as usize).and_then(|s| s.as_mut())
    }

    pub fn contains(&self, h: u32) -> bool {
        self.get(h).is_some()
    }

    pub fn remove(&mut self, h: u32) -> Option<T> {
        let v = self.slots.get_mut(h as usize)?.take()?;
        self.free.push_back(h);
        self.count -= 1;
        Some(v)
    }

    pub fn len(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    /// Every live object with its handle.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|v| (i as u32, v)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|v| (i as u32, v)))
    }

    /// Fill an empty table with objects at given handles (migration, spec §17.3). Fails, and
    /// leaves the table empty, on handle 0, a duplicate, or more objects than `max`; the free
    /// list is every unused handle below the highest one, in ascending order.
    pub fn restore(&mut self, entries: Vec<(u32, T)>) -> Result<(), u32> {
        self.clear();
        let top = restore_top(&entries, self.max)?;
        let mut slots: Vec<Option<T>> = Vec::new();
        slots.resize_with(top as usize + 1, || None);
        let mut count = 0;
        for (h, v) in entries {
            let slot = &mut slots[h as usize];
            if slot.is_some() {
                return Err(h);
            }
            *slot = Some(v);
            count += 1;
        }
        self.free = (1..slots.len() as u32)
            .filter(|&h| slots[h as usize].is_none())
            .collect();
        self.slots = slots;
        self.count = count;
        Ok(())
    }

    /// Remove everything (device reset); handle numbering starts over.
    pub fn clear(&mut self) {
        self.slots = vec![None];
        self.free.clear();
        self.count = 0;
    }
}

/// The highest handle of a table's migrated objects (`restore`), or the offending handle (0
/// for too many objects): each handle in 1..=max, at most `max` objects. `insert` hands out
/// no handle above `max`, so a state that has one is not ours.
fn restore_top<T>(entries: &[(u32, T)], max: u32) -> Result<u32, u32> {
    if entries.len() as u64 > u64::from(max) {
        return Err(0);
    }
    if let Some((h, _)) = entries.iter().find(|(h, _)| *h == 0 || *h > max) {
        return Err(*h);
    }
    Ok(entries.iter().map(|(h, _)| *h).max().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_start_at_one_limit_and_fifo_reuse() {
        let mut t: HandleTable<&str> = HandleTable::new(3);
        assert_eq!(t.insert("a"), Some(1));
        assert_eq!(t.insert("b"), Some(2));
        assert_eq!(t.insert_with(|h| if h == 3 { "c" } else { "?" }), Some(3));
        assert_eq!(t.insert("d"), None, "limit");
        assert!(t.get(0).is_none());
        assert_eq!(t.remove(2), Some("b"));
        assert_eq!(t.remove(2), None);
        assert_eq!(t.remove(1), Some("a"));
        assert_eq!(t.insert("e"), Some(2), "FIFO: the first freed handle first");
        assert_eq!(t.insert("f"), Some(1));
        assert_eq!(t.len(), 3);
        assert_eq!(
            t.iter().map(|(h, v)| (h, *v)).collect::<Vec<_>>(),
            vec![(1, "f"), (2, "e"), (3, "c")]
        );
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.insert("g"), Some(1));
    }
}
