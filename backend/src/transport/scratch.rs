//! Reusable buffers of the transport, one set per thread: the guest ranges one packet's copy
//! resolves to (`MrTable::resolve_into`) and the bytes of a receive WQE being decoded. Steady-
//! state traffic through pinned MRs allocates nothing per packet for them, and the engine
//! workers of a device do not share (and contend for) one buffer. A nested user on the same
//! thread (none today) would find the buffer taken and get an empty one.

use std::cell::Cell;

use crate::memory::mr::GuestRange;

thread_local! {
    static REQUESTER: Cell<Vec<GuestRange>> = const { Cell::new(Vec::new()) };
    static RESPONDER: Cell<Vec<GuestRange>> = const { Cell::new(Vec::new()) };
    static WQE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The calling thread's WQE buffer, `len` zero bytes (a ring slot's size).
pub(crate) fn take_wqe(len: usize) -> Vec<u8> {
    let mut v = WQE.with(Cell::take);
    v.clear();
    v.resize(len, 0);
    v
}

/// Give the WQE buffer back.
pub(crate) fn give_back_wqe(v: Vec<u8>) {
    WQE.with(|c| c.set(v));
}

/// Whose vector: the requester's gather / READ response scatter, or the responder's.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    Requester,
    Responder,
}

/// The calling thread's vector for `side`, empty (its capacity kept).
pub(crate) fn take(side: Side) -> Vec<GuestRange> {
    let mut v = match side {
        Side::Requester => REQUESTER.with(Cell::take),
        Side::Responder => RESPONDER.with(Cell::take),
    };
    v.clear();
    v
}

/// Give the vector back for the next packet on this thread.
pub(crate) fn give_back(side: Side, v: Vec<GuestRange>) {
    match side {
        Side::Requester => REQUESTER.with(|c| c.set(v)),
        Side::Responder => RESPONDER.with(|c| c.set(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_keeps_its_capacity_per_thread_and_side() {
        let mut v = take(Side::Requester);
        v.reserve(64);
        let cap = v.capacity();
        give_back(Side::Requester, v);
        assert!(take(Side::Responder).capacity() < cap, "sides are apart");
        let again = take(Side::Requester);
        assert_eq!(again.capacity(), cap);
        assert!(again.is_empty());
        // Taken: a nested user gets a fresh one; another thread has its own.
        assert_eq!(take(Side::Requester).capacity(), 0);
        give_back(Side::Requester, again);
        let other = std::thread::spawn(|| take(Side::Requester).capacity());
        assert_eq!(other.join().unwrap(), 0);
    }

    #[test]
    fn the_wqe_buffer_is_zeroed_to_the_slot_size() {
        let mut b = take_wqe(64);
        b.fill(0xAA);
        give_back_wqe(b);
        let b = take_wqe(32);
        assert_eq!(b, vec![0u8; 32]);
        assert!(b.capacity() >= 64, "reused");
    }
}
