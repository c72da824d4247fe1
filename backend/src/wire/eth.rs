//! Ethernet II header with an optional 802.1Q VLAN tag.

use super::{be16, out, take, WireError};

pub type MacAddr = [u8; 6];

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

pub const BROADCAST: MacAddr = [0xff; 6];

/// Group (multicast or broadcast) address: I/G bit set.
#[inline]
pub fn is_multicast(mac: &MacAddr) -> bool {
    mac[0] & 1 != 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthHeader {
    pub dst: MacAddr,
    pub src: MacAddr,
    /// 802.1Q tag control information (PCP 15:13, DEI 12, VID 11:0), if the frame is tagged.
    pub vlan: Option<u16>,
    /// The (inner) ethertype.
    pub ethertype: u16,
}

impl EthHeader {
    /// Length without a VLAN tag.
    pub const LEN: usize = 14;
    /// Length with one 802.1Q tag.
    pub const LEN_VLAN: usize = 18;

    /// On-wire length of this header.
    pub const fn wire_len(&self) -> usize {
        if self.vlan.is_some() {
            Self::LEN_VLAN
        } else {
            Self::LEN
        }
    }

    pub fn parse(buf: &[u8]) -> Result<(EthHeader, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "Ethernet")?;
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&b[0..6]);
        src.copy_from_slice(&b[6..12]);
        let t = be16(b, 12);
        if t != ETHERTYPE_VLAN {
            return Ok((
                EthHeader {
                    dst,
                    src,
                    vlan: None,
                    ethertype: t,
                },
                rest,
            ));
        }
        let (tag, rest) = take(rest, 4, "802.1Q tag")?;
        Ok((
            EthHeader {
                dst,
                src,
                vlan: Some(be16(tag, 0)),
                ethertype: be16(tag, 2),
            },
            rest,
        ))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let n = self.wire_len();
        let b = out(buf, n, "Ethernet")?;
        b[0..6].copy_from_slice(&self.dst);
        b[6..12].copy_from_slice(&self.src);
        if let Some(tci) = self.vlan {
            b[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            b[14..16].copy_from_slice(&tci.to_be_bytes());
        }
        b[n - 2..n].copy_from_slice(&self.ethertype.to_be_bytes());
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_untagged_and_tagged() {
        for vlan in [None, Some(0x6064u16)] {
            let h = EthHeader {
                dst: [2, 0, 0, 0, 0, 1],
                src: [2, 0, 0, 0, 0, 2],
                vlan,
                ethertype: ETHERTYPE_IPV6,
            };
            let mut b = [0u8; 19];
            let n = h.write(&mut b).unwrap();
            assert_eq!(n, if vlan.is_some() { 18 } else { 14 });
            if vlan.is_some() {
                assert_eq!(&b[12..18], &[0x81, 0x00, 0x60, 0x64, 0x86, 0xdd]);
            } else {
                assert_eq!(&b[12..14], &[0x86, 0xdd]);
            }
            let (p, rest) = EthHeader::parse(&b[..n + 1]).unwrap();
            assert_eq!(p, h);
            assert_eq!(rest.len(), 1);
        }
    }

    #[test]
    fn truncated_tag() {
        let mut b = [0u8; 16];
        b[12] = 0x81;
        assert!(matches!(
            EthHeader::parse(&b),
            Err(WireError::Truncated {
                what: "802.1Q tag",
                ..
            })
        ));
        assert!(EthHeader::parse(&b[..13]).is_err());
    }

    #[test]
    fn group_bit() {
        assert!(is_multicast(&BROADCAST));
        assert!(is_multicast(&[0x33, 0x33, 0, 0, 0, 1]));
        assert!(!is_multicast(&[0x02, 0, 0, 0, 0, 1]));
    }
}
