//! The DMA fence of by-reference fabric segments (spec §16.2 rule 6, issue #13 item 2).
//!
//! A by-reference segment carries, instead of its payload, where the payload is in the SENDING
//! device's guest memory (guest ranges resolved through the sender's MRs when the packet was
//! built). The receiving engine reads those ranges later, on its own thread. A reference may
//! only be read while what it points to is still what the sender's MR allowed, so every
//! operation that takes that permission away must (a) make every older reference unreadable
//! and (b) not complete while a reader may still be inside a copy through one.
//!
//! Mechanism: generation counters and a gate.
//! - one generation per MR slot ([`SlotGen`], bumped by DEREG_MR, REREG_MR, fast registration,
//!   LOCAL_INV / SEND_WITH_INV, ODP_INVALIDATE or reclaim in that slot: FRWR-heavy ULPs
//!   invalidate one MR per I/O, and the other MRs' references must keep flowing), and one per
//!   device ([`DmaFence::device_gen`], bumped by reset, SET_MEM_TABLE, migration suspend and
//!   state load), recorded in the reference when it is made;
//! - a per-device gate (an `RwLock<()>`): a reader checks the generations and copies under its
//!   read side; a fencing operation bumps the generation and then takes the write side once,
//!   which waits for at most the copies in flight (each is one packet, ≤ one path MTU, and
//!   takes no other lock), before the operation completes.
//!
//! Why that suffices: a reader that took the read side before the fencing operation's write
//! attempt finishes its copy before the operation completes (the memory was still the MR's);
//! a reader that takes it after sees the bumped generation (the write unlock releases, the
//! read lock acquires) and drops the packet without reading. Lock order: the gate is a leaf:
//! taken (read) by a receiving engine under its own device lock, (write) by the sender's
//! control path or engine under the sender's device lock; nothing is locked while it is held.

use crate::sync::{read, write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// The generation of one MR slot (shared by the slot and every reference made through it).
pub type SlotGen = Arc<AtomicU64>;

/// A device's fence (see the module documentation). Shared (`Arc`) by the device's MR table and
/// every reference its engine made.
#[derive(Debug, Default)]
pub struct DmaFence {
    device_gen: AtomicU64,
    gate: RwLock<()>,
}

impl DmaFence {
    /// The device generation a new reference records.
    pub fn device_gen(&self) -> u64 {
        self.device_gen.load(Ordering::Acquire)
    }

    /// Reset, SET_MEM_TABLE, suspend, state load: no reference made before may be read after
    /// this returns.
    pub fn fence_device(&self) {
        self.device_gen.fetch_add(1, Ordering::AcqRel);
        self.wait_readers();
    }

    /// An MR operation on the slot of `gen`: no reference made through that slot before may be
    /// read after this returns. Other slots' references are untouched.
    pub fn fence_slot(&self, gen: &AtomicU64) {
        gen.fetch_add(1, Ordering::AcqRel);
        self.wait_readers();
    }

    /// Take the write side once: returns when no copy that began before is still running.
    fn wait_readers(&self) {
        drop(write(&self.gate));
    }

    /// The read side, for one copy through references of this device: check the generations
    /// after taking it, copy, drop it. Never take another lock while holding it.
    pub fn read(&self) -> RwLockReadGuard<'_, ()> {
        read(&self.gate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_waits_for_the_copy_in_flight() {
        let f = Arc::new(DmaFence::default());
        let slot: SlotGen = Arc::default();
        let g = f.read();
        let f2 = Arc::clone(&f);
        let s2 = Arc::clone(&slot);
        let t = std::thread::spawn(move || f2.fence_slot(&s2));
        // The fence has started once the generation moved (it moves first); it cannot finish
        // while the copy holds the gate, and the moment given here lets a broken fence show
        // that it does (no scheduling is hoped for: a fence that has not run on yet would
        // not be finished either).
        while slot.load(Ordering::Acquire) != 1 {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !t.is_finished(),
            "the fence completed while a copy was in flight"
        );
        assert_eq!(slot.load(Ordering::Acquire), 1, "moved once");
        drop(g);
        t.join().unwrap();
        let before = f.device_gen();
        f.fence_device();
        assert_eq!(f.device_gen(), before + 1);
    }
}
