//! Engine workers (`--engine-threads N`, ARCHITECTURE.md "Engine workers"): what the other
//! threads route to one worker, and where a doorbell record or a received frame goes.
//!
//! A QP belongs to one worker for its life: `qp::worker_of(qpn, N)`. Everything a QP sends is
//! sent by its worker (its doorbells, the frames addressed to it, its timers and ODP
//! resumptions), so the frames of one QP leave in the order the transport made them even
//! though workers send outside the device lock. Device-wide work (CQ_ARM hints, CQ moderation,
//! page-request timeouts) may run on any worker.
//!
//! Each worker has an [`Inbox`]: its doorbell queue, its eventfd and busy-poll flags, and the
//! frames other workers took for its QPs (worker 0 from the uplink, any worker looped back to
//! a QP of the same device). The inbox is bounded ([`INBOX_FRAMES`], [`INBOX_BYTES`]): beyond
//! it a frame is dropped and counted (`PortStats::drop_worker_busy`); RC retransmits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;
use vrdma_spec::{VrdmaDoorbell, VRDMA_DB_RQ, VRDMA_DB_SQ, VRDMA_MCAST_QPN};

use super::doorbells::DoorbellQueue;
use crate::port::{classify_located, Destination};
use crate::qp::worker_of;
use crate::sync::lock;

/// Most engine workers per device (`--engine-threads`).
pub const MAX_WORKERS: usize = 16;

/// Frames an inbox holds for its worker before it drops (a worker that stopped taking them
/// must not grow host memory): a few receive batches...
pub const INBOX_FRAMES: usize = 1024;
/// ...and at most this many bytes of buffers (their capacity: what they hold of the host),
/// like a fabric port's receive queue (`fabric::rxqueue::RXQ_MAX_BYTES`).
pub const INBOX_BYTES: usize = 16 << 20;

/// How a kick reaches a worker without a system call while it busy-polls (`Poller`). A
/// Dekker pair: the kicker sets `work` then reads `polling`; the worker clears `polling` then
/// reads `work`. With SeqCst on both sides one of them sees the other's store, so either the
/// kicker writes the eventfd or the worker sees the work before it sleeps.
#[derive(Debug, Default)]
pub(super) struct WakeFlags {
    /// Set by every kick; cleared by the worker when it starts a batch.
    pub(super) work: AtomicBool,
    /// The worker is spinning and will see `work` without the eventfd.
    pub(super) polling: AtomicBool,
}

/// A buffer routed to another worker's inbox: its segment mark and, for a by-reference segment, the
/// references that hold its payloads (spec §16.2 rule 6).
#[derive(Debug)]
pub(super) struct Routed {
    pub(super) buf: Vec<u8>,
    pub(super) segment: bool,
    pub(super) refs: Option<crate::wire::segment::SegRefs>,
}

impl Routed {
    /// A buffer of frames that carry their bytes.
    pub(super) fn plain(buf: Vec<u8>, segment: bool) -> Self {
        Routed {
            buf,
            segment,
            refs: None,
        }
    }

    /// Give the buffer and the references back to their pools.
    pub(super) fn recycle(self) {
        super::packet::recycle_frame(self.buf);
        if let Some(r) = self.refs {
            r.recycle();
        }
    }
}

/// `EngineSender::fence`: wait, until `limit` or `stop`, for every worker of `inboxes` to have
/// run the records its queue had accepted when this was called.
pub(super) fn fence(inboxes: &[Inbox], stop: &AtomicBool, limit: Duration) -> bool {
    let mut targets = [0u64; MAX_WORKERS];
    for (t, inbox) in targets.iter_mut().zip(inboxes) {
        *t = lock(&inbox.queue).received();
    }
    let deadline = Instant::now() + limit;
    for (inbox, &t) in inboxes.iter().zip(targets.iter()) {
        let mut spins = 0u32;
        while inbox.done.load(Ordering::Acquire) < t {
            if stop.load(Ordering::Acquire) || Instant::now() >= deadline {
                return false;
            }
            // A batch of a few WQEs takes microseconds; a worker descheduled on a busy host
            // takes longer, and the waiter then sleeps rather than spin on its core.
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
    true
}

/// See the module documentation.
#[derive(Debug)]
pub(super) struct Inbox {
    pub(super) queue: Mutex<DoorbellQueue>,
    pub(super) kick: EventFd,
    pub(super) wake: WakeFlags,
    /// The queue's `received()` that the worker's last batch covered (`DoorbellBatch::received`:
    /// all of it unless records were left for the next round), stored once that batch's records
    /// were run and its frames sent: what a control command waits for (`EngineSender::fence`).
    pub(super) done: AtomicU64,
    frames: Mutex<InboxFrames>,
}

/// An inbox's frames and the bytes their buffers hold.
#[derive(Debug, Default)]
struct InboxFrames {
    frames: Vec<Routed>,
    bytes: usize,
}

impl Inbox {
    pub(super) fn new(kick: EventFd) -> Inbox {
        Inbox {
            queue: Mutex::new(DoorbellQueue::new()),
            kick,
            wake: WakeFlags::default(),
            done: AtomicU64::new(0),
            frames: Mutex::new(InboxFrames::default()),
        }
    }

    /// Wake the worker (see [`WakeFlags`]).
    pub(super) fn kick(&self) {
        self.wake.work.store(true, Ordering::SeqCst);
        if self.wake.polling.load(Ordering::SeqCst) {
            return;
        }
        // An eventfd write only fails when the counter would overflow, i.e. the worker has
        // already been kicked; nothing is lost.
        let _ = self.kick.write(1);
    }

    /// Queue a frame for the worker (the caller kicks it). A full inbox gives the frame back.
    pub(super) fn push(&self, frame: Routed) -> Result<(), Routed> {
        let mut q = lock(&self.frames);
        let bytes = frame.buf.capacity();
        if q.frames.len() >= INBOX_FRAMES || q.bytes + bytes > INBOX_BYTES {
            return Err(frame);
        }
        q.bytes += bytes;
        q.frames.push(frame);
        Ok(())
    }

    /// Move every routed frame into `into` (empty; it keeps its capacity for the inbox).
    pub(super) fn take_frames(&self, into: &mut Vec<Routed>) {
        let mut q = lock(&self.frames);
        std::mem::swap(into, &mut q.frames);
        q.bytes = 0;
    }
}

/// The worker a doorbell record is for: an SQ or RQ record its QP's, anything else (CQ_ARM,
/// which any worker may run under the device lock) worker 0.
pub(super) fn doorbell_worker(db: &VrdmaDoorbell, workers: usize) -> usize {
    match db.type_ {
        VRDMA_DB_SQ | VRDMA_DB_RQ => worker_of(db.id, workers),
        _ => 0,
    }
}

/// The workers set in a bit mask (at most [`MAX_WORKERS`], so a `u32`).
pub(super) fn each_bit(mask: u32) -> impl Iterator<Item = usize> {
    (0..MAX_WORKERS).filter(move |w| mask & (1 << w) != 0)
}

/// The workers (bit per worker, of `n`) that take a received buffer: the worker of the BTH's
/// destination QP when its first frame is a RoCEv2 frame for the engine (`classify_located`);
/// for a multicast datagram the worker of each attached QP (`members`: the group's QPNs), so
/// every member is delivered to by its own worker (its responder state is taken there); bit
/// `w` alone for a frame for the guest or one this worker counts as dropped.
pub(super) fn received_by(
    buf: &[u8],
    segment: bool,
    mac: crate::wire::eth::MacAddr,
    ours: impl Fn(&crate::wire::frame::Gid) -> bool,
    members: impl Fn(&crate::wire::frame::Gid) -> u32,
    w: usize,
    n: usize,
) -> u32 {
    let here = 1 << w;
    let Some(f) = super::frames_of(buf, segment).next() else {
        return here;
    };
    match classify_located(f, &[mac], false, ours) {
        (Destination::Engine, Some(l)) => match l.dest_qpn() {
            Some(VRDMA_MCAST_QPN) => Some(members(&l.dst_gid())).filter(|&m| m != 0),
            Some(qpn) => Some(1 << worker_of(qpn, n)),
            None => None,
        }
        .unwrap_or(here),
        _ => here,
    }
}

/// [`received_by`] for a frame the engine looped back (always for the engine).
pub(super) fn looped_to(
    buf: &[u8],
    segment: bool,
    members: impl Fn(&crate::wire::frame::Gid) -> u32,
    w: usize,
    n: usize,
) -> u32 {
    let here = 1 << w;
    if n <= 1 {
        return here;
    }
    let Some(l) = super::frames_of(buf, segment)
        .next()
        .and_then(|f| crate::wire::frame::locate(f).ok())
    else {
        return here;
    };
    match l.dest_qpn() {
        Some(VRDMA_MCAST_QPN) => Some(members(&l.dst_gid())).filter(|&m| m != 0),
        Some(qpn) => Some(1 << worker_of(qpn, n)),
        None => None,
    }
    .unwrap_or(here)
}

/// The workers (bit per worker, of `n`) of the QPs in `qpns`: a multicast group's members.
pub(super) fn owners(qpns: &[u32], n: usize) -> u32 {
    qpns.iter().fold(0, |m, &q| m | 1 << worker_of(q, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;
    use vrdma_spec::VRDMA_DB_CQ_ARM;

    #[test]
    fn qp_doorbells_go_to_the_qps_worker_others_to_worker_0() {
        let db = |type_, id| VrdmaDoorbell { type_, id };
        assert_eq!(doorbell_worker(&db(VRDMA_DB_SQ, 17), 2), 1);
        assert_eq!(doorbell_worker(&db(VRDMA_DB_RQ, 17), 2), 1);
        assert_eq!(doorbell_worker(&db(VRDMA_DB_SQ, 18), 2), 0);
        assert_eq!(doorbell_worker(&db(VRDMA_DB_SQ, 17), 3), 2);
        assert_eq!(doorbell_worker(&db(VRDMA_DB_CQ_ARM, 17), 2), 0);
        assert_eq!(doorbell_worker(&db(VRDMA_DB_SQ, 17), 1), 0);
        assert_eq!(each_bit(0b1010).collect::<Vec<_>>(), [1, 3]);
    }

    #[test]
    fn a_full_inbox_gives_the_frame_back() {
        let inbox = Inbox::new(EventFd::new(EFD_NONBLOCK).unwrap());
        for i in 0..INBOX_FRAMES {
            assert!(inbox.push(Routed::plain(vec![i as u8], false)).is_ok());
        }
        let back = inbox.push(Routed::plain(vec![1, 2, 3], true)).unwrap_err();
        assert_eq!((back.buf, back.segment), (vec![1, 2, 3], true));
        let mut got = Vec::new();
        inbox.take_frames(&mut got);
        assert_eq!(got.len(), INBOX_FRAMES);
        assert!(inbox.push(Routed::plain(vec![9], false)).is_ok());
    }

    #[test]
    fn an_inbox_is_bounded_in_bytes_too() {
        let inbox = Inbox::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let big = || Routed::plain(Vec::with_capacity(64 << 10), true);
        let fit = INBOX_BYTES / (64 << 10);
        for _ in 0..fit {
            assert!(inbox.push(big()).is_ok());
        }
        assert!(inbox.push(big()).is_err());
        let mut got = Vec::new();
        inbox.take_frames(&mut got);
        assert_eq!(got.len(), fit);
        assert!(
            inbox.push(big()).is_ok(),
            "taking the frames frees the bytes"
        );
    }
}
