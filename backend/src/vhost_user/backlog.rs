//! The bounded queue of records waiting for a driver buffer, shared fairly between senders.
//!
//! A device -> driver queue keeps records the driver has no buffer for yet (like a NIC's rx
//! FIFO). For the netdev's frames a plain drop-tail FIFO lets one sender starve the others: a
//! neighbour flooding a guest whose netdev drains slower than the flood arrives keeps the FIFO
//! full, and every other sender's frame (a TCP handshake, an ARP reply, perftest's exchange)
//! finds it full and is dropped. The fabric's own queues are fair per sending port (spec §16.4);
//! the engine empties them into this one at once, so this one must be fair too.
//!
//! Records carry their [`Sender`]: for a frame from the fabric the port that sent it (a
//! device's or an uplink's, as in the fabric's own queues), for a frame from the device's own
//! uplink its source MAC. A full backlog drops from the sender holding the most records
//! (longest-queue drop): a new record of a sender holding fewer takes the place of that
//! sender's newest record; a record of the sender holding the most (or as many as the most) is
//! itself dropped. Records without a sender (events, page requests) all count as one: for them
//! this is the drop-tail FIFO it replaces.

use std::collections::VecDeque;

/// Who sent a record: the fair share is kept per sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// Records without a sender of their own (events, page requests): one shared sender.
    Shared,
    /// A frame from the fabric: the index of the port that sent it. Whatever source MACs an
    /// uplink's frames carry, the uplink is one sender.
    Port(usize),
    /// A frame from the device's own uplink (no fabric): its source MAC.
    Mac([u8; 6]),
}

/// A bounded FIFO of records, fair between senders when full.
#[derive(Debug)]
pub struct Backlog {
    capacity: usize,
    records: VecDeque<(Sender, Vec<u8>)>,
    /// Records held per sender (few senders: a vector beats a map at this size).
    held: Vec<(Sender, usize)>,
}

/// What [`Backlog::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; nothing dropped.
    Queued,
    /// Queued in the place of a record of the sender holding the most, which was dropped.
    QueuedOverShare,
    /// Dropped: the backlog is full and this record's sender holds the most.
    Dropped,
}

impl Backlog {
    /// An empty backlog of at most `capacity` records (at least one).
    pub fn new(capacity: usize) -> Self {
        Backlog {
            capacity: capacity.max(1),
            records: VecDeque::new(),
            held: Vec::new(),
        }
    }

    /// Queue `record` of `key`, dropping by the rule above when full.
    pub fn push(&mut self, key: Sender, record: &[u8]) -> Pushed {
        let mut pushed = Pushed::Queued;
        if self.records.len() >= self.capacity {
            let (top, most) = self.most_held();
            if self.held_by(key) >= most {
                return Pushed::Dropped;
            }
            self.drop_newest_of(top);
            pushed = Pushed::QueuedOverShare;
        }
        self.records.push_back((key, record.to_vec()));
        self.count(key, 1);
        pushed
    }

    /// The oldest record's length.
    pub fn front_len(&self) -> Option<usize> {
        self.records.front().map(|(_, r)| r.len())
    }

    /// Take the oldest record.
    pub fn pop_front(&mut self) -> Option<Vec<u8>> {
        let (key, record) = self.records.pop_front()?;
        self.count(key, -1);
        Some(record)
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// No record waits.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Forget every record.
    pub fn clear(&mut self) {
        self.records.clear();
        self.held.clear();
    }

    fn held_by(&self, key: Sender) -> usize {
        self.held
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(0, |&(_, n)| n)
    }

    fn most_held(&self) -> (Sender, usize) {
        self.held
            .iter()
            .copied()
            .max_by_key(|&(_, n)| n)
            .unwrap_or((Sender::Shared, 0))
    }

    fn drop_newest_of(&mut self, key: Sender) {
        if let Some(i) = self.records.iter().rposition(|(k, _)| *k == key) {
            self.records.remove(i);
            self.count(key, -1);
        }
    }

    fn count(&mut self, key: Sender, delta: isize) {
        match self.held.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                let n = self.held[i].1.saturating_add_signed(delta);
                if n == 0 {
                    self.held.swap_remove(i);
                } else {
                    self.held[i].1 = n;
                }
            }
            None if delta > 0 => self.held.push((key, delta.unsigned_abs())),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOODER: Sender = Sender::Port(1);
    const PEER: Sender = Sender::Port(2);

    fn fill(b: &mut Backlog, key: Sender, n: usize) {
        for i in 0..n {
            b.push(key, &[i as u8]);
        }
    }

    #[test]
    fn a_flooder_holding_the_whole_backlog_gives_way_to_another_sender() {
        let mut b = Backlog::new(8);
        fill(&mut b, FLOODER, 20);
        assert_eq!(b.len(), 8);
        assert_eq!(b.push(FLOODER, b"more"), Pushed::Dropped);
        assert_eq!(b.push(PEER, b"syn"), Pushed::QueuedOverShare);
        assert_eq!(b.len(), 8);
        // The flooder lost its newest record, not its oldest: order is kept.
        let records: Vec<Vec<u8>> = std::iter::from_fn(|| b.pop_front()).collect();
        let expected: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i]).chain([b"syn".to_vec()]).collect();
        assert_eq!(records, expected);
    }

    #[test]
    fn two_senders_end_with_equal_shares() {
        let mut b = Backlog::new(8);
        fill(&mut b, FLOODER, 8);
        for i in 0..100u8 {
            b.push(PEER, &[i]);
            b.push(FLOODER, &[i]);
        }
        assert_eq!(b.held_by(PEER), 4);
        assert_eq!(b.held_by(FLOODER), 4);
        assert_eq!(b.len(), 8);
    }

    #[test]
    fn without_senders_it_is_a_drop_tail_fifo() {
        let mut b = Backlog::new(3);
        for i in 0..5u8 {
            let p = b.push(Sender::Shared, &[i]);
            assert_eq!(p == Pushed::Dropped, i >= 3);
        }
        assert_eq!(b.front_len(), Some(1));
        let records: Vec<Vec<u8>> = std::iter::from_fn(|| b.pop_front()).collect();
        assert_eq!(records, vec![vec![0], vec![1], vec![2]]);
        assert!(b.is_empty());
        assert!(b.held.is_empty());
    }

    #[test]
    fn an_uplink_is_one_sender_whatever_source_macs_its_frames_carry() {
        // Frames of one port count as that port's, so a remote flood that varies its source
        // MAC holds one share, and a device port's frame still gets in.
        let mut b = Backlog::new(8);
        fill(&mut b, FLOODER, 8);
        assert_eq!(b.push(FLOODER, b"another mac"), Pushed::Dropped);
        assert_eq!(b.push(PEER, b"arp reply"), Pushed::QueuedOverShare);
        // Keyed by MAC, each new MAC would have been a sender holding nothing.
        let mut m = Backlog::new(8);
        for i in 0..8u8 {
            m.push(Sender::Mac([2, 0, 0, 0, 1, i]), &[i]);
        }
        assert_eq!(
            m.push(Sender::Mac([2, 0, 0, 0, 1, 0xff]), b"x"),
            Pushed::QueuedOverShare
        );
    }

    #[test]
    fn clear_forgets_the_shares() {
        let mut b = Backlog::new(2);
        fill(&mut b, FLOODER, 2);
        b.clear();
        assert_eq!(b.push(FLOODER, b"x"), Pushed::Queued);
        assert_eq!(b.held_by(FLOODER), 1);
    }
}
