//! RDMA Extended Transport Header (IBTA 9.3.3, 16 bytes): VA, R_Key, DMA length.

use super::{be32, be64, out, take, WireError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl Reth {
    pub const LEN: usize = 16;

    pub fn parse(buf: &[u8]) -> Result<(Reth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "RETH")?;
        Ok((
            Reth {
                va: be64(b, 0),
                rkey: be32(b, 8),
                dma_len: be32(b, 12),
            },
            rest,
        ))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "RETH")?;
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = Reth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            dma_len: 0xdead_beef,
        };
        let mut b = [0u8; 16];
        assert_eq!(h.write(&mut b), Ok(16));
        assert_eq!(&b[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[8..], &[0x11, 0x22, 0x33, 0x44, 0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(Reth::parse(&b), Ok((h, &[][..])));
        assert!(Reth::parse(&b[..15]).is_err());
        assert!(h.write(&mut [0u8; 15]).is_err());
    }
}
