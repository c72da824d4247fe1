//! IPv6 fixed header (RFC 8200), 40 bytes. Extension headers are not supported on the RoCEv2 path
//! (next header must be UDP).

use super::{be16, be32, out, take, WireError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Header {
    pub traffic_class: u8,
    /// 20 bits.
    pub flow_label: u32,
    pub payload_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
}

impl Ipv6Header {
    pub const LEN: usize = 40;

    pub fn parse(buf: &[u8]) -> Result<(Ipv6Header, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "IPv6")?;
        let w = be32(b, 0);
        if w >> 28 != 6 {
            return Err(WireError::BadIpVersion((w >> 28) as u8));
        }
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&b[8..24]);
        dst.copy_from_slice(&b[24..40]);
        Ok((
            Ipv6Header {
                traffic_class: (w >> 20) as u8,
                flow_label: w & 0x000f_ffff,
                payload_len: be16(b, 4),
                next_header: b[6],
                hop_limit: b[7],
                src,
                dst,
            },
            rest,
        ))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "IPv6")?;
        let w = (6u32 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xfffff);
        b[0..4].copy_from_slice(&w.to_be_bytes());
        b[4..6].copy_from_slice(&self.payload_len.to_be_bytes());
        b[6] = self.next_header;
        b[7] = self.hop_limit;
        b[8..24].copy_from_slice(&self.src);
        b[24..40].copy_from_slice(&self.dst);
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = Ipv6Header {
            traffic_class: 0xab,
            flow_label: 0x12345,
            payload_len: 300,
            next_header: 17,
            hop_limit: 64,
            src: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        };
        let mut b = [0u8; 40];
        assert_eq!(h.write(&mut b), Ok(40));
        assert_eq!(&b[..4], &[0x6a, 0xb1, 0x23, 0x45]);
        assert_eq!(Ipv6Header::parse(&b), Ok((h, &[][..])));
        b[0] = 0x4a;
        assert_eq!(Ipv6Header::parse(&b), Err(WireError::BadIpVersion(4)));
        assert!(Ipv6Header::parse(&b[..39]).is_err());
    }
}
