//! A handle table whose objects each have their own lock and whose shape a shared borrow can
//! grow ([`LockedTable`]): the PDs, XRC domains, CQs and SRQs. The engine workers lock the CQs
//! and SRQs their QPs post to and take from (ARCHITECTURE.md "Locks"), and the commands that
//! create or destroy one of these objects run beside them (`Device::handle_shared`), so a
//! lookup takes no table lock: the slots live in segments that are allocated once and never
//! move.
//!
//! Handles are 1..=max (0 is never valid). A freed handle is reused only once
//! [`REUSE_DEPTH`] handles are free (or every handle up to `max` has been used), oldest first:
//! a number a worker still has from the wire or a timer (an XRC packet names its SRQ, a CQ
//! moderation deadline its CQ) then does not name a new object the moment after a destroy.
//! Handles stay below the live objects plus `REUSE_DEPTH`, so the slots stay bounded.
//! Removal works through a shared borrow too: the destroy commands run beside the workers and
//! check that nothing refers to the object (BUSY) and, for CQs and SRQs, wait for the units of
//! work in flight (`tables/units.rs`) before they answer.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
// Segments are published once through std's `OnceLock` also under loom: only inserts, which
// hold the allocation mutex (loom's), initialise one, and a lookup of a handle that was never
// handed out finds none either way.
use std::sync::OnceLock;

// Loom's types under `--cfg loom` (the model at the end of this file).
use crate::sync::modeled::{lock, unlocked, AtomicBool, AtomicU32, Mutex, MutexGuard, Ordering};

/// Slots in segment 0; segment `k` has `FIRST_SEGMENT << k`, so a table holds at most twice
/// the slots it has used, and handle 0's slot (never used) is the only waste.
const FIRST_SEGMENT: u64 = 64;
/// Freed handles kept back before the oldest is handed out again (see the module
/// documentation).
pub const REUSE_DEPTH: usize = 16;
/// Enough segments for every `u32` handle: `FIRST_SEGMENT * (2^SEGMENTS - 1) > u32::MAX`.
const SEGMENTS: usize = 27;

/// One handle's slot. `live` mirrors whether `obj` holds an object, so `contains` needs no
/// lock (a caller may hold the object's guard).
struct Slot<T> {
    live: AtomicBool,
    obj: Mutex<Option<T>>,
}

impl<T> Slot<T> {
    fn new() -> Self {
        Slot {
            live: AtomicBool::new(false),
            obj: Mutex::new(None),
        }
    }
}

/// Which handles have been handed out.
#[derive(Debug)]
struct Alloc {
    /// Freed handles, oldest first.
    free: VecDeque<u32>,
    /// The next never-used handle.
    next: u32,
}

/// See the module documentation.
pub struct LockedTable<T> {
    segments: [OnceLock<Box<[Slot<T>]>>; SEGMENTS],
    /// Taken by inserts only (they may come from a shared borrow); lookups never take it.
    alloc: Mutex<Alloc>,
    count: AtomicU32,
    max: u32,
}

impl<T> std::fmt::Debug for LockedTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockedTable")
            .field("count", &self.len())
            .field("max", &self.max)
            .finish()
    }
}

/// An object of a [`LockedTable`], locked until the guard drops.
pub struct SlotGuard<'a, T>(MutexGuard<'a, Option<T>>);

impl<T> Deref for SlotGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // A guard is made only for a slot found holding an object under this same lock, and
        // only the exclusive borrow (which no guard outlives) empties a slot.
        self.0
            .as_ref()
            .expect("a slot guard is made only for an occupied slot")
    }
}

impl<T> DerefMut for SlotGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // As in `deref`.
        self.0
            .as_mut()
            .expect("a slot guard is made only for an occupied slot")
    }
}

/// Segment and index of handle `h`'s slot.
fn locate(h: u32) -> (usize, usize) {
    let q = u64::from(h) / FIRST_SEGMENT + 1;
    let k = 63 - q.leading_zeros() as usize;
    let start = FIRST_SEGMENT * ((1u64 << k) - 1);
    (k, (u64::from(h) - start) as usize)
}

/// The first handle of segment `k`.
fn segment_start(k: usize) -> u64 {
    FIRST_SEGMENT * ((1u64 << k) - 1)
}

impl<T> LockedTable<T> {
    pub fn new(max: u32) -> Self {
        LockedTable {
            segments: std::array::from_fn(|_| OnceLock::new()),
            alloc: Mutex::new(Alloc {
                free: VecDeque::new(),
                next: 1,
            }),
            count: AtomicU32::new(0),
            max,
        }
    }

    fn slot(&self, h: u32) -> Option<&Slot<T>> {
        let (k, i) = locate(h);
        self.segments.get(k)?.get()?.get(i)
    }

    /// Handle `h`'s slot, its segment allocated if it is the first handle used there.
    fn slot_or_alloc(&self, h: u32) -> Option<&Slot<T>> {
        let (k, i) = locate(h);
        let seg = self.segments.get(k)?.get_or_init(|| {
            let n = FIRST_SEGMENT << k;
            (0..n).map(|_| Slot::new()).collect()
        });
        seg.get(i)
    }

    fn slot_mut(&mut self, h: u32) -> Option<&mut Slot<T>> {
        let (k, i) = locate(h);
        self.segments.get_mut(k)?.get_mut()?.get_mut(i)
    }

    /// Insert; `None` when the table is full.
    pub fn insert(&self, v: T) -> Option<u32> {
        self.insert_with(|_| v)
    }

    /// Insert the object `f` builds from its handle; `None` when the table is full. Through a
    /// shared borrow: lookups of other objects go on meanwhile.
    pub fn insert_with(&self, f: impl FnOnce(u32) -> T) -> Option<u32> {
        let mut a = lock(&self.alloc);
        if self.count.load(Ordering::Relaxed) >= self.max {
            return None;
        }
        // With fewer than `max` objects a handle at most `max` is free or never used.
        let fresh = a.next <= self.max && a.free.len() < REUSE_DEPTH;
        let h = match if fresh { None } else { a.free.pop_front() } {
            Some(h) => h,
            None => {
                let h = a.next;
                a.next = h.checked_add(1)?;
                h
            }
        };
        let Some(slot) = self.slot_or_alloc(h) else {
            a.free.push_front(h);
            return None;
        };
        *lock(&slot.obj) = Some(f(h));
        slot.live.store(true, Ordering::Release);
        self.count.fetch_add(1, Ordering::Relaxed);
        Some(h)
    }

    /// Object `h`, locked until the guard drops. Never lock an object while holding its guard:
    /// the lock is not re-entrant.
    pub fn get(&self, h: u32) -> Option<SlotGuard<'_, T>> {
        let g = lock(&self.slot(h)?.obj);
        g.is_some().then_some(SlotGuard(g))
    }

    /// Object `h` through the exclusively borrowed table: no lock taken.
    pub fn get_mut(&mut self, h: u32) -> Option<&mut T> {
        unlocked(&mut self.slot_mut(h)?.obj).as_mut()
    }

    /// Whether object `h` exists; takes no lock, so it may be asked while holding a guard.
    pub fn contains(&self, h: u32) -> bool {
        self.slot(h).is_some_and(|s| s.live.load(Ordering::Acquire))
    }

    /// Take object `h` out (it drops when the caller lets it go, outside the table's locks).
    /// Through a shared borrow: waits while a worker holds the object's guard. Whoever removes
    /// beside the workers makes sure none still needs the object (a destroy command's BUSY
    /// checks and unit fence).
    pub fn remove(&self, h: u32) -> Option<T> {
        let slot = self.slot(h)?;
        // Lock order as in `insert_with`: the allocation, then the slot.
        let mut a = lock(&self.alloc);
        let v = lock(&slot.obj).take()?;
        slot.live.store(false, Ordering::Release);
        a.free.push_back(h);
        self.count.fetch_sub(1, Ordering::Relaxed);
        Some(v)
    }

    pub fn len(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    /// Every live object with its handle, each locked while the iteration is at it.
    pub fn iter(&self) -> impl Iterator<Item = (u32, SlotGuard<'_, T>)> {
        let next = lock(&self.alloc).next;
        (1..next).filter_map(move |h| self.get(h).map(|g| (h, g)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.segments
            .iter_mut()
            .enumerate()
            .filter_map(|(k, seg)| seg.get_mut().map(|s| (segment_start(k), s)))
            .flat_map(|(start, seg)| {
                seg.iter_mut().enumerate().filter_map(move |(i, slot)| {
                    let h = u32::try_from(start + i as u64).ok()?;
                    unlocked(&mut slot.obj).as_mut().map(|v| (h, v))
                })
            })
    }

    /// Fill an empty table with objects at given handles (migration, spec §17.3). Fails, and
    /// leaves the table empty, on handle 0, a handle above `max`, a duplicate, or more objects
    /// than `max`; the free list is every unused handle below the highest one, ascending.
    pub fn restore(&mut self, entries: Vec<(u32, T)>) -> Result<(), u32> {
        self.clear();
        let top = super::restore_top(&entries, self.max)?;
        for (h, v) in entries {
            if self.contains(h) {
                self.clear();
                return Err(h);
            }
            let Some(slot) = self.slot_or_alloc(h) else {
                self.clear();
                return Err(h);
            };
            *lock(&slot.obj) = Some(v);
            slot.live.store(true, Ordering::Release);
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        let free = (1..top).filter(|&h| !self.contains(h)).collect();
        *unlocked(&mut self.alloc) = Alloc {
            free,
            next: top + 1,
        };
        Ok(())
    }

    /// Remove everything (device reset); handle numbering starts over.
    pub fn clear(&mut self) {
        for s in &mut self.segments {
            *s = OnceLock::new();
        }
        *unlocked(&mut self.alloc) = Alloc {
            free: VecDeque::new(),
            next: 1,
        };
        self.count.store(0, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::overlap::Overlap;

    #[test]
    fn objects_are_reached_locked_or_through_the_exclusive_table() {
        let mut t: LockedTable<u32> = LockedTable::new(2);
        let a = t.insert(10).unwrap();
        let b = t.insert_with(|h| h * 100).unwrap();
        assert_eq!((a, b), (1, 2));
        assert_eq!(t.insert(1), None, "limit");
        *t.get(a).unwrap() += 1;
        *t.get_mut(b).unwrap() += 1;
        let all: Vec<(u32, u32)> = t.iter().map(|(h, v)| (h, *v)).collect();
        assert_eq!(all, vec![(a, 11), (b, b * 100 + 1)]);
        assert_eq!(t.remove(a), Some(11));
        assert_eq!(t.remove(a), None);
        assert!(t.get(a).is_none() && !t.contains(a));
        assert!(t.get(0).is_none() && t.get(u32::MAX).is_none());
        t.restore(vec![(2, 7)]).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(*t.get(2).unwrap(), 7);
        assert_eq!(
            t.insert(8),
            Some(1),
            "restore frees the handles below the highest"
        );
        assert_eq!(t.insert(9), None);
    }

    #[test]
    fn handles_start_at_one_and_freed_ones_are_reused_oldest_first() {
        let mut t: LockedTable<&str> = LockedTable::new(3);
        assert_eq!(t.insert("a"), Some(1));
        assert_eq!(t.insert("b"), Some(2));
        assert_eq!(t.insert("c"), Some(3));
        assert_eq!(t.remove(2), Some("b"));
        assert_eq!(t.remove(1), Some("a"));
        // Every handle up to max was used: the freed ones come back, oldest first.
        assert_eq!(t.insert("e"), Some(2), "FIFO: the first freed handle first");
        assert_eq!(t.insert("f"), Some(1));
        let mut v: Vec<(u32, &str)> = t.iter_mut().map(|(h, v)| (h, *v)).collect();
        v.sort();
        assert_eq!(v, vec![(1, "f"), (2, "e"), (3, "c")]);
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.insert("g"), Some(1));
    }

    #[test]
    fn a_destroyed_handle_is_not_handed_out_again_at_once() {
        let t: LockedTable<u32> = LockedTable::new(1000);
        let first = t.insert(0).unwrap();
        assert!(t.remove(first).is_some());
        // Create and destroy in a loop: the first handle returns only after REUSE_DEPTH others
        // were freed, and the handles stay bounded.
        let mut seen = Vec::new();
        for n in 0..200 {
            let h = t.insert(n).unwrap();
            seen.push(h);
            assert!(t.remove(h).is_some());
        }
        let back = seen
            .iter()
            .position(|&h| h == first)
            .expect("reused at last");
        assert_eq!(back, REUSE_DEPTH - 1, "{seen:?}");
        assert!(
            seen.iter().all(|&h| h as usize <= REUSE_DEPTH + 1),
            "{seen:?}"
        );
    }

    #[test]
    fn segments_cover_every_handle_once() {
        let mut seen = std::collections::HashSet::new();
        for h in (0..20_000u32).chain([u32::MAX - 1, u32::MAX]) {
            let (k, i) = locate(h);
            assert!(k < SEGMENTS, "handle {h}");
            assert!((i as u64) < FIRST_SEGMENT << k, "handle {h}");
            assert_eq!(segment_start(k) + i as u64, u64::from(h));
            assert!(seen.insert((k, i)));
        }
        let mut t: LockedTable<u32> = LockedTable::new(5000);
        for n in 1..=5000 {
            assert_eq!(t.insert(n), Some(n));
        }
        assert_eq!(t.iter_mut().count(), 5000);
        assert!((1..=5000).all(|h| t.contains(h) && *t.get(h).unwrap() == h));
        t.restore(vec![(4000, 1), (3, 2)]).unwrap();
        assert_eq!(t.len(), 2);
        assert!(t.restore(vec![(3, 1), (3, 2)]).is_err() && t.is_empty());
        assert!(t.restore(vec![(5001, 1)]).is_err());
    }

    #[test]
    fn inserts_through_a_shared_borrow_beside_lookups() {
        let t: LockedTable<u64> = LockedTable::new(4096);
        let first = t.insert(0).unwrap();
        // Lookups of an existing object while the table grows around it: the inserter waits
        // for a lookup after every 16 inserts, so the two overlap through the whole growth
        // (issue 38 item 5, see `sync::overlap`).
        let o = Overlap::new(1);
        let lookups = std::thread::scope(|s| {
            let reader = s.spawn(|| o.read(0, || *t.get(first).unwrap() += 1));
            let w = o.writer();
            for n in 1..4096u64 {
                assert!(t.insert(n).is_some());
                if n % 16 == 0 {
                    w.wait_readers(1);
                }
            }
            drop(w);
            reader.join().expect("reader")
        });
        assert!(lookups >= 4096 / 16, "{lookups} lookups");
        assert_eq!(t.len(), 4096);
        assert_eq!(*t.get(first).unwrap(), lookups);
        assert_eq!(t.iter().count(), 4096);
    }
}

/// The loom model (issue 38 item 1): `RUSTFLAGS="--cfg loom" cargo test --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::Arc;

    /// A full table of two objects: one thread destroys object 1 while another creates an
    /// object (it gets handle 1 back, reused since every handle up to `max` was used, or
    /// nothing while the table is still full) and the test thread looks object 2 up. No
    /// handle names two objects: the destroy takes the object it was asked for, a handed-out
    /// handle holds its new object, and object 2 stays.
    #[test]
    fn loom_a_destroy_beside_a_create_never_names_a_handle_twice() {
        crate::sync::modeled::model(|| {
            let t = Arc::new(LockedTable::new(2));
            assert_eq!((t.insert(10u32), t.insert(20)), (Some(1), Some(2)));
            let destroy = {
                let t = t.clone();
                loom::thread::spawn(move || t.remove(1))
            };
            let create = {
                let t = t.clone();
                loom::thread::spawn(move || t.insert(30))
            };
            assert_eq!(t.get(2).map(|g| *g), Some(20), "object 2 changed");
            assert_eq!(
                destroy.join().unwrap(),
                Some(10),
                "the destroy took another object"
            );
            match create.join().unwrap() {
                None => assert!(!t.contains(1) && t.len() == 1),
                Some(h) => {
                    assert_eq!(h, 1, "handle 1 is the only one free");
                    assert_eq!(t.get(h).map(|g| *g), Some(30), "the new object is gone");
                    assert!(t.contains(h) && t.len() == 2);
                }
            }
        });
    }
}
