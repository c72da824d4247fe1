//! MAC learning for the fabric's uplink ports: which uplink a remote MAC was last seen on.
//!
//! Only needed with two or more uplinks (with one, every non-local unicast goes there). Bounded:
//! at most [`MAX_LEARNED`] entries; an entry not refreshed for [`MAC_AGE`] is stale (ignored and
//! replaced). A full table learns nothing new, and the frames for the MACs it could not learn
//! flood to every uplink: a network that sends from many source MACs costs flooding, never host
//! memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::wire::eth::MacAddr;

/// Entries kept at most.
pub const MAX_LEARNED: usize = 4096;
/// An entry not refreshed for this long is forgotten (IEEE 802.1Q's default ageing time).
pub const MAC_AGE: Duration = Duration::from_secs(300);

/// See the module documentation. Port numbers are the fabric's port indices.
#[derive(Debug, Default)]
pub struct MacTable {
    entries: HashMap<MacAddr, (usize, Instant)>,
}

impl MacTable {
    pub fn new() -> MacTable {
        MacTable::default()
    }

    /// `mac` was seen as a source on `port` at `now`.
    pub fn learn(&mut self, mac: MacAddr, port: usize, now: Instant) {
        if let Some(e) = self.entries.get_mut(&mac) {
            *e = (port, now);
            return;
        }
        if self.entries.len() >= MAX_LEARNED {
            self.entries
                .retain(|_, (_, seen)| now.saturating_duration_since(*seen) < MAC_AGE);
            if self.entries.len() >= MAX_LEARNED {
                return;
            }
        }
        self.entries.insert(mac, (port, now));
    }

    /// The port `mac` was last seen on, unless the entry is stale.
    pub fn lookup(&self, mac: &MacAddr, now: Instant) -> Option<usize> {
        self.entries
            .get(mac)
            .filter(|(_, seen)| now.saturating_duration_since(*seen) < MAC_AGE)
            .map(|(p, _)| *p)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u32) -> MacAddr {
        let b = i.to_be_bytes();
        [0x02, 0x10, b[0], b[1], b[2], b[3]]
    }

    #[test]
    fn learns_moves_and_ages() {
        let t0 = Instant::now();
        let mut t = MacTable::new();
        t.learn(mac(1), 3, t0);
        assert_eq!(t.lookup(&mac(1), t0), Some(3));
        t.learn(mac(1), 4, t0);
        assert_eq!(t.lookup(&mac(1), t0), Some(4), "a MAC that moves follows");
        assert_eq!(t.lookup(&mac(1), t0 + MAC_AGE), None, "stale");
        assert_eq!(t.lookup(&mac(2), t0), None);
    }

    #[test]
    fn bounded_and_stale_entries_make_room() {
        let t0 = Instant::now();
        let mut t = MacTable::new();
        for i in 0..(MAX_LEARNED as u32 + 100) {
            t.learn(mac(i), 1, t0);
        }
        assert_eq!(t.len(), MAX_LEARNED);
        assert_eq!(t.lookup(&mac(MAX_LEARNED as u32 + 50), t0), None);
        let later = t0 + MAC_AGE;
        t.learn(mac(999_999), 2, later);
        assert_eq!(t.lookup(&mac(999_999), later), Some(2));
        assert_eq!(t.len(), 1, "every old entry had aged out");
    }
}
