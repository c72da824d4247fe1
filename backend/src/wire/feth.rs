//! FLUSH Extended Transport Header (IBTA 1.5 FLUSH, 4 bytes): placement type in bits 3:0 and
//! selectivity level in bits 5:4 of a big-endian word; the other bits are reserved.

use super::{be32, out, take, WireError};

/// Placement type bit: make the data globally visible.
pub const PLACEMENT_GLOBAL: u8 = 1 << 0;
/// Placement type bit: make the data persistent.
pub const PLACEMENT_PERSISTENT: u8 = 1 << 1;
/// Selectivity level: the RETH's VA and length select the range.
pub const SELECT_RANGE: u8 = 0;
/// Selectivity level: the whole MR of the RETH's R_Key.
pub const SELECT_MR: u8 = 1;

const PLACEMENT_MASK: u32 = 0xf;
const SELECT_SHIFT: u32 = 4;
const SELECT_MASK: u32 = 0x3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Feth {
    /// `PLACEMENT_*` bits (4 bits on the wire).
    pub placement: u8,
    /// `SELECT_*` (2 bits on the wire).
    pub selectivity: u8,
}

impl Feth {
    pub const LEN: usize = 4;

    /// Reserved bits are ignored on receive (IBTA: reserved fields are not checked).
    pub fn parse(buf: &[u8]) -> Result<(Feth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "FETH")?;
        let w = be32(b, 0);
        Ok((
            Feth {
                placement: (w & PLACEMENT_MASK) as u8,
                selectivity: ((w >> SELECT_SHIFT) & SELECT_MASK) as u8,
            },
            rest,
        ))
    }

    /// Fields wider than their wire bits are truncated to them.
    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "FETH")?;
        let w = (u32::from(self.placement) & PLACEMENT_MASK)
            | ((u32::from(self.selectivity) & SELECT_MASK) << SELECT_SHIFT);
        b.copy_from_slice(&w.to_be_bytes());
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bit_positions() {
        let h = Feth {
            placement: PLACEMENT_GLOBAL,
            selectivity: SELECT_MR,
        };
        let mut b = [0u8; 4];
        assert_eq!(h.write(&mut b), Ok(4));
        assert_eq!(b, [0, 0, 0, 0x11]);
        assert_eq!(Feth::parse(&b), Ok((h, &[][..])));
        let p = Feth {
            placement: PLACEMENT_PERSISTENT,
            selectivity: SELECT_RANGE,
        };
        assert_eq!(p.write(&mut b), Ok(4));
        assert_eq!(b, [0, 0, 0, 0x02]);
        // Reserved bits are ignored.
        assert_eq!(Feth::parse(&[0xff, 0xff, 0xff, 0xd1]).unwrap().0, h);
        assert!(Feth::parse(&b[..3]).is_err());
        assert!(h.write(&mut [0u8; 3]).is_err());
    }
}
