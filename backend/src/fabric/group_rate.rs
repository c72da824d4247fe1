//! The broadcast and multicast rate bounds of one ingress port (spec §16.4): token buckets of
//! [`GROUP_BURST`] frames refilled at [`GROUP_RATE`] frames per second for the netdev's group
//! frames (ARP, ND, mDNS), [`ROCE_GROUP_BURST`] at [`ROCE_GROUP_RATE`] for RoCEv2 multicast
//! (UD multicast applications send at data rates). A group frame is copied into every device's
//! queue, so without a bound one port's broadcast flood costs every neighbour its engine's time.

use crate::sync::lock;
use std::sync::Mutex;
use std::time::Instant;

/// Broadcast and multicast frames per second a port may send, on average.
pub const GROUP_RATE: u32 = 1000;
/// Broadcast and multicast frames a port may send at once after a quiet while.
pub const GROUP_BURST: u32 = 256;
/// RoCEv2 multicast frames per second a port may send, on average.
pub const ROCE_GROUP_RATE: u32 = 100_000;
/// RoCEv2 multicast frames a port may send at once after a quiet while.
pub const ROCE_GROUP_BURST: u32 = 4096;

#[derive(Debug)]
struct Bucket {
    /// Credit one frame costs, in nanoseconds of elapsed time.
    frame_ns: u64,
    /// Most credit held.
    max_ns: u64,
    /// Credit in nanoseconds of refill time (integer: no rounding drift).
    credit_ns: u64,
    last: Option<Instant>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct GroupRate {
    bucket: Mutex<Bucket>,
}

impl GroupRate {
    /// `rate` frames per second on average, `burst` at once (full at first).
    pub fn new(rate: u32, burst: u32) -> GroupRate {
        let frame_ns = 1_000_000_000 / u64::from(rate.max(1));
        let max_ns = u64::from(burst) * frame_ns;
        GroupRate {
            bucket: Mutex::new(Bucket {
                frame_ns,
                max_ns,
                credit_ns: max_ns,
                last: None,
            }),
        }
    }

    /// A port's bounds, indexed by `rxqueue::Class`: RoCEv2, then other frames.
    pub fn per_class() -> [GroupRate; 2] {
        [
            GroupRate::new(ROCE_GROUP_RATE, ROCE_GROUP_BURST),
            GroupRate::new(GROUP_RATE, GROUP_BURST),
        ]
    }

    /// May the port send one more group frame at `now`? Takes a token if so.
    pub fn admit(&self, now: Instant) -> bool {
        let mut b = lock(&self.bucket);
        if let Some(last) = b.last {
            let elapsed =
                u64::try_from(now.saturating_duration_since(last).as_nanos()).unwrap_or(u64::MAX);
            b.credit_ns = b.credit_ns.saturating_add(elapsed).min(b.max_ns);
        }
        b.last = Some(now.max(b.last.unwrap_or(now)));
        if b.credit_ns >= b.frame_ns {
            b.credit_ns -= b.frame_ns;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate() {
        let r = GroupRate::new(GROUP_RATE, GROUP_BURST);
        let t0 = Instant::now();
        let burst = (0..2 * GROUP_BURST).filter(|_| r.admit(t0)).count();
        assert_eq!(burst, GROUP_BURST as usize);
        // 100 ms later: 100 ms worth.
        let t1 = t0 + Duration::from_millis(100);
        let more = (0..2 * GROUP_RATE).filter(|_| r.admit(t1)).count();
        assert_eq!(more, (GROUP_RATE / 10) as usize);
        let t2 = t1 + Duration::from_secs(60);
        let capped = (0..2 * GROUP_BURST).filter(|_| r.admit(t2)).count();
        assert_eq!(capped, GROUP_BURST as usize);
    }
}
