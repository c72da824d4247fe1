//! XRC Extended Transport Header (XRCETH, IBTA Vol. 1 rel. 1.2.1 XRC, 4 bytes; spec §15.2): 8 reserved
//! bits, then the 24-bit XRC SRQ number at the target that receives the request (spec §13.7).

use super::{be24, out, take, WireError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Xrceth {
    /// XRC SRQ number (24 bits).
    pub srqn: u32,
}

impl Xrceth {
    pub const LEN: usize = 4;

    pub fn parse(buf: &[u8]) -> Result<(Xrceth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "XRCETH")?;
        Ok((Xrceth { srqn: be24(b, 1) }, rest))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "XRCETH")?;
        b[0] = 0;
        b[1..4].copy_from_slice(&(self.srqn & 0x00ff_ffff).to_be_bytes()[1..]);
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_masks_to_24_bits() {
        let h = Xrceth { srqn: 0x12_3456 };
        let mut b = [0xaau8; 4];
        assert_eq!(h.write(&mut b), Ok(4));
        assert_eq!(b, [0, 0x12, 0x34, 0x56]);
        assert_eq!(Xrceth::parse(&b), Ok((h, &[][..])));
        // The reserved byte is ignored on receive.
        assert_eq!(Xrceth::parse(&[0xff, 0, 0, 7]).map(|x| x.0.srqn), Ok(7));
        assert!(Xrceth::parse(&b[..3]).is_err());
        let mut b = [0u8; 4];
        Xrceth { srqn: 0xff00_0001 }.write(&mut b).unwrap();
        assert_eq!(b, [0, 0, 0, 1]);
    }
}
