//! Test support: reader threads and a writer that are made to overlap (issue 38 item 5).
//!
//! A test that runs readers beside a writer and only hopes the scheduler interleaves them
//! fails in release builds on a 2-core host: the writer's loop ends before a reader is ever
//! scheduled. Here every thread first meets at a barrier (so every reader is running), each
//! reader publishes how many rounds it has done, and the writer goes on, or waits, until the
//! readers have done the rounds the test asks for; only then does it stop them.
//!
//! A reader that panics counts as done (so the writer does not wait for it forever) and the
//! panic reaches the test through its join; a writer that panics stops the readers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;

/// Shared by the readers and the writer of one test (see the module documentation).
#[derive(Debug)]
pub struct Overlap {
    start: Barrier,
    rounds: Box<[AtomicU64]>,
    stop: AtomicBool,
}

impl Overlap {
    /// For `readers` reader threads and one writer.
    pub fn new(readers: usize) -> Self {
        Overlap {
            start: Barrier::new(readers + 1),
            rounds: (0..readers).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
        }
    }

    /// Reader `r`: wait until every thread runs, then call `round` until the writer stops.
    /// Returns the rounds done.
    pub fn read(&self, r: usize, mut round: impl FnMut()) -> u64 {
        let done = ReaderDone(&self.rounds[r]);
        self.start.wait();
        let mut n = 0;
        while !self.stop.load(Ordering::Acquire) {
            round();
            n += 1;
            done.0.store(n, Ordering::Release);
        }
        n
    }

    /// The writer: waits until every reader runs. The readers stop when the returned guard
    /// drops.
    pub fn writer(&self) -> Writer<'_> {
        self.start.wait();
        Writer(self)
    }
}

/// A reader that ends (returns or panics) no longer holds the writer back.
struct ReaderDone<'a>(&'a AtomicU64);

impl Drop for ReaderDone<'_> {
    fn drop(&mut self) {
        self.0.store(u64::MAX, Ordering::Release);
    }
}

/// See [`Overlap::writer`].
#[derive(Debug)]
pub struct Writer<'a>(&'a Overlap);

impl Writer<'_> {
    /// Every reader has done at least `rounds` rounds (or ended).
    pub fn readers_did(&self, rounds: u64) -> bool {
        self.0
            .rounds
            .iter()
            .all(|n| n.load(Ordering::Acquire) >= rounds)
    }

    /// Wait until every reader has done `more` rounds beyond those it had done at the call.
    pub fn wait_readers(&self, more: u64) {
        let at: Vec<u64> = self
            .0
            .rounds
            .iter()
            .map(|n| n.load(Ordering::Acquire))
            .collect();
        for (n, at) in self.0.rounds.iter().zip(at) {
            while n.load(Ordering::Acquire) < at.saturating_add(more) {
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_waits_for_every_reader_and_then_stops_them() {
        const ROUNDS: u64 = 1000;
        let o = Overlap::new(2);
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|r| {
                    let o = &o;
                    s.spawn(move || o.read(r, || {}))
                })
                .collect();
            let w = o.writer();
            let mut steps = 0u64;
            while steps < 10 || !w.readers_did(ROUNDS) {
                steps += 1;
            }
            w.wait_readers(3);
            drop(w);
            for r in readers {
                let n = r.join().unwrap();
                assert!(n >= ROUNDS + 3, "reader stopped early: {n}");
            }
        });
    }

    #[test]
    fn a_panicking_reader_does_not_hold_the_writer_back() {
        let o = Overlap::new(1);
        std::thread::scope(|s| {
            let r = s.spawn(|| o.read(0, || panic!("reader fails")));
            let w = o.writer();
            while !w.readers_did(1) {
                std::thread::yield_now();
            }
            w.wait_readers(1);
            drop(w);
            assert!(r.join().is_err());
        });
    }
}
