//! Invalidate Extended Transport Header (IBTA 9.3.6, 4 bytes): the R_Key to invalidate.

use super::{out, take, WireError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ieth {
    pub rkey: u32,
}

impl Ieth {
    pub const LEN: usize = 4;

    pub fn parse(buf: &[u8]) -> Result<(Ieth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "IETH")?;
        Ok((
            Ieth {
                rkey: super::be32(b, 0),
            },
            rest,
        ))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        out(buf, Self::LEN, "IETH")?.copy_from_slice(&self.rkey.to_be_bytes());
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut b = [0u8; 4];
        let h = Ieth { rkey: 0xcafe_0102 };
        assert_eq!(h.write(&mut b), Ok(4));
        assert_eq!(b, [0xca, 0xfe, 1, 2]);
        assert_eq!(Ieth::parse(&b), Ok((h, &[][..])));
        assert!(Ieth::parse(&b[..3]).is_err());
        assert!(h.write(&mut [0u8; 2]).is_err());
    }
}
