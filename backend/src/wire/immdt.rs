//! Immediate Data Extended Transport Header (IBTA 9.3.5, 4 bytes).

use super::{out, take, WireError};

/// Immediate data. `0` holds the 4 wire bytes as a big-endian value: `ImmDt(v).0.to_be_bytes()` is
/// what is on the wire. (The ABI's `ex` field carries imm_data in wire byte order: convert with
/// `u32::from_be_bytes(ex_bytes)`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImmDt(pub u32);

impl ImmDt {
    pub const LEN: usize = 4;

    pub fn parse(buf: &[u8]) -> Result<(ImmDt, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "ImmDt")?;
        Ok((ImmDt(super::be32(b, 0)), rest))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        out(buf, Self::LEN, "ImmDt")?.copy_from_slice(&self.0.to_be_bytes());
        Ok(Self::LEN)
    }

    /// The four bytes as on the wire.
    pub fn wire_bytes(&self) -> [u8; 4] {
        self.0.to_be_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut b = [0u8; 4];
        assert_eq!(ImmDt(0x1234_5678).write(&mut b), Ok(4));
        assert_eq!(b, [0x12, 0x34, 0x56, 0x78]);
        assert_eq!(ImmDt::parse(&b), Ok((ImmDt(0x1234_5678), &[][..])));
        assert_eq!(ImmDt(0x1234_5678).wire_bytes(), b);
        assert!(ImmDt::parse(&b[..3]).is_err());
    }
}
