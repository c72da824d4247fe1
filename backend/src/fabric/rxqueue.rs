//! A device port's receive queue: frames the fabric delivered, waiting for the device's engine.
//!
//! Bounded in frames and in the bytes of the buffers it holds (spec §16.4): at most
//! [`RXQ_MAX_FRAMES`] frames, and queued plus spare buffers at most [`RXQ_MAX_BYTES`] of
//! `Vec::capacity()`, whatever the frames' lengths. A small frame is kept in a small buffer
//! ([`SMALL_BUF`]): one that arrives in a larger buffer is copied into a small one rather than
//! queued in a buffer many times its size.
//!
//! Fair share (spec §16.4): the queue is split into lanes, one per (sending port, class), the
//! class being RoCEv2 (UDP destination port 4791, and every fabric segment) or other (netdev)
//! frames. A frame that finds the queue full pushes out the newest frames of the lane that
//! holds the most ([`Lane::load`]), unless that is its own lane: a port that floods a device
//! fills only its own share, its excess is what drops ([`Admission::evicted`] names the
//! senders), and another port's RoCE frames are not refused while it holds less. The engine
//! takes frames round-robin across the senders (deficit round-robin on bytes plus a per-frame
//! cost, [`DRR_QUANTUM`], [`FRAME_COST`]), each sender's RoCE frames before its other ones, so
//! a flood also gets only its sender's share of the engine and a port's own netdev traffic
//! never delays its RoCE frames. Within a lane frames stay in order.
//!
//! The eventfd is readable while frames are queued, so the engine's level-triggered epoll
//! wakes for them. Buffers circulate: the queue keeps bounded pools of spare buffers that
//! [`RxQueue::pop_into`] refills with the buffers it swaps out of the engine's receive slots.
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

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::sync::modeled::{fence, lock, AtomicBool, AtomicUsize, Mutex, MutexGuard, Ordering};

/// Frames a port queues before it drops.
pub const RXQ_MAX_FRAMES: usize = 4096;
/// Buffer bytes (capacities, queued and spare together) a port holds at most (spec §16.4).
pub const RXQ_MAX_BYTES: usize = 16 << 20;
/// Capacity of the buffer a frame of at most this length is queued in: an MTU 1500 frame fits.
pub const SMALL_BUF: usize = 2048;
/// Capacity of a fresh buffer for a longer frame: a jumbo frame fits.
const JUMBO_BUF: usize = 9216;
/// Spare buffers kept for reuse, per pool.
const SPARE_MAX: usize = 512;
/// Bytes a lane may take per round of the engine's round-robin, beside [`FRAME_COST`] per
/// frame: a 64 KiB segment needs a few rounds, a small frame a fraction of one.
pub const DRR_QUANTUM: usize = 16 << 10;
/// What one frame costs in the round-robin beyond its bytes: the engine's work per frame, so a
/// flood of small frames does not get many times the frames of a stream of large ones.
pub const FRAME_COST: usize = 1024;
/// UDP destination port of RoCEv2.
const ROCE_UDP_PORT: u16 = 4791;

/// A segment's by-reference payloads.
type Refs = Option<Box<dyn crate::wire::segment::PayloadRefs>>;

/// The two classes of a sender's frames, each its own lane (spec §16.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// RoCEv2 frames and fabric segments.
    Roce = 0,
    /// Everything else (the guests' netdev traffic).
    Other = 1,
}

impl Class {
    /// The class of an ordinary frame: RoCEv2 if it is IPv4 or IPv6 (optionally behind one
    /// 802.1Q tag) carrying UDP to port 4791.
    pub fn of(frame: &[u8]) -> Class {
        let be16 = |o: usize| {
            frame
                .get(o..o + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
        };
        let mut l3 = 14;
        let mut ethertype = be16(12);
        if ethertype == Some(0x8100) {
            l3 = 18;
            ethertype = be16(16);
        }
        let udp = match ethertype {
            Some(0x0800) => match frame.get(l3) {
                Some(v) if frame.get(l3 + 9) == Some(&17) => l3 + usize::from(v & 0xf) * 4,
                _ => return Class::Other,
            },
            Some(0x86dd) if frame.get(l3 + 6) == Some(&17) => l3 + 40,
            _ => return Class::Other,
        };
        if be16(udp + 2) == Some(ROCE_UDP_PORT) {
            Class::Roce
        } else {
            Class::Other
        }
    }
}

/// One queued buffer.
struct Entry {
    buf: Vec<u8>,
    /// A fabric segment (spec §16.2 rule 6), not one frame.
    segment: bool,
    refs: Refs,
}

/// The frames of one (sender, class), in order.
#[derive(Default)]
struct Lane {
    frames: VecDeque<Entry>,
    /// Capacities of the buffers in `frames`.
    bytes: usize,
}

impl Lane {
    /// How full the lane is, in bytes, with each frame counted at least at a queue's average
    /// share of bytes per frame: a lane of many small frames is as "long" as its frame count
    /// makes it against [`RXQ_MAX_FRAMES`].
    fn load(frames: usize, bytes: usize) -> usize {
        bytes.max(frames * (RXQ_MAX_BYTES / RXQ_MAX_FRAMES))
    }
}

#[derive(Default)]
struct State {
    /// Indexed by `sender * 2 + class`.
    lanes: Vec<Lane>,
    /// Deficit round-robin credit of each sender, in bytes.
    deficits: Vec<usize>,
    /// The senders that have frames queued, in round-robin order; the front one is served.
    active: VecDeque<usize>,
    frames: usize,
    /// Capacities of the queued buffers.
    bytes: usize,
    /// Spare buffers of capacity up to twice [`SMALL_BUF`], and larger ones.
    spare_small: Vec<Vec<u8>>,
    spare_large: Vec<Vec<u8>>,
    /// Capacities of the spare buffers.
    spare_bytes: usize,
    /// The eventfd was written and not read since: it is readable.
    signaled: bool,
}

/// What became of a push.
#[derive(Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Admission {
    /// The frame was queued (else it was dropped: its sender's lane held the most).
    pub queued: bool,
    /// (sender, frames) of each entry pushed out to make room (empty unless the queue was
    /// full; a segment's entry counts its frames).
    pub evicted: Vec<(usize, usize)>,
}

/// See the module documentation.
pub struct RxQueue {
    state: Mutex<State>,
    /// `state.frames`, stored under the lock after every push and pop: the busy-polling
    /// engine reads it without the lock, which every push of the peer engine takes (the
    /// lock taken per poll was contended on every 64 B round trip).
    queued: AtomicUsize,
    ready: EventFd,
    /// The engine is busy-polling the queue and will see a push without the eventfd.
    polling: AtomicBool,
    /// 1 + the lane whose frame was last refused (the queue full, that lane the longest), 0
    /// if none since the last pop or eviction: that lane's pushes drop without the lock, so a
    /// flooding sender does not contend for it with the senders and the engine it crowds.
    refused: AtomicUsize,
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxQueue").finish_non_exhaustive()
    }
}

/// Capacity of a fresh buffer for a `len`-byte frame.
fn fresh_capacity(len: usize) -> usize {
    if len <= SMALL_BUF {
        SMALL_BUF
    } else {
        len.max(JUMBO_BUF)
    }
}

/// Is a buffer of capacity `cap` the right size to queue a `len`-byte frame in (at most four
/// times what a fresh buffer for it would be: a segment's buffer grown to 128 KiB still carries
/// its 33 KiB tail segment without a copy, a 64 KiB receive buffer holding a 60-byte frame does
/// not)?
fn fits(cap: usize, len: usize) -> bool {
    cap <= 4 * fresh_capacity(len)
}

impl State {
    fn lane_index(sender: usize, class: Class) -> usize {
        sender * 2 + class as usize
    }

    /// Make room for lane `index` and its sender.
    fn grow_to(&mut self, index: usize) {
        if self.lanes.len() <= index {
            self.lanes.resize_with((index | 1) + 1, Lane::default);
            self.deficits.resize(self.lanes.len() / 2, 0);
        }
    }

    /// Does `sender` have no frame queued?
    fn idle(&self, sender: usize) -> bool {
        self.lanes
            .get(2 * sender..2 * sender + 2)
            .is_none_or(|l| l[0].frames.is_empty() && l[1].frames.is_empty())
    }

    /// Keep `buf` as a spare if a pool has room and the byte bound allows, else free it.
    fn recycle(&mut self, mut buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap == 0 || self.bytes + self.spare_bytes + cap > RXQ_MAX_BYTES {
            return;
        }
        let pool = if cap <= 2 * SMALL_BUF {
            &mut self.spare_small
        } else {
            &mut self.spare_large
        };
        if pool.len() < SPARE_MAX {
            buf.clear();
            pool.push(buf);
            self.spare_bytes += cap;
        }
    }

    fn take_spare(&mut self, large: bool) -> Option<Vec<u8>> {
        let b = if large {
            self.spare_large.pop()
        } else {
            self.spare_small.pop()
        }?;
        self.spare_bytes -= b.capacity();
        Some(b)
    }

    /// A buffer holding a copy of `frame`, sized for it.
    fn copy_of(&mut self, frame: &[u8]) -> Vec<u8> {
        let mut buf = if frame.len() <= SMALL_BUF {
            self.take_spare(false)
                .unwrap_or_else(|| Vec::with_capacity(SMALL_BUF))
        } else {
            match self.spare_large.last() {
                Some(b) if b.capacity() >= frame.len() && fits(b.capacity(), frame.len()) => {
                    self.take_spare(true).unwrap_or_default()
                }
                _ => Vec::with_capacity(fresh_capacity(frame.len())),
            }
        };
        buf.clear();
        buf.extend_from_slice(frame);
        buf
    }

    /// Make room for a buffer of capacity `cap` in lane `lane`: push out the newest frames of
    /// the lane that holds the most while it holds more than `lane` would with the frame.
    /// False if the frame must drop instead.
    fn admit(&mut self, lane: usize, cap: usize, evicted: &mut Vec<(usize, usize)>) -> bool {
        let full = |s: &State| s.frames >= RXQ_MAX_FRAMES || s.bytes + cap > RXQ_MAX_BYTES;
        while full(self) {
            let mine = self.lanes.get(lane).map_or(Lane::load(1, cap), |l| {
                Lane::load(l.frames.len() + 1, l.bytes + cap)
            });
            let victim = self
                .active
                .iter()
                .flat_map(|&sender| [2 * sender, 2 * sender + 1])
                .filter(|&i| i != lane && !self.lanes[i].frames.is_empty())
                .max_by_key(|&i| Lane::load(self.lanes[i].frames.len(), self.lanes[i].bytes));
            let Some(v) = victim else {
                return false;
            };
            let l = &self.lanes[v];
            if Lane::load(l.frames.len(), l.bytes) <= mine {
                return false;
            }
            // Not empty: it is active.
            let Some(e) = self.lanes[v].frames.pop_back() else {
                return false;
            };
            self.lanes[v].bytes -= e.buf.capacity();
            self.bytes -= e.buf.capacity();
            self.frames -= 1;
            if self.idle(v / 2) {
                self.deficits[v / 2] = 0;
                self.active.retain(|&s| s != v / 2);
            }
            let frames = if e.segment {
                crate::wire::segment::frame_count(&e.buf, true)
            } else {
                1
            };
            if let Some(r) = e.refs {
                r.recycle();
            }
            self.recycle(e.buf);
            evicted.push((v / 2, frames));
        }
        true
    }

    /// Queue `e` in `lane` (admitted already) and trim the spares to the byte bound.
    fn enqueue(&mut self, lane: usize, e: Entry) {
        let cap = e.buf.capacity();
        self.grow_to(lane);
        if self.idle(lane / 2) {
            self.active.push_back(lane / 2);
        }
        let l = &mut self.lanes[lane];
        l.bytes += cap;
        l.frames.push_back(e);
        self.frames += 1;
        self.bytes += cap;
        while self.bytes + self.spare_bytes > RXQ_MAX_BYTES {
            let Some(b) = self.spare_large.pop().or_else(|| self.spare_small.pop()) else {
                break;
            };
            self.spare_bytes -= b.capacity();
        }
    }

    /// The next entry and the port that sent it: senders in deficit round-robin order, each
    /// sender's RoCE lane before its other one.
    fn dequeue(&mut self) -> Option<(Entry, usize)> {
        loop {
            let &sender = self.active.front()?;
            let roce = 2 * sender + Class::Roce as usize;
            let i = if self.lanes[roce].frames.is_empty() {
                2 * sender + Class::Other as usize
            } else {
                roce
            };
            let cost = self.lanes[i]
                .frames
                .front()
                .map_or(0, |e| e.buf.len() + FRAME_COST);
            if self.deficits[sender] < cost {
                self.deficits[sender] += DRR_QUANTUM;
                self.active.rotate_left(1);
                continue;
            }
            self.deficits[sender] -= cost;
            let l = &mut self.lanes[i];
            let e = l.frames.pop_front()?;
            l.bytes -= e.buf.capacity();
            if self.idle(sender) {
                self.deficits[sender] = 0;
                self.active.pop_front();
            }
            self.frames -= 1;
            self.bytes -= e.buf.capacity();
            return Some((e, sender));
        }
    }
}

impl RxQueue {
    pub fn new() -> std::io::Result<RxQueue> {
        Ok(RxQueue {
            state: Mutex::new(State::default()),
            queued: AtomicUsize::new(0),
            ready: EventFd::new(EFD_NONBLOCK)?,
            polling: AtomicBool::new(false),
            refused: AtomicUsize::new(0),
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
        self.queued.store(s.frames, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !s.signaled && !self.polling.load(Ordering::SeqCst) {
            // Fails only if the counter would overflow: it is already readable.
            let _ = self.ready.write(1);
            s.signaled = true;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Queue a copy of `frame` from port `sender`.
    pub fn push(&self, sender: usize, frame: &[u8]) -> Admission {
        let lane = State::lane_index(sender, Class::of(frame));
        let cap = fresh_capacity(frame.len());
        let mut a = Admission::default();
        if self.refused.load(Ordering::Relaxed) == lane + 1 {
            return a;
        }
        let mut s = self.lock();
        if !self.admit(&mut s, lane, cap, &mut a) {
            return a;
        }
        let buf = s.copy_of(frame);
        s.enqueue(
            lane,
            Entry {
                buf,
                segment: false,
                refs: None,
            },
        );
        self.wake(&mut s);
        a.queued = true;
        a
    }

    /// Queue `frame` itself from port `sender`, leaving a spare buffer (or an empty one) in
    /// its place: no copy, unless its buffer is far larger than the frame (then a copy in a
    /// buffer of the frame's size is queued and `frame` is left as it was). Dropped: `frame`
    /// untouched.
    pub fn push_owned(&self, sender: usize, frame: &mut Vec<u8>) -> Admission {
        let lane = State::lane_index(sender, Class::of(frame));
        self.push_owned_as(lane, frame, false, None).0
    }

    /// [`RxQueue::push_owned`] for a fabric segment: popped with its segment mark.
    pub fn push_segment(&self, sender: usize, seg: &mut Vec<u8>) -> Admission {
        let lane = State::lane_index(sender, Class::Roce);
        self.push_owned_as(lane, seg, true, None).0
    }

    /// [`RxQueue::push_segment`] with the segment's by-reference payloads, which travel with
    /// it; when the segment drops they come back (`Err`) with `seg` untouched.
    pub fn push_segment_refs(
        &self,
        sender: usize,
        seg: &mut Vec<u8>,
        refs: Box<dyn crate::wire::segment::PayloadRefs>,
    ) -> (
        Admission,
        Result<(), Box<dyn crate::wire::segment::PayloadRefs>>,
    ) {
        let lane = State::lane_index(sender, Class::Roce);
        let (a, back) = self.push_owned_as(lane, seg, true, Some(refs));
        match back {
            Some(r) => (a, Err(r)),
            None => (a, Ok(())),
        }
    }

    /// Returns the admission and, if it dropped, the refs.
    fn push_owned_as(
        &self,
        lane: usize,
        frame: &mut Vec<u8>,
        segment: bool,
        refs: Refs,
    ) -> (Admission, Refs) {
        let copy = !fits(frame.capacity(), frame.len());
        let cap = if copy {
            fresh_capacity(frame.len())
        } else {
            frame.capacity()
        };
        let mut a = Admission::default();
        if self.refused.load(Ordering::Relaxed) == lane + 1 {
            return (a, refs);
        }
        let mut s = self.lock();
        if !self.admit(&mut s, lane, cap, &mut a) {
            return (a, refs);
        }
        let buf = if copy {
            s.copy_of(frame)
        } else {
            // The sender builds its next frames in what it gets back: a large buffer if any.
            let spare = s
                .take_spare(true)
                .or_else(|| s.take_spare(false))
                .unwrap_or_default();
            std::mem::replace(frame, spare)
        };
        s.enqueue(lane, Entry { buf, segment, refs });
        self.wake(&mut s);
        a.queued = true;
        (a, None)
    }

    /// [`State::admit`], keeping [`RxQueue::refused`]: set to `lane` when it is refused,
    /// cleared when another lane loses frames.
    fn admit(&self, s: &mut State, lane: usize, cap: usize, a: &mut Admission) -> bool {
        let ok = s.admit(lane, cap, &mut a.evicted);
        if !ok {
            self.refused.store(lane + 1, Ordering::Relaxed);
        } else if !a.evicted.is_empty() {
            self.refused.store(0, Ordering::Relaxed);
        }
        ok
    }

    /// Move up to `slots.len()` queued buffers into `slots` (each swapped with the slot's old
    /// buffer, which becomes a spare) and, for each, call `mark(i, segment)` with its slot
    /// index and segment mark; returns how many. An emptied queue clears the eventfd. A
    /// segment's by-reference payloads are gathered into its buffer first, for a caller that
    /// does not take them (a stale one loses the segment: an empty, unmarked buffer).
    pub fn pop_into(&self, slots: &mut [Vec<u8>], mut mark: impl FnMut(usize, bool)) -> usize {
        self.pop_with(slots, true, |i, segment, _, _| mark(i, segment))
    }

    /// [`RxQueue::pop_into`] handing each segment's by-reference payloads to `mark` as well,
    /// and the index of the port that sent each buffer.
    pub fn pop_into_refs(
        &self,
        slots: &mut [Vec<u8>],
        mark: impl FnMut(usize, bool, Refs, usize),
    ) -> usize {
        self.pop_with(slots, false, mark)
    }

    fn pop_with(
        &self,
        slots: &mut [Vec<u8>],
        materialize: bool,
        mut mark: impl FnMut(usize, bool, Refs, usize),
    ) -> usize {
        let mut s = self.lock();
        let mut n = 0;
        while n < slots.len() {
            let Some((
                Entry {
                    buf: mut f,
                    mut segment,
                    mut refs,
                },
                sender,
            )) = s.dequeue()
            else {
                break;
            };
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
            mark(n, segment, refs, sender);
            s.recycle(f);
            n += 1;
        }
        if n > 0 {
            self.refused.store(0, Ordering::Relaxed);
        }
        self.queued.store(s.frames, Ordering::SeqCst);
        if s.frames == 0 && s.signaled {
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

    /// Capacities of the buffers the queue holds, queued and spare (spec §16.4 bound).
    pub fn held_bytes(&self) -> usize {
        let s = self.lock();
        s.bytes + s.spare_bytes
    }
}

impl AsRawFd for RxQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}

#[cfg(test)]
mod tests;

/// The loom model (issue 38 item 1): `make loom-test`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::sync::Arc;

    /// The engine stops busy-polling and looks at the queue once more before it would sleep,
    /// while a peer pushes a frame: either the engine sees the frame or the eventfd it would
    /// sleep on is readable (no lost wake-up), whatever the interleaving. Weakening either
    /// half of the Dekker pair fails this model (tried: `set_polling` storing with Release
    /// and `len` loading with Acquire, no fence; or `wake` storing and loading Relaxed, no
    /// fence).
    #[test]
    fn loom_a_push_beside_the_engine_leaving_its_poll_is_never_lost() {
        crate::sync::modeled::model(|| {
            let q = Arc::new(RxQueue::new().expect("eventfd"));
            q.set_polling(true);
            let peer = {
                let q = q.clone();
                loom::thread::spawn(move || assert!(q.push(3, &[0xab; 60]).queued))
            };
            q.set_polling(false);
            // The engine's last look; it would sleep on the eventfd if it saw nothing, and a
            // write to it at any later time would wake it.
            let seen = !q.is_empty();
            peer.join().expect("peer");
            let woken = q.ready.read().is_ok();
            assert!(
                seen || woken,
                "the frame is queued, unseen, and no wake-up was written"
            );
            let mut slots = vec![Vec::new(); 2];
            assert_eq!(q.pop_into(&mut slots, |_, _| {}), 1);
            assert_eq!(slots[0], [0xab; 60]);
        });
    }
}
