//! UDP header (RFC 768), 8 bytes, and the IPv6 UDP checksum.

use super::ipv4::{csum_add, csum_finish};

fixed_header! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct UdpHeader("UDP", 8) {
        pub src_port: u16 = Be16 @ 0,
        pub dst_port: u16 = Be16 @ 2,
        /// Header + data length.
        pub length: u16 = Be16 @ 4,
        pub checksum: u16 = Be16 @ 6,
    }
}

/// UDP checksum over the IPv6 pseudo-header and `udp` (header with checksum field 0, then data).
/// A computed 0 is sent as 0xffff (RFC 8200 §8.1).
pub fn ipv6_udp_checksum(src: &[u8; 16], dst: &[u8; 16], udp: &[&[u8]]) -> u16 {
    let len: usize = udp.iter().map(|p| p.len()).sum();
    let mut sum = csum_add(0, src);
    sum = csum_add(sum, dst);
    sum = csum_add(sum, &(len as u32).to_be_bytes());
    sum = csum_add(sum, &[0, 0, 0, super::ipv4::PROTO_UDP]);
    // Pieces may have odd lengths: carry the odd byte over.
    let mut carry: Option<u8> = None;
    for p in udp {
        let mut p = *p;
        if let Some(c) = carry.take() {
            if let Some((&first, rest)) = p.split_first() {
                sum = csum_add(sum, &[c, first]);
                p = rest;
            } else {
                carry = Some(c);
                continue;
            }
        }
        let even = p.len() & !1;
        sum = csum_add(sum, &p[..even]);
        if even < p.len() {
            carry = Some(p[even]);
        }
    }
    if let Some(c) = carry {
        sum = csum_add(sum, &[c]);
    }
    match csum_finish(sum) {
        0 => 0xffff,
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixed_header::assert_round_trip;

    #[test]
    fn round_trip() {
        let b = assert_round_trip(&UdpHeader {
            src_port: 0xc123,
            dst_port: 4791,
            length: 40,
            checksum: 0,
        });
        assert_eq!(b, [0xc1, 0x23, 0x12, 0xb7, 0, 40, 0, 0]);
    }

    #[test]
    fn ipv6_checksum_split_anywhere_is_the_same_and_verifies() {
        let src = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let dst = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let mut d: Vec<u8> = vec![0xc0, 0x00, 0x12, 0xb7, 0, 15, 0, 0];
        d.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7]);
        let whole = ipv6_udp_checksum(&src, &dst, &[&d]);
        for cut in 0..d.len() {
            let (a, b) = d.split_at(cut);
            assert_eq!(ipv6_udp_checksum(&src, &dst, &[a, &[], b]), whole);
        }
        // Inserting the checksum makes the total sum verify (complement 0).
        d[6..8].copy_from_slice(&whole.to_be_bytes());
        let mut s = csum_add(0, &src);
        s = csum_add(s, &dst);
        s = csum_add(s, &(d.len() as u32).to_be_bytes());
        s = csum_add(s, &[0, 0, 0, 17]);
        s = csum_add(s, &d);
        assert_eq!(csum_finish(s), 0);
    }
}
