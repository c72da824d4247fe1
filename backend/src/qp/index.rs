//! Which slot of the QP table holds QP `qpn` ([`QpnIndex`]): an open-addressing hash table of
//! atomic words, so the engine workers look a QP up (several times per packet) without a lock
//! while CREATE_QP and DESTROY_QP add and remove entries beside them (ARCHITECTURE.md
//! "Control commands").
//!
//! Each bucket is one `AtomicU64`: empty (0), a tombstone (a removed entry, `u64::MAX`), or
//! `qpn << 32 | slot`. QPNs are 1..=0xffffff, so an entry is neither. A lookup probes linearly
//! from the QPN's hash until it finds the QPN or an empty bucket. A removed entry becomes a
//! tombstone, or empty when the next bucket is empty (then no entry lies beyond it on any
//! probe path); otherwise a bucket becomes empty only when the exclusively borrowed table is
//! rebuilt ([`QpnIndex::make_room`]). So a lookup racing an insert or a removal sees the
//! entry either there or not, never a probe chain cut short. Inserts and removals take the writer lock (commands of one device already
//! come one at a time; the lock keeps the counts right whoever calls). An insert through a
//! shared borrow reuses a tombstone on its probe path or fills an empty bucket while at most
//! three quarters of the buckets are in use; beyond that the table must be rebuilt (grown,
//! tombstones dropped), which needs the exclusive borrow: the command then runs on the
//! exclusive device. That is rare: a rebuild leaves at most half the buckets in use, so the
//! next one comes only after a quarter of the buckets' worth of creates (at least half as
//! many as there are live QPs).

use std::hash::BuildHasher;

use crate::fasthash::FastHash;
// Loom's types under `--cfg loom` (the model at the end of this file).
use crate::sync::modeled::{lock, unlocked, AtomicU64, Mutex, Ordering};

const EMPTY: u64 = 0;
const GONE: u64 = u64::MAX;
/// Buckets of a new or cleared index.
const MIN_BUCKETS: usize = 64;

fn entry(qpn: u32, slot: u32) -> u64 {
    (u64::from(qpn) << 32) | u64::from(slot)
}

/// The QPN and slot of a bucket that holds an entry.
fn split(e: u64) -> Option<(u32, u32)> {
    (e != EMPTY && e != GONE).then_some(((e >> 32) as u32, e as u32))
}

/// Buckets in use (entries and tombstones) and live entries; changed under the writer lock.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    used: usize,
    live: usize,
}

/// See the module documentation.
pub struct QpnIndex {
    buckets: Box<[AtomicU64]>,
    hash: FastHash,
    counts: Mutex<Counts>,
}

impl std::fmt::Debug for QpnIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpnIndex")
            .field("buckets", &self.buckets.len())
            .field("counts", &*lock(&self.counts))
            .finish()
    }
}

fn empty_buckets(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(EMPTY)).collect()
}

/// Whether one more bucket may be filled: at most three quarters in use.
fn fits(used: usize, buckets: usize) -> bool {
    (used + 1) * 4 <= buckets * 3
}

impl Default for QpnIndex {
    fn default() -> Self {
        QpnIndex {
            buckets: empty_buckets(MIN_BUCKETS),
            hash: FastHash::default(),
            counts: Mutex::new(Counts::default()),
        }
    }
}

impl QpnIndex {
    fn home(&self, qpn: u32) -> usize {
        self.hash.hash_one(qpn) as usize & (self.buckets.len() - 1)
    }

    /// The buckets `qpn`'s probe visits, in order (each bucket once).
    fn probe(&self, qpn: u32) -> impl Iterator<Item = (usize, &AtomicU64)> {
        let (n, home) = (self.buckets.len(), self.home(qpn));
        (0..n).map(move |i| {
            let b = (home + i) & (n - 1);
            (b, &self.buckets[b])
        })
    }

    /// The slot of QP `qpn`. Lock-free: a few atomic loads.
    pub fn find(&self, qpn: u32) -> Option<u32> {
        for (_, b) in self.probe(qpn) {
            match b.load(Ordering::Acquire) {
                EMPTY => return None,
                e => match split(e) {
                    Some((q, slot)) if q == qpn => return Some(slot),
                    _ => {}
                },
            }
        }
        None
    }

    /// Whether an insert through a shared borrow can take a new bucket.
    pub fn has_room(&self) -> bool {
        fits(lock(&self.counts).used, self.buckets.len())
    }

    /// Record that QP `qpn` is in `slot`. `false` (nothing changed) if `qpn` is out of range
    /// or present already, or the index has no room ([`QpnIndex::has_room`]).
    pub fn insert(&self, qpn: u32, slot: u32) -> bool {
        if qpn == 0 || qpn > crate::qp::MASK24 {
            return false;
        }
        let mut c = lock(&self.counts);
        let mut tomb = None;
        let mut empty = None;
        for (i, b) in self.probe(qpn) {
            match b.load(Ordering::Acquire) {
                EMPTY => {
                    empty = Some(i);
                    break;
                }
                GONE => {
                    tomb = tomb.or(Some(i));
                }
                e => {
                    if split(e).is_some_and(|(q, _)| q == qpn) {
                        return false;
                    }
                }
            }
        }
        let at = match (tomb, empty) {
            (Some(t), _) => t,
            (None, Some(e)) if fits(c.used, self.buckets.len()) => {
                c.used += 1;
                e
            }
            _ => return false,
        };
        // Release: whoever finds the entry finds the slot filled (the QP table fills it first).
        self.buckets[at].store(entry(qpn, slot), Ordering::Release);
        c.live += 1;
        true
    }

    /// Forget QP `qpn`; its slot, if it was there. The bucket becomes a tombstone, so the
    /// probes of other QPNs that pass it go on; or empty, with the tombstones right before it,
    /// when the next bucket is empty: no probe that must go on passes an empty bucket, so
    /// none needs these (an entry is never stored beyond an empty bucket on its probe path).
    pub fn remove(&self, qpn: u32) -> Option<u32> {
        let mut c = lock(&self.counts);
        let mask = self.buckets.len() - 1;
        for (i, b) in self.probe(qpn) {
            match b.load(Ordering::Acquire) {
                EMPTY => return None,
                e => {
                    let Some((_, slot)) = split(e).filter(|&(q, _)| q == qpn) else {
                        continue;
                    };
                    c.live -= 1;
                    if self.buckets[(i + 1) & mask].load(Ordering::Acquire) != EMPTY {
                        b.store(GONE, Ordering::Release);
                        return Some(slot);
                    }
                    let mut j = i;
                    loop {
                        self.buckets[j].store(EMPTY, Ordering::Release);
                        c.used -= 1;
                        j = (j + mask) & mask;
                        if j == i || self.buckets[j].load(Ordering::Acquire) != GONE {
                            return Some(slot);
                        }
                    }
                }
            }
        }
        None
    }

    /// Entries in the index.
    pub fn len(&self) -> usize {
        lock(&self.counts).live
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Through the exclusive borrow: rebuild without tombstones, with twice the buckets the
    /// live entries plus one need, if the next insert would not fit.
    pub fn make_room(&mut self) {
        let c = *unlocked(&mut self.counts);
        if fits(c.used, self.buckets.len()) {
            return;
        }
        let live: Vec<(u32, u32)> = self
            .buckets
            .iter()
            .filter_map(|b| split(b.load(Ordering::Relaxed)))
            .collect();
        let n = ((live.len() + 1) * 2).next_power_of_two().max(MIN_BUCKETS);
        self.buckets = empty_buckets(n);
        *unlocked(&mut self.counts) = Counts::default();
        for (q, slot) in live {
            // Fits: n buckets hold more than 4/3 of the entries.
            self.insert(q, slot);
        }
    }

    /// Forget everything (device reset); back to the smallest size.
    pub fn clear(&mut self) {
        self.buckets = empty_buckets(MIN_BUCKETS);
        *unlocked(&mut self.counts) = Counts::default();
    }

    /// Buckets (for tests of the growth policy).
    pub fn capacity(&self) -> usize {
        self.buckets.len()
    }

    #[cfg(all(test, not(loom)))]
    fn used(&self) -> usize {
        lock(&self.counts).used
    }

    #[cfg(all(test, not(loom)))]
    fn tombstones(&self) -> usize {
        self.buckets
            .iter()
            .filter(|b| b.load(Ordering::Relaxed) == GONE)
            .count()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::overlap::Overlap;

    #[test]
    fn finds_what_was_inserted_and_not_what_was_removed() {
        let ix = QpnIndex::default();
        assert!(ix.insert(0x12_3456, 7));
        assert!(ix.insert(1, 0));
        assert!(!ix.insert(0x12_3456, 9), "a QPN is there once");
        assert!(
            !ix.insert(0, 1) && !ix.insert(1 << 24, 1),
            "QPNs are 24-bit, not 0"
        );
        assert_eq!(ix.find(0x12_3456), Some(7));
        assert_eq!(ix.find(1), Some(0));
        assert_eq!(ix.find(2), None);
        assert_eq!(ix.remove(0x12_3456), Some(7));
        assert_eq!(ix.find(0x12_3456), None);
        assert_eq!(ix.remove(0x12_3456), None);
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn a_shared_insert_stops_at_three_quarters_and_the_exclusive_borrow_grows() {
        let mut ix = QpnIndex::default();
        let cap = ix.capacity();
        let mut q = 16;
        while ix.has_room() {
            assert!(ix.insert(q, q));
            q += 1;
        }
        assert_eq!(ix.len(), cap * 3 / 4);
        assert!(!ix.insert(q, q), "no room without the exclusive borrow");
        // A removal makes room again, or leaves a tombstone that the same QPN reuses.
        assert_eq!(ix.remove(16), Some(16));
        assert!(ix.insert(16, 99));
        assert!(!ix.has_room(), "full again");
        ix.make_room();
        assert!(ix.capacity() > cap);
        assert!(ix.has_room());
        assert!(ix.insert(q, q));
        assert_eq!(ix.remove(17), Some(17));
        assert_eq!(ix.find(16), Some(99));
        for k in 18..=q {
            assert_eq!(ix.find(k), Some(k), "qpn {k} kept through the rebuild");
        }
        assert_eq!(ix.find(17), None);
    }

    #[test]
    fn churn_rebuilds_rarely_and_stays_small() {
        // Create/destroy pairs leave tombstones that later inserts reuse when their probe
        // passes one; the rest fill empty buckets until a rebuild (the exclusive device)
        // clears them. The index stays a small multiple of the live QPs.
        let mut ix = QpnIndex::default();
        let mut live: std::collections::VecDeque<u32> = (16..48).collect();
        for &q in &live {
            assert!(ix.insert(q, q));
        }
        let (mut next, mut rebuilds) = (1000u32, 0);
        for _ in 0..10_000 {
            let gone = live.pop_front().unwrap();
            assert_eq!(ix.remove(gone), Some(gone));
            live.push_back(next);
            if !ix.has_room() {
                ix.make_room();
                rebuilds += 1;
            }
            assert!(ix.insert(next, next), "insert {next} after removing {gone}");
            next += 1;
        }
        assert_eq!(ix.len(), 32);
        assert!(ix.capacity() <= 128, "{} buckets for 32 QPs", ix.capacity());
        assert!(
            rebuilds < 10_000 / 16,
            "{rebuilds} rebuilds in 10000 creates"
        );
    }

    #[test]
    fn random_inserts_and_removals_agree_with_a_map() {
        // Against a model: every live QPN found with its slot, none of the removed, and the
        // count of used buckets is exactly the live entries plus the tombstones left.
        let mut ix = QpnIndex::default();
        let mut model = std::collections::HashMap::new();
        let mut rng = crate::ids::IdRng::from_seed(11);
        for step in 0..20_000u32 {
            // Keys from a small space, so removals hit and probe chains cluster.
            let q = rng.in_range(1, 200);
            if let Some(slot) = model.remove(&q) {
                assert_eq!(ix.remove(q), Some(slot), "remove {q}");
            } else {
                if !ix.has_room() {
                    ix.make_room();
                }
                assert!(ix.insert(q, step));
                model.insert(q, step);
            }
            if step % 97 == 0 {
                for k in 1..=200 {
                    assert_eq!(ix.find(k), model.get(&k).copied(), "find {k} at {step}");
                }
                assert_eq!(ix.used(), model.len() + ix.tombstones());
            }
        }
    }

    #[test]
    fn lookups_beside_inserts_and_removals_see_every_stable_entry() {
        // Readers look up QPNs that stay while the writer churns others through the same
        // buckets: a stable entry is always found, a removed one never comes back wrong.
        // Every reader looks all of them up this many times while the writer churns (issue 38
        // item 5: the overlap is made to happen, see `sync::overlap`).
        const READER_ROUNDS: u64 = 2_000;
        let ix = QpnIndex::default();
        for q in 100..120 {
            assert!(ix.insert(q, q + 1));
        }
        let o = Overlap::new(2);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|r| {
                    let (o, ix) = (&o, &ix);
                    s.spawn(move || {
                        o.read(r, || {
                            for q in 100..120 {
                                assert_eq!(ix.find(q), Some(q + 1));
                            }
                            if let Some(s) = ix.find(5000) {
                                assert_eq!(s, 5001);
                            }
                        })
                    })
                })
                .collect();
            let w = o.writer();
            let mut churns = 0;
            while churns < 20_000 || !w.readers_did(READER_ROUNDS) {
                assert!(ix.insert(5000, 5001));
                assert!(ix.insert(6000, 6001));
                assert_eq!(ix.remove(5000), Some(5001));
                assert_eq!(ix.remove(6000), Some(6001));
                churns += 1;
            }
            drop(w);
            for r in readers {
                assert!(r.join().expect("reader") >= READER_ROUNDS);
            }
        });
    }
}

/// The loom model (issue 38 item 1): `RUSTFLAGS="--cfg loom" cargo test --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::Arc;

    /// QPN `x` and QPN `s` share a home bucket, `x` first: `s` sits one bucket on, behind
    /// `x` on its probe path. A writer removes `x` and inserts it again (through the
    /// tombstone) after filling in the slot it points to, beside a reader: the reader always
    /// finds `s` (a removal never cuts its probe short), finds `x` either not at all or with
    /// its slot filled, and never finds anything else.
    #[test]
    fn loom_lookups_beside_a_removal_and_an_insert_find_every_stable_entry() {
        // One hash for every run of the model, so that every run touches the same buckets.
        let hash = FastHash::default();
        crate::sync::modeled::model(move || {
            let ix = Arc::new(QpnIndex {
                buckets: empty_buckets(MIN_BUCKETS),
                hash,
                counts: Mutex::new(Counts::default()),
            });
            let x = 1;
            let s = (2..=crate::qp::MASK24)
                .find(|&q| ix.home(q) == ix.home(x))
                .expect("a QPN with x's home bucket");
            // What the QP table holds in x's slot: 0 until the writer fills it in.
            let filled = Arc::new(AtomicU64::new(0));
            assert!(ix.insert(x, 7) && ix.insert(s, 8));
            let reader = {
                let (ix, filled) = (ix.clone(), filled.clone());
                loom::thread::spawn(move || {
                    assert_eq!(ix.find(s), Some(8), "the stable entry was not found");
                    match ix.find(x) {
                        None => {}
                        Some(7) => {}
                        Some(9) => assert_eq!(
                            filled.load(Ordering::Relaxed),
                            9,
                            "an entry was found before its slot was filled"
                        ),
                        other => panic!("x found at {other:?}"),
                    }
                })
            };
            assert_eq!(ix.remove(x), Some(7));
            filled.store(9, Ordering::Relaxed);
            assert!(ix.insert(x, 9));
            reader.join().expect("reader");
        });
    }
}
