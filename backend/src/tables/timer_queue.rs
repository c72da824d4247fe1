//! The per-device queue of transport deadlines: per engine worker (a QP's deadlines live in
//! its worker's shard, `qp::worker_of`), a min-heap of `(deadline, qpn)` entries and a
//! worklist of QPs to visit at the next tick. Only the data structure lives here, with the
//! tables it belongs to; what a deadline means, when entries are pushed and how a tick walks
//! them is the transport's (`transport/timers.rs`), whose cost per tick therefore does not grow
//! with idle QPs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// The device's timer shards, one per engine worker (at least one).
#[derive(Debug)]
pub struct TimerQueue {
    shards: Vec<TimerShard>,
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
            shards: vec![TimerShard::default()],
        }
    }
}

impl TimerQueue {
    /// Entries (heaps and worklists) examined by all ticks so far.
    pub fn visited(&self) -> u64 {
        self.shards.iter().map(|s| s.visited).sum()
    }

    /// Heap entries, stale ones included.
    pub fn heap_len(&self) -> usize {
        self.shards.iter().map(|s| s.heap.len()).sum()
    }

    /// Empty every shard (the number of shards stays).
    pub fn clear(&mut self) {
        for s in &mut self.shards {
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
        self.shards = (0..n.max(1)).map(|_| TimerShard::default()).collect();
    }

    /// Worker `w`'s shard (`w` below [`TimerQueue::shards`]; a larger one is taken modulo).
    pub(crate) fn shard(&mut self, w: usize) -> &mut TimerShard {
        let n = self.shards.len();
        &mut self.shards[w % n]
    }
}
