//! The ICRC at the fabric's edge (spec §16.2): frames between the devices of one daemon never
//! leave the process, so nothing can corrupt them and their engines neither compute nor check the
//! RoCEv2 ICRC (`Uplink::icrc_offload`). The fabric computes it for an engine's frame that leaves
//! through an uplink or is captured, and checks it on a frame that enters from an uplink before
//! any device sees it.

use crate::wire::{seal_icrc, IcrcCheck, RocePacket, WireError};

/// Make an engine's frame a standard RoCEv2 frame before it leaves the process. Frames that are
/// not RoCEv2, and malformed ones, are left as they are (a receiver drops the latter).
pub fn seal(frame: &mut [u8]) {
    if let Err(e) = seal_icrc(frame) {
        guest_debug!("fabric: not sealing a malformed RoCEv2 frame: {e}");
    }
}

/// May a frame from an uplink go on to the devices? No only for a RoCEv2 frame whose ICRC is
/// wrong (IBTA 9.7.5.2: dropped silently; counted here). Frames that are not RoCEv2 pass, and so
/// do otherwise malformed RoCEv2 frames: the device's intake drops and counts those.
pub fn intact(frame: &[u8]) -> bool {
    !matches!(
        RocePacket::parse_with(frame, IcrcCheck::Verify),
        Err(WireError::BadIcrc { .. })
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Addressing, Bth, Opcode, PacketBuilder};

    fn built(icrc: bool, payload: &[u8]) -> Vec<u8> {
        let addr = Addressing::new(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            crate::wire::gid_from_ipv4([10, 0, 0, 1]),
            crate::wire::gid_from_ipv4([10, 0, 0, 2]),
            0xc000,
        );
        let mut b = PacketBuilder::new(addr, Bth::new(Opcode::RcSendOnly, 0x11, 5));
        b.icrc = icrc;
        let mut out = Vec::new();
        b.build(&[payload], &mut out).unwrap();
        out
    }

    #[test]
    fn sealing_an_unsealed_frame_gives_the_standard_frame() {
        for len in [0usize, 1, 3, 64, 1000, 4096] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let standard = built(true, &payload);
            let mut bare = built(false, &payload);
            assert_ne!(bare, standard, "an unsealed frame has no ICRC ({len} B)");
            assert!(
                !intact(&bare),
                "an unsealed frame fails the check ({len} B)"
            );
            seal(&mut bare);
            assert_eq!(bare, standard, "sealed == built with the ICRC ({len} B)");
            assert!(intact(&bare));
            assert!(RocePacket::parse(&bare).is_ok());
        }
    }

    #[test]
    fn the_check_drops_only_corrupt_roce_frames() {
        let good = built(true, b"payload");
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 6] ^= 1; // a payload byte
        assert!(intact(&good));
        assert!(!intact(&bad));
        // Not RoCEv2 (ARP): passes, and sealing leaves it alone.
        let mut arp = vec![0xffu8; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        let before = arp.clone();
        assert!(intact(&arp));
        seal(&mut arp);
        assert_eq!(arp, before);
        // Truncated RoCEv2: passes the check (the device counts it as malformed), not sealed.
        let mut short = good[..40].to_vec();
        let before = short.clone();
        assert!(intact(&short));
        seal(&mut short);
        assert_eq!(short, before);
    }
}
