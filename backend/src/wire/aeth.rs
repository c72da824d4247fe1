//! ACK Extended Transport Header (IBTA 9.3.7, 4 bytes): syndrome + MSN.
//!
//! Syndrome byte: bit 7 reserved (0); bits 6:5 type (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK);
//! bits 4:0 value (ACK: credit count, RNR NAK: timer code, NAK: NAK code).

use super::{be24, out, take, WireError};

/// Credit count value meaning "invalid / no end-to-end credits" (IBTA 9.7.7.2).
pub const CREDITS_INVALID: u8 = 0x1f;

/// NAK codes (syndrome bits 4:0 when the type is NAK).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    /// Any other (reserved) code, 5..=31; kept so a parse is lossless.
    Reserved(u8),
}

impl NakCode {
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    pub const fn from_code(c: u8) -> NakCode {
        match c & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

/// The decoded syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive ACK with a 5-bit credit count code ([`CREDITS_INVALID`] if unused).
    Ack {
        credits: u8,
    },
    /// Receiver not ready, with a 5-bit timer code (see [`rnr_timer_usecs`]).
    RnrNak {
        timer: u8,
    },
    Nak(NakCode),
    /// Type 10 (reserved) or bit 7 set: the raw syndrome byte.
    Reserved(u8),
}

impl Syndrome {
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c.code(),
            Syndrome::Reserved(b) => b,
        }
    }
    pub const fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 3 {
            0 => Syndrome::Ack { credits: b & 0x1f },
            1 => Syndrome::RnrNak { timer: b & 0x1f },
            3 => Syndrome::Nak(NakCode::from_code(b & 0x1f)),
            _ => Syndrome::Reserved(b),
        }
    }
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth {
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    pub const LEN: usize = 4;

    /// A positive ACK with invalid credits.
    pub const fn ack(msn: u32) -> Aeth {
        Aeth {
            syndrome: Syndrome::Ack {
                credits: CREDITS_INVALID,
            },
            msn: msn & 0x00ff_ffff,
        }
    }

    pub fn parse(buf: &[u8]) -> Result<(Aeth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "AETH")?;
        Ok((
            Aeth {
                syndrome: Syndrome::from_byte(b[0]),
                msn: be24(b, 1),
            },
            rest,
        ))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "AETH")?;
        b[0] = self.syndrome.to_byte();
        b[1..4].copy_from_slice(&(self.msn & 0x00ff_ffff).to_be_bytes()[1..]);
        Ok(Self::LEN)
    }
}

/// RNR NAK timer code → microseconds (IBTA table "Encoding for RNR NAK Timer Field").
pub const RNR_TIMER_USECS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// Microseconds for an RNR timer code (the low 5 bits are used).
pub const fn rnr_timer_usecs(code: u8) -> u32 {
    RNR_TIMER_USECS[(code & 0x1f) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_encodings() {
        assert_eq!(Syndrome::Ack { credits: 0x1f }.to_byte(), 0x1f);
        assert_eq!(Syndrome::RnrNak { timer: 14 }.to_byte(), 0x2e);
        assert_eq!(Syndrome::Nak(NakCode::PsnSequenceError).to_byte(), 0x60);
        assert_eq!(Syndrome::Nak(NakCode::InvalidRequest).to_byte(), 0x61);
        assert_eq!(Syndrome::Nak(NakCode::RemoteAccessError).to_byte(), 0x62);
        assert_eq!(
            Syndrome::Nak(NakCode::RemoteOperationalError).to_byte(),
            0x63
        );
        assert_eq!(Syndrome::Nak(NakCode::InvalidRdRequest).to_byte(), 0x64);
        // Every byte decodes and re-encodes losslessly.
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b, "{b:#x}");
        }
        assert_eq!(Syndrome::from_byte(0x40), Syndrome::Reserved(0x40));
        assert_eq!(Syndrome::from_byte(0x9f), Syndrome::Reserved(0x9f));
        assert_eq!(
            Syndrome::from_byte(0x7f),
            Syndrome::Nak(NakCode::Reserved(0x1f))
        );
    }

    #[test]
    fn round_trip() {
        let h = Aeth {
            syndrome: Syndrome::RnrNak { timer: 3 },
            msn: 0x00ab_cdef,
        };
        let mut b = [0u8; 4];
        assert_eq!(h.write(&mut b), Ok(4));
        assert_eq!(b, [0x23, 0xab, 0xcd, 0xef]);
        assert_eq!(Aeth::parse(&b), Ok((h, &[][..])));
        assert!(Aeth::parse(&b[..3]).is_err());
        assert_eq!(Aeth::ack(0x0100_0002).msn, 2);
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_usecs(0), 655_360);
        assert_eq!(rnr_timer_usecs(1), 10);
        assert_eq!(rnr_timer_usecs(14), 1_280);
        assert_eq!(rnr_timer_usecs(31), 491_520);
        assert_eq!(rnr_timer_usecs(0xff), 491_520);
    }
}
