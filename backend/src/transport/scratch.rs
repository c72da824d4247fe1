//! Reusable vectors for the guest ranges one packet's copy resolves to (`MrTable::resolve_into`),
//! one pair per thread: steady-state traffic through pinned MRs allocates nothing per packet,
//! and the engine workers of a device do not share (and contend for) one vector. A nested user
//! on the same thread (none today) would find the vector taken and get an empty one.

use std::cell::Cell;

use crate::memory::mr::GuestRange;

thread_local! {
    static REQUESTER: Cell<Vec<GuestRange>> = const { Cell::new(Vec::new()) };
    static RESPONDER: Cell<Vec<GuestRange>> = const { Cell::new(Vec::new()) };
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
}
