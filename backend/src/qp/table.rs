//! The QP table (spec §13.6, §16): GSI is QPN 1, ordinary QPs get random QPNs in
//! 16..=0xfffffe, unique among live QPs.
//!
//! The QPs live in an [`objects::LockedTable`](crate::objects::locked::LockedTable) (slots in
//! segments that never move, a lock per QP) and a [`QpnIndex`] maps a QPN to its slot without
//! a lock, so CREATE_QP and DESTROY_QP work through a shared borrow, beside the engine workers
//! that look QPs up several times per packet (ARCHITECTURE.md "Control commands"). A lookup
//! checks the QPN of the QP it locked: a slot freed and filled again between the index lookup
//! and the lock holds another QP, and the lookup then answers `None`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use vrdma_spec::*;

use super::index::QpnIndex;
use super::{Protocol, Qp, QpType, MAX_QPN};
use crate::objects::locked::{LockedTable, SlotGuard};
use crate::sync::{lock, unlocked};

/// Random draws before [`QpTable::alloc_qpn`] walks from a random point instead; with
/// `max_qp` far below the 2^24 space the first draw is free with overwhelming probability.
const QPN_DRAWS: u32 = 16;

/// A random QPN in 16..=MAX_QPN for which `used` is false, `None` if `count` + 1 steps of the
/// fallback walk find none (impossible while `count` QPNs are used and count < the space).
///
/// Spec §16: a peer cannot predict the QPN of the next QP (it would need it, with the PSN and
/// the peer's address, to inject into a connection). A destroyed QPN comes back only by chance
/// (probability count / 2^24 per allocation).
fn pick_qpn(rng: &mut crate::ids::IdRng, count: u32, used: impl Fn(u32) -> bool) -> Option<u32> {
    for _ in 0..QPN_DRAWS {
        let q = rng.in_range(VRDMA_FIRST_QPN, MAX_QPN);
        if !used(q) {
            return Some(q);
        }
    }
    // Dense table: walk from a random QPN.
    let span = MAX_QPN - VRDMA_FIRST_QPN + 1;
    let start = rng.in_range(0, span - 1);
    (0..=count)
        .map(|i| VRDMA_FIRST_QPN + (start + i) % span)
        .find(|&q| !used(q))
}
/// How QPNs are drawn; taken by CREATE_QP only.
struct QpnDraw {
    rng: crate::ids::IdRng,
    /// The worker the next QP goes to (round robin).
    next_worker: u32,
}

/// See the module documentation.
pub struct QpTable<P: Protocol> {
    index: QpnIndex,
    /// Each QP with its own lock, so an engine worker and a command about another QP do not
    /// wait for each other (ARCHITECTURE.md "Locks"); with the table borrowed mutably nothing
    /// is locked.
    slots: LockedTable<Qp<P>>,
    draw: Mutex<QpnDraw>,
    max_qp: u32,
    /// Ordinary QPs (the GSI QP does not count).
    count: AtomicU32,
    /// Engine workers the QPNs are spread over ([`super::worker_of`]); 1 without sharding.
    workers: u32,
    /// The counters of every QP removed so far (destroyed or reset away): the port's
    /// QUERY_STATS totals count from daemon start (spec §11.9).
    retired: Mutex<crate::stats::QpStats>,
}

impl<P: Protocol> std::fmt::Debug for QpTable<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpTable")
            .field("count", &self.len())
            .field("max_qp", &self.max_qp)
            .finish()
    }
}

impl<P: Protocol> QpTable<P> {
    /// `max_qp` ordinary QPs (the GSI QP does not count); QPNs from an OS-seeded generator.
    pub fn new(max_qp: u32) -> Self {
        Self::with_rng(max_qp, crate::ids::IdRng::from_os())
    }

    /// As [`QpTable::new`] with a given generator (reproducible unit tests).
    pub fn with_rng(max_qp: u32, rng: crate::ids::IdRng) -> Self {
        // Strictly below the number of QPNs, so a free one always exists.
        let max_qp = max_qp.min(MAX_QPN - VRDMA_FIRST_QPN);
        QpTable {
            index: QpnIndex::default(),
            slots: LockedTable::new(max_qp.saturating_add(1)),
            draw: Mutex::new(QpnDraw {
                rng,
                next_worker: 0,
            }),
            max_qp,
            count: AtomicU32::new(0),
            workers: 1,
            retired: Default::default(),
        }
    }

    /// Spread the QPs created from now on over `workers` engine workers ([`super::worker_of`]).
    pub fn set_workers(&mut self, workers: usize) {
        self.workers = u32::try_from(workers).unwrap_or(u32::MAX).max(1);
    }

    /// Reserve a QPN for a new QP of type `t`; `None` if none left (or the GSI QP exists).
    /// Commands of one device come one at a time, so the QPN is still free at the insert.
    pub fn alloc_qpn(&self, t: QpType) -> Option<u32> {
        if t == QpType::Gsi {
            return (!self.contains(VRDMA_GSI_QPN)).then_some(VRDMA_GSI_QPN);
        }
        let count = self.len();
        if count >= self.max_qp {
            return None;
        }
        let mut d = lock(&self.draw);
        if self.workers > 1 {
            // Round robin over the workers: a random QPN moved into the worker's residue
            // class (the QPN keeps all but log2(workers) bits of its randomness).
            let (n, w) = (self.workers, d.next_worker % self.workers);
            d.next_worker = d.next_worker.wrapping_add(1);
            for _ in 0..QPN_DRAWS {
                let q = d.rng.in_range(VRDMA_FIRST_QPN, MAX_QPN);
                let q = q - q % n + w;
                let q = if q < VRDMA_FIRST_QPN { q + n } else { q };
                if q <= MAX_QPN && !self.contains(q) {
                    return Some(q);
                }
            }
        }
        pick_qpn(&mut d.rng, count, |q| self.contains(q))
    }

    /// Whether [`QpTable::insert_shared`] has room for one more QP without the exclusive
    /// borrow (see `index.rs`).
    pub fn has_room(&self) -> bool {
        self.index.has_room() && self.slots.len() < self.slots.max()
    }

    /// Through the exclusive borrow: make room for one more QP ([`QpTable::has_room`]).
    pub fn make_room(&mut self) {
        self.index.make_room();
    }

    /// Insert a QP whose QPN came from `alloc_qpn`, through a shared borrow (beside the
    /// engine workers). `false`, and the QP dropped, if the table has no room
    /// ([`QpTable::has_room`]) or its QPN is taken.
    #[must_use]
    pub fn insert_shared(&self, qp: Qp<P>) -> bool {
        let (qpn, gsi) = (qp.qpn, qp.qpn == VRDMA_GSI_QPN);
        if !self.index.has_room() || self.contains(qpn) {
            return false;
        }
        // The slot first: whoever finds the QPN in the index finds the QP in its slot.
        let Some(slot) = self.slots.insert(qp) else {
            return false;
        };
        if !self.index.insert(qpn, slot) {
            drop(self.slots.remove(slot));
            return false;
        }
        if !gsi {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Insert through the exclusive borrow (migration, tests), making room first; `false` as
    /// for [`QpTable::insert_shared`].
    #[must_use]
    pub fn insert(&mut self, qp: Qp<P>) -> bool {
        self.make_room();
        self.insert_shared(qp)
    }

    /// QP `qpn`, locked until the guard drops. Never lock a QP while holding its guard (the
    /// lock is not re-entrant), nor two QPs at once (ARCHITECTURE.md "Locks": one QP at a time).
    pub fn get(&self, qpn: u32) -> Option<SlotGuard<'_, Qp<P>>> {
        let g = self.slots.get(self.index.find(qpn)?)?;
        (g.qpn == qpn).then_some(g)
    }

    /// QP `qpn` through the exclusively borrowed table: no lock taken.
    pub fn get_mut(&mut self, qpn: u32) -> Option<&mut Qp<P>> {
        let slot = self.index.find(qpn)?;
        self.slots.get_mut(slot).filter(|q| q.qpn == qpn)
    }

    /// Is there a QP `qpn`? (Takes no QP lock.)
    pub fn contains(&self, qpn: u32) -> bool {
        self.index.find(qpn).is_some()
    }

    /// Take QP `qpn` out, through a shared borrow: lookups stop finding it at once; waits
    /// while another thread holds the QP's guard. A worker inside a unit of work may still
    /// use what it took from the QP (its protocol state, translations): a destroy beside the
    /// workers waits for the units in flight before it answers (`tables/units.rs`).
    pub fn remove(&self, qpn: u32) -> Option<Qp<P>> {
        let qp = self.slots.remove(self.index.remove(qpn)?)?;
        if qpn != VRDMA_GSI_QPN {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        lock(&self.retired).add(&qp.stats);
        Some(qp)
    }

    /// Ordinary QPs in use.
    pub fn len(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn qpns(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.iter().map(|q| q.qpn).collect();
        v.sort_unstable();
        v
    }

    /// Every QP, each locked while the iteration is at it (drop the guard before the next).
    pub fn iter(&self) -> impl Iterator<Item = SlotGuard<'_, Qp<P>>> {
        self.slots.iter().map(|(_, q)| q)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Qp<P>> {
        self.slots.iter_mut().map(|(_, q)| q)
    }

    pub fn clear(&mut self) {
        let retired = unlocked(&mut self.retired);
        for (_, qp) in self.slots.iter_mut() {
            retired.add(&qp.stats);
        }
        self.slots.clear();
        self.index.clear();
        *self.count.get_mut() = 0;
    }

    /// The counters of every QP this table has had: the live ones and those removed (§11.9).
    pub fn stats_total(&self) -> crate::stats::QpStats {
        let mut t = *lock(&self.retired);
        for qp in self.iter() {
            t.add(&qp.stats);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::{GuestMem, Ring};
    use crate::qp::{QpAttrs, QpCaps, QpState, RecvState, SendState};

    /// Protocol state that only counts what `qp/` does to it.
    #[derive(Default)]
    struct Psn(u32);
    impl SendState for Psn {
        fn set_sq_psn(&mut self, psn: u32) {
            self.0 = psn;
        }
        fn reset(&mut self) {
            self.0 = 0;
        }
    }
    impl RecvState for Psn {
        fn set_rq_psn(&mut self, psn: u32) {
            self.0 = psn;
        }
        fn reset(&mut self) {
            self.0 = 0;
        }
    }
    struct Test;
    impl Protocol for Test {
        type Req = Psn;
        type Resp = Psn;
        type Tick = ();
    }

    fn qp(mem: &GuestMem, qpn: u32, t: QpType) -> Qp<Test> {
        let sq = Ring::new(mem, &[0, 4096], 16, 6, 6, 16).unwrap();
        Qp {
            qpn,
            qp_type: t,
            pd: 1,
            send_cqn: 1,
            recv_cqn: 1,
            srqn: None,
            xrcdn: None,
            sq,
            rq: None,
            sq_sig_all: false,
            caps: QpCaps::default(),
            state: QpState::Reset,
            attrs: QpAttrs::default(),
            sq_draining: false,
            req: Default::default(),
            resp: Default::default(),
            tick: Default::default(),
            stats: Default::default(),
            charge: Default::default(),
        }
    }

    #[test]
    fn qpns_are_random_unique_and_in_range() {
        let mem = GuestMem::from_ranges(&[(0, 1 << 16)]).unwrap();
        let mut t = QpTable::<Test>::new(64);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..64 {
            let q = t.alloc_qpn(QpType::Rc).unwrap();
            assert!((VRDMA_FIRST_QPN..=MAX_QPN).contains(&q), "qpn {q:#x}");
            assert!(seen.insert(q), "qpn {q:#x} handed out twice");
            assert!(t.insert(qp(&mem, q, QpType::Rc)));
        }
        // Not the sequence 16, 17, ... of a counter.
        let mut v: Vec<u32> = seen.iter().copied().collect();
        v.sort_unstable();
        assert_ne!(v, (16..80).collect::<Vec<u32>>());
        // max_qp reached.
        assert_eq!(t.alloc_qpn(QpType::Rc), None);
        // GSI: QPN 1, one per device, not counted.
        assert_eq!(t.alloc_qpn(QpType::Gsi), Some(VRDMA_GSI_QPN));
        assert!(t.insert(qp(&mem, 1, QpType::Gsi)));
        assert_eq!(t.alloc_qpn(QpType::Gsi), None);
        assert_eq!(t.len(), 64);
    }

    #[test]
    fn a_dense_table_still_finds_the_free_qpn() {
        let span = MAX_QPN - VRDMA_FIRST_QPN + 1;
        assert_eq!(QpTable::<Test>::new(u32::MAX).max_qp, span - 1);
        // Every QPN but one is live: the draws miss, the walk (≤ count + 1 steps) finds it.
        let mut rng = crate::ids::IdRng::from_seed(7);
        for free in [VRDMA_FIRST_QPN, 0x12_3456, MAX_QPN] {
            assert_eq!(pick_qpn(&mut rng, span - 1, |q| q != free), Some(free));
        }
        assert_eq!(pick_qpn(&mut rng, span, |_| true), None);
    }
}
