//! Atomic Extended Transport Header (IBTA 9.3.4, 28 bytes): VA, R_Key, swap/add data, compare data.

use super::{be32, be64, out, take, WireError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEth {
    pub va: u64,
    pub rkey: u32,
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (CMP_SWAP; ignored by FETCH_ADD).
    pub compare: u64,
}

impl AtomicEth {
    pub const LEN: usize = 28;

    pub fn parse(buf: &[u8]) -> Result<(AtomicEth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "AtomicETH")?;
        Ok((
            AtomicEth {
                va: be64(b, 0),
                rkey: be32(b, 8),
                swap_add: be64(b, 12),
                compare: be64(b, 20),
            },
            rest,
        ))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "AtomicETH")?;
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..20].copy_from_slice(&self.swap_add.to_be_bytes());
        b[20..28].copy_from_slice(&self.compare.to_be_bytes());
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = AtomicEth {
            va: 0x1000,
            rkey: 0x0102_0304,
            swap_add: 0x1111_2222_3333_4444,
            compare: 0x5555_6666_7777_8888,
        };
        let mut b = [0u8; 28];
        assert_eq!(h.write(&mut b), Ok(28));
        assert_eq!(&b[8..12], &[1, 2, 3, 4]);
        assert_eq!(&b[12..14], &[0x11, 0x11]);
        assert_eq!(&b[26..28], &[0x88, 0x88]);
        assert_eq!(AtomicEth::parse(&b), Ok((h, &[][..])));
        assert!(AtomicEth::parse(&b[..27]).is_err());
        assert!(h.write(&mut [0u8; 27]).is_err());
    }
}
