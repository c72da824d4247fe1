//! A device port's receive queue: frames the fabric delivered, waiting for the device's engine.
//!
//! Bounded in frames and in bytes (a guest flooding another guest costs the host at most
//! [`RXQ_MAX_BYTES`] per destination port); a full queue drops the frame, which RoCE treats as
//! loss. The eventfd is readable while frames are queued, so the engine's level-triggered epoll
//! wakes for them. Buffers circulate: the queue keeps a bounded pool of spare buffers that
//! [`RxQueue::pop_into`] refills with the buffer it swaps out of the engine's receive slot.
//!
//! Each entry carries its kind beside the buffer: an ordinary frame, or a fabric segment
//! (`wire::segment`, spec §16.2 rule 6) that only [`RxQueue::push_segment`] queues. The mark
//! is never derived from a buffer's bytes. A segment may carry its by-reference payloads
//! (`wire::segment::PayloadRefs`, [`RxQueue::push_segment_refs`]) beside it, popped with it by
//! [`RxQueue::pop_into_refs`].
//!
//! While the engine busy-polls the queue ([`RxQueue::set_polling`]) a push does not write the
//! eventfd: a Dekker pair like the engine's doorbell kick. The pusher queues the frame, then
//! reads `polling`; the engine clears `polling`, then looks at the queue. With SeqCst fences on
//! both sides one of them sees the other's store, so either the eventfd is written or the
//! engine finds the frame before it sleeps. A 64 B round trip between two spinning engines so
//! costs no system call for its frames (it cost an eventfd write and read per hop). The queue's
//! length is an atomic beside the lock (the `queued` half of the pair), so polling takes no
//! lock.

use std::collections::VecDeque;
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Frames a port queues before it drops.
pub const RXQ_MAX_FRAMES: usize = 4096;
/// Bytes (frame lengths) a port queues before it drops.
pub const RXQ_MAX_BYTES: usize = 16 << 20;
/// Spare buffers kept for reuse.
const SPARE_MAX: usize = 512;
/// Capacity of a fresh buffer: a jumbo frame fits, so buffers never grow afterwards.
const BUF_CAPACITY: usize = 9216;

/// A segment's by-reference payloads.
type Refs = Option<Box<dyn crate::wire::segment::PayloadRefs>>;

#[derive(Default)]
struct State {
    /// Each buffer with its segment mark (and a segment's by-reference payloads).
    frames: VecDeque<(Vec<u8>, bool, Refs)>,
    bytes: usize,
    spare: Vec<Vec<u8>>,
    /// The eventfd was written and not read since: it is readable.
    signaled: bool,
}

/// See the module documentation.
pub struct RxQueue {
    state: Mutex<State>,
    /// `state.frames.len()`, stored under the lock after every push and pop: the busy-polling
    /// engine reads it without the lock, which every push of the peer engine takes (the
    /// lock taken per poll was contended on every 64 B round trip).
    queued: AtomicUsize,
    ready: EventFd,
    /// The engine is busy-polling the queue and will see a push without the eventfd.
    polling: AtomicBool,
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxQueue").finish_non_exhaustive()
    }
}

impl RxQueue {
    pub fn new() -> std::io::Result<RxQueue> {
        Ok(RxQueue {
            state: Mutex::new(State {
                frames: VecDeque::with_capacity(256),
                ..State::default()
            }),
            queued: AtomicUsize::new(0),
            ready: EventFd::new(EFD_NONBLOCK)?,
            polling: AtomicBool::new(false),
        })
    }

    /// The engine starts (`true`) or stops busy-polling [`RxQueue::is_empty`]. After it stops
    /// it must look at the queue once more before it sleeps (the other half of the Dekker pair
    /// in the module documentation).
    pub fn set_polling(&self, polling: bool) {
        self.polling.store(polling, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// After a push: publish the length, then make the eventfd readable unless it is or the
    /// engine is polling.
    fn wake(&self, s: &mut State) {
        self.queued.store(s.frames.len(), Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !s.signaled && !self.polling.load(Ordering::SeqCst) {
            // Fails only if the counter would overflow: it is already readable.
            let _ = self.ready.write(1);
            s.signaled = true;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue a copy of `frame`; false (dropped) when the queue is full.
    pub fn push(&self, frame: &[u8]) -> bool {
        let mut s = self.lock();
        if s.frames.len() >= RXQ_MAX_FRAMES || s.bytes + frame.len() > RXQ_MAX_BYTES {
            return false;
        }
        let mut buf = s
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUF_CAPACITY.max(frame.len())));
        buf.clear();
        buf.extend_from_slice(frame);
        s.bytes += frame.len();
        s.frames.push_back((buf, false, None));
        self.wake(&mut s);
        true
    }

    /// Queue `frame` itself, leaving a spare buffer (or an empty one) in its place: no copy.
    /// False (dropped, `frame` untouched) when the queue is full.
    pub fn push_owned(&self, frame: &mut Vec<u8>) -> bool {
        self.push_owned_as(frame, false, None).is_ok()
    }

    /// [`RxQueue::push_owned`] for a fabric segment: popped with its segment mark.
    pub fn push_segment(&self, seg: &mut Vec<u8>) -> bool {
        self.push_owned_as(seg, true, None).is_ok()
    }

    /// [`RxQueue::push_segment`] with the segment's by-reference payloads, which travel with
    /// it; when the queue is full they come back (`Err`) with `seg` untouched.
    pub fn push_segment_refs(
        &self,
        seg: &mut Vec<u8>,
        refs: Box<dyn crate::wire::segment::PayloadRefs>,
    ) -> Result<(), Box<dyn crate::wire::segment::PayloadRefs>> {
        self.push_owned_as(seg, true, Some(refs))
            .map_err(|r| r.expect("the refs pushed come back"))
    }

    fn push_owned_as(&self, frame: &mut Vec<u8>, segment: bool, refs: Refs) -> Result<(), Refs> {
        let mut s = self.lock();
        if s.frames.len() >= RXQ_MAX_FRAMES || s.bytes + frame.len() > RXQ_MAX_BYTES {
            return Err(refs);
        }
        let spare = s.spare.pop().unwrap_or_default();
        let f = std::mem::replace(frame, spare);
        s.bytes += f.len();
        s.frames.push_back((f, segment, refs));
        self.wake(&mut s);
        Ok(())
    }

    /// Move up to `slots.len()` queued buffers into `slots` (each swapped with the slot's old
    /// buffer, which becomes a spare) and, for each, call `mark(i, segment)` with its slot
    /// index and segment mark; returns how many. An emptied queue clears the eventfd. A
    /// segment's by-reference payloads are gathered into its buffer first, for a caller that
    /// does not take them (a stale one loses the segment: an empty, unmarked buffer).
    pub fn pop_into(&self, slots: &mut [Vec<u8>], mut mark: impl FnMut(usize, bool)) -> usize {
        self.pop_with(slots, true, |i, segment, _| mark(i, segment))
    }

    /// [`RxQueue::pop_into`] handing each segment's by-reference payloads to `mark` as well.
    pub fn pop_into_refs(
        &self,
        slots: &mut [Vec<u8>],
        mark: impl FnMut(usize, bool, Refs),
    ) -> usize {
        self.pop_with(slots, false, mark)
    }

    fn pop_with(
        &self,
        slots: &mut [Vec<u8>],
        materialize: bool,
        mut mark: impl FnMut(usize, bool, Refs),
    ) -> usize {
        let mut s = self.lock();
        let mut n = 0;
        while n < slots.len() {
            let Some((mut f, mut segment, mut refs)) = s.frames.pop_front() else {
                break;
            };
            s.bytes -= f.len();
            std::mem::swap(&mut slots[n], &mut f);
            if materialize {
                if let Some(r) = refs.take() {
                    if !crate::wire::segment::materialize(&mut slots[n], &*r) {
                        slots[n].clear();
                        segment = false;
                    }
                    r.recycle();
                }
            }
            mark(n, segment, refs);
            if s.spare.len() < SPARE_MAX {
                s.spare.push(f);
            }
            n += 1;
        }
        self.queued.store(s.frames.len(), Ordering::SeqCst);
        if s.frames.is_empty() && s.signaled {
            // Under the lock: a push after this sees `signaled` clear and writes it again.
            let _ = self.ready.read();
            s.signaled = false;
        }
        n
    }

    /// Frames queued now (as of the last push or pop; no lock taken).
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AsRawFd for RxQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn eventfd_follows_the_queue() {
        let q = RxQueue::new().unwrap();
        assert!(!readable(q.as_raw_fd()));
        assert!(q.push(&[1, 2, 3]));
        assert!(q.push(&[4]));
        assert!(readable(q.as_raw_fd()));
        let mut slots = vec![Vec::new()];
        assert_eq!(q.pop_into(&mut slots, |_, _| {}), 1);
        assert_eq!(slots[0], vec![1, 2, 3]);
        assert!(readable(q.as_raw_fd()), "one frame still queued");
        assert_eq!(q.pop_into(&mut slots, |_, _| {}), 1);
        assert_eq!(slots[0], vec![4]);
        assert!(!readable(q.as_raw_fd()));
        assert_eq!(q.pop_into(&mut slots, |_, _| {}), 0);
    }

    #[test]
    fn a_polling_engine_gets_no_eventfd_write() {
        let q = RxQueue::new().unwrap();
        q.set_polling(true);
        assert!(q.push(&[1]));
        assert!(
            !readable(q.as_raw_fd()),
            "the polling engine sees the queue itself"
        );
        assert!(!q.is_empty());
        q.set_polling(false);
        // A push once the engine stopped polling wakes it.
        assert!(q.push(&[2]));
        assert!(readable(q.as_raw_fd()));
        let mut slots = vec![Vec::new(); 2];
        assert_eq!(q.pop_into(&mut slots, |_, _| {}), 2);
        assert!(!readable(q.as_raw_fd()));
        // Emptied without ever being signaled: nothing to read, the next push signals.
        q.set_polling(true);
        q.push(&[3]);
        assert_eq!(q.pop_into(&mut slots, |_, _| {}), 1);
        q.set_polling(false);
        q.push(&[4]);
        assert!(readable(q.as_raw_fd()));
    }

    /// A consumer that alternates between polling and sleeping on the eventfd, the way the
    /// engine does, against a producer pushing at random moments: no frame is ever left queued
    /// while the consumer sleeps (a lost wake-up would show as a 2 s poll timeout).
    #[test]
    fn no_wakeup_is_lost_between_polling_and_sleeping() {
        const FRAMES: usize = 20_000;
        let q = std::sync::Arc::new(RxQueue::new().unwrap());
        let producer = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut x = 0x1234_5678u32;
                for i in 0..FRAMES {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    while !q.push(&i.to_le_bytes()) {
                        std::thread::yield_now();
                    }
                    if x.is_multiple_of(7) {
                        std::thread::sleep(std::time::Duration::from_micros(u64::from(x % 50)));
                    }
                }
            })
        };
        let mut slots = vec![Vec::new(); 64];
        let mut got = 0;
        let mut round = 0u32;
        while got < FRAMES {
            round += 1;
            // Spin a varying while, as the adaptive window does.
            q.set_polling(true);
            for _ in 0..round % 64 {
                if !q.is_empty() {
                    break;
                }
                std::hint::spin_loop();
            }
            q.set_polling(false);
            if q.is_empty() {
                let mut p = libc::pollfd {
                    fd: q.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let r = unsafe { libc::poll(&mut p, 1, 2000) };
                assert!(
                    r == 1 || got == FRAMES,
                    "slept 2 s with {} frames queued after {got} (a lost wake-up)",
                    q.len()
                );
            }
            let n = q.pop_into(&mut slots, |_, _| {});
            for s in &slots[..n] {
                assert_eq!(
                    usize::from_le_bytes(s[..8].try_into().unwrap()),
                    got,
                    "in order"
                );
                got += 1;
            }
        }
        producer.join().unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn bounded_in_frames_and_bytes() {
        let q = RxQueue::new().unwrap();
        for _ in 0..RXQ_MAX_FRAMES {
            assert!(q.push(&[0; 8]));
        }
        assert!(!q.push(&[0; 8]), "frame limit");
        let mut slots = vec![Vec::new(); RXQ_MAX_FRAMES];
        assert_eq!(q.pop_into(&mut slots, |_, _| {}), RXQ_MAX_FRAMES);
        let big = vec![0u8; 9000];
        let fit = RXQ_MAX_BYTES / big.len();
        for _ in 0..fit {
            assert!(q.push(&big));
        }
        assert!(!q.push(&big), "byte limit");
        assert_eq!(q.len(), fit);
    }

    #[test]
    fn owned_frames_move_without_a_copy() {
        let q = RxQueue::new().unwrap();
        let mut f = vec![9u8; 300];
        let ptr = f.as_ptr();
        assert!(q.push_owned(&mut f));
        assert!(f.is_empty(), "a spare (here: empty) buffer took its place");
        let mut slots = vec![Vec::new()];
        assert_eq!(q.pop_into(&mut slots, |_, _| {}), 1);
        assert_eq!(slots[0].as_ptr(), ptr, "the same buffer arrived");
        assert_eq!(slots[0], vec![9u8; 300]);
        // The slot's old buffer is now the spare handed to the next sender.
        let mut g = vec![1u8; 10];
        q.push_owned(&mut g);
        assert!(g.capacity() == 0 || g.is_empty());
    }

    #[test]
    fn buffers_are_reused() {
        let q = RxQueue::new().unwrap();
        let mut slots = vec![Vec::with_capacity(BUF_CAPACITY)];
        q.push(&[7; 100]);
        q.pop_into(&mut slots, |_, _| {});
        // The slot's old buffer became the spare; the next push reuses it.
        let spare_ptr = q.lock().spare[0].as_ptr();
        q.push(&[8; 100]);
        assert_eq!(q.lock().frames[0].0.as_ptr(), spare_ptr);
    }
}
