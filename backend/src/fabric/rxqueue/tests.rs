//! Unit tests of [`super::RxQueue`]: wake-ups, bounds, buffer reuse, fair share.

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
    assert!(q.push(0, &[1, 2, 3]).queued);
    assert!(q.push(0, &[4]).queued);
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
    assert!(q.push(0, &[1]).queued);
    assert!(
        !readable(q.as_raw_fd()),
        "the polling engine sees the queue itself"
    );
    assert!(!q.is_empty());
    q.set_polling(false);
    // A push once the engine stopped polling wakes it.
    assert!(q.push(0, &[2]).queued);
    assert!(readable(q.as_raw_fd()));
    let mut slots = vec![Vec::new(); 2];
    assert_eq!(q.pop_into(&mut slots, |_, _| {}), 2);
    assert!(!readable(q.as_raw_fd()));
    // Emptied without ever being signaled: nothing to read, the next push signals.
    q.set_polling(true);
    let _ = q.push(0, &[3]);
    assert_eq!(q.pop_into(&mut slots, |_, _| {}), 1);
    q.set_polling(false);
    let _ = q.push(0, &[4]);
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
                while !q.push(0, &i.to_le_bytes()).queued {
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
        assert!(q.push(0, &[0; 8]).queued);
    }
    assert!(!q.push(0, &[0; 8]).queued, "frame limit");
    let mut slots = vec![Vec::new(); RXQ_MAX_FRAMES];
    assert_eq!(q.pop_into(&mut slots, |_, _| {}), RXQ_MAX_FRAMES);
    let big = vec![0u8; 9000];
    let fit = RXQ_MAX_BYTES / JUMBO_BUF;
    for _ in 0..fit {
        assert!(q.push(0, &big).queued);
    }
    assert!(!q.push(0, &big).queued, "byte limit");
    assert_eq!(q.len(), fit);
}

/// The capacities of every buffer the queue holds, counted from the buffers themselves.
fn held(q: &RxQueue) -> usize {
    let s = q.lock();
    let queued: usize = s
        .lanes
        .iter()
        .flat_map(|l| l.frames.iter())
        .map(|e| e.buf.capacity())
        .sum();
    let spare: usize = s
        .spare_small
        .iter()
        .chain(&s.spare_large)
        .map(Vec::capacity)
        .sum();
    queued + spare
}

/// Finding 4 of issue 39: small frames arriving in (and popped into) 64 KiB buffers held
/// 64 KiB each against a bound counted in frame lengths.
#[test]
fn small_frames_in_large_buffers_hold_at_most_the_byte_bound() {
    let q = RxQueue::new().unwrap();
    // The engine's receive slots are 64 KiB buffers: popping swaps them into the spares.
    let mut slots: Vec<Vec<u8>> = (0..128).map(|_| vec![0u8; 65535]).collect();
    for round in 0..4 {
        for i in 0..RXQ_MAX_FRAMES + 100 {
            let mut f = Vec::with_capacity(65535);
            f.extend_from_slice(&[round as u8; 60]);
            if i % 2 == 0 {
                let _ = q.push_owned(1, &mut f);
            } else {
                let _ = q.push(2, &f);
            }
            assert!(held(&q) <= RXQ_MAX_BYTES, "round {round} frame {i}");
        }
        assert_eq!(held(&q), q.held_bytes(), "the counters follow the buffers");
        while q.pop_into(&mut slots, |_, _| {}) > 0 {
            assert!(held(&q) <= RXQ_MAX_BYTES);
        }
    }
    // Frames of the small size are queued up to the frame limit.
    for _ in 0..RXQ_MAX_FRAMES {
        let mut f = vec![1u8; 60];
        f.reserve(65535);
        assert!(q.push_owned(1, &mut f).queued);
    }
    assert!(held(&q) <= RXQ_MAX_BYTES);
}

#[test]
fn owned_frames_move_without_a_copy() {
    let q = RxQueue::new().unwrap();
    let mut f = vec![9u8; 300];
    f.reserve(SMALL_BUF - 300);
    let ptr = f.as_ptr();
    assert!(q.push_owned(0, &mut f).queued);
    assert!(f.is_empty(), "a spare (here: empty) buffer took its place");
    let mut slots = vec![Vec::new()];
    assert_eq!(q.pop_into(&mut slots, |_, _| {}), 1);
    assert_eq!(slots[0].as_ptr(), ptr, "the same buffer arrived");
    assert_eq!(slots[0], vec![9u8; 300]);
    // A small frame in a buffer far larger than it is queued as a copy, the sender keeps
    // its buffer.
    let mut g = Vec::with_capacity(65535);
    g.extend_from_slice(&[1u8; 10]);
    let gptr = g.as_ptr();
    assert!(q.push_owned(0, &mut g).queued);
    assert_eq!((g.as_ptr(), g.len()), (gptr, 10));
    assert_eq!(q.held_bytes(), SMALL_BUF);
}

#[test]
fn buffers_are_reused() {
    let q = RxQueue::new().unwrap();
    let mut slots = vec![Vec::with_capacity(SMALL_BUF)];
    let _ = q.push(0, &[7; 100]);
    q.pop_into(&mut slots, |_, _| {});
    // The slot's old buffer became the spare; the next push reuses it.
    let spare_ptr = q.lock().spare_small[0].as_ptr();
    let _ = q.push(0, &[8; 100]);
    assert_eq!(q.lock().lanes[1].frames[0].buf.as_ptr(), spare_ptr);
}

/// An IPv4/UDP frame to `port`, `len` bytes long, its first payload bytes `tag`.
fn udp_frame(port: u16, len: usize, tag: u16) -> Vec<u8> {
    let mut f = vec![0u8; len.max(14 + 20 + 8 + 2)];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[14 + 9] = 17;
    f[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&port.to_be_bytes());
    f[14 + 28..14 + 30].copy_from_slice(&tag.to_be_bytes());
    f
}

fn tag(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[14 + 28], f[14 + 29]])
}

#[test]
fn roce_is_told_from_other_frames() {
    assert_eq!(Class::of(&udp_frame(4791, 100, 0)), Class::Roce);
    assert_eq!(Class::of(&udp_frame(4792, 100, 0)), Class::Other);
    let mut v6 = vec![0u8; 14 + 40 + 8];
    v6[12..14].copy_from_slice(&[0x86, 0xdd]);
    v6[14 + 6] = 17;
    v6[14 + 40 + 2..14 + 40 + 4].copy_from_slice(&4791u16.to_be_bytes());
    assert_eq!(Class::of(&v6), Class::Roce);
    let mut tagged = udp_frame(4791, 104, 0);
    tagged.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    assert_eq!(Class::of(&tagged), Class::Roce);
    assert_eq!(Class::of(&[0u8; 10]), Class::Other, "truncated");
    assert_eq!(Class::of(&udp_frame(4791, 100, 0)[..36]), Class::Other);
}

/// Finding 3 of issue 39: a port flooding a device (netdev frames, broadcasts, RoCE) beside
/// another port's RoCE stream into the same queue, nobody popping: every frame of the
/// stream is queued; the flooder's excess drops and is reported as the flooder's.
#[test]
fn a_flooding_sender_fills_only_its_own_share() {
    const FLOODER: usize = 1;
    const STREAM: usize = 2;
    let q = RxQueue::new().unwrap();
    let netdev = udp_frame(53, 1500, 0);
    let mut bcast = udp_frame(67, 342, 0);
    bcast[..6].copy_from_slice(&[0xff; 6]);
    let mut dropped = 0usize;
    let mut stream_sent = 1u16;
    for i in 0..3 * RXQ_MAX_FRAMES {
        let flood = match i % 3 {
            0 => netdev.clone(),
            1 => bcast.clone(),
            _ => udp_frame(4791, 1100, 0),
        };
        let a = q.push(FLOODER, &flood);
        dropped += usize::from(!a.queued);
        for (sender, n) in &a.evicted {
            assert_eq!(*sender, FLOODER, "only the flooder loses frames");
            dropped += n;
        }
        if i % 40 == 0 {
            let a = q.push(STREAM, &udp_frame(4791, 1100, stream_sent));
            assert!(a.queued, "the stream's frame {stream_sent} was dropped");
            for (sender, _) in &a.evicted {
                assert_eq!(*sender, FLOODER);
            }
            stream_sent += 1;
        }
    }
    assert!(
        dropped > RXQ_MAX_FRAMES,
        "the flood's excess dropped: {dropped}"
    );
    // Every stream frame is there, in order.
    let mut slots = vec![Vec::new(); RXQ_MAX_FRAMES];
    let n = q.pop_into(&mut slots, |_, _| {});
    let tags: Vec<u16> = slots[..n]
        .iter()
        .filter(|f| f.len() == 1100 && Class::of(f) == Class::Roce && tag(f) != 0)
        .map(|f| tag(f))
        .collect();
    let expected: Vec<u16> = (1..stream_sent).collect();
    assert_eq!(tags, expected);
}

/// A backlog of one sender does not delay another's frames: the engine takes them
/// round-robin.
#[test]
fn the_engine_takes_senders_in_turn() {
    let q = RxQueue::new().unwrap();
    for _ in 0..1000 {
        assert!(q.push(1, &udp_frame(4791, 1100, 0)).queued);
    }
    for t in 1..=10 {
        assert!(q.push(2, &udp_frame(4791, 1100, t)).queued);
    }
    // Deficit round-robin: about 7 frames of 1.1 KB a turn each.
    let mut slots = vec![Vec::new(); 30];
    assert_eq!(q.pop_into(&mut slots, |_, _| {}), 30);
    let mine = slots.iter().filter(|f| tag(f) != 0).count();
    assert_eq!(mine, 10, "sender 2's frames came within the first 30");
}

/// A sender's RoCE frames are not behind its own netdev backlog, and a sender with both kinds
/// gets one sender's share, not two.
#[test]
fn roce_first_within_a_sender_and_one_share_per_sender() {
    let q = RxQueue::new().unwrap();
    for _ in 0..300 {
        assert!(q.push(1, &udp_frame(53, 1100, 0)).queued);
    }
    assert!(q.push(1, &udp_frame(4791, 1100, 7)).queued);
    let mut one = vec![Vec::new()];
    assert_eq!(q.pop_into(&mut one, |_, _| {}), 1);
    assert_eq!(
        (Class::of(&one[0]), tag(&one[0])),
        (Class::Roce, 7),
        "the RoCE frame came first"
    );
    for _ in 0..300 {
        assert!(q.push(1, &udp_frame(4791, 1100, 0)).queued);
        assert!(q.push(2, &udp_frame(4791, 1100, 2)).queued);
    }
    let mut slots = vec![Vec::new(); 200];
    assert_eq!(q.pop_into(&mut slots, |_, _| {}), 200);
    let second = slots.iter().filter(|f| tag(f) == 2).count();
    assert!((90..=110).contains(&second), "sender 2 got {second} of 200");
}

/// A sender refused at a full queue is refused without the lock until the engine pops or
/// another sender pushes its frames out; then it is admitted again.
#[test]
fn a_refused_sender_is_admitted_again_after_a_pop() {
    let q = RxQueue::new().unwrap();
    for _ in 0..RXQ_MAX_FRAMES {
        assert!(q.push(1, &[0; 8]).queued);
    }
    assert!(!q.push(1, &[0; 8]).queued);
    assert!(!q.push(1, &[0; 8]).queued, "still the longest");
    assert!(q.push(2, &[0; 8]).queued, "another sender pushes one out");
    let mut slots = vec![Vec::new(); 2];
    assert!(!q.push(1, &[0; 8]).queued);
    assert_eq!(q.pop_into(&mut slots, |_, _| {}), 2);
    assert!(q.push(1, &[0; 8]).queued, "room again after a pop");
    assert_eq!(q.len(), RXQ_MAX_FRAMES - 1);
}
