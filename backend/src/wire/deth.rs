//! Datagram Extended Transport Header (IBTA 9.3.2, 8 bytes): Q_Key, source QP.

use super::{be24, be32, out, take, WireError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deth {
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qp: u32,
}

impl Deth {
    pub const LEN: usize = 8;

    pub fn parse(buf: &[u8]) -> Result<(Deth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "DETH")?;
        Ok((
            Deth {
                qkey: be32(b, 0),
                src_qp: be24(b, 5),
            },
            rest,
        ))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "DETH")?;
        b[0..4].copy_from_slice(&self.qkey.to_be_bytes());
        b[4] = 0;
        b[5..8].copy_from_slice(&(self.src_qp & 0x00ff_ffff).to_be_bytes()[1..]);
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = Deth {
            qkey: 0x8001_0000,
            src_qp: 0x00_0001,
        };
        let mut b = [0xaau8; 8];
        assert_eq!(h.write(&mut b), Ok(8));
        assert_eq!(b, [0x80, 0x01, 0, 0, 0, 0, 0, 1]);
        assert_eq!(Deth::parse(&b), Ok((h, &[][..])));
        assert!(Deth::parse(&b[..7]).is_err());
        assert!(h.write(&mut [0u8; 7]).is_err());
    }
}
