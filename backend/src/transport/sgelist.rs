//! A WQE's scatter/gather list with room for two entries in place: nearly every WQE has one or
//! two SGEs, and a heap vector per fetched WQE was the last allocation per message on the data
//! path ([datapath] item 3). Longer lists (up to `max_send_sge` / `max_recv_sge`) spill to the heap.

use std::ops::Deref;

use super::requester::Sge;

const INLINE: usize = 2;

/// See the module documentation. Dereferences to the entries as a slice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SgeList {
    inline: [Sge; INLINE],
    len: u8,
    /// All entries once there are more than `INLINE` (then `inline` is unused).
    spill: Vec<Sge>,
}

impl SgeList {
    pub fn push(&mut self, s: Sge) {
        if !self.spill.is_empty() {
            self.spill.push(s);
        } else if usize::from(self.len) < INLINE {
            self.inline[usize::from(self.len)] = s;
            self.len += 1;
        } else {
            self.spill.reserve(INLINE * 2);
            self.spill.extend_from_slice(&self.inline);
            self.spill.push(s);
        }
    }
}

impl Deref for SgeList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        if self.spill.is_empty() {
            &self.inline[..usize::from(self.len)]
        } else {
            &self.spill
        }
    }
}

impl<'a> IntoIterator for &'a SgeList {
    type Item = &'a Sge;
    type IntoIter = std::slice::Iter<'a, Sge>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(i: u32) -> Sge {
        Sge {
            addr: u64::from(i) << 12,
            len: i,
            lkey: i + 100,
        }
    }

    #[test]
    fn keeps_order_in_place_and_after_spilling() {
        for n in 0..40u32 {
            let mut l = SgeList::default();
            for i in 0..n {
                l.push(sge(i));
            }
            let want: Vec<Sge> = (0..n).map(sge).collect();
            assert_eq!(&l[..], &want[..], "{n} entries");
            assert_eq!(l.len(), n as usize);
            assert_eq!(l.iter().count(), n as usize);
            assert_eq!(
                l.spill.is_empty(),
                n as usize <= INLINE,
                "spills only beyond {INLINE}"
            );
        }
    }
}
