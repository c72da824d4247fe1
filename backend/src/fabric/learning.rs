//! MAC learning for the fabric's uplink ports: which uplink a remote MAC was last seen on.
//!
//! Only needed with two or more uplinks (with one, every non-local unicast goes there). Bounded:
//! at most [`MAX_LEARNED`] entries; an entry not refreshed for [`MAC_AGE`] is stale (ignored).
//! A full table makes room for a new MAC by forgetting the entry refreshed least recently (spec
//! §16.4 rule 6): the entries form a list in refresh order (indices into one slab, linked both
//! ways), so learning, refreshing and evicting each take constant time, under the lock every
//! uplink-bound frame takes. (A scan of the whole table for stale entries per new MAC was 4096
//! steps per frame from a network sending from many MACs.) A network that sends from more MACs
//! than the table holds costs flooding, never host memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::wire::eth::MacAddr;

/// Entries kept at most.
pub const MAX_LEARNED: usize = 4096;
/// An entry not refreshed for this long is forgotten (IEEE 802.1Q's default ageing time).
pub const MAC_AGE: Duration = Duration::from_secs(300);

/// No neighbour in the refresh-order list.
const NONE: usize = usize::MAX;

#[derive(Debug)]
struct Entry {
    mac: MacAddr,
    port: usize,
    seen: Instant,
    /// Refreshed less recently.
    older: usize,
    /// Refreshed more recently.
    newer: usize,
}

/// See the module documentation. Port numbers are the fabric's port indices.
#[derive(Debug)]
pub struct MacTable {
    index: HashMap<MacAddr, usize>,
    slab: Vec<Entry>,
    /// Least and most recently refreshed entries.
    oldest: usize,
    newest: usize,
}

impl Default for MacTable {
    fn default() -> Self {
        MacTable {
            index: HashMap::new(),
            slab: Vec::new(),
            oldest: NONE,
            newest: NONE,
        }
    }
}

impl MacTable {
    pub fn new() -> MacTable {
        MacTable::default()
    }

    fn unlink(&mut self, i: usize) {
        let (older, newer) = (self.slab[i].older, self.slab[i].newer);
        match older {
            NONE => self.oldest = newer,
            o => self.slab[o].newer = newer,
        }
        match newer {
            NONE => self.newest = older,
            n => self.slab[n].older = older,
        }
    }

    fn link_newest(&mut self, i: usize) {
        self.slab[i].older = self.newest;
        self.slab[i].newer = NONE;
        match self.newest {
            NONE => self.oldest = i,
            n => self.slab[n].newer = i,
        }
        self.newest = i;
    }

    /// `mac` was seen as a source on `port` at `now`.
    pub fn learn(&mut self, mac: MacAddr, port: usize, now: Instant) {
        if let Some(&i) = self.index.get(&mac) {
            self.slab[i].port = port;
            self.slab[i].seen = now;
            if self.newest != i {
                self.unlink(i);
                self.link_newest(i);
            }
            return;
        }
        let entry = Entry {
            mac,
            port,
            seen: now,
            older: NONE,
            newer: NONE,
        };
        let i = if self.slab.len() < MAX_LEARNED {
            self.slab.push(entry);
            self.slab.len() - 1
        } else {
            // Full: the least recently refreshed entry makes room.
            let i = self.oldest;
            self.unlink(i);
            self.index.remove(&self.slab[i].mac);
            self.slab[i] = entry;
            i
        };
        self.index.insert(mac, i);
        self.link_newest(i);
    }

    /// The port `mac` was last seen on, unless the entry is stale.
    pub fn lookup(&self, mac: &MacAddr, now: Instant) -> Option<usize> {
        self.index
            .get(mac)
            .map(|&i| &self.slab[i])
            .filter(|e| now.saturating_duration_since(e.seen) < MAC_AGE)
            .map(|e| e.port)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
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

    /// Finding 9 of issue 39: a full table learned nothing new unless a scan of every entry
    /// found stale ones. Now a new MAC replaces the entry refreshed least recently.
    #[test]
    fn a_full_table_forgets_the_least_recently_refreshed() {
        let t0 = Instant::now();
        let mut t = MacTable::new();
        for i in 0..MAX_LEARNED as u32 {
            t.learn(mac(i), 1, t0);
        }
        assert_eq!(t.len(), MAX_LEARNED);
        // Refresh the two oldest: mac(2) is now the least recently refreshed.
        t.learn(mac(0), 1, t0);
        t.learn(mac(1), 2, t0);
        let n = MAX_LEARNED as u32;
        t.learn(mac(n), 3, t0);
        assert_eq!(t.len(), MAX_LEARNED, "bounded");
        assert_eq!(t.lookup(&mac(n), t0), Some(3), "the new MAC is learned");
        assert_eq!(
            t.lookup(&mac(2), t0),
            None,
            "the least recently refreshed went"
        );
        assert_eq!(t.lookup(&mac(0), t0), Some(1));
        assert_eq!(t.lookup(&mac(1), t0), Some(2));
        // Then in refresh order: 3, 4, ... and never a refreshed one.
        for k in 1..=100u32 {
            t.learn(mac(n + k), 3, t0);
            assert_eq!(t.lookup(&mac(2 + k), t0), None);
            assert_eq!(t.lookup(&mac(3 + k), t0), Some(1));
        }
        assert_eq!(t.lookup(&mac(0), t0), Some(1));
        assert_eq!(t.len(), MAX_LEARNED);
        // Many MACs more than it holds: still bounded, the newest ones kept.
        for k in 0..3 * n {
            t.learn(mac(10 * n + k), 4, t0);
        }
        assert_eq!(t.len(), MAX_LEARNED);
        assert_eq!(t.lookup(&mac(13 * n - 1), t0), Some(4));
        assert_eq!(t.lookup(&mac(12 * n - 1), t0), None);
    }

    #[test]
    fn stale_entries_are_not_answered() {
        let t0 = Instant::now();
        let mut t = MacTable::new();
        for i in 0..(MAX_LEARNED as u32 + 100) {
            t.learn(mac(i), 1, t0);
        }
        assert_eq!(t.len(), MAX_LEARNED);
        let later = t0 + MAC_AGE;
        t.learn(mac(999_999), 2, later);
        assert_eq!(t.lookup(&mac(999_999), later), Some(2));
        assert_eq!(t.lookup(&mac(500), later), None, "stale");
    }
}
