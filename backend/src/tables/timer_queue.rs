//! The per-device queue of transport deadlines: a min-heap of `(deadline, qpn)` entries and a
//! worklist of QPs to visit at the next tick. Only the data structure lives here, with the
//! tables it belongs to; what a deadline means, when entries are pushed and how a tick walks
//! them is the transport's (`transport/timers.rs`), whose cost per tick therefore does not grow
//! with idle QPs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// The device's timer heap and tick worklist.
#[derive(Debug, Default)]
pub struct TimerQueue {
    pub(crate) heap: BinaryHeap<Reverse<(Instant, u32)>>,
    pub(crate) work: Vec<u32>,
    /// Spare buffer the worklist is swapped with during a tick (no allocation per tick).
    pub(crate) spare: Vec<u32>,
    /// Heap entries and worklist slots examined by ticks so far (test hook: the work per tick).
    pub(crate) visited: u64,
}

impl TimerQueue {
    /// Entries (heap and worklist) examined by all ticks so far.
    pub fn visited(&self) -> u64 {
        self.visited
    }

    /// Heap entries, stale ones included.
    pub fn heap_len(&self) -> usize {
        self.heap.len()
    }

    pub fn clear(&mut self) {
        self.heap.clear();
        self.work.clear();
    }
}
