//! Who flushes a QP that entered ERR (ARCHITECTURE.md "Invariants"): QPs wait in their engine
//! worker's queue and are flushed on that worker's thread, one after the other. The flush
//! takes the QP's protocol state, and only the QP's own worker may (its doorbells, frames and
//! timers need it next; a flush on another thread would make them find the state taken and
//! drop their work). A worker that moves another worker's QP to ERR (a shared CQ overflowed,
//! a shared SRQ broke) only queues it there and asks for a kick. A thread that is not a
//! worker holds the device exclusively (a control command, a unit test), so it flushes every
//! queued QP itself, unless it runs a command on the shared device ([`SharedCommand`],
//! MODIFY_QP beside the workers): then it only queues, and the kick that follows every command
//! batch wakes the owner.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::sync::Locked;

thread_local! {
    /// The engine worker this thread is (`enter_worker`), `None` for any other thread.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
    /// This thread is inside a flush loop: flushes it schedules meanwhile only queue, so a
    /// chain of overflows is walked iteratively, never recursively.
    static FLUSHING: Cell<bool> = const { Cell::new(false) };
    /// This thread runs a command on the device held shared (`SharedCommand`).
    static SHARED: Cell<bool> = const { Cell::new(false) };
}

/// While alive, the calling thread runs a command on the shared device, beside the workers:
/// a QP it moves to ERR is only queued for its worker (`Device::schedule_flush`).
pub(crate) struct SharedCommand(());

impl SharedCommand {
    pub(crate) fn enter() -> SharedCommand {
        SHARED.with(|c| c.set(true));
        SharedCommand(())
    }
}

impl Drop for SharedCommand {
    fn drop(&mut self) {
        SHARED.with(|c| c.set(false));
    }
}

/// Whether the calling thread may only queue flushes: it is an engine worker other than
/// `owner`, or it runs a command on the shared device.
pub(crate) fn queue_only(owner: usize) -> bool {
    current_worker().is_some_and(|w| w != owner) || SHARED.with(Cell::get)
}

/// Mark the calling thread as engine worker `w` for its life (the engine's worker threads).
pub fn enter_worker(w: usize) {
    WORKER.with(|c| c.set(Some(w)));
}

/// The engine worker the calling thread is, if it is one.
pub(crate) fn current_worker() -> Option<usize> {
    WORKER.with(Cell::get)
}

/// Resets [`FLUSHING`] even if a flush unwinds.
pub(crate) struct FlushLoop(());

impl FlushLoop {
    /// Enter the thread's flush loop; `None` if it is in it already.
    pub(crate) fn enter() -> Option<FlushLoop> {
        // Built only when entering: a guard built and dropped here would clear the flag.
        let entered = !FLUSHING.with(|f| f.replace(true));
        entered.then(|| FlushLoop(()))
    }
}

impl Drop for FlushLoop {
    fn drop(&mut self) {
        FLUSHING.with(|f| f.set(false));
    }
}

/// One queue of QPs to flush per engine worker, and the workers to kick for theirs.
#[derive(Debug)]
pub(crate) struct FlushQueues {
    queues: Vec<Locked<VecDeque<u32>>>,
    /// Bit `w`: worker `w`'s queue got a QP from another worker (taken by
    /// [`FlushQueues::take_kicks`]).
    kicks: AtomicU32,
    /// QPs queued in all queues: every engine batch looks, so an empty set of queues costs one
    /// load, not a lock.
    queued: AtomicUsize,
}

impl Default for FlushQueues {
    fn default() -> Self {
        FlushQueues {
            queues: vec![Default::default()],
            kicks: AtomicU32::new(0),
            queued: AtomicUsize::new(0),
        }
    }
}

impl FlushQueues {
    /// One queue per worker (at least one); queued QPs are dropped (the device is quiet).
    pub(crate) fn set_workers(&mut self, n: usize) {
        self.queues = (0..n.max(1)).map(|_| Default::default()).collect();
    }

    pub(crate) fn workers(&self) -> usize {
        self.queues.len()
    }

    pub(crate) fn clear(&mut self) {
        for q in &mut self.queues {
            q.get_mut().clear();
        }
        *self.kicks.get_mut() = 0;
        *self.queued.get_mut() = 0;
    }

    /// Queue QP `qpn` on worker `w`'s queue.
    pub(crate) fn push(&self, w: usize, qpn: u32) {
        if let Some(q) = self.queues.get(w) {
            q.lock().push_back(qpn);
            self.queued.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Whether no QP is queued anywhere (a push before a kick is seen by the kicked worker).
    pub(crate) fn is_empty(&self) -> bool {
        self.queued.load(Ordering::SeqCst) == 0
    }

    /// Ask for worker `w` to be kicked: it has a QP to flush.
    pub(crate) fn request_kick(&self, w: usize) {
        if w < 32 {
            self.kicks.fetch_or(1 << w, Ordering::SeqCst);
        }
    }

    /// Whether QP `qpn` waits in worker `w`'s queue.
    pub(crate) fn is_queued(&self, w: usize, qpn: u32) -> bool {
        !self.is_empty() && self.queues.get(w).is_some_and(|q| q.lock().contains(&qpn))
    }

    /// The workers to kick (bit per worker), cleared.
    pub(crate) fn take_kicks(&self) -> u32 {
        self.kicks.swap(0, Ordering::SeqCst)
    }

    /// The next QP of worker `w`'s queue.
    pub(crate) fn pop(&self, w: usize) -> Option<u32> {
        let q = self.queues.get(w)?.lock().pop_front();
        if q.is_some() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        q
    }

    /// The next QP of any queue (a thread that holds the device exclusively).
    pub(crate) fn pop_any(&self) -> Option<u32> {
        (0..self.queues.len()).find_map(|w| self.pop(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_are_per_worker_and_kicks_are_taken_once() {
        let mut f = FlushQueues::default();
        f.set_workers(3);
        f.push(2, 7);
        f.push(0, 5);
        f.push(2, 9);
        assert!(!f.is_empty());
        f.request_kick(2);
        assert_eq!(f.take_kicks(), 1 << 2);
        assert_eq!(f.take_kicks(), 0);
        assert!(f.is_queued(2, 9) && !f.is_queued(0, 9) && !f.is_queued(2, 5));
        assert_eq!(f.pop(2), Some(7));
        assert_eq!(f.pop(1), None);
        assert_eq!(f.pop_any(), Some(5));
        assert_eq!(f.pop_any(), Some(9));
        assert_eq!(f.pop_any(), None);
        assert!(f.is_empty(), "every pop counted");
    }

    #[test]
    fn the_flush_loop_is_entered_once_per_thread() {
        let outer = FlushLoop::enter().expect("not in a loop yet");
        assert!(FlushLoop::enter().is_none(), "nested: only queue");
        assert!(
            FlushLoop::enter().is_none(),
            "a refused entry leaves the loop's flag"
        );
        drop(outer);
        assert!(FlushLoop::enter().is_some());
        assert_eq!(current_worker(), None);
        std::thread::spawn(|| {
            enter_worker(3);
            assert_eq!(current_worker(), Some(3));
        })
        .join()
        .unwrap();
        assert_eq!(current_worker(), None, "per thread");
    }
}
