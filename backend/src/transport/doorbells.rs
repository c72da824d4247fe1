//! Doorbell records waiting for the engine (spec §8): the queue between the vhost-user thread,
//! which adds the records of each doorbell buffer, and the engine thread, which takes them all
//! per batch.
//!
//! Records for the same object are merged while pending (§8 allows it: an SQ doorbell makes the
//! device read the current producer, so one pending record covers every later one), found in
//! O(1) through a set of pending `(type, id)` pairs. The number of distinct pending records is
//! bounded by [`MAX_PENDING`]: a guest can name 2^32 ids per type, far more than the objects
//! that exist. Beyond the bound nothing more is queued; the next batch instead *sweeps*: every
//! QP gets an SQ and an RQ doorbell, which is what any dropped record could have asked for
//! (CQ_ARM and SRQ records are hints the device may ignore, §8). The guest thus cannot grow the
//! queue without bound, and no doorbell of a real QP is lost.
//!
//! A worker takes at most a round's share of the records ([`DoorbellQueue::take_at_most`]) and
//! leaves the rest queued for its next round, so a device with many rung QPs does not hold its
//! thread (shared by other devices in an engine group) for one long round. What a partial batch
//! covers is exact: every record remembers how many had been accepted before it first arrived,
//! and the records are taken in that order, so a batch covers every record accepted before the
//! first one it leaves.

use std::collections::{HashSet, VecDeque};

use vrdma_spec::{VrdmaDoorbell, VRDMA_DB_CQ_ARM, VRDMA_DB_RQ, VRDMA_DB_SQ};

/// Distinct records pending before the queue stops queueing and asks for a sweep. Large enough
/// that a driver ringing each of `max_qp` (16384 by default) QPs' SQ and RQ plus every CQ in
/// one batch never reaches it.
pub const MAX_PENDING: usize = 65536;

/// QPNs are 24 bits (IBTA 9.7.1): a QP doorbell with a larger id names no QP (§8: ignored).
const QPN_MASK: u32 = 0x00ff_ffff;

/// What [`DoorbellQueue::push`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued: the first pending record for its object.
    Queued,
    /// A record for the same object was already pending: merged into it.
    Merged,
    /// Dropped on receipt: a type the engine does not act on (SRQ hint, unknown) or an id no
    /// object can have (§8: ignored).
    Ignored,
    /// [`MAX_PENDING`] distinct records are pending: not queued, the next batch sweeps.
    Swept,
    /// A CQ_ARM hint while [`MAX_PENDING`] records are pending: dropped (it is optional).
    Dropped,
}

/// The records of one engine batch, in the order they first arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoorbellBatch {
    pub records: Vec<VrdmaDoorbell>,
    /// Records were not queued because of the bound: the engine rings the SQ and RQ doorbell of
    /// every QP after `records`.
    pub sweep: bool,
    /// How many of the records accepted so far ([`DoorbellQueue::received`]) the batch covers:
    /// all of them when it emptied the queue, else those accepted before the first record left.
    pub received: u64,
}

impl DoorbellBatch {
    /// No records, only the sweep (a resume after migration, spec §17.1).
    pub fn sweep_only() -> Self {
        DoorbellBatch {
            records: Vec::new(),
            sweep: true,
            received: 0,
        }
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct DoorbellQueue {
    /// The pending records in the order they first arrived, each with the count of records
    /// accepted before it (what a batch that stops before it covers).
    order: VecDeque<(VrdmaDoorbell, u64)>,
    pending: HashSet<(u32, u32)>,
    sweep: bool,
    /// Records accepted so far (queued, merged or covered by the sweep): the position a
    /// control command is ordered after (`EngineSender::fence`).
    received: u64,
}

impl DoorbellQueue {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one record (O(1)).
    pub fn push(&mut self, db: VrdmaDoorbell) -> Pushed {
        let known = match db.type_ {
            VRDMA_DB_SQ | VRDMA_DB_RQ => db.id <= QPN_MASK,
            VRDMA_DB_CQ_ARM => true,
            _ => false,
        };
        if !known {
            return Pushed::Ignored;
        }
        let r = self.push_known(db);
        if r != Pushed::Dropped {
            self.received += 1;
        }
        r
    }

    fn push_known(&mut self, db: VrdmaDoorbell) -> Pushed {
        if self.sweep {
            // Every QP is examined by the next batch anyway; CQ_ARM is only a hint.
            return Pushed::Swept;
        }
        if self.pending.contains(&(db.type_, db.id)) {
            return Pushed::Merged;
        }
        if self.order.len() >= MAX_PENDING {
            // A full queue of CQ_ARM hints (any 32-bit id) must not force a sweep of every QP
            // per batch: an arm doorbell is optional (spec §5.3), so it is dropped instead.
            if db.type_ == VRDMA_DB_CQ_ARM {
                return Pushed::Dropped;
            }
            self.sweep = true;
            return Pushed::Swept;
        }
        self.pending.insert((db.type_, db.id));
        self.order.push_back((db, self.received));
        Pushed::Queued
    }

    /// Make the next batch sweep (another engine worker took a device-wide sweep request,
    /// `workers.rs`).
    pub fn request_sweep(&mut self) {
        self.sweep = true;
    }

    /// Records accepted since the queue was made (every one a later [`DoorbellQueue::take`]
    /// hands out, merged ones included).
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Distinct records pending.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty() && !self.sweep
    }

    /// Whether the next batch sweeps.
    pub fn sweep_pending(&self) -> bool {
        self.sweep
    }

    /// Everything pending, for one engine batch; the queue is empty afterwards. Records that
    /// arrive after this are not merged with the ones taken (their guest writes may be newer
    /// than what the engine reads for the taken ones).
    pub fn take(&mut self) -> DoorbellBatch {
        self.pending.clear();
        DoorbellBatch {
            records: self.order.drain(..).map(|(db, _)| db).collect(),
            sweep: std::mem::take(&mut self.sweep),
            received: self.received,
        }
    }

    /// The first `max` pending records (at least one), for one round; the rest stay queued,
    /// still merging, in their order. A pending sweep takes everything, as [`take`]: it runs
    /// after every record and rings every QP anyway.
    ///
    /// [`take`]: DoorbellQueue::take
    pub fn take_at_most(&mut self, max: usize) -> DoorbellBatch {
        let max = max.max(1);
        if self.sweep || self.order.len() <= max {
            return self.take();
        }
        let records: Vec<VrdmaDoorbell> = self
            .order
            .drain(..max)
            .map(|(db, _)| {
                self.pending.remove(&(db.type_, db.id));
                db
            })
            .collect();
        let received = self
            .order
            .front()
            .map_or(self.received, |&(_, before)| before);
        DoorbellBatch {
            records,
            sweep: false,
            received,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(type_: u32, id: u32) -> VrdmaDoorbell {
        VrdmaDoorbell { type_, id }
    }

    #[test]
    fn same_object_merges_other_types_do_not() {
        let mut q = DoorbellQueue::new();
        assert_eq!(q.push(db(VRDMA_DB_SQ, 5)), Pushed::Queued);
        assert_eq!(q.push(db(VRDMA_DB_SQ, 5)), Pushed::Merged);
        assert_eq!(q.push(db(VRDMA_DB_RQ, 5)), Pushed::Queued);
        assert_eq!(q.push(db(VRDMA_DB_CQ_ARM, 5)), Pushed::Queued);
        assert_eq!(q.push(db(vrdma_spec::VRDMA_DB_SRQ, 5)), Pushed::Ignored);
        assert_eq!(q.push(db(99, 5)), Pushed::Ignored);
        assert_eq!(q.push(db(VRDMA_DB_SQ, QPN_MASK + 1)), Pushed::Ignored);
        let b = q.take();
        assert_eq!(
            b.records,
            vec![
                db(VRDMA_DB_SQ, 5),
                db(VRDMA_DB_RQ, 5),
                db(VRDMA_DB_CQ_ARM, 5)
            ]
        );
        assert!(!b.sweep);
        // Taken records are no longer pending: the same object queues again.
        assert_eq!(q.push(db(VRDMA_DB_SQ, 5)), Pushed::Queued);
    }

    #[test]
    fn received_counts_what_a_batch_will_cover() {
        let mut q = DoorbellQueue::new();
        q.push(db(VRDMA_DB_SQ, 5));
        q.push(db(VRDMA_DB_SQ, 5)); // merged: still covered by the next take
        q.push(db(vrdma_spec::VRDMA_DB_SRQ, 5)); // ignored: nothing to wait for
        q.push(db(99, 1));
        assert_eq!(q.received(), 2);
        assert_eq!(q.take().received, 2, "the batch covers both");
        assert_eq!(q.received(), 2, "taking does not move the count");
        // Over the bound a QP record is covered by the sweep; a CQ_ARM hint is dropped.
        for id in 0..MAX_PENDING as u32 {
            q.push(db(VRDMA_DB_CQ_ARM, id));
        }
        let before = q.received();
        assert_eq!(q.push(db(VRDMA_DB_CQ_ARM, u32::MAX)), Pushed::Dropped);
        assert_eq!(q.received(), before);
        assert_eq!(q.push(db(VRDMA_DB_SQ, 7)), Pushed::Swept);
        assert_eq!(q.received(), before + 1);
    }

    /// A round's share: the first records in arrival order; the rest stay queued and keep
    /// merging; each batch covers exactly the records accepted before the first one it left
    /// (a merge into a record still queued is not covered); a pending sweep takes everything.
    #[test]
    fn a_round_takes_a_share_and_covers_what_came_before_the_rest() {
        let mut q = DoorbellQueue::new();
        for id in 0..5 {
            q.push(db(VRDMA_DB_SQ, id)); // accepted 1..=5
        }
        q.push(db(VRDMA_DB_SQ, 0)); // 6: merged into the first record
        q.push(db(VRDMA_DB_SQ, 4)); // 7: merged into the last
        let b = q.take_at_most(2);
        assert_eq!(b.records, vec![db(VRDMA_DB_SQ, 0), db(VRDMA_DB_SQ, 1)]);
        assert!(!b.sweep);
        assert_eq!(
            b.received, 2,
            "covers what came before record 2, not merge 6"
        );
        assert_eq!(q.len(), 3);
        // Taken records queue again; queued ones still merge.
        assert_eq!(q.push(db(VRDMA_DB_SQ, 0)), Pushed::Queued); // 8
        assert_eq!(q.push(db(VRDMA_DB_SQ, 3)), Pushed::Merged); // 9
        let b = q.take_at_most(3);
        assert_eq!(
            b.records,
            vec![db(VRDMA_DB_SQ, 2), db(VRDMA_DB_SQ, 3), db(VRDMA_DB_SQ, 4)]
        );
        assert_eq!(b.received, 7, "up to record 0's second arrival (8)");
        let b = q.take_at_most(0);
        assert_eq!(b.records, vec![db(VRDMA_DB_SQ, 0)], "at least one record");
        assert_eq!(b.received, 9, "an emptied queue covers everything");
        assert!(q.is_empty());
        assert_eq!(
            q.take_at_most(4),
            DoorbellBatch {
                received: 9,
                ..Default::default()
            }
        );

        // A sweep takes every record with it.
        for id in 0..4 {
            q.push(db(VRDMA_DB_RQ, id));
        }
        q.request_sweep();
        let b = q.take_at_most(1);
        assert_eq!(b.records.len(), 4);
        assert!(b.sweep);
        assert_eq!(b.received, 13);
        assert!(q.is_empty());
    }
}
