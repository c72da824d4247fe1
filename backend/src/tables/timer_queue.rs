//! The per-device queue of transport deadlines: per engine worker (a QP's deadlines live in
//! its worker's shard, `qp::worker_of`), a min-heap of `(deadline, qpn)` entries and a
//! worklist of QPs to visit at the next tick. Only the data structure lives here, with the
//! tables it belongs to; what a deadline means, when entries are pushed and how a tick walks
//! them is the transport's (`transport/timers.rs`), whose cost per tick therefore does not grow
//! with idle QPs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::MutexGuard;
use std::time::Instant;

use crate::sync::Locked;

/// The device's timer shards, one per engine worker (at least one).
#[derive(Debug)]
pub struct TimerQueue {
    /// Each behind its own lock: only its worker takes it, so workers never wait for each
    /// other's timers.
    shards: Vec<Locked<TimerShard>>,
}

/// One worker's timer heap and tick worklist.
#[derive(Debug, Default)]
pub struct TimerShard {
    pub(crate) heap: BinaryHeap<Reverse<(Instant, u32)>>,
    pub(crate) work: Vec<u32>,
    /// Spare buffer the worklist is swapped with during a tick (no allocation per tick).
    pub(crate) spare: Vec<u32>,
    /// Heap entries and worklist slots examined by ticks so far (test hook: the work per tick).
    pub(crate) visited: u64,
}

impl Default for TimerQueue {
    fn default() -> Self {
        TimerQueue {
            shards: vec![Default::default()],
        }
    }
}

impl TimerQueue {
    /// Entries (heaps and worklists) examined by all ticks so far.
    pub fn visited(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().visited).sum()
    }

    /// Heap entries, stale ones included.
    pub fn heap_len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().heap.len()).sum()
    }

    /// Empty every shard (the number of shards stays).
    pub fn clear(&mut self) {
        for s in self.shards.iter_mut().map(Locked::get_mut) {
            s.heap.clear();
            s.work.clear();
        }
    }

    /// The number of shards (engine workers).
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// `n` empty shards (at least one); the caller queues the live deadlines again.
    pub(crate) fn reshard(&mut self, n: usize) {
        self.shards = (0..n.max(1)).map(|_| Default::default()).collect();
    }

    /// Worker `w`'s shard (`w` below [`TimerQueue::shards`]; a larger one is taken modulo).
    /// Locked until the guard drops.
    pub(crate) fn shard(&self, w: usize) -> MutexGuard<'_, TimerShard> {
        let n = self.shards.len();
        self.shards[w % n].lock()
    }

    /// [`TimerQueue::shard`] through the exclusively borrowed queue: no lock taken.
    pub(crate) fn shard_mut(&mut self, w: usize) -> &mut TimerShard {
        let n = self.shards.len();
        self.shards[w % n].get_mut()
    }
}
