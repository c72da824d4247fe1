//! IPv4 header (RFC 791), 20 bytes; options are not supported on the RoCEv2 path.

use super::{be16, out, take, WireError};

pub const PROTO_UDP: u8 = 17;
/// Flags/fragment word: Don't Fragment.
pub const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// Internet checksum (RFC 1071) accumulation: 16-bit big-endian words, odd tail padded with 0.
pub fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([c[0], c[1]])));
        // Fold early so very long inputs cannot overflow.
        if sum & 0x8000_0000 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
    }
    if let [last] = chunks.remainder() {
        sum = sum.wrapping_add(u32::from(*last) << 8);
    }
    sum
}

/// Fold and complement an accumulated sum.
pub fn csum_finish(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Header {
    /// DSCP + ECN.
    pub tos: u8,
    pub total_len: u16,
    pub id: u16,
    /// Flags (15:13) and fragment offset (12:0).
    pub flags_frag: u16,
    pub ttl: u8,
    pub protocol: u8,
    /// As parsed; `write` computes it.
    pub checksum: u16,
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

impl Ipv4Header {
    pub const LEN: usize = 20;

    /// Parse and validate: version 4, IHL 5 (IHL < 5 → `BadIpv4HeaderLength`, > 5 →
    /// `Ipv4Options`), header checksum. Length fields are checked by the caller against the frame.
    pub fn parse(buf: &[u8]) -> Result<(Ipv4Header, &[u8]), WireError> {
        let first = *buf.first().ok_or(WireError::Truncated {
            what: "IPv4",
            need: Self::LEN,
            have: 0,
        })?;
        if first >> 4 != 4 {
            return Err(WireError::BadIpVersion(first >> 4));
        }
        let ihl = first & 0xf;
        if ihl < 5 {
            return Err(WireError::BadIpv4HeaderLength(ihl));
        }
        let (b, rest) = take(buf, Self::LEN, "IPv4")?;
        if ihl > 5 {
            return Err(WireError::Ipv4Options(ihl));
        }
        if csum_finish(csum_add(0, b)) != 0 {
            return Err(WireError::BadIpv4Checksum);
        }
        let mut src = [0u8; 4];
        let mut dst = [0u8; 4];
        src.copy_from_slice(&b[12..16]);
        dst.copy_from_slice(&b[16..20]);
        Ok((
            Ipv4Header {
                tos: b[1],
                total_len: be16(b, 2),
                id: be16(b, 4),
                flags_frag: be16(b, 6),
                ttl: b[8],
                protocol: b[9],
                checksum: be16(b, 10),
                src,
                dst,
            },
            rest,
        ))
    }

    pub fn is_fragment(&self) -> bool {
        self.flags_frag & (FLAG_MF | FRAG_OFFSET_MASK) != 0
    }

    /// Write with a freshly computed header checksum.
    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "IPv4")?;
        b[0] = 0x45;
        b[1] = self.tos;
        b[2..4].copy_from_slice(&self.total_len.to_be_bytes());
        b[4..6].copy_from_slice(&self.id.to_be_bytes());
        b[6..8].copy_from_slice(&self.flags_frag.to_be_bytes());
        b[8] = self.ttl;
        b[9] = self.protocol;
        b[12..16].copy_from_slice(&self.src);
        b[16..20].copy_from_slice(&self.dst);
        // The checksum is summed from the fields, not read back from `buf` (a frame buffer
        // another core wrote last: reading it back waits for the stores just made).
        b[10..12].copy_from_slice(&self.checksum_of_fields().to_be_bytes());
        Ok(Self::LEN)
    }

    /// The header checksum of this header as [`Ipv4Header::write`] lays it out (IHL 5).
    fn checksum_of_fields(&self) -> u16 {
        let w = |hi: u8, lo: u8| u32::from(u16::from_be_bytes([hi, lo]));
        let sum = w(0x45, self.tos)
            + u32::from(self.total_len)
            + u32::from(self.id)
            + u32::from(self.flags_frag)
            + w(self.ttl, self.protocol)
            + w(self.src[0], self.src[1])
            + w(self.src[2], self.src[3])
            + w(self.dst[0], self.dst[1])
            + w(self.dst[2], self.dst[3]);
        csum_finish(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Ipv4Header {
        Ipv4Header {
            tos: 0x02,
            total_len: 60,
            id: 0x1c46,
            flags_frag: FLAG_DF,
            ttl: 64,
            protocol: PROTO_UDP,
            checksum: 0,
            src: [192, 168, 0, 1],
            dst: [192, 168, 0, 199],
        }
    }

    #[test]
    fn known_checksum() {
        // RFC 1071-style worked example (Wikipedia's IPv4 checksum example header).
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(csum_finish(csum_add(0, &hdr)), 0xb861);
        assert_eq!(csum_finish(csum_add(0, &[0x01])), !0x0100);
    }

    #[test]
    fn round_trip_and_checksum() {
        let h = sample();
        let mut b = [0u8; 20];
        assert_eq!(h.write(&mut b), Ok(20));
        let (p, _) = Ipv4Header::parse(&b).unwrap();
        assert_eq!(p.checksum, u16::from_be_bytes([b[10], b[11]]));
        assert_eq!(Ipv4Header { checksum: 0, ..p }, h);
        b[8] ^= 1;
        assert_eq!(Ipv4Header::parse(&b), Err(WireError::BadIpv4Checksum));
    }

    /// Headers of varied fields: the checksum `write` sums from the fields verifies over the
    /// bytes it wrote, and a parse reads the fields back.
    #[test]
    fn written_checksum_verifies_for_varied_headers() {
        let mut x = 0x2545_f491u32;
        for _ in 0..1000 {
            let mut r = || {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x
            };
            let h = Ipv4Header {
                tos: r() as u8,
                total_len: (r() as u16).max(20),
                id: r() as u16,
                flags_frag: r() as u16,
                ttl: r() as u8,
                protocol: r() as u8,
                checksum: 0,
                src: r().to_be_bytes(),
                dst: r().to_be_bytes(),
            };
            let mut b = [0u8; 20];
            h.write(&mut b).unwrap();
            assert_eq!(csum_finish(csum_add(0, &b)), 0, "{h:?}");
            let (p, _) = Ipv4Header::parse(&b).unwrap();
            assert_eq!(Ipv4Header { checksum: 0, ..p }, h);
        }
    }

    #[test]
    fn bad_lengths_and_versions() {
        let mut b = [0u8; 24];
        sample().write(&mut b).unwrap();
        let mut x = b;
        x[0] = 0x44;
        assert_eq!(
            Ipv4Header::parse(&x),
            Err(WireError::BadIpv4HeaderLength(4))
        );
        x[0] = 0x46;
        assert_eq!(Ipv4Header::parse(&x), Err(WireError::Ipv4Options(6)));
        x[0] = 0x65;
        assert_eq!(Ipv4Header::parse(&x), Err(WireError::BadIpVersion(6)));
        assert!(matches!(
            Ipv4Header::parse(&b[..19]),
            Err(WireError::Truncated { .. })
        ));
        assert!(Ipv4Header::parse(&[]).is_err());
    }

    #[test]
    fn fragments() {
        let mut h = sample();
        assert!(!h.is_fragment());
        h.flags_frag = 0x2000;
        assert!(h.is_fragment());
        h.flags_frag = 0x0001;
        assert!(h.is_fragment());
    }
}
