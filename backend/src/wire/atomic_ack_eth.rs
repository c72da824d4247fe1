//! Atomic Acknowledge Extended Transport Header (IBTA 9.5.3, 8 bytes): the original remote data.

use super::{be64, out, take, WireError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicAckEth {
    pub orig: u64,
}

impl AtomicAckEth {
    pub const LEN: usize = 8;

    pub fn parse(buf: &[u8]) -> Result<(AtomicAckEth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "AtomicAckETH")?;
        Ok((AtomicAckEth { orig: be64(b, 0) }, rest))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        out(buf, Self::LEN, "AtomicAckETH")?.copy_from_slice(&self.orig.to_be_bytes());
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = AtomicAckEth {
            orig: 0x0102_0304_0506_0708,
        };
        let mut b = [0u8; 8];
        assert_eq!(h.write(&mut b), Ok(8));
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(AtomicAckEth::parse(&b), Ok((h, &[][..])));
        assert!(AtomicAckEth::parse(&b[..7]).is_err());
    }
}
