//! Tenant networks (spec §16.3): every fabric port belongs to one network (a device) or carries
//! one or several (an uplink). Frames never cross networks. On a trunk uplink a network is the
//! 802.1Q VLAN of the same number: tagged on egress, untagged by its tag on ingress.

use crate::uplink::IO_BATCH;
use crate::wire::eth::ETHERTYPE_VLAN;

/// A network number, 0..=4094 (a VLAN id on a trunk uplink). 0 is the default network.
pub type NetId = u16;

/// The networks an uplink port carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UplinkNets {
    /// One network, frames as they are (no tag added or removed): `net=N`, default 0.
    Untagged(NetId),
    /// Several networks as 802.1Q tags, VLAN id = network number: `vlans=N1+N2...` (sorted,
    /// no duplicates). An ingress frame without a tag or with a tag not in the list is
    /// dropped and counted.
    Tagged(Vec<NetId>),
}

impl Default for UplinkNets {
    fn default() -> Self {
        UplinkNets::Untagged(0)
    }
}

impl UplinkNets {
    /// Does the uplink carry network `net`?
    pub fn carries(&self, net: NetId) -> bool {
        match self {
            UplinkNets::Untagged(n) => *n == net,
            UplinkNets::Tagged(v) => v.binary_search(&net).is_ok(),
        }
    }

    /// The networks, for the counters.
    pub fn list(&self) -> Vec<NetId> {
        match self {
            UplinkNets::Untagged(n) => vec![*n],
            UplinkNets::Tagged(v) => v.clone(),
        }
    }
}

/// The VLAN id of an 802.1Q-tagged frame, if it is one.
pub fn vlan_of(frame: &[u8]) -> Option<NetId> {
    let tpid = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let tci = u16::from_be_bytes([*frame.get(14)?, *frame.get(15)?]);
    (tpid == ETHERTYPE_VLAN && frame.len() >= 18).then_some(tci & 0x0fff)
}

/// `frame` without its 802.1Q tag (a frame [`vlan_of`] accepted), appended to `out`.
pub fn untag_onto(frame: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&frame[..12]);
    out.extend_from_slice(&frame[16..]);
}

/// `frame` with an 802.1Q tag for VLAN `net` (priority 0), appended to `out`.
pub fn tag_onto(frame: &[u8], net: NetId, out: &mut Vec<u8>) {
    let Some(macs) = frame.get(..12) else {
        out.extend_from_slice(frame);
        return;
    };
    out.extend_from_slice(macs);
    out.extend_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
    out.extend_from_slice(&(net & 0x0fff).to_be_bytes());
    out.extend_from_slice(&frame[12..]);
}

/// A chunk of frames rewritten (tagged or untagged) back to back into one buffer, so that a
/// trunk costs no allocation per frame. The buffer is kept for the next chunk: it holds at
/// most one chunk ([`IO_BATCH`] frames of at most [`MAX_FRAME`](crate::uplink::MAX_FRAME) bytes and a tag each).
#[derive(Debug, Default)]
pub struct RewrittenChunk {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl RewrittenChunk {
    /// Start a new chunk, forgetting the frames of the last one.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Append one frame, written by `write` onto the buffer.
    pub fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        write(&mut self.bytes);
        self.ends.push(self.bytes.len());
    }

    /// The frames, in the order they were pushed, as slices into `out` (at most its length).
    pub fn slices<'a>(&'a self, out: &mut [&'a [u8]; IO_BATCH]) -> usize {
        let mut start = 0;
        let mut n = 0;
        for (slot, &end) in out.iter_mut().zip(&self.ends) {
            *slot = &self.bytes[start..end];
            start = end;
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_and_untag_round_trip() {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06, 9, 9, 9]);
        let mut tagged = Vec::new();
        tag_onto(&f, 42, &mut tagged);
        assert_eq!(&tagged[12..16], &[0x81, 0x00, 0x00, 42]);
        assert_eq!(vlan_of(&tagged), Some(42));
        assert_eq!(vlan_of(&f), None);
        let mut back = Vec::new();
        untag_onto(&tagged, &mut back);
        assert_eq!(back, f);
        assert_eq!(vlan_of(&tagged[..17]), None, "a truncated tag is not a tag");
    }

    #[test]
    fn a_rewritten_chunk_gives_back_each_frame_and_forgets_the_last_chunk() {
        let mut chunk = RewrittenChunk::default();
        chunk.push_with(|out| out.extend_from_slice(b"stale"));
        chunk.clear();
        let frames: [&[u8]; 3] = [b"first", b"", b"third frame"];
        for f in frames {
            chunk.push_with(|out| out.extend_from_slice(f));
        }
        let mut slices: [&[u8]; IO_BATCH] = [&[]; IO_BATCH];
        let n = chunk.slices(&mut slices);
        assert_eq!(&slices[..n], &frames[..]);
    }

    #[test]
    fn carries() {
        assert!(UplinkNets::default().carries(0));
        assert!(!UplinkNets::Untagged(3).carries(0));
        let t = UplinkNets::Tagged(vec![3, 7]);
        assert!(t.carries(7) && t.carries(3) && !t.carries(0));
    }
}
